#include "megatrain/model/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fmt/format.h>

#include <functional>

#include "megatrain/core/rng.h"
#include "megatrain/model/layout.h"

namespace mt {

namespace {
Tensor mat(const HostBuffer& b, int64_t rows, int64_t cols) { return f32_view(b.f32(), {rows, cols}); }
Tensor vec(const HostBuffer& b, int64_t n) { return f32_view(b.f32(), {n}); }
}  // namespace

GPT::GPT(const ModelConfig& cfg, Ops& ops, size_t pad_multiple, TpComm* tp, GptPart part)
    : cfg_(cfg), ops_(ops), part_(std::move(part)) {
  if (tp && tp->size() > 1) tp_ = tp;
  declare_gpt_params(cfg_, params_, tp_size(), tp_rank(), part_);
  params_.allocate(pad_multiple);
  chunks_ = part_.chunks;
  if (chunks_.empty()) chunks_.emplace_back(0, cfg_.n_layer);
  blocks_.resize(cfg_.n_layer);
  for (auto [a, b] : chunks_)
    for (int l = a; l < b; ++l) blocks_[l].emplace(cfg_, params_, l, tp_);
  auto idx = [&](const std::string& n) { return params_.has(n) ? params_.index(n) : -1; };
  wte_ = idx("wte.weight");
  wpe_ = idx("wpe.weight");
  lnf_w_ = idx("ln_f.weight");
  lnf_b_ = idx("ln_f.bias");
  head_ = cfg_.tied_embeddings ? wte_ : idx("lm_head.weight");
  emb_end_ = part_.embedding ? std::max(wte_, wpe_) + 1 : 0;
  layer_first_.assign(cfg_.n_layer, -1);
  layer_end_.assign(cfg_.n_layer, -1);
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string& n = params_.info(static_cast<int>(i)).name;
    if (n.rfind("h.", 0) != 0) continue;
    const int l = std::stoi(n.substr(2));
    if (layer_first_[l] < 0) layer_first_[l] = static_cast<int>(i);
    layer_end_[l] = static_cast<int>(i) + 1;
  }
}

void GPT::init_weights(uint64_t seed) {
  const float proj_std = cfg_.init_std / std::sqrt(2.0f * cfg_.n_layer);
  std::vector<float> full;
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamInfo& p = params_.info(static_cast<int>(i));
    // A shard is initialised as the slice of the full tensor the single process draws, so any tp layout
    // starts from the same model.
    float* w = params_.param(static_cast<int>(i)).f32();
    if (p.shard.sharded()) {
      full.resize(static_cast<size_t>(p.shard.full_numel()));
      w = full.data();
    }
    const size_t numel = p.shard.sharded() ? full.size() : p.numel;
    const std::string& n = p.name;
    auto ends_with = [&](const char* s) {
      size_t k = std::strlen(s);
      return n.size() >= k && n.compare(n.size() - k, k, s) == 0;
    };
    if (ends_with(".bias")) {
      std::memset(w, 0, numel * sizeof(float));
    } else if (p.shape.size() == 1) {  // norm weights
      for (size_t j = 0; j < numel; ++j) w[j] = 1.0f;
    } else {
      Rng rng(mix_seed(seed, std::hash<std::string>{}(n)));
      float std = ends_with("c_proj.weight") ? proj_std : cfg_.init_std;
      for (size_t j = 0; j < numel; ++j) w[j] = std * rng.normal();
      if (n == "wte.weight" || n == "lm_head.weight")  // padded vocab rows stay zero
        std::memset(w + static_cast<size_t>(cfg_.vocab_size) * cfg_.d_model, 0,
                    (numel - static_cast<size_t>(cfg_.vocab_size) * cfg_.d_model) * sizeof(float));
    }
    if (p.shard.sharded()) shard_slice(p.shard, full.data(), params_.param(static_cast<int>(i)).f32());
  }
}

void GPT::ensure_capacity(int B, int T) {
  MT_CHECK(B > 0 && T > 0, "batch {} x {} must be positive", B, T);
  MT_CHECK(T <= cfg_.max_seq_len, "sequence length {} exceeds model.max_seq_len {}", T, cfg_.max_seq_len);
  const int64_t rows = static_cast<int64_t>(B) * T;
  const int tp = tp_size();
  MT_CHECK(rows % tp == 0, "sequence parallelism splits the B*T = {}*{} = {} rows of a batch over parallel.tp = {} "
           "ranks: B*T must be divisible by tp", B, T, rows, tp);
  if (rows <= cap_rows_) return;
  const int64_t C = cfg_.d_model, Vp = local_vocab(), srows = rows / tp;  // srows: my residual-stream rows
  const size_t f = sizeof(float);
  tokens_.resize(rows * sizeof(int32_t));
  targets_.resize(rows * sizeof(int32_t));
  losses_.resize(rows * f);
  residual_.clear();
  residual_.resize(cfg_.n_layer + 1);
  acts_.clear();
  acts_.resize(cfg_.n_layer);
  for (auto [a, b] : chunks_)
    for (int l = a; l <= b; ++l) residual_[l].resize(srows * C * f, false);
  bool any_recompute = false;
  for (int l = 0; l < cfg_.n_layer; ++l) {
    if (!blocks_[l]) continue;
    if (recompute(l))
      any_recompute = true;
    else
      acts_[l].allocate(cfg_, rows, tp);
  }
  if (any_recompute) recompute_acts_.allocate(cfg_, rows, tp);
  scratch_.allocate(cfg_, rows, tp);
  lnf_.resize(rows * C * f, false);
  lnf_mean_.resize(rows * f, false);
  lnf_rstd_.resize(rows * f, false);
  if (part_.head) logits_.resize(rows * Vp * f, false);
  dres_.resize(srows * C * f, false);
  dlnf_.resize(srows * C * f, false);
  if (tp_) {
    local_tokens_.resize(rows * sizeof(int32_t));
    ce_stats_.resize(3 * rows * f, false);
  }
  cap_rows_ = rows;
}

void GPT::set_tokens(const int32_t* tokens, int B, int T) {
  ensure_capacity(B, T);
  const int64_t N = static_cast<int64_t>(B) * T;
  B_ = B;
  T_ = T;
  std::memcpy(tokens_.data(), tokens, N * sizeof(int32_t));
  for (int64_t i = 0; i < N; ++i)
    MT_CHECK(tokens[i] >= 0 && tokens[i] < cfg_.vocab_size, "token id {} at position {} is outside the vocabulary [0, {})",
             tokens[i], i, cfg_.vocab_size);
}

void GPT::forward_trunk(const int32_t* tokens, int B, int T) {
  MT_CHECK(part_.whole(), "this GPT holds one pipeline stage: run it with forward_chunk / backward_chunk");
  set_tokens(tokens, B, T);
  embed_forward();
  layers_forward(0, cfg_.n_layer);
  head_forward();
}

void GPT::embed_forward() {
  const int B = B_, T = T_;
  const int64_t N = static_cast<int64_t>(B) * T, C = cfg_.d_model;
  if (!tp_) {
    Tensor tok(tokens_.data(), {B, T}, DType::I32);
    used(0, emb_end_);
    ops_.embedding_forward(mat(residual_[0], N, C), tok, params_.param(wte_),
                           wpe_ >= 0 ? params_.param(wpe_) : Tensor{});
    return;
  }
  const int64_t Ns = N / tp_->size(), Vl = local_vocab(), v0 = vocab_begin();
  const int32_t* tok = static_cast<const int32_t*>(tokens_.data());
  int32_t* lt = static_cast<int32_t*>(local_tokens_.data());
  for (int64_t i = 0; i < N; ++i) lt[i] = tok[i] >= v0 && tok[i] < v0 + Vl ? static_cast<int32_t>(tok[i] - v0) : -1;
  Tensor ltok(local_tokens_.data(), {B, T}, DType::I32);
  Tensor emb = mat(scratch_.d_h, N, C);
  used(0, emb_end_);
  ops_.embedding_forward(emb, ltok, params_.param(wte_),
                         wpe_ >= 0 && tp_->rank() == 0 ? params_.param(wpe_) : Tensor{});
  tp_->reduce_scatter_rows(mat(residual_[0], Ns, C), N, [&](Tensor out, int64_t r0, int64_t n) {
    ops_.copy(out, emb.slice0(r0, r0 + n));
  });
}

void GPT::layers_forward(int first, int end) {
  const int64_t R = stream_rows(), C = cfg_.d_model;
  for (int l = first; l < end; ++l) {
    BlockActs& a = recompute(l) ? recompute_acts_ : acts_[l];
    used(layer_first_[l], layer_end_[l]);
    blocks_[l]->forward(ops_, mat(residual_[l + 1], R, C), mat(residual_[l], R, C), a, scratch_, B_, T_);
  }
}

void GPT::head_forward() {
  const int64_t N = static_cast<int64_t>(B_) * T_, C = cfg_.d_model;
  if (!tp_) {
    const int64_t Vp = cfg_.padded_vocab();
    Tensor x = mat(residual_[cfg_.n_layer], N, C);
    Tensor lnf = mat(lnf_, N, C);
    used(lnf_w_, static_cast<int>(params_.size()));
    if (cfg_.norm == "layernorm")
      ops_.layernorm_forward(lnf, vec(lnf_mean_, N), vec(lnf_rstd_, N), x, params_.param(lnf_w_),
                             lnf_b_ >= 0 ? params_.param(lnf_b_) : Tensor{}, cfg_.norm_eps);
    else
      ops_.rmsnorm_forward(lnf, vec(lnf_rstd_, N), x, params_.param(lnf_w_), cfg_.norm_eps);
    ops_.matmul_forward(mat(logits_, N, Vp), lnf, params_.param(head_), Tensor{});
    return;
  }
  const int64_t Ns = N / tp_->size(), Vl = local_vocab();
  Tensor x = mat(residual_[cfg_.n_layer], Ns, C), shard = mat(scratch_.proj_out, Ns, C);
  Tensor lnf = mat(lnf_, N, C), logits = mat(logits_, N, Vl);
  used(lnf_w_, static_cast<int>(params_.size()));
  if (cfg_.norm == "layernorm")
    ops_.layernorm_forward(shard, vec(lnf_mean_, Ns), vec(lnf_rstd_, Ns), x, params_.param(lnf_w_),
                           lnf_b_ >= 0 ? params_.param(lnf_b_) : Tensor{}, cfg_.norm_eps);
  else
    ops_.rmsnorm_forward(shard, vec(lnf_rstd_, Ns), x, params_.param(lnf_w_), cfg_.norm_eps);
  tp_->all_gather_rows(lnf, shard, [&](int64_t r0, int64_t n) {
    ops_.matmul_forward(logits.slice0(r0, r0 + n), lnf.slice0(r0, r0 + n), params_.param(head_), Tensor{});
  });
}

float GPT::forward(const int32_t* tokens, const int32_t* targets, int B, int T, bool train, float loss_scale) {
  forward_trunk(tokens, B, T);
  return loss(targets, loss_scale, train);
}

float GPT::loss(const int32_t* targets, float loss_scale, bool train) {
  const int64_t N = static_cast<int64_t>(B_) * T_, Vp = cfg_.padded_vocab();
  int32_t* tg = static_cast<int32_t*>(targets_.data());
  int64_t valid = 0;
  for (int64_t i = 0; i < N; ++i) {
    MT_CHECK(targets[i] < cfg_.vocab_size, "target id {} at position {} is outside the vocabulary [0, {})", targets[i],
             i, cfg_.vocab_size);
    tg[i] = targets[i];
    valid += targets[i] >= 0;
  }
  MT_CHECK(valid > 0, "batch has no valid targets");
  const float dloss = loss_scale / static_cast<float>(valid);
  if (tp_) return loss_tp(N, valid, dloss, train);
  ops_.cross_entropy(vec(losses_, N), mat(logits_, N, Vp), Tensor(targets_.data(), {N}, DType::I32), cfg_.vocab_size,
                     dloss, train);
  double sum = 0;
  const float* l = losses_.f32();
  for (int64_t i = 0; i < N; ++i) sum += l[i];
  have_grad_ = train;
  return static_cast<float>(sum / static_cast<double>(valid));
}

void GPT::backward() {
  MT_CHECK(have_grad_, "GPT::backward() needs a preceding forward(..., train = true)");
  have_grad_ = false;
  head_backward();
  layers_backward(0, cfg_.n_layer);
  embed_backward();
}

// Head: logits_ holds dlogits now. With tp, d(lnf) is partial over the vocabulary shards -> reduce-scatter to
// row blocks; dW overlaps it.
void GPT::head_backward() {
  const int64_t N = static_cast<int64_t>(B_) * T_, R = stream_rows(), C = cfg_.d_model;
  Tensor dlnf = mat(dlnf_, R, C), dres = mat(dres_, R, C);
  if (!tp_) {
    const int64_t Vp = cfg_.padded_vocab();
    ops_.matmul_backward(dlnf, params_.grad(head_), Tensor{}, mat(logits_, N, Vp), mat(lnf_, N, C),
                         params_.param(head_), false);
  } else {
    Tensor lnf = mat(lnf_, N, C), dlogits = mat(logits_, N, local_vocab());
    tp_->reduce_scatter_rows(
        dlnf, N,
        [&](Tensor out, int64_t r0, int64_t n) {
          ops_.matmul_backward(out, Tensor{}, Tensor{}, dlogits.slice0(r0, r0 + n), Tensor{}, params_.param(head_),
                               false);
        },
        [&] {
          ops_.matmul_backward(Tensor{}, params_.grad(head_), Tensor{}, dlogits, lnf, params_.param(head_), false);
        });
  }
  if (!cfg_.tied_embeddings) ready(head_);
  ops_.zero(dres);
  Tensor x = mat(residual_[cfg_.n_layer], R, C);
  if (cfg_.norm == "layernorm")
    ops_.layernorm_backward(dres, params_.grad(lnf_w_), lnf_b_ >= 0 ? params_.grad(lnf_b_) : Tensor{}, dlnf, x,
                            params_.param(lnf_w_), vec(lnf_mean_, R), vec(lnf_rstd_, R));
  else
    ops_.rmsnorm_backward(dres, params_.grad(lnf_w_), dlnf, x, params_.param(lnf_w_), vec(lnf_rstd_, R));
  sync_replicated_grads(lnf_w_, static_cast<int>(params_.size()));
  ready(lnf_w_);
}

void GPT::layers_backward(int first, int end) {
  const int64_t R = stream_rows(), C = cfg_.d_model;
  Tensor dres = mat(dres_, R, C);
  for (int l = end - 1; l >= first; --l) {
    Tensor xin = mat(residual_[l], R, C);
    BlockActs& a = recompute(l) ? recompute_acts_ : acts_[l];
    // Recomputation re-runs the layer's forward (deterministic, so bit-identical activations); its output goes
    // to scratch so the saved residual stream is untouched.
    if (recompute(l)) blocks_[l]->forward(ops_, mat(scratch_.d_h, R, C), xin, a, scratch_, B_, T_);
    blocks_[l]->backward(ops_, dres, xin, a, scratch_, B_, T_);
    sync_replicated_grads(layer_first_[l], layer_end_[l]);
    ready(layer_first_[l]);
  }
}

void GPT::embed_backward() {
  const int B = B_, T = T_;
  const int64_t N = static_cast<int64_t>(B) * T, C = cfg_.d_model;
  if (!tp_) {
    Tensor tok(tokens_.data(), {B, T}, DType::I32);
    ops_.embedding_backward(params_.grad(wte_), wpe_ >= 0 ? params_.grad(wpe_) : Tensor{}, mat(dres_, N, C), tok);
    ready(0);
    return;
  }
  Tensor demb = mat(scratch_.d_h, N, C);
  tp_->all_gather_rows(demb, mat(dres_, stream_rows(), C));
  Tensor ltok(local_tokens_.data(), {B, T}, DType::I32);
  ops_.embedding_backward(params_.grad(wte_), wpe_ >= 0 && tp_->rank() == 0 ? params_.grad(wpe_) : Tensor{}, demb,
                          ltok);
  sync_replicated_grads(0, emb_end_);
  ready(0);
}

Tensor GPT::forward_chunk(int c, Tensor x, const int32_t* tokens, const int32_t* targets, int B, int T,
                          float loss_scale, float* loss_out) {
  MT_CHECK(c >= 0 && c < num_chunks(), "model chunk {} does not exist (this stage holds {})", c, num_chunks());
  const auto [first, end] = chunks_[c];
  if (first_chunk(c)) {
    set_tokens(tokens, B, T);
    embed_forward();
  } else {
    ensure_capacity(B, T);
    B_ = B;
    T_ = T;
    const int64_t R = stream_rows(), C = cfg_.d_model;
    MT_CHECK(x.numel() == R * C, "model chunk {} expects an input of {} x {} floats, got {}", c, R, C, x.numel());
    ops_.copy(mat(residual_[first], R, C), f32_view(x.f32(), {R, C}));
  }
  layers_forward(first, end);
  if (!last_chunk(c)) return mat(residual_[end], stream_rows(), cfg_.d_model);
  head_forward();
  const float l = loss(targets, loss_scale, true);
  if (loss_out) *loss_out = l;
  return {};
}

Tensor GPT::backward_chunk(int c, Tensor dy) {
  MT_CHECK(c >= 0 && c < num_chunks(), "model chunk {} does not exist (this stage holds {})", c, num_chunks());
  const auto [first, end] = chunks_[c];
  const int64_t R = stream_rows(), C = cfg_.d_model;
  if (last_chunk(c)) {
    MT_CHECK(have_grad_, "GPT::backward_chunk({}) needs a preceding forward_chunk of the last chunk", c);
    have_grad_ = false;
    head_backward();
  } else {
    MT_CHECK(dy.numel() == R * C, "model chunk {} expects an output gradient of {} x {} floats, got {}", c, R, C,
             dy.numel());
    ops_.copy(mat(dres_, R, C), f32_view(dy.f32(), {R, C}));
  }
  layers_backward(first, end);
  if (first_chunk(c)) {
    embed_backward();
    return {};
  }
  return mat(dres_, R, C);
}

Tensor GPT::logits(const int32_t* tokens, int B, int T) {
  MT_CHECK(part_.whole(), "logits() needs the whole model, this GPT holds one pipeline stage");
  forward_trunk(tokens, B, T);
  have_grad_ = false;
  return mat(logits_, static_cast<int64_t>(B) * T, local_vocab());
}

int64_t GPT::local_vocab() const { return tp_ ? cfg_.padded_vocab(tp_->size()) / tp_->size() : cfg_.padded_vocab(); }
int64_t GPT::vocab_begin() const { return tp_ ? local_vocab() * tp_->rank() : 0; }

// ---- tensor + sequence parallel -------------------------------------------------------------------------------
// The residual stream is my row block [Ns = N/tp, C]. Embedding: every rank looks up the tokens of its
// vocabulary shard (others give zero rows), rank 0 adds the positions, and the reduce-scatter sums the partial
// embeddings into row blocks. Head: the gathered final-norm output times my vocabulary rows gives my logit
// columns; the cross-entropy reduces row max and sums over the ranks (vocab-parallel, Megatron).

float GPT::loss_tp(int64_t N, int64_t valid, float dloss, bool train) {
  const int64_t Vl = local_vocab(), v0 = vocab_begin();
  const int n_real = static_cast<int>(std::clamp<int64_t>(cfg_.vocab_size - v0, 0, Vl));
  Tensor stats = vec(ce_stats_, 3 * N), logits = mat(logits_, N, Vl), tg(targets_.data(), {N}, DType::I32);
  ops_.vp_ce_max(stats, logits, n_real);
  tp_->allreduce(f32_view(stats.f32(), {N}), TpReduce::Max);
  ops_.vp_ce_sums(stats, logits, tg, v0, n_real, cfg_.vocab_size);
  tp_->allreduce(f32_view(stats.f32() + N, {2 * N}), TpReduce::Sum);
  ops_.vp_ce_finish(vec(losses_, N), logits, stats, tg, v0, n_real, dloss, train);
  double sum = 0;
  const float* l = losses_.f32();
  for (int64_t i = 0; i < N; ++i) sum += l[i];
  have_grad_ = train;
  return static_cast<float>(sum / static_cast<double>(valid));
}

void GPT::sync_replicated_grads(int first, int end) {
  if (!tp_ || !tp_grad_sync_) return;
  for (int i = first; i < end; ++i)
    if (!params_.info(i).shard.sharded()) tp_->allreduce(params_.grad(i), TpReduce::Sum);
}

}  // namespace mt
