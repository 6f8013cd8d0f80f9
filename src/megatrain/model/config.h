// GPT model configuration: GPT-2 layout by default, with Llama-style options and MegaScale's two changes
// (parallel transformer block, sliding-window attention).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "megatrain/core/kind.h"
#include "megatrain/kernels/moe_router.h"
#include "megatrain/kernels/rope_freqs.h"

namespace mt {

// The model's kinds. Users (TOML, CLI overrides) and checkpoint manifests spell them as strings; kind_name and
// parse_kind (core/kind.h) are the one place that turns a spelling into a kind, so the layers branch on enums and a
// misspelt kind is refused where the config is read, naming the key and the allowed spellings.
enum class NormKind { LayerNorm, RmsNorm };     // "layernorm" | "rmsnorm"
enum class MlpKind { Gelu, SwiGlu };            // "gelu" | "swiglu"
enum class PosKind { Learned, Rope };           // "learned" | "rope"
enum class BlockKind { Sequential, Parallel };  // "sequential" | "parallel"

// Each kind's spellings, in the enum's order.
inline constexpr std::array<const char*, 2> kNormNames = {"layernorm", "rmsnorm"};
inline constexpr std::array<const char*, 2> kMlpNames = {"gelu", "swiglu"};
inline constexpr std::array<const char*, 2> kPosNames = {"learned", "rope"};
inline constexpr std::array<const char*, 2> kBlockNames = {"sequential", "parallel"};
inline const std::array<const char*, 2>& kind_names(NormKind) { return kNormNames; }
inline const std::array<const char*, 2>& kind_names(MlpKind) { return kMlpNames; }
inline const std::array<const char*, 2>& kind_names(PosKind) { return kPosNames; }
inline const std::array<const char*, 2>& kind_names(BlockKind) { return kBlockNames; }

// Upper bounds on the model's sizes (ModelConfig::validate). They lie far beyond any model one host can train (the
// largest real vocabularies have ~256k tokens, the deepest models ~128 layers, the widest d_model ~32k), and they
// keep every size derived from them representable: the padded vocabulary in int, parameter counts and byte sizes in
// int64. A value past them is a typo or an attack, refused at load in microseconds instead of failing (or
// overflowing) in an allocation much later.
inline constexpr int kMaxVocab = 1 << 24;
inline constexpr int kMaxVocabPad = 1 << 16;
inline constexpr int kMaxLayers = 1 << 16;
inline constexpr int kMaxWidth = 1 << 20;    // d_model
inline constexpr int kMaxFf = 1 << 22;       // d_ff
inline constexpr int kMaxSeqLen = 1 << 24;   // max_seq_len (and so window)
inline constexpr int kMaxExperts = 1 << 16;  // moe_experts (and so moe_top_k, moe_shared_experts)
// 2^40 parameters: 4.4 TB of fp32 weights alone, more memory than any single machine has.
inline constexpr int64_t kMaxParams = int64_t{1} << 40;

struct ModelConfig {
  int vocab_size = 50257;  // real vocabulary
  int vocab_pad_to = 64;   // the embedding/LM head have padded_vocab() rows (multiple of this) for GEMM speed
  int n_layer = 12;
  int n_head = 12;
  int n_kv_head = 0;  // 0 = n_head (plain multi-head); fewer = grouped-query attention
  int d_model = 768;
  int d_ff = 0;  // 0 = 4*d_model (gelu) or the Llama rule 8/3*d_model rounded to 64 (swiglu)
  int max_seq_len = 1024;
  NormKind norm = NormKind::LayerNorm;
  MlpKind mlp = MlpKind::Gelu;
  PosKind pos = PosKind::Learned;
  float rope_theta = 10000.0f;
  // RoPE's long-context frequency scaling, as Llama 3.1 and later (HF rope_type "llama3"; kernels/rope_freqs.h):
  // 0 = none, else the factor that divides the low frequencies (Llama 3.1: 8, Llama 3.2: 32), with the band edges
  // and the context length the model was first trained at.
  float rope_scaling = 0.0f;
  float rope_low_freq_factor = 1.0f;
  float rope_high_freq_factor = 4.0f;
  int rope_original_max_len = 8192;
  BlockKind block = BlockKind::Sequential;  // sequential: x += Attn(LN1 x); x += MLP(LN2 x)
                                            // parallel:   x += Attn(LN x) + MLP(LN x)   (MegaScale PTB)
  int window = 0;                           // sliding-window attention width; 0 = full causal
  bool tied_embeddings = true;              // LM head shares wte
  bool bias = true;                         // biases in linears (and LayerNorm)
  float norm_eps = 1e-5f;
  float init_std = 0.02f;
  std::vector<bool> recompute;  // per layer: recompute activations in backward (empty = none)
  // GeLU MLP: keep only the pre-activation of each layer and recompute gelu(pre) in backward (one elementwise pass
  // per layer) into a scratch buffer the GeLU backward does not otherwise use: saves rows x ff_dim activations per
  // layer (3.2 GB for the 1.3B model at B 4, T 2048), as torch.compile does. The SwiGLU MLP keeps its activation.
  bool recompute_act = false;
  // Keep only each norm's input and statistics and rebuild its output in backward (one elementwise pass per norm,
  // into a BlockScratch buffer): saves rows x d_model activations per norm, i.e. 2 per sequential layer and 1 per
  // parallel one (1.6 GB for the 1.3B model at B 4, T 2048, as torch.compile's recomputation of cheap ops). With
  // tensor parallelism the rebuilt rows are all-gathered again, as Megatron's sequence parallelism does.
  bool recompute_norm = false;

  // Mixture of experts (docs/moe.md): on the MoE layers the MLP is replaced by moe_experts SwiGLU experts of width
  // moe_d_ff, of which a router picks moe_top_k per token, plus moe_shared_experts always-on ones. 0 experts: dense.
  int moe_experts = 0;
  int moe_top_k = 2;
  int moe_d_ff = 0;  // each expert's hidden width; required (> 0) with moe_experts
  int moe_shared_experts = 0;
  int moe_every = 1;        // layer l is MoE when l >= moe_first_dense and (l - moe_first_dense) % moe_every == 0
  int moe_first_dense = 0;  // the first layers stay dense (DeepSeek's first_k_dense_replace)
  MoeRouter moe_router = MoeRouter::Softmax;
  float moe_bias_rate = 1e-3f;    // sigmoid_bias: the bias step per optimizer step (DeepSeek-V3's gamma)
  float moe_aux_loss = 0.0f;      // Switch/GShard load-balancing loss coefficient
  float moe_z_loss = 0.0f;        // router z-loss coefficient (ST-MoE)
  float moe_capacity_factor = 0;  // 0 = dropless; else each expert takes ceil(cf * N * k / E) assignments at most

  bool moe() const { return moe_experts > 0; }
  bool moe_layer(int l) const { return moe() && l >= moe_first_dense && (l - moe_first_dense) % moe_every == 0; }
  int moe_ff_dim() const { return moe_d_ff; }
  int moe_layers() const;  // how many layers are MoE
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  RopeFreqs rope_freqs() const {
    return {rope_theta, rope_scaling, rope_low_freq_factor, rope_high_freq_factor, rope_original_max_len};
  }
  int head_dim() const { return d_model / n_head; }
  int ff_dim() const;
  int padded_vocab() const;
  // With tensor parallelism the vocabulary rows are split over tp ranks: padded to a multiple of vocab_pad_to*tp.
  int padded_vocab(int tp) const;
  // Throws mt::Error naming the field that parallel.tp does not divide (heads, kv heads, d_ff).
  void validate_tp(int tp) const;
  // Throws mt::Error naming the inconsistent field (heads not dividing d_model, an odd head dim with rope, ...).
  void validate() const;
  void validate_moe() const;   // the moe_* keys (part of validate)
  int64_t num_params() const;  // parameters counted without vocab padding
  // Model FLOPs per token for one training step (forward + backward): 6N (non-embedding matmuls + LM head)
  // + attention (12 * n_layer * d_model * effective context), where context = T (or the window).
  double flops_per_token(int T) const;
};

}  // namespace mt
