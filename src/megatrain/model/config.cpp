#include "megatrain/model/config.h"

#include <array>
#include <cmath>
#include <cstdint>
#include <optional>

#include "megatrain/core/error.h"

namespace mt {

namespace {

// a * b + c in int64, or nullopt on overflow.
std::optional<int64_t> mul_add(int64_t a, int64_t b, int64_t c = 0) {
  int64_t p = 0, s = 0;
  if (__builtin_mul_overflow(a, b, &p) || __builtin_add_overflow(p, c, &s)) return std::nullopt;
  return s;
}

}  // namespace

int ModelConfig::ff_dim() const {
  if (d_ff > 0) return d_ff;
  if (mlp == MlpKind::SwiGlu) return (8 * d_model / 3 + 63) / 64 * 64;
  return 4 * d_model;
}

int ModelConfig::padded_vocab() const { return padded_vocab(1); }

int ModelConfig::padded_vocab(int tp) const {
  // In int64: validate() bounds vocab_size and vocab_pad_to, but tp multiplies the padding unit.
  const int64_t m = int64_t{vocab_pad_to > 0 ? vocab_pad_to : 1} * (tp > 0 ? tp : 1);
  const int64_t padded = (int64_t{vocab_size} + m - 1) / m * m;
  MT_CHECK(padded <= INT32_MAX,
           "model.vocab_size {} padded to a multiple of model.vocab_pad_to * parallel.tp = {} "
           "exceeds {} rows",
           vocab_size, m, INT32_MAX);
  return static_cast<int>(padded);
}

void ModelConfig::validate_tp(int tp) const {
  MT_CHECK(tp >= 1, "parallel.tp must be >= 1 (got {})", tp);
  MT_CHECK(n_head % tp == 0, "model.n_head ({}) must be divisible by parallel.tp ({})", n_head, tp);
  MT_CHECK(kv_heads() % tp == 0, "model.n_kv_head ({}) must be divisible by parallel.tp ({})", kv_heads(), tp);
  MT_CHECK(ff_dim() % tp == 0, "the MLP width (model.d_ff = {}) must be divisible by parallel.tp ({})", ff_dim(), tp);
}

void ModelConfig::validate() const {
  // Sizes first, each against its bound (see kMax*), so that everything computed from them below is exact.
  auto in_range = [](const char* key, int64_t v, int64_t lo, int64_t hi, const char* note = "") {
    MT_CHECK(v >= lo && v <= hi, "model.{} = {} is out of range: it must be in [{}, {}]{}", key, v, lo, hi, note);
  };
  in_range("vocab_size", vocab_size, 1, kMaxVocab);
  in_range("vocab_pad_to", vocab_pad_to, 0, kMaxVocabPad, " (0 or 1: no padding)");
  in_range("n_layer", n_layer, 1, kMaxLayers);
  in_range("d_model", d_model, 1, kMaxWidth);
  in_range("n_head", n_head, 1, d_model, " (at most model.d_model)");
  in_range("n_kv_head", n_kv_head, 0, n_head, " (0: model.n_head)");
  in_range("d_ff", d_ff, 0, kMaxFf, " (0: derived from model.d_model)");
  in_range("max_seq_len", max_seq_len, 1, kMaxSeqLen);
  // A window of max_seq_len or more already sees the whole context; a wider one is a mistake, and one near 2^31
  // overflowed the attention kernels' block arithmetic.
  in_range("window", window, 0, max_seq_len, " (0: full causal attention; at most model.max_seq_len)");
  MT_CHECK(d_model % n_head == 0, "model.d_model ({}) must be a positive multiple of model.n_head ({})", d_model,
           n_head);
  MT_CHECK(kv_heads() > 0 && n_head % kv_heads() == 0, "model.n_head ({}) must be a multiple of model.n_kv_head ({})",
           n_head, kv_heads());
  // norm, mlp, pos and block are enums, checked where their spelling was parsed (parse_kind).
  MT_CHECK(pos != PosKind::Rope || head_dim() % 2 == 0, "model.pos = 'rope' needs an even head dim (got {})",
           head_dim());
  MT_CHECK(ff_dim() > 0, "model.d_ff must be positive (got {})", d_ff);
  MT_CHECK(recompute.empty() || static_cast<int>(recompute.size()) == n_layer,
           "model.recompute lists {} layers but the model has {}", recompute.size(), n_layer);
  // Real-valued keys: finite, and positive where zero means nothing (a zero epsilon divides by zero on a zero
  // row; zero-initialised weights never break the symmetry between units; theta = 0 makes RoPE's angles infinite).
  auto positive = [](const char* key, float v, const char* why) {
    MT_CHECK(std::isfinite(v) && v > 0, "model.{} = {} is out of range: it must be finite and > 0 ({})", key, v, why);
  };
  positive("norm_eps", norm_eps, "the epsilon added to the variance in LayerNorm/RMSNorm");
  positive("init_std", init_std, "the standard deviation of the initial weights");
  positive("rope_theta", rope_theta, "RoPE's base frequency");
  MT_CHECK(std::isfinite(rope_scaling) && rope_scaling >= 0,
           "model.rope_scaling = {} is out of range: it must be 0 (none) or a finite factor > 0", rope_scaling);
  if (rope_scaling > 0) {
    MT_CHECK(pos == PosKind::Rope, "model.rope_scaling = {} scales RoPE's frequencies, but model.pos = '{}'",
             rope_scaling, kind_name(pos));
    positive("rope_low_freq_factor", rope_low_freq_factor,
             "the wavelength band's upper edge is "
             "rope_original_max_len / rope_low_freq_factor");
    MT_CHECK(std::isfinite(rope_high_freq_factor) && rope_high_freq_factor > rope_low_freq_factor,
             "model.rope_high_freq_factor = {} must be finite and above model.rope_low_freq_factor = {}",
             rope_high_freq_factor, rope_low_freq_factor);
    in_range("rope_original_max_len", rope_original_max_len, 1, kMaxSeqLen);
  }
  validate_moe();
  const int64_t n = num_params();
  MT_CHECK(n <= kMaxParams,
           "model: {} parameters (model.n_layer {}, model.d_model {}, model.vocab_size {}) exceed the "
           "limit of {} ({} TB of fp32 weights)",
           n, n_layer, d_model, vocab_size, kMaxParams, (kMaxParams * 4) >> 40);
}

int ModelConfig::moe_layers() const {
  int n = 0;
  for (int l = 0; l < n_layer; ++l) n += moe_layer(l) ? 1 : 0;
  return n;
}

void ModelConfig::validate_moe() const {
  MT_CHECK(moe_experts >= 0 && moe_experts <= kMaxExperts,
           "model.moe_experts = {} is out of range: it must be in [0, {}] (0: dense)", moe_experts, kMaxExperts);
  if (!moe()) return;
  MT_CHECK(moe_top_k >= 1 && moe_top_k <= moe_experts,
           "model.moe_top_k = {} is out of range: it must be in [1, model.moe_experts = {}]", moe_top_k, moe_experts);
  MT_CHECK(moe_d_ff >= 1 && moe_d_ff <= kMaxFf,
           "model.moe_d_ff = {} is out of range: it must be in [1, {}] (each expert's hidden width; required with "
           "model.moe_experts)",
           moe_d_ff, kMaxFf);
  MT_CHECK(moe_shared_experts >= 0 && moe_shared_experts <= kMaxExperts,
           "model.moe_shared_experts = {} is out of range: it must be in [0, {}]", moe_shared_experts, kMaxExperts);
  MT_CHECK(moe_every >= 1 && moe_every <= n_layer,
           "model.moe_every = {} is out of range: it must be in [1, model.n_layer = {}]", moe_every, n_layer);
  MT_CHECK(moe_first_dense >= 0 && moe_first_dense < n_layer,
           "model.moe_first_dense = {} is out of range: it must be in [0, model.n_layer = {}) (at least one MoE "
           "layer)",
           moe_first_dense, n_layer);
  auto non_negative = [](const char* key, float v) {
    MT_CHECK(std::isfinite(v) && v >= 0, "model.{} = {} is out of range: it must be finite and >= 0", key, v);
  };
  non_negative("moe_bias_rate", moe_bias_rate);
  non_negative("moe_aux_loss", moe_aux_loss);
  non_negative("moe_z_loss", moe_z_loss);
  non_negative("moe_capacity_factor", moe_capacity_factor);
  MT_CHECK(block == BlockKind::Sequential,
           "model.moe_experts = {} needs model.block = 'sequential' (the parallel block with MoE is not supported yet)",
           moe_experts);
}

int64_t ModelConfig::num_params() const {
  // Checked: validate() calls this on sizes it has bounded, but any caller gets an error, never a wrapped count.
  auto ok = [this](std::optional<int64_t> v) {
    MT_CHECK(v.has_value(),
             "model: the parameter count overflows int64 (model.n_layer {}, model.d_model {}, "
             "model.d_ff {}, model.vocab_size {})",
             n_layer, d_model, d_ff, vocab_size);
    return *v;
  };
  const int64_t C = d_model, hd = head_dim(), F = ff_dim(), L = n_layer;
  const int64_t qkv = ok(mul_add(int64_t{n_head} + 2 * int64_t{kv_heads()}, hd));
  const int64_t fc = mlp == MlpKind::SwiGlu ? 2 * F : F;
  const int64_t nb = norm == NormKind::LayerNorm && bias ? 2 : 1;  // norm params per channel
  const int64_t n_norms = block == BlockKind::Parallel ? 1 : 2;
  int64_t per_layer = ok(mul_add(qkv, C, ok(mul_add(C, int64_t{n_head} * hd))));
  per_layer = ok(mul_add(fc, C, per_layer));
  per_layer = ok(mul_add(C, F, per_layer));
  per_layer = ok(mul_add(n_norms * nb, C, per_layer));
  if (bias) per_layer = ok(mul_add(1, per_layer, qkv + C + fc + C));
  int64_t n = ok(mul_add(L, per_layer, ok(mul_add(vocab_size, C, nb * C))));
  if (moe()) {
    // A MoE layer has the router [E, C] (and, sigmoid_bias, its bias [E]) and 3 x moe_d_ff x C per expert, routed or
    // shared, instead of the MLP (with its biases).
    const int64_t E = moe_experts, M = moe_layers();
    const int64_t mlp = fc * C + C * F + (bias ? fc + C : 0);
    const int64_t experts = ok(mul_add(3 * int64_t{moe_d_ff} * C, E + moe_shared_experts));
    const int64_t moe_layer = ok(mul_add(E, C, experts + (moe_router == MoeRouter::SigmoidBias ? E : 0)));
    n = ok(mul_add(M, moe_layer - mlp, n));
  }
  if (pos == PosKind::Learned) n = ok(mul_add(max_seq_len, C, n));
  if (!tied_embeddings) n = ok(mul_add(vocab_size, C, n));
  return n;
}

double ModelConfig::flops_per_token(int T) const {
  // Matmul parameters touched per token (embedding lookups are not matmuls; the LM head is).
  double C = d_model, hd = head_dim(), F = ff_dim();
  double qkv = (n_head + 2.0 * kv_heads()) * hd;
  double fc = mlp == MlpKind::SwiGlu ? 2 * F : F;
  double per_layer = qkv * C + C * n_head * hd + fc * C + C * F;
  double n_matmul = n_layer * per_layer + static_cast<double>(padded_vocab()) * C;
  if (moe()) {
    // Per token a MoE layer runs the router, its top_k experts and the shared ones, instead of the MLP.
    const double active = moe_experts * C + 3.0 * moe_d_ff * C * (moe_top_k + moe_shared_experts);
    n_matmul += moe_layers() * (active - (fc * C + C * F));
  }
  // Attention scores and weighted sum: 2 matmuls of (ctx x hd) per head, forward 2*2*ctx*d, x3 for fwd+bwd.
  double ctx = window > 0 && window < T ? window : T;
  // Causal: on average half the context is attended; follow the common convention (PaLM, llm.c) of full T.
  double attn = 12.0 * n_layer * n_head * hd * ctx;
  return 6.0 * n_matmul + attn;
}

}  // namespace mt
