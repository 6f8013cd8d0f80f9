// Mixture-of-experts reference ops on the CPU (fp32, host memory): routing with top-k, the permutation of tokens
// into expert-contiguous order and back, grouped expert GEMMs, and their backwards. The model's MoE layer
// (model/moe.h) composes them; docs/moe.md states the maths for users.
//
// The routing and the losses run on the host on every backend (moe_route's result goes to the device through
// MoeRoutingBuffers, kernels/moe_routing.h). The permutation, the grouped GEMMs and the combine are also Ops entry
// points (ops.h): the CPU backend's run these functions, the CUDA backend's are kernels checked against them.
//
// Terms. N tokens (rows), E experts, k experts per token. An assignment is a (token t, slot j) pair, j < k, slot j
// holding the token's j-th choice. The permuted order lists the kept assignments expert by expert (expert 0's
// first), within an expert in token order: rows [offsets[e], offsets[e+1]) of a permuted [A, *] tensor are expert
// e's, A = offsets[E] <= N*k.
#pragma once
#include <cstdint>
#include <vector>

#include "megatrain/core/tensor.h"
#include "megatrain/kernels/ops.h"
#include "megatrain/kernels/moe_router.h"

namespace mt {

// The routing of one batch of N tokens: what forward decided and backward needs.
struct MoeRouting {
  int64_t N = 0;
  int E = 0, k = 0;
  MoeRouter router = MoeRouter::Softmax;
  // [N, E]: the router's probabilities. softmax: softmax(logits). sigmoid_bias: the scores sigmoid(logits).
  std::vector<float> probs;
  std::vector<int> expert;       // [N, k]: the chosen experts, best first (ties: the lower expert index)
  std::vector<float> gate;       // [N, k]: the combine weights (the chosen probs/scores, normalised to sum 1)
  std::vector<int> row;          // [N, k]: the assignment's row in the permuted order; -1: dropped (capacity)
  std::vector<int> token;        // [A]: the token of each permuted row
  std::vector<int> slot;         // [A]: its slot j
  std::vector<int64_t> offsets;  // [E + 1]
  std::vector<int64_t> routed;   // [E]: assignments the router chose per expert (before the capacity drop)
  int64_t dropped = 0;           // assignments dropped by the capacity
  int64_t capacity = 0;          // per expert; 0 = none (dropless)
  // The whole micro-batch's counts, of which these N tokens may be a part (sequence parallelism: each rank routes
  // its rows of one micro-batch). moe_route sets them to this call's own (N, routed, dropped); a caller whose
  // micro-batch is split sums them over its parts before moe_aux_loss / moe_router_backward, which take the
  // fractions f_e and the token means over the micro-batch: f_e = batch_routed[e] / (batch_N * k), 1 / batch_N.
  int64_t batch_N = 0;
  std::vector<int64_t> batch_routed;  // [E]
  int64_t batch_dropped = 0;
  int64_t rows() const { return offsets.empty() ? 0 : offsets.back(); }
};

// Routes N tokens from their router logits [N, E] (host fp32):
//   softmax:      p = softmax(logits); choose the k largest p; gate_j = p_{e_j} / sum_m p_{e_m}
//   sigmoid_bias: s = sigmoid(logits); choose the k largest s + bias (bias [E], not in any gradient);
//                 gate_j = s_{e_j} / sum_m s_{e_m}  (DeepSeek-V3)
// capacity_factor > 0: each expert keeps at most capacity = ceil(cf * N * k / E) assignments, the first ones in
// token order (then slot order); the rest are dropped: they add nothing to the output (the surviving gates are not
// renormalised, as in Switch/GShard) and are counted in r.dropped. 0: dropless.
void moe_route(MoeRouting& r, const float* logits, int64_t N, int E, int k, MoeRouter router, const float* bias,
               float capacity_factor);

// The load-balancing loss without its coefficient: E * sum_e f_e * P_e (Switch Transformer, GShard), where
// f_e = routed[e] / (N * k) (the router's choices before any drop; a constant in the gradient) and P_e is the mean
// over tokens of the router probability of e: softmax, p; sigmoid_bias, the scores normalised per token,
// s_e / sum_e' s_e'. Equals 1 for perfectly uniform routing and probabilities.
// The micro-batch's own: P_e and f_e from r's tokens and r.batch_* (moe_aux_from_sums with moe_prob_sums(r)).
double moe_aux_loss(const MoeRouting& r);
// P[e] (overwritten, [E]) = the sum over r's tokens of the aux loss's per-token probability of e (above).
void moe_prob_sums(const MoeRouting& r, double* P);
// The load-balancing loss from the micro-batch's sums: P_sums[e] summed over all its tokens, and r.batch_*.
double moe_aux_from_sums(const MoeRouting& r, const double* P_sums);
// The router z-loss without its coefficient (ST-MoE): mean over tokens of logsumexp(logits_t)^2.
double moe_z_loss(const float* logits, int64_t N, int E);

// dlogits [N, E] (overwritten) = the gradient w.r.t. the router logits of
//   sum_{t,j} dgate[t, j] * gate[t, j] + aux_coef * moe_aux_loss + z_coef * moe_z_loss,
// both losses taken over the micro-batch (r.batch_*: its f_e and token count) of which r's tokens are a part.
// dgate [N, k] is the gradient w.r.t. the gates (0 for dropped assignments: they did not reach the output).
// The sigmoid_bias router's bias takes no part (it only chose the experts).
void moe_router_backward(float* dlogits, const float* dgate, const float* logits, const MoeRouting& r, float aux_coef,
                         float z_coef);

// xp[A, C] = the rows of x[N, C] in the permuted order: xp[r] = x[token[r]].
void moe_permute(Tensor xp, Tensor x, const MoeRouting& r);
// dx[N, C] += the permuted gradient summed back to its tokens: dx[token[r]] += dxp[r].
void moe_permute_backward(Tensor dx, Tensor dxp, const MoeRouting& r);

// y[N, C] (overwritten) = sum over the token's kept slots j, in slot order, of gate[t, j] * yp[row[t, j]]
// (a token with every assignment dropped gets a zero row).
void moe_combine(Tensor y, Tensor yp, const MoeRouting& r);
// dyp[A, C] (overwritten) = gate * dy[token]; dgate[N, k] (overwritten) = dot(dy[t], yp[row[t, j]]), 0 if dropped.
void moe_combine_backward(Tensor dyp, float* dgate, Tensor dy, Tensor yp, const MoeRouting& r);

// Grouped GEMM: for each expert e, out[rows of e] = in[rows of e] @ w[e]^T, w [E, O, I] (no bias).
void moe_grouped_forward(Ops& ops, Tensor out, Tensor in, Tensor w, const std::vector<int64_t>& offsets);
// Its backward per expert: din[rows of e] = dout[rows of e] @ w[e] (overwritten; din may be undefined: skipped);
// dw[e] += dout[rows]^T @ in[rows] (overwritten instead with accumulate_dw false; an expert with no rows then gets
// zeros).
void moe_grouped_backward(Ops& ops, Tensor din, Tensor dw, Tensor dout, Tensor in, Tensor w,
                          const std::vector<int64_t>& offsets, bool accumulate_dw);

}  // namespace mt
