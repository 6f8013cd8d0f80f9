// The GPT: token (+ position) embedding, n_layer Blocks, final norm, LM head (tied to wte or not) and the fused
// softmax-cross-entropy. Memory is planned up front for a maximum number of rows (B*T) and reused every step.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "megatrain/core/buffer.h"
#include "megatrain/kernels/ops.h"
#include "megatrain/model/block.h"
#include "megatrain/model/config.h"
#include "megatrain/model/layout.h"
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
  // part: pipeline parallelism - only these layers (and the embedding / head when set); such a part runs through
  // forward_chunk / backward_chunk, the whole-model calls below need the whole model.
  // ep: expert parallelism (model/moe.h): the store holds this ep rank's experts of each MoE layer, and all ep ranks
  // call forward / backward together (each on its own tokens). nullptr or size 1: every expert here.
  GPT(const ModelConfig& cfg, Ops& ops, size_t pad_multiple = 16, TpComm* tp = nullptr, GptPart part = {},
      EpComm* ep = nullptr);
  void set_hooks(GptHooks h) { hooks_ = std::move(h); }
  const GptHooks& hooks() const { return hooks_; }  // to wrap them (train/coded_forward_backward.cpp)

  const ModelConfig& config() const { return cfg_; }
  int tp_size() const { return tp_ ? tp_->size() : 1; }
  int tp_rank() const { return tp_ ? tp_->rank() : 0; }
  TpComm* tp_comm() const { return tp_; }  // nullptr without tensor parallelism
  int ep_size() const { return ep_ ? ep_->size() : 1; }
  // Gradients of replicated parameters are partial per tp rank; backward all-reduces them over tp (layer by
  // layer, before the grads_ready hook) unless disabled: turn it off for all but the last micro-batch of an
  // accumulation, since the sum is taken over the accumulated buffer.
  void set_tp_grad_sync(bool on) { tp_grad_sync_ = on; }
  // This rank's vocabulary columns of logits(): ids [vocab_begin(), vocab_begin() + local_vocab()).
  int64_t vocab_begin() const;
  int64_t local_vocab() const;
  Ops& ops() const { return ops_; }
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

  // ---- pipeline parallelism: one model chunk (part().chunks[c]) at a time --------------------------------------
  const GptPart& part() const { return part_; }
  int num_chunks() const { return static_cast<int>(chunks_.size()); }
  bool first_chunk(int c) const { return part_.embedding && c == 0; }           // embeds the tokens
  bool last_chunk(int c) const { return part_.head && c == num_chunks() - 1; }  // ends in the loss
  // The parameter indices [first, end) whose gradients chunk c's backward produces (its layers, plus the embedding
  // on the first chunk and the final norm + head on the last).
  std::pair<int, int> chunk_params(int c) const;

  // Activation slots: what one micro-batch keeps between the forward and the backward of a chunk (its layers'
  // inputs and activations; the tokens on the first chunk, the final norm and the logit gradients on the last).
  // forward_chunk of micro-batch mb takes a free slot of the chunk (or mb's own when mb is forwarded again
  // without a backward, e.g. in evaluation); backward_chunk of mb reads it and frees it. A pipeline reserves as
  // many as micro-batches are in flight on the chunk at once; every chunk has 1 until then. Reserving allocates
  // for B x T rows now (no allocation in a step) and needs every slot of the chunk free.
  void reserve_activation_slots(int c, int n, int B, int T);
  int activation_slots(int c) const;
  int64_t chunk_forwards() const { return chunk_forwards_; }  // forward_chunk calls so far

  // Forward of chunk c over micro-batch mb [B, T]: the first chunk embeds `tokens`, any other reads x (this rank's
  // [B*T/tp, C] rows of the previous stage's output). Returns the output rows (a view valid until mb's backward),
  // or on the last chunk an empty tensor, with *loss = the mean loss over the targets and the gradient of
  // loss * loss_scale prepared for backward_chunk. train = false: an evaluation's forward, whose MoE routing is
  // not counted (take_moe_stats).
  Tensor forward_chunk(int c, int mb, Tensor x, const int32_t* tokens, const int32_t* targets, int B, int T,
                       float loss_scale, float* loss, bool train = true);
  // Backward of chunk c for micro-batch mb, from the activations its forward_chunk kept (layers configured for
  // recomputation re-run their forward from their saved input). dy: gradient w.r.t. the chunk's output (ignored
  // on the last chunk). Returns the gradient w.r.t. x (a view valid until the next call), empty on the first chunk.
  Tensor backward_chunk(int c, int mb, Tensor dy);
  // Inference forward of chunk c (no loss, nothing kept for a backward; uses a free slot): on the last chunk the
  // logits [B*T, local_vocab()], on any other the output rows; a view valid until the next call on this model.
  Tensor logits_chunk(int c, Tensor x, const int32_t* tokens, int B, int T);
  // Frees micro-batch mb's activation slot on chunk c without a backward (after a forward_chunk that no backward
  // follows, e.g. the loss of an evaluation); a no-op when mb holds none.
  void release_activations(int c, int mb);
  // The same for micro-batch 0.
  Tensor forward_chunk(int c, Tensor x, const int32_t* tokens, const int32_t* targets, int B, int T, float loss_scale,
                       float* loss) {
    return forward_chunk(c, 0, x, tokens, targets, B, T, loss_scale, loss);
  }
  Tensor backward_chunk(int c, Tensor dy) { return backward_chunk(c, 0, dy); }

  // ---- expert parallelism's interleave of two micro-batches (parallel.ep_interleave) ---------------------------
  // The training forwards of micro-batches mb[0] and mb[1] ([B, T] each; the whole model, tp = 1), interleaved
  // layer by layer: on a MoE layer, mb[0]'s attention half, then its MoE, during whose expert dispatch mb[1]'s
  // attention half runs (Block::forward_moe's while_dispatch), then mb[1]'s MoE; a dense layer runs mb[0]'s then
  // mb[1]'s. Each micro-batch's arithmetic is its forward_chunk's exactly (only the order of independent work
  // changes), so loss[k] and the activations kept are forward_chunk(0, mb[k], ...)'s; backward_chunk(0, mb[k])
  // follows for each. Needs two free activation slots (reserve_activation_slots(0, 2, B, T)) and no recomputed
  // layer or recompute_norm (their buffers are shared by the micro-batches).
  void forward_pair(const int (&mb)[2], const int32_t* const (&tokens)[2], const int32_t* const (&targets)[2], int B,
                    int T, float loss_scale, float (&loss)[2]);

  // ---- mixture of experts (model/moe.h) --------------------------------------------------------------------
  // Per MoE layer held, the routing counts and auxiliary losses of the training forwards since the last take
  // (recomputation's and evaluation's forwards are not counted); empty for a dense model.
  std::vector<MoeLayerStats> take_moe_stats();
  // The auxiliary losses' share of the training loss over those forwards: sum over MoE layers of
  // moe_aux_loss * aux + moe_z_loss * z, averaged over the forwards (what the step's gradients include).
  static double moe_loss(const ModelConfig& cfg, const std::vector<MoeLayerStats>& stats);
  // sigmoid_bias router: each MoE layer's bias steps by model.moe_bias_rate towards balance from the loads routed
  // since the last call (call once per optimizer step, after it); a no-op for the softmax router. sum_loads, when
  // set, turns a layer's loads into the sum over the data-parallel ranks (a collective every dp rank calls in the
  // same layer order), so that every replica takes the same step.
  void moe_update_bias(const std::function<void(std::vector<int64_t>& loads)>& sum_loads = {});

  // Inference: logits of every position, returned as a [B*T, padded_vocab] view valid until the next call
  // (with tp: this rank's vocabulary columns, [B*T, local_vocab()]).
  Tensor logits(const int32_t* tokens, int B, int T);

 private:
  // One micro-batch's activations on one chunk (see reserve_activation_slots). The whole model uses one slot.
  struct Slot {
    int mb = -1;  // the micro-batch holding it; -1: free
    int B = 0, T = 0;
    bool have_grad = false;
    Buffer tokens, local_tokens;   // first chunk (I32); local_tokens (tp): mapped to my vocabulary shard (-1: not mine)
    std::vector<Buffer> residual;  // by layer: the chunk's residual streams [first, end], [rows/tp, C]
    std::vector<BlockActs> acts;   // by layer: the chunk's layers that keep activations
    Buffer lnf, lnf_mean, lnf_rstd, logits;  // last chunk; logits hold their gradient after the loss
  };
  // Grows every buffer to B*T rows; other micro-batches than `mb` must not be in flight then.
  void ensure_capacity(int B, int T, int mb = -1);
  void allocate_slot(int c, Slot& s, int64_t rows);
  Slot& take_slot(int c, int mb);
  Slot& held_slot(int c, int mb);
  // Forward of chunk c up to its output (the last chunk: up to the logits) on slot s.
  void chunk_trunk(int c, Slot& s, Tensor x, const int32_t* tokens, int B, int T);
  void set_tokens(Slot& s, const int32_t* tokens, int B, int T);
  void forward_trunk(const int32_t* tokens, int B, int T);  // up to the logits
  // The pieces of forward and backward (with or without tp), on the micro-batch of slot s.
  void embed_forward(Slot& s);
  void layers_forward(Slot& s, int first, int end);
  void layer_forward_pair(Slot& s0, Slot& s1, int l);  // forward_pair's layer l
  void head_forward(Slot& s);
  float loss(Slot& s, const int32_t* targets, float loss_scale, bool train);
  float loss_tp(Slot& s, int64_t N, int64_t valid, float dloss, bool train);
  void head_backward(Slot& s);  // leaves the gradient w.r.t. the last layer's output in dres_
  void layers_backward(Slot& s, int first, int end);
  void embed_backward(Slot& s);
  int64_t stream_rows(const Slot& s) const { return static_cast<int64_t>(s.B) * s.T / tp_size(); }
  void sync_replicated_grads(int first, int end);
  bool recompute(int l) const { return !cfg_.recompute.empty() && cfg_.recompute[l]; }

  // MoE: counts of the training forwards (moe_count_ on while one runs), and the loads for the bias update.
  void count_moe(int l, const MoeActs& a);
  void update_bias_on_host(Tensor bias, const std::vector<int64_t>& load);  // moe_update_bias's step, any backend
  std::vector<MoeLayerStats> moe_stats_;        // by layer (layer = -1: not a MoE layer held here)
  std::vector<std::vector<int64_t>> moe_load_;  // by layer: routed assignments since moe_update_bias
  bool moe_count_ = false;
  float loss_scale_ = 1.0f;  // the last training forward's (the auxiliary losses' gradients use it)
  ModelConfig cfg_;
  Ops& ops_;
  TpComm* tp_ = nullptr;  // set only when tp > 1
  EpComm* ep_ = nullptr;  // set only when ep > 1
  bool tp_grad_sync_ = true;
  GptPart part_;
  std::vector<std::pair<int, int>> chunks_;  // the layer ranges held (the whole model: one)
  ParamStore params_;
  std::vector<std::optional<Block>> blocks_;  // per layer; empty for layers another pipeline stage holds
  int wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1, head_ = -1;
  int emb_end_ = 0;                           // the embedding tensors are indices [0, emb_end_)
  std::vector<int> layer_first_, layer_end_;  // parameter index range of each held layer
  GptHooks hooks_;
  void used(int first, int end) const {
    if (hooks_.before_params_used) hooks_.before_params_used(first, end);
  }
  void ready(int first) const {
    if (hooks_.grads_ready) hooks_.grads_ready(first);
  }

  int64_t cap_rows_ = 0;
  int64_t chunk_forwards_ = 0;
  std::vector<std::vector<Slot>> slots_;  // [chunk][slot]
  // Shared by all slots: forward temporaries and backward gradients of the one micro-batch being computed.
  // All of it lives in the backend's memory: activations in its compute dtype (act_), statistics in fp32.
  Buffer targets_, losses_;
  BlockActs recompute_acts_;  // recomputed layers' activations, rebuilt in their backward
  BlockScratch scratch_;
  Buffer dres_, dlnf_;
  Buffer ce_stats_;          // tp: [3, N] cross-entropy statistics
  Buffer replicated_grads_;  // tp: staging to sum a range of replicated tensors' gradients in one all-reduce
  DType act_ = DType::F32;
  std::vector<int32_t> host_ids_;  // staging for token/target ids on their way to the device
  std::vector<float> host_losses_;
  // Views of the buffers above: [rows, cols] activations, [n] fp32 statistics from element `at`.
  Tensor act(const Buffer& b, int64_t rows, int64_t cols) const { return mat(b, rows, cols, act_); }
  static Tensor f32s(const Buffer& b, int64_t n, int64_t at = 0);
  static Tensor ids(const Buffer& b, int64_t B, int64_t T);
  Tensor W(int i) const { return i < 0 ? Tensor{} : params_.weight(i); }  // the compute copy of parameter i
};

}  // namespace mt
