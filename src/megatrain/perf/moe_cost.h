// What a mixture-of-experts layer (docs/moe.md) costs on one GPU for one micro-batch, with expert parallelism.
// The model: attention as in a dense layer (compute_cost.h); in place of the MLP, the router GEMM (tokens x E x
// d_model), the shared experts (one SwiGLU of width moe_shared_experts x moe_d_ff over every token) and the routed
// experts. Routing is taken as perfectly balanced: each of the ep ranks of an expert-parallel group holds E / ep
// experts and, of the N x k routed rows of the group's N tokens per rank, receives N x k, N x k x ep / E per local
// expert; each expert's SwiGLU is three GEMMs (gate and up fused, as megatrain stores them, then down) priced one
// expert at a time (a grouped GEMM no faster than its parts). Elementwise: the hidden activation of the N x k routed
// and N x S shared rows (read and written once, as the dense MLP's), the permutation into expert order and the
// weighted combine back (each reads and writes its rows), the router's fp32 scores.
// Expert parallelism (Megatron's convention, ep ranks carved out of the dp ranks, adjacent after tp in the rank
// order): per MoE layer and micro-batch, a dispatch and a combine all-to-all forward and their conjugates backward
// (two more when full recomputation reruns the forward), each moving the rank's routed rows x d_model elements,
// (ep-1)/ep of them to other ranks, at the slowest link of the group (its members are tp apart, so NVLink when
// tp x ep GPUs fit in a node). With Techniques::ep_overlap (megatrain's parallel.ep_overlap) an all-to-all hides
// behind the compute megatrain runs while it is in flight, up to that compute's time: forward, the dispatch behind the
// shared experts (the combine behind the auxiliary losses: nothing to price); backward, the first exchange behind
// the shared experts' backward and the second behind the router's; a recomputed forward's dispatch behind the shared
// experts again. A model without shared experts hides little. Nothing hides on a host whose cores the ranks use up.
// Tensor parallelism (megatrain's, docs/moe.md "Parallelism"; sequence parallelism is always on with tp > 1): the
// router, routed and shared experts are replicated over tp, not split, and each tp rank runs the MoE on its own
// N / tp sequence-parallel rows, with no all-gather before the layer and no reduce-scatter after it (MlpCost::
// tp_collectives is false: only the attention's pair remains). So every per-token term above is taken over N / tp
// tokens: the router and the shared experts on N / tp rows, N x k / tp routed rows through the E / ep local experts,
// and all-to-alls of N x k / tp rows per rank within each tp coordinate's ep group. The per-expert statistics'
// all-reduce over tp (2E + 3 floats per layer and micro-batch) is a few bytes and not priced; the replicated
// weights' gradient sum over tp is once a step (step_model.cpp, with the norms').
#pragma once
#include "megatrain/perf/compute_cost.h"

namespace mt::perf {

// The feed-forward half of a MoE layer (layer_cost's MlpCost) on one GPU of an ep group.
MlpCost moe_mlp_cost(const ModelConfig& m, const Cluster& c, const Shape& s, int ep);
// One all-to-all (dispatch or combine) of a MoE layer: N x k x d_model elements per rank over the ep group.
double expert_all_to_all_seconds(const ModelConfig& m, const Cluster& c, const Shape& s, int ep);
// The compute each all-to-all of a MoE layer can hide behind (seconds on one GPU for one micro-batch).
struct ExpertOverlap {
  double shared_fwd = 0, shared_bwd = 0;  // the shared experts' forward and backward (0 without shared experts)
  double router_bwd = 0;                  // the router GEMM's backward
};
ExpertOverlap expert_overlap_seconds(const ModelConfig& m, const Cluster& c, const Shape& s);
// A whole MoE layer: attention, the MoE feed-forward and the all-to-alls (PassCost::ep_comm, ep_exposed).
LayerCost moe_layer_cost(const ModelConfig& m, const Cluster& c, const Shape& s, const Techniques& t, int ep);

}  // namespace mt::perf
