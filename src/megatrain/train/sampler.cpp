#include "megatrain/train/sampler.h"

#include <algorithm>
#include <cmath>

#include "megatrain/core/bf16.h"
#include "megatrain/core/buffer.h"
#include "megatrain/parallel/pipeline_eval.h"

namespace mt {

namespace {

// Row r of [rows, n] logits as host floats: the logits may live in device memory in bf16 (the CUDA backend).
void logits_row_to_host(Ops& ops, Tensor logits, int64_t r, float* out) {
  const Tensor row = logits.slice0(r, r + 1);
  const int64_t n = row.numel();
  if (row.dtype == DType::F32) {
    ops.to_host(out, row);
    return;
  }
  MT_CHECK(row.dtype == DType::BF16, "sampling: logits of dtype {} are not supported", dtype_name(row.dtype));
  std::vector<uint16_t> h(static_cast<size_t>(n));
  ops.to_host(h.data(), row);
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(h[i]);
}

}  // namespace

TokenPicker::TokenPicker(int vocab_size, const SampleOptions& o) : vocab_(vocab_size), o_(o), rng_(o.seed) {
  MT_CHECK(vocab_size > 0, "sampling needs a vocabulary, got vocab_size {}", vocab_size);
}

int TokenPicker::pick(const float* row) {
  if (o_.temperature <= 0) return static_cast<int>(std::max_element(row, row + vocab_) - row);
  cand_.resize(vocab_);
  for (int v = 0; v < vocab_; ++v) cand_[v] = {row[v] / o_.temperature, v};
  const int k = o_.top_k > 0 ? std::min(o_.top_k, vocab_) : vocab_;
  std::partial_sort(cand_.begin(), cand_.begin() + k, cand_.end(),
                    [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  double z = 0;
  for (int i = 0; i < k; ++i) z += std::exp(cand_[i].first - cand_[0].first);
  const double u = rng_.uniform() * z;
  double acc = 0;
  for (int i = 0; i < k; ++i) {
    acc += std::exp(cand_[i].first - cand_[0].first);
    if (u < acc) return cand_[i].second;
  }
  return cand_[k - 1].second;
}

std::vector<int32_t> sample_tokens(GPT& model, const std::vector<int32_t>& prompt, const SampleOptions& o) {
  return sample_tokens(model, nullptr, nullptr, prompt, o);
}

std::vector<int32_t> sample_tokens(GPT& model, ProcessGroup* tp, ProcessGroup* pp, const std::vector<int32_t>& prompt,
                                   const SampleOptions& o, ProcessGroup* pp_data, ProcessGroup* ep) {
  MT_CHECK(!prompt.empty(), "sampling needs a non-empty prompt");
  const ModelConfig& c = model.config();
  const int tps = tp ? tp->size() : 1, pps = pp ? pp->size() : 1;
  MT_CHECK(tps == model.tp_size(), "sampling: the tp group has {} ranks but the model is split over {}", tps,
           model.tp_size());
  MT_CHECK(pps > 1 || model.part().whole(), "sampling from a pipeline stage needs its pp group");
  // The longest window whose padded length still fits the model's positions.
  const int max_window = c.max_seq_len / tps * tps;
  MT_CHECK(max_window > 0, "model.max_seq_len {} is shorter than parallel.tp {}", c.max_seq_len, tps);
  const bool last_stage = pps == 1 || pp->rank() == pps - 1;
  TokenPicker picker(c.vocab_size, o);
  const int64_t Vl = model.local_vocab();
  HostBuffer mine(static_cast<size_t>(Vl) * sizeof(float), false), full;
  if (tps > 1) full.resize(static_cast<size_t>(Vl) * tps * sizeof(float), false);
  std::vector<int32_t> seq = prompt, out, window;
  for (int n = 0; n < o.tokens; ++n) {
    const int T = std::min<int>(static_cast<int>(seq.size()), max_window);
    const int Tpad = (T + tps - 1) / tps * tps;
    window.assign(seq.end() - T, seq.end());
    window.resize(Tpad, 0);
    Tensor logits = pps > 1 ? pipeline_logits(model, pp_data ? *pp_data : *pp, window.data(), 1, Tpad)
                            : model.logits(window.data(), 1, Tpad);
    int32_t next = 0;
    if (last_stage) {
      logits_row_to_host(model.ops(), logits.view({logits.numel() / Vl, Vl}), T - 1, mine.f32());
      const float* row = mine.f32();
      if (tps > 1) {
        tp->all_gather(f32_view(full.f32(), {Vl * tps}), f32_view(mine.f32(), {Vl}))->wait();
        row = full.f32();  // rank r's columns are ids [r * Vl, (r + 1) * Vl)
      }
      next = picker.pick(row);
    }
    if (pps > 1) {
      Tensor t(&next, {1}, DType::I32);
      pp->broadcast(t, pps - 1)->wait();
    }
    if (ep && ep->size() > 1) ep->broadcast(Tensor(&next, {1}, DType::I32), 0)->wait();
    if (next == o.stop_token) break;
    seq.push_back(next);
    out.push_back(next);
  }
  return out;
}

}  // namespace mt
