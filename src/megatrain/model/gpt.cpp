#include "megatrain/model/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fmt/format.h>

#include <functional>

#include "megatrain/core/rng.h"
#include "megatrain/model/layout.h"
#include "megatrain/obs/timeline.h"

namespace mt {

Tensor GPT::f32s(const Buffer& b, int64_t n, int64_t at) {
  MT_CHECK(static_cast<size_t>(at + n) * sizeof(float) <= b.size(), "{} floats at {} exceed a buffer of {} bytes", n,
           at, b.size());
  return Tensor(static_cast<float*>(b.data()) + at, {n}, DType::F32, b.device());
}

Tensor GPT::ids(const Buffer& b, int64_t B, int64_t T) {
  MT_CHECK(static_cast<size_t>(B * T) * sizeof(int32_t) <= b.size(), "{} x {} ids exceed a buffer of {} bytes", B, T,
           b.size());
  return Tensor(b.data(), {B, T}, DType::I32, b.device());
}

GPT::GPT(const ModelConfig& cfg, Ops& ops, size_t pad_multiple, TpComm* tp, GptPart part, EpComm* ep)
    : cfg_(cfg), ops_(ops), part_(std::move(part)), act_(ops.compute_dtype()) {
  if (tp && tp->size() > 1) tp_ = tp;
  if (ep && ep->size() > 1) ep_ = ep;
  declare_gpt_params(cfg_, params_, tp_size(), tp_rank(), part_, ep_size(), ep_ ? ep_->rank() : 0);
  params_.allocate(pad_multiple, &ops_);
  chunks_ = part_.chunks;
  if (chunks_.empty()) chunks_.emplace_back(0, cfg_.n_layer);
  slots_.resize(chunks_.size());
  for (auto& v : slots_) v.resize(1);
  blocks_.resize(cfg_.n_layer);
  for (auto [a, b] : chunks_)
    for (int l = a; l < b; ++l) blocks_[l].emplace(cfg_, params_, l, tp_, ep_);
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
  // Drawn on the host (the same numbers on every backend), then copied to the parameter's memory.
  std::vector<float> full, local;
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamInfo& p = params_.info(static_cast<int>(i));
    // A shard is initialised as the slice of the full tensor the single process draws, so any tp layout
    // starts from the same model.
    full.resize(p.shard.sharded() ? static_cast<size_t>(p.shard.full_numel()) : p.numel);
    float* w = full.data();
    const size_t numel = full.size();
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
    if (p.shard.sharded()) {
      local.resize(p.numel);
      shard_slice(p.shard, full.data(), local.data());
      ops_.to_device(params_.param(static_cast<int>(i)), local.data());
    } else {
      ops_.to_device(params_.param(static_cast<int>(i)), full.data());
    }
  }
  params_.refresh_weights(ops_);
}

void GPT::ensure_capacity(int B, int T, int mb) {
  MT_CHECK(B > 0 && T > 0, "batch {} x {} must be positive", B, T);
  MT_CHECK(T <= cfg_.max_seq_len, "sequence length {} exceeds model.max_seq_len {}", T, cfg_.max_seq_len);
  const int64_t rows = static_cast<int64_t>(B) * T;
  const int tp = tp_size();
  MT_CHECK(rows % tp == 0,
           "sequence parallelism splits the B*T = {}*{} = {} rows of a batch over parallel.tp = {} "
           "ranks: B*T must be divisible by tp",
           B, T, rows, tp);
  if (rows <= cap_rows_) return;
  for (size_t c = 0; c < slots_.size(); ++c)
    for (const Slot& s : slots_[c])
      MT_CHECK(s.mb < 0 || s.mb == mb,
               "model chunk {}: a batch of {} x {} rows needs more activation memory than the "
               "{} rows planned, but micro-batch {} still awaits its backward there (reserve_activation_slots for the "
               "largest batch first)",
               c, B, T, cap_rows_, s.mb);
  const int64_t C = cfg_.d_model, srows = rows / tp;
  const size_t f = sizeof(float), a = dtype_size(act_);
  for (int c = 0; c < num_chunks(); ++c)
    for (Slot& s : slots_[c]) allocate_slot(c, s, rows);
  targets_ = ops_.alloc(rows * sizeof(int32_t));
  losses_ = ops_.alloc(rows * f);
  host_ids_.resize(rows);
  host_losses_.resize(rows);
  bool any_recompute = false;
  for (int l = 0; l < cfg_.n_layer; ++l) any_recompute |= blocks_[l] && recompute(l);
  if (any_recompute) recompute_acts_.allocate(cfg_, rows, tp, &ops_);
  scratch_.allocate(cfg_, rows, tp, &ops_);
  dres_ = ops_.alloc(srows * C * a);
  dlnf_ = ops_.alloc(srows * C * a);
  if (tp_) {
    ce_stats_ = ops_.alloc(3 * rows * f);
    int64_t replicated = 0;
    for (int i = 0; i < static_cast<int>(params_.size()); ++i)
      if (!params_.info(i).shard.tp_sharded()) replicated += params_.grad(i).numel();
    if (replicated > 0 && !replicated_grads_.data())
      replicated_grads_ = ops_.alloc(static_cast<size_t>(replicated) * f);
  }
  AttnShape as;  // every layer's attention has this shape: its workspace is planned here, not in a step
  as.B = B, as.T = T, as.n_head = cfg_.n_head / tp, as.n_kv_head = cfg_.kv_heads() / tp;
  as.head_dim = cfg_.head_dim(), as.window = cfg_.window;
  ops_.reserve_attention(as);
  cap_rows_ = rows;
}

void GPT::allocate_slot(int c, Slot& s, int64_t rows) {
  const int64_t C = cfg_.d_model, Vp = local_vocab(), srows = rows / tp_size();
  const size_t f = sizeof(float), a = dtype_size(act_);
  const auto [first, end] = chunks_[c];
  if (first_chunk(c)) {
    s.tokens = ops_.alloc(rows * sizeof(int32_t));
    if (tp_) s.local_tokens = ops_.alloc(rows * sizeof(int32_t));
  }
  s.residual.clear();
  s.residual.resize(cfg_.n_layer + 1);
  for (int l = first; l <= end; ++l) s.residual[l] = ops_.alloc(srows * C * a);
  s.acts.clear();
  s.acts.resize(cfg_.n_layer);
  for (int l = first; l < end; ++l)
    if (!recompute(l)) s.acts[l].allocate(cfg_, rows, tp_size(), &ops_);
  if (last_chunk(c)) {
    s.lnf = ops_.alloc(rows * C * a);
    s.lnf_mean = ops_.alloc(rows * f);
    s.lnf_rstd = ops_.alloc(rows * f);
    s.logits = ops_.alloc(rows * Vp * a);
  }
}

void GPT::reserve_activation_slots(int c, int n, int B, int T) {
  MT_CHECK(c >= 0 && c < num_chunks(), "model chunk {} does not exist (this stage holds {})", c, num_chunks());
  MT_CHECK(n >= 1, "model chunk {} needs at least one activation slot, asked for {}", c, n);
  for (const Slot& s : slots_[c])
    MT_CHECK(s.mb < 0, "model chunk {}: cannot re-plan its activation slots while micro-batch {} awaits its backward",
             c, s.mb);
  const size_t old = slots_[c].size();
  slots_[c].resize(n);
  if (cap_rows_ > 0)
    for (size_t k = old; k < slots_[c].size(); ++k) allocate_slot(c, slots_[c][k], cap_rows_);
  ensure_capacity(B, T);
}

int GPT::activation_slots(int c) const {
  MT_CHECK(c >= 0 && c < num_chunks(), "model chunk {} does not exist (this stage holds {})", c, num_chunks());
  return static_cast<int>(slots_[c].size());
}

GPT::Slot& GPT::take_slot(int c, int mb) {
  Slot* free = nullptr;
  for (Slot& s : slots_[c]) {
    if (s.mb == mb) return s;
    if (!free && s.mb < 0) free = &s;
  }
  if (!free) {
    std::string held;
    for (const Slot& s : slots_[c]) held += fmt::format("{}{}", held.empty() ? "" : ", ", s.mb);
    fail("model chunk {}: no free activation slot for micro-batch {}: its {} slot(s) are held by micro-batch(es) {} "
         "awaiting their backward (reserve_activation_slots for the schedule's peak in flight)",
         c, mb, slots_[c].size(), held);
  }
  free->mb = mb;
  return *free;
}

GPT::Slot& GPT::held_slot(int c, int mb) {
  for (Slot& s : slots_[c])
    if (s.mb == mb) return s;
  fail("GPT::backward_chunk({}, micro-batch {}) needs a preceding forward_chunk of that micro-batch on that chunk", c,
       mb);
}

std::pair<int, int> GPT::chunk_params(int c) const {
  MT_CHECK(c >= 0 && c < num_chunks(), "model chunk {} does not exist (this stage holds {})", c, num_chunks());
  const auto [first, end] = chunks_[c];
  MT_CHECK(first < end, "model chunk {} holds no layers", c);
  const int lo = first_chunk(c) ? 0 : layer_first_[first];
  const int hi = last_chunk(c) ? static_cast<int>(params_.size()) : layer_end_[end - 1];
  return {lo, hi};
}

void GPT::set_tokens(Slot& s, const int32_t* tokens, int B, int T) {
  const int64_t N = static_cast<int64_t>(B) * T;
  s.B = B;
  s.T = T;
  for (int64_t i = 0; i < N; ++i)
    MT_CHECK(tokens[i] >= 0 && tokens[i] < cfg_.vocab_size,
             "token id {} at position {} is outside the vocabulary [0, {})", tokens[i], i, cfg_.vocab_size);
  ops_.to_device(ids(s.tokens, B, T), tokens);
  if (!tp_) return;
  // Vocab-parallel embedding: my shard's row of each token, -1 where another rank owns it.
  const int64_t Vl = local_vocab(), v0 = vocab_begin();
  for (int64_t i = 0; i < N; ++i)
    host_ids_[i] = tokens[i] >= v0 && tokens[i] < v0 + Vl ? static_cast<int32_t>(tokens[i] - v0) : -1;
  ops_.to_device(ids(s.local_tokens, B, T), host_ids_.data());
}

void GPT::forward_trunk(const int32_t* tokens, int B, int T) {
  MT_CHECK(part_.whole(), "this GPT holds one pipeline stage: run it with forward_chunk / backward_chunk");
  ensure_capacity(B, T);
  Slot& s = slots_[0][0];
  set_tokens(s, tokens, B, T);
  embed_forward(s);
  layers_forward(s, 0, cfg_.n_layer);
  head_forward(s);
}

void GPT::embed_forward(Slot& s) {
  const int B = s.B, T = s.T;
  const int64_t N = static_cast<int64_t>(B) * T, C = cfg_.d_model;
  if (!tp_) {
    used(0, emb_end_);
    ops_.embedding_forward(act(s.residual[0], N, C), ids(s.tokens, B, T), W(wte_), W(wpe_));
    return;
  }
  const int64_t Ns = N / tp_->size();
  Tensor emb = act(scratch_.d_h, N, C);
  used(0, emb_end_);
  ops_.embedding_forward(emb, ids(s.local_tokens, B, T), W(wte_), tp_->rank() == 0 ? W(wpe_) : Tensor{});
  tp_->reduce_scatter_rows(act(s.residual[0], Ns, C), N,
                           [&](Tensor out, int64_t r0, int64_t n) { ops_.copy(out, emb.slice0(r0, r0 + n)); });
}

void GPT::layers_forward(Slot& s, int first, int end) {
  const int64_t R = stream_rows(s), C = cfg_.d_model;
  for (int l = first; l < end; ++l) {
    BlockActs& a = recompute(l) ? recompute_acts_ : s.acts[l];
    used(layer_first_[l], layer_end_[l]);
    blocks_[l]->forward(ops_, act(s.residual[l + 1], R, C), act(s.residual[l], R, C), a, scratch_, s.B, s.T);
    if (blocks_[l]->moe()) count_moe(l, a.moe);
  }
}

void GPT::forward_pair(const int (&mb)[2], const int32_t* const (&tokens)[2], const int32_t* const (&targets)[2], int B,
                       int T, float loss_scale, float (&loss_out)[2]) {
  MT_CHECK(part_.whole() && !tp_, "GPT::forward_pair runs the whole model without tensor parallelism");
  MT_CHECK(!cfg_.recompute_norm, "GPT::forward_pair: recompute_norm keeps the norms' outputs in shared scratch");
  for (int l = 0; l < cfg_.n_layer; ++l)
    MT_CHECK(!recompute(l), "GPT::forward_pair: layer {} is recomputed (its activations are shared scratch)", l);
  MT_CHECK(mb[0] >= 0 && mb[1] >= 0 && mb[0] != mb[1], "GPT::forward_pair: micro-batch ids {} and {}", mb[0], mb[1]);
  ensure_capacity(B, T, mb[0]);
  Slot& s0 = take_slot(0, mb[0]);
  Slot& s1 = take_slot(0, mb[1]);
  chunk_forwards_ += 2;
  loss_scale_ = loss_scale;
  moe_count_ = true;
  for (Slot* s : {&s0, &s1}) {
    set_tokens(*s, tokens[s == &s0 ? 0 : 1], B, T);
    embed_forward(*s);
  }
  for (int l = 0; l < cfg_.n_layer; ++l) layer_forward_pair(s0, s1, l);
  moe_count_ = false;
  head_forward(s0);
  loss_out[0] = loss(s0, targets[0], loss_scale, true);
  head_forward(s1);
  loss_out[1] = loss(s1, targets[1], loss_scale, true);
}

void GPT::layer_forward_pair(Slot& s0, Slot& s1, int l) {
  const Block& b = *blocks_[l];
  if (!b.moe()) {
    layers_forward(s0, l, l + 1);
    return layers_forward(s1, l, l + 1);
  }
  const int64_t R = stream_rows(s0), C = cfg_.d_model;
  used(layer_first_[l], layer_end_[l]);
  b.forward_attention(ops_, act(s0.residual[l], R, C), s0.acts[l], scratch_, s0.B, s0.T);
  b.forward_moe(ops_, act(s0.residual[l + 1], R, C), s0.acts[l], scratch_, s0.B, s0.T, [&] {
    obs::ScopedSpan span("compute", [&] {
      return obs::SpanInfo{fmt::format("attention mb{} behind mb{}'s dispatch", s1.mb, s0.mb),
                           {{"mb", s1.mb}, {"layer", l}}};
    });
    b.forward_attention(ops_, act(s1.residual[l], R, C), s1.acts[l], scratch_, s1.B, s1.T);
  });
  count_moe(l, s0.acts[l].moe);
  b.forward_moe(ops_, act(s1.residual[l + 1], R, C), s1.acts[l], scratch_, s1.B, s1.T, {});
  count_moe(l, s1.acts[l].moe);
}

void GPT::count_moe(int l, const MoeActs& a) {
  if (!moe_count_) return;
  if (moe_stats_.empty()) {
    moe_stats_.resize(cfg_.n_layer);
    moe_load_.assign(cfg_.n_layer, std::vector<int64_t>(cfg_.moe_experts, 0));
  }
  MoeLayerStats& st = moe_stats_[l];
  const MoeRouting& r = a.routing;
  if (st.tokens.empty()) st.tokens.assign(r.E, 0);
  st.layer = l;
  // The micro-batch's counts (with tp, each rank routes its rows of it: MoeFfn shares them over tp).
  for (int e = 0; e < r.E; ++e) st.tokens[e] += r.batch_routed[e], moe_load_[l][e] += r.batch_routed[e];
  st.dropped += r.batch_dropped;
  st.assignments += r.batch_N * r.k;
  st.aux += a.aux, st.z += a.z;
  ++st.forwards;
}

std::vector<MoeLayerStats> GPT::take_moe_stats() {
  std::vector<MoeLayerStats> out;
  for (MoeLayerStats& st : moe_stats_) {
    if (st.layer < 0) continue;
    out.push_back(st);
    st = MoeLayerStats{};
  }
  return out;
}

double GPT::moe_loss(const ModelConfig& cfg, const std::vector<MoeLayerStats>& stats) {
  double sum = 0;
  for (const MoeLayerStats& st : stats)
    if (st.forwards > 0) sum += (cfg.moe_aux_loss * st.aux + cfg.moe_z_loss * st.z) / st.forwards;
  return sum;
}

// The step on the host (E values): in place on the CPU backend; on a device, the fp32 master down and back up.
void GPT::update_bias_on_host(Tensor bias, const std::vector<int64_t>& load) {
  if (ops_.device() == Device::CPU) return mt::moe_update_bias(bias.f32(), load, cfg_.moe_bias_rate);
  std::vector<float> host(static_cast<size_t>(bias.numel()));
  ops_.to_host(host.data(), bias);
  mt::moe_update_bias(host.data(), load, cfg_.moe_bias_rate);
  ops_.to_device(bias, host.data());
}

void GPT::moe_update_bias(const std::function<void(std::vector<int64_t>&)>& sum_loads) {
  if (cfg_.moe_router != MoeRouter::SigmoidBias || moe_load_.empty()) return;
  for (int l = 0; l < cfg_.n_layer; ++l) {
    if (!blocks_[l] || !blocks_[l]->moe()) continue;
    const int b = blocks_[l]->moe()->router_bias();
    // The bias is a parameter (checkpointed with the model) that no gradient reaches: the optimizer leaves it
    // (zero gradient, no weight decay), and this step is its only change.
    if (sum_loads) sum_loads(moe_load_[l]);
    update_bias_on_host(params_.param(b), moe_load_[l]);
    std::fill(moe_load_[l].begin(), moe_load_[l].end(), 0);
    const ParamInfo& p = params_.info(b);
    params_.refresh_weights(ops_, p.offset, p.offset + p.numel);
  }
}

void GPT::head_forward(Slot& s) {
  const int64_t N = static_cast<int64_t>(s.B) * s.T, C = cfg_.d_model;
  if (!tp_) {
    const int64_t Vp = cfg_.padded_vocab();
    Tensor x = act(s.residual[cfg_.n_layer], N, C);
    Tensor lnf = act(s.lnf, N, C);
    used(lnf_w_, static_cast<int>(params_.size()));
    if (cfg_.norm == NormKind::LayerNorm)
      ops_.layernorm_forward(lnf, f32s(s.lnf_mean, N), f32s(s.lnf_rstd, N), x, W(lnf_w_), W(lnf_b_), cfg_.norm_eps);
    else
      ops_.rmsnorm_forward(lnf, f32s(s.lnf_rstd, N), x, W(lnf_w_), cfg_.norm_eps);
    ops_.matmul_forward(act(s.logits, N, Vp), lnf, W(head_), Tensor{});
    return;
  }
  const int64_t Ns = N / tp_->size(), Vl = local_vocab();
  Tensor x = act(s.residual[cfg_.n_layer], Ns, C), shard = act(scratch_.proj_out, Ns, C);
  Tensor lnf = act(s.lnf, N, C), logits = act(s.logits, N, Vl);
  used(lnf_w_, static_cast<int>(params_.size()));
  if (cfg_.norm == NormKind::LayerNorm)
    ops_.layernorm_forward(shard, f32s(s.lnf_mean, Ns), f32s(s.lnf_rstd, Ns), x, W(lnf_w_), W(lnf_b_), cfg_.norm_eps);
  else
    ops_.rmsnorm_forward(shard, f32s(s.lnf_rstd, Ns), x, W(lnf_w_), cfg_.norm_eps);
  tp_->all_gather_rows(lnf, shard, [&](int64_t r0, int64_t n) {
    ops_.matmul_forward(logits.slice0(r0, r0 + n), lnf.slice0(r0, r0 + n), W(head_), Tensor{});
  });
}

float GPT::forward(const int32_t* tokens, const int32_t* targets, int B, int T, bool train, float loss_scale) {
  moe_count_ = train;
  loss_scale_ = loss_scale;
  forward_trunk(tokens, B, T);
  moe_count_ = false;
  return loss(slots_[0][0], targets, loss_scale, train);
}

float GPT::loss(Slot& s, const int32_t* targets, float loss_scale, bool train) {
  const int64_t N = static_cast<int64_t>(s.B) * s.T, Vp = cfg_.padded_vocab();
  int64_t valid = 0;
  for (int64_t i = 0; i < N; ++i) {
    MT_CHECK(targets[i] < cfg_.vocab_size, "target id {} at position {} is outside the vocabulary [0, {})", targets[i],
             i, cfg_.vocab_size);
    valid += targets[i] >= 0;
  }
  MT_CHECK(valid > 0, "batch has no valid targets");
  ops_.to_device(ids(targets_, 1, N).view({N}), targets);
  const float dloss = loss_scale / static_cast<float>(valid);
  if (tp_) return loss_tp(s, N, valid, dloss, train);
  ops_.cross_entropy(f32s(losses_, N), act(s.logits, N, Vp), ids(targets_, 1, N).view({N}), cfg_.vocab_size, dloss,
                     train);
  // The per-position losses come back to the host (N floats: the one sync of a step on a GPU).
  ops_.to_host(host_losses_.data(), f32s(losses_, N));
  double sum = 0;
  for (int64_t i = 0; i < N; ++i) sum += host_losses_[i];
  s.have_grad = train;
  return static_cast<float>(sum / static_cast<double>(valid));
}

void GPT::backward() {
  Slot& s = slots_[0][0];
  MT_CHECK(s.have_grad, "GPT::backward() needs a preceding forward(..., train = true)");
  s.have_grad = false;
  head_backward(s);
  layers_backward(s, 0, cfg_.n_layer);
  embed_backward(s);
}

// Head: the slot's logits hold dlogits now. With tp, d(lnf) is partial over the vocabulary shards ->
// reduce-scatter to row blocks; dW overlaps it.
void GPT::head_backward(Slot& s) {
  const int64_t N = static_cast<int64_t>(s.B) * s.T, R = stream_rows(s), C = cfg_.d_model;
  Tensor dlnf = act(dlnf_, R, C), dres = act(dres_, R, C);
  if (!tp_) {
    const int64_t Vp = cfg_.padded_vocab();
    ops_.matmul_backward(dlnf, params_.grad(head_), Tensor{}, act(s.logits, N, Vp), act(s.lnf, N, C), W(head_), false,
                         !params_.take_fresh_grad(head_));
  } else {
    Tensor lnf = act(s.lnf, N, C), dlogits = act(s.logits, N, local_vocab());
    tp_->reduce_scatter_rows(
        dlnf, N,
        [&](Tensor out, int64_t r0, int64_t n) {
          ops_.matmul_backward(out, Tensor{}, Tensor{}, dlogits.slice0(r0, r0 + n), Tensor{}, W(head_), false);
        },
        [&] {
          ops_.matmul_backward(Tensor{}, params_.grad(head_), Tensor{}, dlogits, lnf, W(head_), false,
                               !params_.take_fresh_grad(head_));
        });
  }
  if (!cfg_.tied_embeddings) ready(head_);
  ops_.zero(dres);
  Tensor x = act(s.residual[cfg_.n_layer], R, C);
  const bool accumulate = !params_.take_fresh_grad(lnf_w_, lnf_b_);  // the norm's weight and bias, by one op
  if (cfg_.norm == NormKind::LayerNorm)
    ops_.layernorm_backward(dres, params_.grad(lnf_w_), lnf_b_ >= 0 ? params_.grad(lnf_b_) : Tensor{}, dlnf, x,
                            W(lnf_w_), f32s(s.lnf_mean, R), f32s(s.lnf_rstd, R), accumulate);
  else
    ops_.rmsnorm_backward(dres, params_.grad(lnf_w_), dlnf, x, W(lnf_w_), f32s(s.lnf_rstd, R), accumulate);
  params_.settle_grads(lnf_w_, static_cast<int>(params_.size()));
  sync_replicated_grads(lnf_w_, static_cast<int>(params_.size()));
  ready(lnf_w_);
}

void GPT::layers_backward(Slot& s, int first, int end) {
  const int64_t R = stream_rows(s), C = cfg_.d_model;
  Tensor dres = act(dres_, R, C);
  for (int l = end - 1; l >= first; --l) {
    Tensor xin = act(s.residual[l], R, C);
    BlockActs& a = recompute(l) ? recompute_acts_ : s.acts[l];
    a.moe_loss_scale = loss_scale_;
    // Recomputation re-runs the layer's forward (deterministic, so bit-identical activations); its output goes
    // to scratch so the saved residual stream is untouched.
    if (recompute(l)) blocks_[l]->forward(ops_, act(scratch_.d_h, R, C), xin, a, scratch_, s.B, s.T);
    blocks_[l]->backward(ops_, dres, xin, a, scratch_, s.B, s.T);
    params_.settle_grads(layer_first_[l], layer_end_[l]);  // what this rank did not write (tp: rank 0's row biases)
    sync_replicated_grads(layer_first_[l], layer_end_[l]);
    ready(layer_first_[l]);
  }
}

void GPT::embed_backward(Slot& s) {
  const int B = s.B, T = s.T;
  const int64_t N = static_cast<int64_t>(B) * T, C = cfg_.d_model;
  // The embedding's backward is a scatter-add, which always accumulates: a table no op has written yet this step
  // (untied, or tied with the head on another stage) is zeroed first; settle_grads then zeroes what this rank
  // did not touch (tp: the positions table outside rank 0).
  params_.settle_grads(wte_, wte_ + 1);
  const bool write_wpe = wpe_ >= 0 && (!tp_ || tp_->rank() == 0);
  if (write_wpe) params_.settle_grads(wpe_, wpe_ + 1);
  if (!tp_) {
    ops_.embedding_backward(params_.grad(wte_), write_wpe ? params_.grad(wpe_) : Tensor{}, act(dres_, N, C),
                            ids(s.tokens, B, T));
    params_.settle_grads(0, emb_end_);
    ready(0);
    return;
  }
  Tensor demb = act(scratch_.d_h, N, C);
  tp_->all_gather_rows(demb, act(dres_, stream_rows(s), C));
  ops_.embedding_backward(params_.grad(wte_), write_wpe ? params_.grad(wpe_) : Tensor{}, demb,
                          ids(s.local_tokens, B, T));
  params_.settle_grads(0, emb_end_);
  sync_replicated_grads(0, emb_end_);
  ready(0);
}

void GPT::chunk_trunk(int c, Slot& s, Tensor x, const int32_t* tokens, int B, int T) {
  const auto [first, end] = chunks_[c];
  if (first_chunk(c)) {
    set_tokens(s, tokens, B, T);
    embed_forward(s);
  } else {
    s.B = B;
    s.T = T;
    const int64_t R = stream_rows(s), C = cfg_.d_model;
    MT_CHECK(x.numel() == R * C, "model chunk {} expects an input of {} x {} floats, got {}", c, R, C, x.numel());
    ops_.copy(act(s.residual[first], R, C), x.view({R, C}));
  }
  layers_forward(s, first, end);
  if (last_chunk(c)) head_forward(s);
}

Tensor GPT::forward_chunk(int c, int mb, Tensor x, const int32_t* tokens, const int32_t* targets, int B, int T,
                          float loss_scale, float* loss_out, bool train) {
  MT_CHECK(c >= 0 && c < num_chunks(), "model chunk {} does not exist (this stage holds {})", c, num_chunks());
  MT_CHECK(mb >= 0, "micro-batch id {} must be >= 0", mb);
  ensure_capacity(B, T, mb);
  Slot& s = take_slot(c, mb);
  ++chunk_forwards_;
  loss_scale_ = loss_scale;
  moe_count_ = train;
  chunk_trunk(c, s, x, tokens, B, T);
  moe_count_ = false;
  if (!last_chunk(c)) return act(s.residual[chunks_[c].second], stream_rows(s), cfg_.d_model);
  const float l = loss(s, targets, loss_scale, true);
  if (loss_out) *loss_out = l;
  return {};
}

Tensor GPT::logits_chunk(int c, Tensor x, const int32_t* tokens, int B, int T) {
  MT_CHECK(c >= 0 && c < num_chunks(), "model chunk {} does not exist (this stage holds {})", c, num_chunks());
  ensure_capacity(B, T);
  Slot* s = nullptr;
  for (Slot& k : slots_[c])
    if (!s && k.mb < 0) s = &k;
  MT_CHECK(s,
           "model chunk {}: no free activation slot for an inference forward ({} micro-batch(es) await their "
           "backward)",
           c, slots_[c].size());
  chunk_trunk(c, *s, x, tokens, B, T);
  s->have_grad = false;
  if (last_chunk(c)) return act(s->logits, static_cast<int64_t>(B) * T, local_vocab());
  return act(s->residual[chunks_[c].second], stream_rows(*s), cfg_.d_model);
}

void GPT::release_activations(int c, int mb) {
  MT_CHECK(c >= 0 && c < num_chunks(), "model chunk {} does not exist (this stage holds {})", c, num_chunks());
  for (Slot& s : slots_[c])
    if (s.mb == mb) {
      s.mb = -1;
      s.have_grad = false;
    }
}

Tensor GPT::backward_chunk(int c, int mb, Tensor dy) {
  MT_CHECK(c >= 0 && c < num_chunks(), "model chunk {} does not exist (this stage holds {})", c, num_chunks());
  const auto [first, end] = chunks_[c];
  Slot& s = held_slot(c, mb);
  const int64_t R = stream_rows(s), C = cfg_.d_model;
  if (last_chunk(c)) {
    MT_CHECK(s.have_grad, "GPT::backward_chunk({}, micro-batch {}) needs a preceding forward_chunk of the last chunk",
             c, mb);
    s.have_grad = false;
    head_backward(s);
  } else {
    MT_CHECK(dy.numel() == R * C, "model chunk {} expects an output gradient of {} x {} floats, got {}", c, R, C,
             dy.numel());
    ops_.copy(act(dres_, R, C), dy.view({R, C}));
  }
  layers_backward(s, first, end);
  if (first_chunk(c)) embed_backward(s);
  s.mb = -1;  // the slot is free for the next micro-batch
  if (first_chunk(c)) return {};
  return act(dres_, R, C);
}

Tensor GPT::logits(const int32_t* tokens, int B, int T) {
  MT_CHECK(part_.whole(), "logits() needs the whole model, this GPT holds one pipeline stage");
  forward_trunk(tokens, B, T);
  slots_[0][0].have_grad = false;
  return act(slots_[0][0].logits, static_cast<int64_t>(B) * T, local_vocab());
}

int64_t GPT::local_vocab() const { return tp_ ? cfg_.padded_vocab(tp_->size()) / tp_->size() : cfg_.padded_vocab(); }
int64_t GPT::vocab_begin() const { return tp_ ? local_vocab() * tp_->rank() : 0; }

// ---- tensor + sequence parallel -------------------------------------------------------------------------------
// The residual stream is my row block [Ns = N/tp, C]. Embedding: every rank looks up the tokens of its
// vocabulary shard (others give zero rows), rank 0 adds the positions, and the reduce-scatter sums the partial
// embeddings into row blocks. Head: the gathered final-norm output times my vocabulary rows gives my logit
// columns; the cross-entropy reduces row max and sums over the ranks (vocab-parallel, Megatron).

float GPT::loss_tp(Slot& s, int64_t N, int64_t valid, float dloss, bool train) {
  const int64_t Vl = local_vocab(), v0 = vocab_begin();
  const int n_real = static_cast<int>(std::clamp<int64_t>(cfg_.vocab_size - v0, 0, Vl));
  Tensor stats = f32s(ce_stats_, 3 * N), logits = act(s.logits, N, Vl), tg = ids(targets_, 1, N).view({N});
  ops_.vp_ce_max(stats, logits, n_real);
  tp_->allreduce(f32s(ce_stats_, N), TpReduce::Max);
  ops_.vp_ce_sums(stats, logits, tg, v0, n_real, cfg_.vocab_size);
  tp_->allreduce(f32s(ce_stats_, 2 * N, N), TpReduce::Sum);
  ops_.vp_ce_finish(f32s(losses_, N), logits, stats, tg, v0, n_real, dloss, train);
  ops_.to_host(host_losses_.data(), f32s(losses_, N));
  double sum = 0;
  for (int64_t i = 0; i < N; ++i) sum += host_losses_[i];
  s.have_grad = train;
  return static_cast<float>(sum / static_cast<double>(valid));
}

// A layer has several small replicated tensors (norm weights and biases, row-parallel biases): one all-reduce of
// them packed together instead of one each, because every collective pays the link's latency (hundreds of us
// over Gloo on loopback) and the tensors are only C floats.
void GPT::sync_replicated_grads(int first, int end) {
  if (!tp_ || !tp_grad_sync_) return;
  std::vector<int> idx;
  int64_t total = 0;
  for (int i = first; i < end; ++i)
    if (!params_.info(i).shard.tp_sharded()) idx.push_back(i), total += params_.grad(i).numel();
  if (idx.empty()) return;
  if (idx.size() == 1) return tp_->allreduce(params_.grad(idx[0]), TpReduce::Sum);
  Tensor packed = f32s(replicated_grads_, total);
  int64_t at = 0;
  for (int i : idx) {
    const int64_t n = params_.grad(i).numel();
    ops_.copy(f32s(replicated_grads_, n, at), params_.grad(i).view({n}));
    at += n;
  }
  tp_->allreduce(packed, TpReduce::Sum);
  at = 0;
  for (int i : idx) {
    const int64_t n = params_.grad(i).numel();
    ops_.copy(params_.grad(i).view({n}), f32s(replicated_grads_, n, at));
    at += n;
  }
}

}  // namespace mt
