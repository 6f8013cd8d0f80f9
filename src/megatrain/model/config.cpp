#include "megatrain/model/config.h"

#include "megatrain/core/error.h"

namespace mt {

int ModelConfig::ff_dim() const {
  if (d_ff > 0) return d_ff;
  if (mlp == "swiglu") return (8 * d_model / 3 + 63) / 64 * 64;
  return 4 * d_model;
}

int ModelConfig::padded_vocab() const {
  int m = vocab_pad_to > 0 ? vocab_pad_to : 1;
  return (vocab_size + m - 1) / m * m;
}

int ModelConfig::padded_vocab(int tp) const {
  int m = (vocab_pad_to > 0 ? vocab_pad_to : 1) * (tp > 0 ? tp : 1);
  return (vocab_size + m - 1) / m * m;
}

void ModelConfig::validate_tp(int tp) const {
  MT_CHECK(tp >= 1, "parallel.tp must be >= 1 (got {})", tp);
  MT_CHECK(n_head % tp == 0, "model.n_head ({}) must be divisible by parallel.tp ({})", n_head, tp);
  MT_CHECK(kv_heads() % tp == 0, "model.n_kv_head ({}) must be divisible by parallel.tp ({})", kv_heads(), tp);
  MT_CHECK(ff_dim() % tp == 0, "the MLP width (model.d_ff = {}) must be divisible by parallel.tp ({})", ff_dim(), tp);
}

void ModelConfig::validate() const {
  MT_CHECK(vocab_size > 0, "model.vocab_size must be positive (got {})", vocab_size);
  MT_CHECK(n_layer > 0, "model.n_layer must be positive (got {})", n_layer);
  MT_CHECK(n_head > 0, "model.n_head must be positive (got {})", n_head);
  MT_CHECK(d_model > 0 && d_model % n_head == 0, "model.d_model ({}) must be a positive multiple of model.n_head ({})",
           d_model, n_head);
  MT_CHECK(kv_heads() > 0 && n_head % kv_heads() == 0, "model.n_head ({}) must be a multiple of model.n_kv_head ({})",
           n_head, kv_heads());
  MT_CHECK(max_seq_len > 0, "model.max_seq_len must be positive (got {})", max_seq_len);
  MT_CHECK(norm == "layernorm" || norm == "rmsnorm", "model.norm must be 'layernorm' or 'rmsnorm' (got '{}')", norm);
  MT_CHECK(mlp == "gelu" || mlp == "swiglu", "model.mlp must be 'gelu' or 'swiglu' (got '{}')", mlp);
  MT_CHECK(pos == "learned" || pos == "rope", "model.pos must be 'learned' or 'rope' (got '{}')", pos);
  MT_CHECK(pos != "rope" || head_dim() % 2 == 0, "model.pos = 'rope' needs an even head dim (got {})", head_dim());
  MT_CHECK(block == "sequential" || block == "parallel", "model.block must be 'sequential' or 'parallel' (got '{}')",
           block);
  MT_CHECK(window >= 0, "model.window must be >= 0 (got {}); 0 means full causal attention", window);
  MT_CHECK(ff_dim() > 0, "model.d_ff must be positive (got {})", d_ff);
  MT_CHECK(recompute.empty() || static_cast<int>(recompute.size()) == n_layer,
           "model.recompute lists {} layers but the model has {}", recompute.size(), n_layer);
}

int64_t ModelConfig::num_params() const {
  int64_t C = d_model, hd = head_dim(), F = ff_dim(), L = n_layer;
  int64_t qkv = (n_head + 2 * kv_heads()) * hd;
  int64_t fc = mlp == "swiglu" ? 2 * F : F;
  int64_t nb = norm == "layernorm" && bias ? 2 : 1;  // norm params per channel
  int64_t n_norms = block == "parallel" ? 1 : 2;
  int64_t per_layer = qkv * C + C * n_head * hd + fc * C + C * F + n_norms * nb * C;
  if (bias) per_layer += qkv + C + fc + C;
  int64_t n = L * per_layer + vocab_size * C + nb * C;
  if (pos == "learned") n += static_cast<int64_t>(max_seq_len) * C;
  if (!tied_embeddings) n += vocab_size * C;
  return n;
}

double ModelConfig::flops_per_token(int T) const {
  // Matmul parameters touched per token (embedding lookups are not matmuls; the LM head is).
  double C = d_model, hd = head_dim(), F = ff_dim();
  double qkv = (n_head + 2.0 * kv_heads()) * hd;
  double fc = mlp == "swiglu" ? 2 * F : F;
  double per_layer = qkv * C + C * n_head * hd + fc * C + C * F;
  double n_matmul = n_layer * per_layer + static_cast<double>(padded_vocab()) * C;
  // Attention scores and weighted sum: 2 matmuls of (ctx x hd) per head, forward 2*2*ctx*d, x3 for fwd+bwd.
  double ctx = window > 0 && window < T ? window : T;
  // Causal: on average half the context is attended; follow the common convention (PaLM, llm.c) of full T.
  double attn = 12.0 * n_layer * n_head * hd * ctx;
  return 6.0 * n_matmul + attn;
}

}  // namespace mt
