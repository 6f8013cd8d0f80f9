// The GPT: token (+ position) embedding, n_layer Blocks, final norm, LM head (tied to wte or not) and the fused
// softmax-cross-entropy. Memory is planned up front for a maximum number of rows (B*T) and reused every step.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "megatrain/core/buffer.h"
#include "megatrain/kernels/ops.h"
#include "megatrain/model/block.h"
#include "megatrain/model/config.h"
#include "megatrain/model/params.h"

namespace mt {

// Callbacks that let a parallel wrapper overlap communication with compute without the model knowing about
// processes. Parameter indices are ParamStore indices; tensors are declared in forward order, so backward
// finishes them from the highest index down.
struct GptHooks {
  // Forward is about to read parameters [first, end) (e.g. wait for their all-gather).
  std::function<void(int first, int end)> before_params_used;
  // Backward has finished the gradients of every parameter with index >= first (e.g. launch reduce-scatters).
  std::function<void(int first)> grads_ready;
};

class GPT {
 public:
  // pad_multiple: the flat parameter/gradient buffers are padded to a multiple of this many floats.
  // tp: tensor + sequence parallelism (Megatron); nullptr or size 1 is the single-process model. With tp the
  // store holds this rank's shards (ParamInfo::shard), B*T must divide by tp, and all tp ranks call forward /
  // backward / logits together on the same tokens.
  GPT(const ModelConfig& cfg, Ops& ops, size_t pad_multiple = 16, TpComm* tp = nullptr);
  void set_hooks(GptHooks h) { hooks_ = std::move(h); }

  const ModelConfig& config() const { return cfg_; }
  int tp_size() const { return tp_ ? tp_->size() : 1; }
  int tp_rank() const { return tp_ ? tp_->rank() : 0; }
  // Gradients of replicated parameters are partial per tp rank; backward all-reduces them over tp (layer by
  // layer, before the grads_ready hook) unless disabled: turn it off for all but the last micro-batch of an
  // accumulation, since the sum is taken over the accumulated buffer.
  void set_tp_grad_sync(bool on) { tp_grad_sync_ = on; }
  // This rank's vocabulary columns of logits(): ids [vocab_begin(), vocab_begin() + local_vocab()).
  int64_t vocab_begin() const;
  int64_t local_vocab() const;
  ParamStore& params() { return params_; }
  const ParamStore& params() const { return params_; }

  // GPT-2 initialisation: N(0, init_std) for matrices and embeddings, residual output projections scaled by
  // 1/sqrt(2 n_layer), zero biases, unit norm weights, zero padded vocab rows. Each tensor draws from its own
  // stream seeded by (seed, tensor name), so the result does not depend on declaration order.
  void init_weights(uint64_t seed);

  // Forward over tokens/targets [B, T] (I32). Returns the mean loss over positions with target >= 0.
  // With train = true it also writes the gradient of (mean loss * loss_scale) into the logits so that backward()
  // can follow; loss_scale is e.g. 1/grad_accum_steps.
  float forward(const int32_t* tokens, const int32_t* targets, int B, int T, bool train, float loss_scale = 1.0f);
  // Accumulates parameter gradients of the last forward(train = true).
  void backward();

  // Inference: logits of every position, returned as a [B*T, padded_vocab] view valid until the next call
  // (with tp: this rank's vocabulary columns, [B*T, local_vocab()]).
  Tensor logits(const int32_t* tokens, int B, int T);

 private:
  void ensure_capacity(int B, int T);
  void forward_trunk(const int32_t* tokens, int B, int T);  // up to the logits
  void forward_trunk_tp(int B, int T);
  float loss_tp(int64_t N, int64_t valid, float dloss, bool train);
  void backward_tp();
  void sync_replicated_grads(int first, int end);
  bool recompute(int l) const { return !cfg_.recompute.empty() && cfg_.recompute[l]; }

  ModelConfig cfg_;
  Ops& ops_;
  TpComm* tp_ = nullptr;  // set only when tp > 1
  bool tp_grad_sync_ = true;
  ParamStore params_;
  std::vector<Block> blocks_;
  int wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1, head_ = -1;
  std::vector<int> layer_first_;  // first parameter index of each layer, plus one past the last layer
  GptHooks hooks_;
  void used(int first, int end) const {
    if (hooks_.before_params_used) hooks_.before_params_used(first, end);
  }
  void ready(int first) const {
    if (hooks_.grads_ready) hooks_.grads_ready(first);
  }

  int64_t cap_rows_ = 0;
  int B_ = 0, T_ = 0;
  bool have_grad_ = false;
  HostBuffer tokens_, targets_, losses_;
  std::vector<HostBuffer> residual_;  // n_layer + 1 residual streams [rows, C]
  std::vector<BlockActs> acts_;       // one per layer that keeps activations; recomputed layers share one
  BlockActs recompute_acts_;
  BlockScratch scratch_;
  HostBuffer lnf_, lnf_mean_, lnf_rstd_, logits_, dres_, dlnf_;
  HostBuffer local_tokens_, ce_stats_;  // tp: tokens mapped to my vocabulary shard (-1: not mine); [3, N] CE stats
};

}  // namespace mt
