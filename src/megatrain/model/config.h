// GPT model configuration: GPT-2 layout by default, with Llama-style options and MegaScale's two changes
// (parallel transformer block, sliding-window attention).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mt {

struct ModelConfig {
  int vocab_size = 50257;     // real vocabulary
  int vocab_pad_to = 64;      // the embedding/LM head have padded_vocab() rows (multiple of this) for GEMM speed
  int n_layer = 12;
  int n_head = 12;
  int n_kv_head = 0;          // 0 = n_head (plain multi-head); fewer = grouped-query attention
  int d_model = 768;
  int d_ff = 0;               // 0 = 4*d_model (gelu) or the Llama rule 8/3*d_model rounded to 64 (swiglu)
  int max_seq_len = 1024;
  std::string norm = "layernorm";   // layernorm | rmsnorm
  std::string mlp = "gelu";         // gelu | swiglu
  std::string pos = "learned";      // learned | rope
  float rope_theta = 10000.0f;
  std::string block = "sequential"; // sequential: x += Attn(LN1 x); x += MLP(LN2 x)
                                    // parallel:   x += Attn(LN x) + MLP(LN x)   (MegaScale PTB)
  int window = 0;                   // sliding-window attention width; 0 = full causal
  bool tied_embeddings = true;      // LM head shares wte
  bool bias = true;                 // biases in linears (and LayerNorm)
  float norm_eps = 1e-5f;
  float init_std = 0.02f;
  std::vector<bool> recompute;      // per layer: recompute activations in backward (empty = none)

  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int head_dim() const { return d_model / n_head; }
  int ff_dim() const;
  int padded_vocab() const;
  // With tensor parallelism the vocabulary rows are split over tp ranks: padded to a multiple of vocab_pad_to*tp.
  int padded_vocab(int tp) const;
  // Throws mt::Error naming the field that parallel.tp does not divide (heads, kv heads, d_ff).
  void validate_tp(int tp) const;
  // Throws mt::Error naming the inconsistent field (heads not dividing d_model, unknown norm, ...).
  void validate() const;
  int64_t num_params() const;             // parameters counted without vocab padding
  // Model FLOPs per token for one training step (forward + backward): 6N (non-embedding matmuls + LM head)
  // + attention (12 * n_layer * d_model * effective context), where context = T (or the window).
  double flops_per_token(int T) const;
};

}  // namespace mt
