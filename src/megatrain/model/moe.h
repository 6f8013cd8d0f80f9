// The mixture-of-experts feed-forward layer: on the layers ModelConfig::moe_layer picks, it replaces the MLP.
//   logits = x @ Wr^T                          (router, [N, E], no bias)
//   route: top-k experts and gates per token   (kernels/cpu/moe.h: softmax or sigmoid_bias, capacity)
//   y_t = sum_j gate_tj * Expert_{e_tj}(x_t) + Shared(x_t)
//   Expert_e(x) = W2_e (silu(W1_e x) * W3_e x)  (SwiGLU of width moe_d_ff; Shared: moe_shared_experts of them)
// plus the auxiliary losses moe_aux_loss * aux + moe_z_loss * z, whose gradients backward adds to the router's
// (scaled as the cross-entropy: by the step's loss_scale).
//
// Parameters (ParamStore names; declared by declare_gpt_params):
//   h.{i}.moe.router.weight          [E, C]
//   h.{i}.moe.router.bias            [E]           sigmoid_bias only: the balancing bias, no gradient (moe_update_bias)
//   h.{i}.moe.experts.c_fc.weight    [E, 2F, C]    per expert: gate rows (Mixtral w1) then up rows (w3)
//   h.{i}.moe.experts.c_proj.weight  [E, C, F]     per expert: down (Mixtral w2)
//   h.{i}.moe.shared.c_fc.weight     [2SF, C]      shared experts: all S gates (expert s: rows [sF, (s+1)F)), then
//   h.{i}.moe.shared.c_proj.weight   [C, SF]       all S ups; down columns [sF, (s+1)F): the S experts' sum is one
//                                                  SwiGLU of width S*F
// F = moe_d_ff, S = moe_shared_experts. No biases (Mixtral, DeepSeek have none).
//
// Backends: one process runs the layer on any Ops backend (CPU fp32, CUDA bf16 activations over fp32 master weights).
// The router GEMM, the permutation, the grouped GEMMs, the SwiGLU and the combine are Ops entry points on the
// activations' device; the routing itself (a top-k over the [N, E] logits) and the auxiliary losses and the router's
// backward through them run on the host: on a device backend forward copies the logits down (fp32) and uploads the
// routing once (MoeRoutingBuffers), and backward copies the gate gradient [N, k] down, computes the logits' gradient
// [N, E] on the host and uploads it. On the CPU backend those copies are the buffers themselves, so the layer runs
// the same reference functions, bit for bit, as when it called them directly. The token group (tp) and expert
// parallelism (ep) run on the CPU backend only: their exchanges are host ones.
//
// A micro-batch split over ranks (the token group: tensor + sequence parallelism, where each tp rank keeps its
// rows through the layer): every rank routes and computes its own tokens with the full (replicated) weights, and
// forward sums the routing counts, the aux loss's probability sums and the z-loss's sum over the group (one
// all-reduce of 2E + 3 values), so that the losses, their gradients (which the rank's tokens receive) and the
// counts each rank reports are the whole micro-batch's. The weights' gradients are then each rank's share: the
// caller sums them over the group (model/gpt.h, replicated parameters). The capacity stays per rank (its tokens).
//
// Expert parallelism (an EpComm of size ep > 1): this rank holds experts [rank*E/ep, (rank+1)*E/ep) (the expert
// tensors' first dimension is E/ep), the router and the shared experts whole. Forward routes the rank's own tokens
// over all E experts and permutes them by expert as without ep, so the rows for each ep rank are one contiguous
// block; it exchanges the per-expert counts, then dispatches the rows (all-to-all) while the shared experts run,
// reorders what arrived (source-major) into local-expert-major order, runs the grouped GEMMs on the local experts,
// restores the source-major order and combines (all-to-all back), then gates and sums as without ep. Backward is
// the mirror: the output gradients go to the experts' owners while the shared experts' backward runs, and the
// input gradients come back while the router's runs. The auxiliary losses stay over the rank's own tokens, or with
// a token group (ep x tp: the ep group is the ranks of my tp coordinate) over the group's micro-batch, shared as
// without ep once the combine is complete.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "megatrain/core/buffer.h"
#include "megatrain/kernels/cpu/moe.h"
#include "megatrain/kernels/moe_routing.h"
#include "megatrain/model/config.h"
#include "megatrain/model/ep_comm.h"
#include "megatrain/model/params.h"
#include "megatrain/model/tp_comm.h"

namespace mt {

// What one MoE layer's forward keeps for its backward (for up to `rows` tokens), and its backward's scratch. The
// buffers are on the backend's device (allocate's ops; host fp32 without one), the activations in its compute dtype;
// d_gate is F32 always. The host vectors hold what the host computes from or for a device backend (unused on the CPU).
struct MoeActs {
  MoeRouting routing;
  MoeRoutingBuffers routing_buffers;  // the routing's arrays on the device (planned for `rows` tokens)
  MoeDeviceRouting device_routing;    // the last forward's upload (its host is `routing`), for backward
  DType dtype = DType::F32;           // the activations' (logits, permuted rows, shared, d_*, tmp)
  Buffer logits;                      // [N, E]
  Buffer xp, fc, act, yp;             // permuted: [N*k, C], [N*k, 2F], [N*k, F], [N*k, C]
  Buffer s_fc, s_act;                 // shared: [N, 2SF], [N, SF]
  Buffer d_yp, d_fc, d_act, d_xp, d_gate, d_logits, s_dfc, s_dact, tmp;  // backward scratch
  // Device backends: F32 [N, E] staging between the activation dtype and the host copies, and those copies (the
  // logits, the gate and logits gradients, the sigmoid_bias router's bias).
  Buffer logits_f32, d_logits_f32;
  std::vector<float> logits_host, d_gate_host, d_logits_host, bias_host;
  double aux = 0, z = 0;  // the last forward's losses (without their coefficients)
  // Expert parallelism: rows sent to / received from each ep rank, the received rows' local-expert offsets
  // [E/ep + 1], and for each row in local-expert-major order its row in the received (source-major) order. The
  // buffers hold the received rows (grown as needed): xe, fce, acte, ye in expert-major order, xr in source-major
  // order (the dispatched rows, then the outputs to combine), s_out the shared experts' output, and their gradients.
  std::vector<int64_t> ep_send, ep_recv, ep_offsets;
  std::vector<int64_t> ep_order;
  Buffer xr, xe, fce, acte, ye, s_out, d_r, d_e, d_fce, d_acte;
  // ops: the backend whose memory holds the buffers (nullptr: host fp32, the CPU backend's).
  void allocate(const ModelConfig& cfg, int64_t rows, Ops* ops = nullptr);
};

// Per-layer routing counts, summed over the forwards since the last take (metrics, the bias update).
struct MoeLayerStats {
  int layer = -1;
  std::vector<int64_t> tokens;  // [E]: assignments routed to each expert (before the capacity drop)
  int64_t dropped = 0;          // assignments dropped by the capacity
  int64_t assignments = 0;      // all assignments (tokens x k)
  double aux = 0, z = 0;        // sums of the losses (without coefficients) over the forwards
  int forwards = 0;
};

class MoeFfn {
 public:
  // ep: expert parallelism (size > 1; nullptr or size 1: every expert here).
  MoeFfn(const ModelConfig& cfg, ParamStore& params, int layer, EpComm* ep = nullptr);
  // out[N, C] (overwritten) = MoE(in[N, C]): activations on ops.device() (a, allocated for that backend).
  // while_dispatch: other work independent of this layer (another micro-batch's attention, GPT::forward_pair), run
  // with expert parallelism while the dispatch is in flight (after the shared experts); without ep, first.
  void forward(Ops& ops, Tensor out, Tensor in, MoeActs& a, const std::function<void()>& while_dispatch = {}) const;
  // din[N, C] (overwritten) = the gradient w.r.t. in, from dout[N, C]; accumulates the parameters' gradients and
  // the router's from the auxiliary losses, those scaled by loss_scale (as the cross-entropy's gradient).
  void backward(Ops& ops, Tensor din, Tensor dout, Tensor in, MoeActs& a, float loss_scale) const;
  int router_bias() const { return bias_; }  // parameter index; -1 without the sigmoid_bias router
  // The ranks that share each micro-batch's tokens (see the header); nullptr or size 1: this rank has them all.
  void set_token_group(TpComm* group) { group_ = group && group->size() > 1 ? group : nullptr; }

 private:
  // The group's micro-batch: sums the counts and the losses' sums over group_, setting a.routing.batch_*, a.aux
  // and a.z to the micro-batch's.
  void share_batch(MoeActs& a, const float* logits) const;
  // The logits [N, E] as host fp32: the buffer itself on the CPU backend, else copied down into a.logits_host.
  const float* host_logits(Ops& ops, MoeActs& a, Tensor logits) const;
  // The sigmoid_bias router's bias [E] as host fp32 (nullptr without one): the CPU backend's weight itself, else the
  // fp32 master copied down (routing on the bias the CPU would use, not its bf16 compute copy).
  const float* host_bias(Ops& ops, MoeActs& a) const;
  // The routed experts without ep: out[N, C] (overwritten) = the gated sum of the experts' outputs, and backward.
  void routed_forward(Ops& ops, Tensor out, Tensor in, MoeActs& a) const;
  void routed_backward(Ops& ops, Tensor din, Tensor dout, MoeActs& a) const;
  void shared_forward(Ops& ops, Tensor out, Tensor in, MoeActs& a) const;

  // The routed experts under expert parallelism: out[N, C] (overwritten) = the gated sum of the experts' outputs;
  // while_dispatch runs while the dispatch is in flight, while_combine while the outputs travel back. The backward
  // accumulates into din, while_return runs while the output gradients travel to the experts, while_back while the
  // input gradients travel back.
  void routed_forward_ep(Ops& ops, Tensor out, Tensor in, MoeActs& a, const std::function<void()>& while_dispatch,
                         const std::function<void()>& while_combine) const;
  void routed_backward_ep(Ops& ops, Tensor din, Tensor dout, MoeActs& a, const std::function<void()>& while_return,
                          const std::function<void()>& while_back) const;
  void forward_ep(Ops& ops, Tensor out, Tensor in, MoeActs& a, const std::function<void()>& while_dispatch) const;
  void backward_ep(Ops& ops, Tensor din, Tensor dout, Tensor in, MoeActs& a, float loss_scale) const;
  void shared_backward(Ops& ops, Tensor din, Tensor dout, Tensor in, MoeActs& a) const;
  void router_backward(Ops& ops, Tensor din, Tensor in, MoeActs& a, float loss_scale) const;

  const ModelConfig& cfg_;
  ParamStore& params_;
  EpComm* ep_ = nullptr;  // set only when ep > 1
  TpComm* group_ = nullptr;
  int router_ = -1, bias_ = -1, w13_ = -1, w2_ = -1, s13_ = -1, s2_ = -1;
};

// The sigmoid_bias router's balancing step (DeepSeek-V3): bias_e += rate * sign(mean_load - load_e), with load_e
// the assignments routed to e and mean_load their mean over the experts; sign(0) = 0.
void moe_update_bias(float* bias, const std::vector<int64_t>& load, float rate);

}  // namespace mt
