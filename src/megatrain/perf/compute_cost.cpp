#include "megatrain/perf/compute_cost.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "megatrain/core/error.h"
#include "megatrain/perf/collectives.h"

namespace mt::perf {

namespace {


// Seconds of elementwise kernels moving `bytes` through memory, `launches` kernels in all.
double memory_seconds(const Cluster& c, double bytes, int launches) {
  return bytes / (c.hbm_bytes_per_s() * c.memory_bound.value) + launches * c.kernel_launch_us.value * 1e-6;
}

// Exposed part of a collective of `comm` seconds overlapped with a GEMM of `gemm` seconds, split into `chunks`
// pieces (Figure 3c): the GEMM hides what it can, and one chunk of the collective cannot overlap anything.
double overlapped_exposed(double comm, double gemm, int chunks) {
  return std::max(0.0, comm - gemm) + comm / std::max(1, chunks);
}

// Exposed part of a collective issued asynchronously next to a GEMM it does not depend on (no chunking).
double concurrent_exposed(double comm, double gemm) { return std::max(0.0, comm - gemm); }

// One tp all-gather (or reduce-scatter: the same ring cost) of `bytes` as megatrain runs it: cut into
// parallel.tp_chunks pieces when tp_overlap is on, each paying the link latency. Used where nothing overlaps
// (a saturated CPU host), so the pieces' latencies are what the overlap costs.
double tp_gather_seconds(const Cluster& c, const Shape& s, const Techniques& t, double bytes) {
  if (s.tp <= 1) return 0;
  const double pieces = t.tp_overlap ? std::max(1, t.tp_chunks) : 1;
  return pieces * ring_all_gather_seconds(s.tp, bytes / pieces, group_link(c, s.tp, 1));
}

// The tp collectives of a layer, each with the GEMM it can hide behind and whether Megatron-LM already overlaps it:
// in backward it runs the re-gather of the input next to the input-gradient GEMM and the reduce-scatter of the input
// gradient next to the weight-gradient GEMM (LinearWithGradAccumulationAndAsyncCommunication); everything in
// forward and the all-gather of the output gradient before each row-parallel linear stay exposed. MegaScale's
// overlap (§3.2, Figure 3c) chunks every collective against its GEMM; with the parallel block the pair is fused
// into the larger MLP GEMMs. A MoE layer (mlp_tp false) has the attention's pair only.
struct Coll {
  double gemm;
  bool megatron_overlaps;
};
struct LayerColls {
  std::vector<Coll> fwd, bwd;
};
LayerColls layer_collectives(bool ptb, bool mlp_tp, double g_qkv, double g_proj, double g_up, double g_down) {
  if (ptb) return {{{g_up, false}, {g_down, false}}, {{g_down, false}, {g_up, true}, {g_up, true}}};
  if (!mlp_tp) return {{{g_qkv, false}, {g_proj, false}}, {{g_proj, false}, {g_qkv, true}, {g_qkv, true}}};
  return {{{g_qkv, false}, {g_proj, false}, {g_up, false}, {g_down, false}},
          {{g_proj, false}, {g_down, false}, {g_qkv, true}, {g_qkv, true}, {g_up, true}, {g_up, true}}};
}

}  // namespace

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::None: return "none";
    case Recompute::Selective: return "selective";
    case Recompute::Full: return "full";
  }
  return "?";
}

Recompute parse_recompute(const std::string& s) {
  if (s == "none") return Recompute::None;
  if (s == "selective") return Recompute::Selective;
  if (s == "full") return Recompute::Full;
  fail_as(ErrorKind::Config, "recompute must be 'none', 'selective' or 'full' (got '{}')", s);
}

double wave_efficiency(const Cluster& c, double M, double N) {
  // The output is cut into tiles, one per SM at a time; the last wave runs partly empty (NVIDIA, Matrix
  // Multiplication Background User's Guide, §3.2 "Wave quantization"). The library may lay the tile either way.
  auto waves = [&](double tm, double tn) {
    const double tiles = std::ceil(M / tm) * std::ceil(N / tn), sms = c.sm_count.value;
    return tiles / (std::ceil(tiles / sms) * sms);
  };
  return std::max(waves(c.gemm_tile_m.value, c.gemm_tile_n.value), waves(c.gemm_tile_n.value, c.gemm_tile_m.value));
}

double gemm_seconds(const Cluster& c, double M, double N, double K) {
  const double flops = 2 * M * N * K;
  if (flops <= 0) return 0;
  return flops / (c.peak_flops() * c.gemm_efficiency(flops) * wave_efficiency(c, M, N));
}

double attended_pairs(int seq, int window) {
  const double T = seq;
  if (window <= 0 || window >= seq) return T * (T + 1) / 2;
  const double w = window;
  return w * T - w * (w - 1) / 2;  // the first w-1 queries see fewer than w keys
}

MlpCost dense_mlp_cost(const ModelConfig& m, const Cluster& c, const Shape& s) {
  const double tp = s.tp, N = double(s.micro_batch) * s.seq, C = m.d_model, F = m.ff_dim();
  const double fc = (m.mlp == MlpKind::SwiGlu ? 2 * F : F) / tp, down_in = F / tp;
  auto bwd = [&](double out, double in) { return gemm_seconds(c, N, in, out) + gemm_seconds(c, out, in, N); };
  MlpCost mlp;
  mlp.up = gemm_seconds(c, N, fc, C);
  mlp.down = gemm_seconds(c, N, C, down_in);
  mlp.up_bwd = bwd(fc, C);
  mlp.down_bwd = bwd(C, down_in);
  mlp.up_width = fc;
  mlp.down_width = F / tp;
  mlp.hidden_elems = N * F / tp;
  return mlp;
}

LayerCost layer_cost(const ModelConfig& m, const Cluster& c, const Shape& s, const Techniques& t) {
  MT_CHECK(s.tp >= 1 && s.micro_batch >= 1 && s.seq >= 1, "layer cost: bad shape tp={} micro_batch={} seq={}", s.tp,
           s.micro_batch, s.seq);
  return layer_cost(m, c, s, t, dense_mlp_cost(m, c, s));
}

LayerCost layer_cost(const ModelConfig& m, const Cluster& c, const Shape& s, const Techniques& t, const MlpCost& mlp) {
  MT_CHECK(s.tp >= 1 && s.micro_batch >= 1 && s.seq >= 1, "layer cost: bad shape tp={} micro_batch={} seq={}", s.tp,
           s.micro_batch, s.seq);
  const bool ptb = m.block == BlockKind::Parallel;
  const double tp = s.tp, N = double(s.micro_batch) * s.seq, C = m.d_model, hd = m.head_dim();
  const double heads = m.n_head / tp;
  const double qkv = (m.n_head + 2.0 * m.kv_heads()) * hd / tp;

  // GEMMs of the forward pass (tokens x out x in); backward computes the input gradient (tokens x in x out) and
  // the weight gradient (out x in x tokens): twice the FLOPs, in other shapes.
  const double proj_in = m.n_head * hd / tp;
  const double g_qkv = gemm_seconds(c, N, qkv, C), g_proj = gemm_seconds(c, N, C, proj_in);
  const double g_up = mlp.up, g_down = mlp.down;
  const double gemm_fwd = g_qkv + g_proj + g_up + g_down;
  auto bwd = [&](double out, double in) { return gemm_seconds(c, N, in, out) + gemm_seconds(c, out, in, N); };
  const double gemm_bwd = bwd(qkv, C) + bwd(C, proj_in) + mlp.up_bwd + mlp.down_bwd;
  const double gemm_flops = 2 * N * C * (qkv + m.n_head * hd / tp + mlp.up_width + mlp.down_width);

  // Attention core: flash attention in both systems (Megatron-LM's --use-flash-attn runs FlashAttention 1; MegaScale's
  // efficient operators (§3.3) swap in FlashAttention-2). Both compute only the causal (windowed) pairs and recompute
  // the scores in backward (5 matmuls against 2 forward: FlashAttention-2, Dao 2023, §3.1.2), so selective
  // recomputation costs nothing extra; they differ in the fraction of peak they reach.
  const double pairs = attended_pairs(s.seq, m.window) * s.micro_batch;
  const double attn_flops_fwd = 4 * heads * hd * pairs, attn_flops_bwd = 2.5 * attn_flops_fwd;
  const double attn_rate = c.peak_flops() * (t.fused_ops ? c.attention_fused.value : c.attention.value);
  const double attn_fwd = attn_flops_fwd / attn_rate, attn_bwd = attn_flops_bwd / attn_rate;

  // Elementwise kernels, counted as passes over the sequence-parallel activation (N/tp x C: norms, bias + dropout +
  // residual) and over the MLP hidden activation (N x F/tp: bias + GeLU). Megatron's kernels: a norm reads and
  // writes (2); bias-dropout-add reads input and residual, writes output and mask (4); bias-GeLU reads and writes (2).
  // The parallel block has one norm and one bias-dropout-add that reads both branches (5). The fused operators of
  // §3.3 fold the norm into the add before it and drop the separate mask pass (norm 1, add 3, block-add 4).
  const double sp_elems = N / tp * C, tp_elems = mlp.hidden_elems;
  double sp_passes, launches;
  if (ptb)
    sp_passes = t.fused_ops ? 1 + 4 : 2 + 5, launches = t.fused_ops ? 3 : 6;
  else
    sp_passes = t.fused_ops ? 2 * (1 + 3) : 2 * (2 + 4), launches = t.fused_ops ? 5 : 10;
  const double elem_fwd = memory_seconds(c,
                                         (sp_passes * sp_elems + 2 * tp_elems) * c.dtype_bytes.value + mlp.extra_bytes,
                                         int(launches) + mlp.extra_launches);
  const double elem_bwd = 2 * elem_fwd;

  // Tensor + sequence parallel collectives on the tp group (NVLink inside a node). Forward: an all-gather before
  // each column-parallel linear and a reduce-scatter after each row-parallel one (one pair with the parallel
  // block or a MoE layer, two without). Backward: their conjugates, plus the all-gather of the sequence-parallel input again for
  // the weight gradient (Megatron keeps only the shard).
  const Link tl = group_link(c, s.tp, 1);
  const double msg = N * C * c.dtype_bytes.value;
  const double one = s.tp > 1 ? ring_all_gather_seconds(s.tp, msg, tl) : 0;
  const double one_cut = tp_gather_seconds(c, s, t, msg);  // on a saturated host
  MT_CHECK(mlp.tp_collectives || !ptb, "layer cost: the parallel block needs a tensor-parallel MLP");
  const int pairs_fwd = ptb || !mlp.tp_collectives ? 1 : 2;
  const double comm_fwd = 2 * pairs_fwd * one, comm_bwd = 3 * pairs_fwd * one;
  const LayerColls colls = layer_collectives(ptb, mlp.tp_collectives, g_qkv, g_proj, g_up, g_down);
  // A collective is never more exposed with the overlap than without it.
  auto exposed = [&](const std::vector<Coll>& list) {
    if (!t.comm_overlaps_compute) return s.tp > 1 ? list.size() * one_cut : 0.0;
    double sum = 0;
    for (const Coll& k : list) {
      double e = k.megatron_overlaps ? concurrent_exposed(one, k.gemm) : one;
      if (t.tp_overlap) e = std::min(e, overlapped_exposed(one, k.gemm, s.tp));
      sum += e;
    }
    return s.tp > 1 ? sum : 0.0;
  };
  const double exp_fwd = exposed(colls.fwd), exp_bwd = exposed(colls.bwd);

  LayerCost lc;
  lc.fwd.compute = gemm_fwd + attn_fwd + elem_fwd;
  lc.fwd.flops = gemm_flops + attn_flops_fwd;
  lc.fwd.tp_comm = t.comm_overlaps_compute ? comm_fwd : exp_fwd;
  lc.fwd.tp_exposed = exp_fwd;
  lc.bwd.compute = gemm_bwd + attn_bwd + elem_bwd;
  lc.bwd.flops = 2 * gemm_flops + attn_flops_bwd;
  lc.bwd.tp_comm = t.comm_overlaps_compute ? comm_bwd : exp_bwd;
  lc.bwd.tp_exposed = exp_bwd;
  if (t.recompute == Recompute::Full) {  // the whole forward runs again before the backward (attention included)
    lc.bwd.compute += gemm_fwd + elem_fwd + attn_fwd;
    lc.bwd.flops += gemm_flops + attn_flops_fwd;
    lc.bwd.tp_comm += comm_fwd;
    lc.bwd.tp_exposed += exp_fwd;
  }
  return lc;
}

LayerCost embedding_cost(const ModelConfig& m, const Cluster& c, const Shape& s, const Techniques& t) {
  // A vocab-parallel lookup (each tp rank its rows), then a reduce-scatter into the sequence-parallel layout;
  // backward all-gathers the gradient and scatters it into the table.
  const double N = double(s.micro_batch) * s.seq, C = m.d_model;
  LayerCost lc;
  lc.fwd.compute = memory_seconds(c, 2 * N * C * c.dtype_bytes.value, 2);
  lc.bwd.compute = memory_seconds(c, 3 * N * C * c.dtype_bytes.value, 2);
  if (s.tp > 1) {
    const double bytes = N * C * c.dtype_bytes.value;
    const double one = t.comm_overlaps_compute ? ring_reduce_scatter_seconds(s.tp, bytes, group_link(c, s.tp, 1))
                                               : tp_gather_seconds(c, s, t, bytes);
    lc.fwd.tp_comm = lc.fwd.tp_exposed = one;
    lc.bwd.tp_comm = lc.bwd.tp_exposed = one;
  }
  return lc;
}

LayerCost head_cost(const ModelConfig& m, const Cluster& c, const Shape& s, const Techniques& t) {
  // Final norm, all-gather of its output, the vocab-parallel LM head GEMM and the cross-entropy over the local
  // logits (fp32: read, and in backward read and write once more).
  const double N = double(s.micro_batch) * s.seq, C = m.d_model, V = m.padded_vocab(s.tp) / double(s.tp);
  const double g = gemm_seconds(c, N, V, C);
  const double logits = N * V * 4;
  LayerCost lc;
  lc.fwd.compute = g + memory_seconds(c, 2 * N / s.tp * C * c.dtype_bytes.value + 2 * logits, 3);
  lc.fwd.flops = 2 * N * V * C;
  lc.bwd.compute = gemm_seconds(c, N, C, V) + gemm_seconds(c, V, C, N) +
                   memory_seconds(c, 4 * N / s.tp * C * c.dtype_bytes.value + 2 * logits, 3);
  lc.bwd.flops = 4 * N * V * C;
  if (s.tp > 1) {
    const double one = ring_all_gather_seconds(s.tp, N * C * c.dtype_bytes.value, group_link(c, s.tp, 1));
    lc.fwd.tp_comm = lc.fwd.tp_exposed = one;
    lc.bwd.tp_comm = lc.bwd.tp_exposed = 2 * one;
    if (!t.comm_overlaps_compute) {  // cut into pieces like the layers' collectives, and nothing hides
      const double cut = tp_gather_seconds(c, s, t, N * C * c.dtype_bytes.value);
      lc.fwd.tp_comm = lc.fwd.tp_exposed = cut;
      lc.bwd.tp_comm = lc.bwd.tp_exposed = 2 * cut;
    } else if (t.tp_overlap) {  // never more exposed than without the overlap (a short GEMM hides less than a chunk)
      lc.fwd.tp_exposed = std::min(one, overlapped_exposed(one, g, s.tp));
      lc.bwd.tp_exposed = 2 * std::min(one, overlapped_exposed(one, g, s.tp));
    }
    // The vocab-parallel cross-entropy needs every rank's row maxima, then the sums of exp and the target logits
    // (megatrain: two all-reduces of N and 2N floats); the loss waits for both, so nothing hides them.
    const double ce = allreduce_seconds(c, s.tp, 1, N * 4) + allreduce_seconds(c, s.tp, 1, 2 * N * 4);
    lc.fwd.tp_comm += ce;
    lc.fwd.tp_exposed += ce;
  }
  return lc;
}

}  // namespace mt::perf
