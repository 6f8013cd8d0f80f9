// What one transformer layer (and the embedding and LM head around the stack) costs on one GPU for one
// micro-batch: GEMM time from the GEMM efficiency curve, attention from the flash or unfused path, elementwise
// kernels from memory traffic at the achieved HBM bandwidth, and the tensor/sequence-parallel collectives with the
// part of them that stays on the critical path. Megatron's layout: column-parallel linears after an all-gather of
// the sequence-parallel input, row-parallel linears followed by a reduce-scatter (Korthikanti et al. 2022).
// MegaScale's parallel transformer block (model.block = "parallel") shares one norm and one all-gather /
// reduce-scatter pair between attention and MLP; sliding-window attention (model.window) shortens the context.
#pragma once
#include "megatrain/model/config.h"
#include "megatrain/perf/cluster.h"

namespace mt::perf {

enum class Recompute { None, Selective, Full };  // "none" | "selective" (attention core) | "full" (whole layer)
const char* recompute_name(Recompute r);
Recompute parse_recompute(const std::string& s);  // throws naming the allowed spellings

// The system-level techniques of MegaScale's Table 3 (the model-level ones, PTB and SWA, are ModelConfig fields).
struct Techniques {
  bool tp_overlap = false;  // all-gather / reduce-scatter chunked and overlapped with the adjacent GEMMs (§3.2)
  bool pp_overlap = false;  // decoupled, asynchronous send/receive (§3.2, Figure 4)
  bool dp_overlap = false;  // per-chunk all-gather before forward, reduce-scatter after backward, first one prefetched
  bool fused_ops = false;   // flash attention and fused LayerNorm / GeLU kernels (§3.3)
  bool misc = false;        // data pipeline (§3.4) and removing stragglers (§6.3): the straggler term is dropped
  Recompute recompute = Recompute::Selective;
  int grad_bytes = 4;  // bytes per gradient element reduced across data parallel (fp32 main grads)
  // Not a technique but a property of the host: false when the ranks of a CPU run use every core, so a collective's
  // copies, reductions and socket work run on the cores the compute needs and nothing hides behind a GEMM. Then
  // every collective is exposed whole, and a tp collective cut into tp_chunks pieces (megatrain's
  // parallel.tp_chunks, with tp_overlap) pays the link latency once per piece.
  bool comm_overlaps_compute = true;
  int tp_chunks = 1;
  // MoE with expert parallelism (parallel.ep_overlap, as megatrain trains): each all-to-all runs while the layer's
  // independent compute does (perf/moe_cost.h says which); false = every all-to-all on the critical path.
  bool ep_overlap = true;
};

struct Shape {
  int tp = 1;
  int micro_batch = 1;  // sequences per micro-batch
  int seq = 1;
};

struct PassCost {
  double compute = 0;     // seconds of kernels (GEMMs, attention, elementwise)
  double tp_comm = 0;     // seconds of tensor-parallel collectives, all of them
  double tp_exposed = 0;  // the part of tp_comm on the critical path
  double flops = 0;       // FLOPs executed (hardware FLOPs: recomputation included)
  double ep_comm = 0;     // seconds of expert-parallel all-to-alls (MoE layers), all of them
  double ep_exposed = 0;  // the part of ep_comm on the critical path
  double total() const { return compute + tp_exposed + ep_exposed; }
};

struct LayerCost {
  PassCost fwd, bwd;
};

// The feed-forward half of a layer as layer_cost prices it: the GEMMs in front of the hidden activation (up) and
// behind it (down), forward and backward, their widths for the FLOP count (forward FLOPs 2 x tokens x d_model x
// (up_width + down_width)), and the elementwise work on the hidden activation (read and written once: bias + GeLU,
// or SwiGLU's gate) plus any other (a MoE layer's routing, permutation and combine).
struct MlpCost {
  double up = 0, down = 0;          // forward GEMM seconds
  double up_bwd = 0, down_bwd = 0;  // backward GEMM seconds (input and weight gradients)
  double up_width = 0, down_width = 0;
  double hidden_elems = 0;  // elements of the hidden activation on this GPU
  double extra_bytes = 0;   // other elementwise bytes moved
  int extra_launches = 0;
  // The feed-forward half is column- then row-parallel over tp, behind an all-gather of the sequence-parallel
  // input and before a reduce-scatter of its output. False for a MoE layer, which runs on each rank's own
  // sequence-parallel rows: only the attention's all-gather / reduce-scatter pair remains.
  bool tp_collectives = true;
};
// The dense MLP (model.mlp, model.d_ff), column- then row-parallel over tp.
MlpCost dense_mlp_cost(const ModelConfig& m, const Cluster& c, const Shape& s);

// One transformer layer; bwd includes the recomputation the chosen Recompute implies.
LayerCost layer_cost(const ModelConfig& m, const Cluster& c, const Shape& s, const Techniques& t);
// The same layer with another feed-forward half (moe_cost.h: a MoE layer).
LayerCost layer_cost(const ModelConfig& m, const Cluster& c, const Shape& s, const Techniques& t, const MlpCost& mlp);
// The token embedding (first virtual stage) and the final norm, LM head and loss (last virtual stage).
LayerCost embedding_cost(const ModelConfig& m, const Cluster& c, const Shape& s, const Techniques& t);
LayerCost head_cost(const ModelConfig& m, const Cluster& c, const Shape& s, const Techniques& t);

// Fraction of the SMs an M x N output keeps busy over its waves of tiles (1 when tiles fill every wave).
double wave_efficiency(const Cluster& c, double M, double N);
// Seconds of one GEMM of M x N x K on this cluster: 2MNK FLOPs at the curve's efficiency for that size, times the
// wave efficiency of its output shape.
double gemm_seconds(const Cluster& c, double M, double N, double K);
// Sum over query positions of the keys a causal (optionally windowed) attention reads: T(T+1)/2 without a window.
double attended_pairs(int seq, int window);

}  // namespace mt::perf
