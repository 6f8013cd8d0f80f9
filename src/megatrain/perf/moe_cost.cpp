#include "megatrain/perf/moe_cost.h"

#include <algorithm>

#include "megatrain/core/error.h"
#include "megatrain/perf/collectives.h"

namespace mt::perf {

namespace {
void check_moe(const ModelConfig& m, const Shape& s, int ep) {
  MT_CHECK(m.moe(), "MoE layer cost: model.moe_experts is 0 (a dense model)");
  MT_CHECK(s.tp >= 1, "MoE layer cost: parallel.tp = {} must be >= 1", s.tp);
  MT_CHECK(m.block == BlockKind::Sequential, "MoE layer cost: model.block must be 'sequential' with MoE");
  MT_CHECK(ep >= 1 && m.moe_experts % ep == 0, "MoE layer cost: parallel.ep = {} must divide model.moe_experts = {}",
           ep, m.moe_experts);
}
}  // namespace

MlpCost moe_mlp_cost(const ModelConfig& m, const Cluster& c, const Shape& s, int ep) {
  check_moe(m, s, ep);
  // N: this rank's sequence-parallel rows of the micro-batch (all of it at tp 1).
  const double tp = s.tp, N = double(s.micro_batch) * s.seq / tp, C = m.d_model, E = m.moe_experts;
  const double k = m.moe_top_k, F = m.moe_d_ff, S = m.moe_shared_experts;
  const double local = E / ep, rows = N * k * ep / E;  // experts on this GPU, rows each receives
  // Backward of a GEMM of `n` rows: the input gradient (n x in x out) and the weight gradient (out x in x n).
  auto bwd = [&](double n, double out, double in) { return gemm_seconds(c, n, in, out) + gemm_seconds(c, out, in, n); };
  MlpCost mlp;
  mlp.up = gemm_seconds(c, N, E, C) + local * gemm_seconds(c, rows, 2 * F, C);
  mlp.down = local * gemm_seconds(c, rows, C, F);
  mlp.up_bwd = bwd(N, E, C) + local * bwd(rows, 2 * F, C);
  mlp.down_bwd = local * bwd(rows, C, F);
  if (S > 0) {
    mlp.up += gemm_seconds(c, N, 2 * S * F, C);
    mlp.down += gemm_seconds(c, N, C, S * F);
    mlp.up_bwd += bwd(N, 2 * S * F, C);
    mlp.down_bwd += bwd(N, C, S * F);
  }
  // Per token of the micro-batch (layer_cost counts 2 x micro-batch tokens x C x width): the router (E), then k
  // routed and S shared experts of 3 x F x C each, on this rank's 1/tp of the tokens.
  mlp.up_width = (E + 2 * F * (k + S)) / tp;
  mlp.down_width = F * (k + S) / tp;
  mlp.tp_collectives = false;
  mlp.hidden_elems = N * k * F + N * S * F;
  // Permutation (read N x C, write N x k x C), combine (read N x k x C, write N x C), the router's fp32 scores
  // (written, read by the top-k): three kernels.
  mlp.extra_bytes = (2 * N * C + 2 * N * k * C) * c.dtype_bytes.value + 2 * N * E * 4;
  mlp.extra_launches = 3;
  return mlp;
}

double expert_all_to_all_seconds(const ModelConfig& m, const Cluster& c, const Shape& s, int ep) {
  check_moe(m, s, ep);
  // The rank's routed rows: its N / tp sequence-parallel tokens x k.
  const double bytes = double(s.micro_batch) * s.seq / s.tp * m.moe_top_k * m.d_model * c.dtype_bytes.value;
  return all_to_all_seconds(ep, bytes, group_link(c, ep, s.tp));
}

ExpertOverlap expert_overlap_seconds(const ModelConfig& m, const Cluster& c, const Shape& s) {
  const double N = double(s.micro_batch) * s.seq / s.tp, C = m.d_model, E = m.moe_experts;
  const double SF = double(m.moe_shared_experts) * m.moe_d_ff;
  auto bwd = [&](double n, double out, double in) { return gemm_seconds(c, n, in, out) + gemm_seconds(c, out, in, n); };
  ExpertOverlap o;
  if (SF > 0) {
    o.shared_fwd = gemm_seconds(c, N, 2 * SF, C) + gemm_seconds(c, N, C, SF);
    o.shared_bwd = bwd(N, 2 * SF, C) + bwd(N, C, SF);
  }
  o.router_bwd = bwd(N, E, C);
  return o;
}

LayerCost moe_layer_cost(const ModelConfig& m, const Cluster& c, const Shape& s, const Techniques& t, int ep) {
  LayerCost lc = layer_cost(m, c, s, t, moe_mlp_cost(m, c, s, ep));
  const double a2a = expert_all_to_all_seconds(m, c, s, ep);
  const bool full = t.recompute == Recompute::Full;
  lc.fwd.ep_comm = 2 * a2a;  // dispatch, combine
  lc.bwd.ep_comm = (full ? 4 : 2) * a2a;
  double hidden_fwd = 0, hidden_bwd = 0;
  if (t.ep_overlap && t.comm_overlaps_compute) {
    const ExpertOverlap o = expert_overlap_seconds(m, c, s);
    hidden_fwd = std::min(a2a, o.shared_fwd);
    hidden_bwd = std::min(a2a, o.shared_bwd) + std::min(a2a, o.router_bwd) + (full ? hidden_fwd : 0.0);
  }
  lc.fwd.ep_exposed = lc.fwd.ep_comm - hidden_fwd;
  lc.bwd.ep_exposed = lc.bwd.ep_comm - hidden_bwd;
  return lc;
}

}  // namespace mt::perf
