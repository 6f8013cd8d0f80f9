#include "megatrain/train/sampler.h"

#include <algorithm>
#include <cmath>

#include "megatrain/core/rng.h"

namespace mt {

std::vector<int32_t> sample_tokens(GPT& model, const std::vector<int32_t>& prompt, const SampleOptions& o) {
  MT_CHECK(!prompt.empty(), "sampling needs a non-empty prompt");
  const ModelConfig& c = model.config();
  Rng rng(o.seed);
  std::vector<int32_t> seq = prompt, out;
  std::vector<std::pair<float, int>> cand(c.vocab_size);
  for (int n = 0; n < o.tokens; ++n) {
    int start = std::max<int>(0, static_cast<int>(seq.size()) - c.max_seq_len);
    int T = static_cast<int>(seq.size()) - start;
    Tensor logits = model.logits(seq.data() + start, 1, T);
    const float* row = logits.f32() + static_cast<size_t>(T - 1) * logits.size(1);
    int next = 0;
    if (o.temperature <= 0) {
      next = static_cast<int>(std::max_element(row, row + c.vocab_size) - row);
    } else {
      for (int v = 0; v < c.vocab_size; ++v) cand[v] = {row[v] / o.temperature, v};
      int k = o.top_k > 0 ? std::min(o.top_k, c.vocab_size) : c.vocab_size;
      std::partial_sort(cand.begin(), cand.begin() + k, cand.end(),
                        [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
      double z = 0;
      for (int i = 0; i < k; ++i) z += std::exp(cand[i].first - cand[0].first);
      double u = rng.uniform() * z, acc = 0;
      next = cand[k - 1].second;
      for (int i = 0; i < k; ++i) {
        acc += std::exp(cand[i].first - cand[0].first);
        if (u < acc) {
          next = cand[i].second;
          break;
        }
      }
    }
    if (next == o.stop_token) break;
    seq.push_back(next);
    out.push_back(next);
  }
  return out;
}

}  // namespace mt
