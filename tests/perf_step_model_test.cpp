// The performance model against independent checks:
//  * the pipeline simulation of the real schedules: 1F1B with uniform costs against the hand-derived
//    (pp - 1)(f + b) + m(f + b), and interleaved schedules with point-to-point time against the schedule's own
//    simulator in parallel/ (written separately, for the executor's tests); blocking transfers never faster;
//    the data-parallel stream (prefetched all-gather, last reduce-scatter exposed) against hand sums;
//  * collectives against their alpha-beta formulas; link classes from the layout;
//  * FLOPs of a layer against 6 N T + attention counted by hand for a small model, and against
//    ModelConfig::flops_per_token; GEMM wave quantization at known shapes;
//  * memory: ZeRO shards, parameter counts per stage adding up to the model's;
//  * monotonicity: no overlap switch, and no extra bandwidth, ever makes a step slower;
//  * the presets: every Table 3 step shortens the time per token;
//  * least squares: a known exponential recovered from exact data, the finite-difference Jacobian against the
//    analytic one, a minimum outside the box stopped at its bound;
//  * calibration: constants recovered from points the model itself generated with them; the shipped cluster's
//    [calibration] equals what --calibrate gives (a command, not a number typed in); the file round trip with the
//    source line; malformed sets refused naming the file and field;
//  * validation (regressions): the held-out Table 2 rows, Table 3's signs and order and the Korthikanti
//    leave-one-out errors against their bounds (docs/perf-model.md, "Validation");
//  * search: ranked, within memory, and never worse than a layout picked by hand;
//  * bad input: unknown cluster key, missing source, missing file, impossible layouts, named in the error.
#include <gtest/gtest.h>

#include <numeric>

#include <cmath>
#include <set>
#include <string>

#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"
#include "megatrain/parallel/schedule.h"
#include "megatrain/perf/calibration.h"
#include "megatrain/perf/cluster.h"
#include "megatrain/perf/collectives.h"
#include "megatrain/perf/compute_cost.h"
#include "megatrain/perf/least_squares.h"
#include "megatrain/perf/memory.h"
#include "megatrain/perf/pipeline_sim.h"
#include "megatrain/perf/presets.h"
#include "megatrain/perf/report.h"
#include "megatrain/perf/scale_costs.h"
#include "megatrain/perf/search.h"
#include "megatrain/perf/step_model.h"
#include "megatrain/perf/validation.h"
#include "megatrain/train/run_config.h"
#include "support/test_util.h"

using namespace mt;
using namespace mt::perf;
using mt::test::error_of;

namespace {

const std::string kA100 = std::string(MT_SOURCE_DIR) + "/configs/clusters/megascale-a100.toml";

// The datasheet model (the [calibration] constants neutral): the mechanism tests derive their answers by hand
// from the datasheet constants. The calibrated file is tested in perf_calibration_test.cpp.
Cluster a100() { return without_calibration(load_cluster(kA100)); }

perf::PipelineCosts uniform(const Schedule& s, double f, double b, double tc, bool overlap) {
  perf::PipelineCosts c;
  c.fwd.assign(s.stages(), f);
  c.bwd.assign(s.stages(), b);
  c.p2p_seconds = tc;
  c.p2p_overlap = overlap;
  return c;
}

// A small GPT whose FLOPs are counted by hand below.
ModelConfig small_model() {
  ModelConfig m;
  m.vocab_size = 512;
  m.n_layer = 8;
  m.n_head = 4;
  m.d_model = 64;
  m.max_seq_len = 32;
  return m;
}

Job small_job(const Cluster& c) {
  Job j;
  j.model = small_model();
  j.layout = Layout{2, 2, 2, 2, 4, 2, 32, {}};  // dp 2, pp 2, tp 2, v 2, 4 micro-batches of 2
  (void)c;
  return j;
}

}  // namespace

// ---- pipeline simulation ----------------------------------------------------------------------------------

TEST(PipelineSim, OneFOneBUniformCostsMatchTheHandDerivedMakespan) {
  for (int pp : {1, 2, 4, 8})
    for (int m : {8, 13, 32}) {
      const double f = 1.0, b = 2.0;
      const Schedule s = make_1f1b(pp, m);
      const PipelineResult r = simulate_pipeline(s, uniform(s, f, b, 0, true));
      // The last micro-batch's forward reaches the last stage after (pp-1) forwards of pipeline fill; its
      // backward returns through (pp-1) backwards: (pp-1)(f+b) of bubble on top of m(f+b) of work.
      EXPECT_DOUBLE_EQ(r.makespan, (pp - 1) * (f + b) + m * (f + b)) << "pp " << pp << " m " << m;
      for (int rank = 0; rank < pp; ++rank) EXPECT_DOUBLE_EQ(r.busy[rank], m * (f + b));
    }
}

TEST(PipelineSim, InterleavedWithTransfersMatchesTheScheduleSimulator) {
  // parallel/schedule.cpp's simulate() was written for the executor's tests, with the same transfer semantics
  // (a transfer starts when both ends have posted and lasts comm_time): an independent implementation.
  for (auto [pp, v, m] : {std::tuple{2, 2, 4}, std::tuple{4, 2, 8}, std::tuple{4, 3, 12}, std::tuple{8, 6, 16}})
    for (double tc : {0.0, 0.05, 0.7}) {
      const Schedule s = make_interleaved_1f1b(pp, v, m);
      const double f = 0.3, b = 0.55;
      const SimResult ref = mt::simulate(s, f, b, tc);
      const PipelineResult got = simulate_pipeline(s, uniform(s, f, b, tc, true));
      EXPECT_NEAR(got.makespan, ref.makespan, 1e-9) << pp << " " << v << " " << m << " tc " << tc;
      for (int r = 0; r < pp; ++r) EXPECT_EQ(got.peak_in_flight[r], ref.peak_in_flight[r]);
    }
}

TEST(PipelineSim, BlockingTransfersAreNeverFasterAndEqualWhenFree) {
  for (auto [pp, v, m] : {std::tuple{2, 1, 6}, std::tuple{4, 2, 8}, std::tuple{8, 3, 16}}) {
    const Schedule s = make_interleaved_1f1b(pp, v, m);
    const double over = simulate_pipeline(s, uniform(s, 1, 2, 0.2, true)).makespan;
    const double block = simulate_pipeline(s, uniform(s, 1, 2, 0.2, false)).makespan;
    EXPECT_GT(block, over);
    EXPECT_DOUBLE_EQ(simulate_pipeline(s, uniform(s, 1, 2, 0, false)).makespan,
                     simulate_pipeline(s, uniform(s, 1, 2, 0, true)).makespan);
  }
}

TEST(PipelineSim, DataParallelStreamPrefetchesTheFirstGatherAndExposesTheLastReduceScatter) {
  const Schedule s = make_1f1b(1, 1);  // one rank, one micro-batch: F then B
  auto c = uniform(s, 1.0, 2.0, 0, true);
  c.dp_all_gather = {{0.5}};
  c.dp_reduce_scatter = {{0.25}};
  EXPECT_DOUBLE_EQ(simulate_pipeline(s, c).makespan, 1.0 + 2.0 + 0.25);
  c.dp_prefetch_first = false;
  EXPECT_DOUBLE_EQ(simulate_pipeline(s, c).makespan, 0.5 + 1.0 + 2.0 + 0.25);
  // Two chunks: the second chunk's gather hides behind the first chunk's forwards when it is short enough.
  const Schedule s2 = make_interleaved_1f1b(2, 2, 2);
  auto c2 = uniform(s2, 1.0, 2.0, 0, true);
  const double base = simulate_pipeline(s2, c2).makespan;
  c2.dp_all_gather = {{0.1, 0.1}, {0.1, 0.1}};
  c2.dp_reduce_scatter = {{0.3, 0.3}, {0.3, 0.3}};
  EXPECT_DOUBLE_EQ(simulate_pipeline(s2, c2).makespan, base + 0.3);  // only the last reduce-scatter shows
}

TEST(PipelineSim, CostsThatDoNotFitTheScheduleAreRefused) {
  const Schedule s = make_1f1b(2, 2);
  perf::PipelineCosts c;
  c.fwd = {1.0};
  c.bwd = {1.0};
  EXPECT_NE(error_of([&] { simulate_pipeline(s, c); }).find("1 forward and 1 backward costs for 2 virtual stages"),
            std::string::npos);
  c = uniform(s, 1, -1, 0, true);
  EXPECT_NE(error_of([&] { simulate_pipeline(s, c); }).find("stage 0 has cost"), std::string::npos);
}

// ---- collectives ------------------------------------------------------------------------------------------

TEST(Collectives, RingAndTreeFollowTheirAlphaBetaFormulas) {
  const Link l{"test", 1e10, 1e-5};
  // ring all-reduce: 2(n-1)/n S/B + 2(n-1) alpha = 2*3/4*0.1 + 6e-5
  EXPECT_DOUBLE_EQ(ring_allreduce_seconds(4, 1e9, l), 0.15 + 6e-5);
  EXPECT_DOUBLE_EQ(ring_reduce_scatter_seconds(4, 1e9, l), 0.075 + 3e-5);
  EXPECT_DOUBLE_EQ(ring_all_gather_seconds(8, 8e8, l), 0.07 + 7e-5);
  EXPECT_DOUBLE_EQ(tree_allreduce_seconds(16, 1e9, l), 0.2 + 8e-5);  // 2 S/B + 2 log2(16) alpha
  EXPECT_DOUBLE_EQ(p2p_seconds(5e8, l), 0.05 + 1e-5);
  EXPECT_EQ(ring_allreduce_seconds(1, 1e9, l), 0);
}

TEST(Collectives, GroupsUseNvlinkInsideANodeAndTheNetworkAcrossNodes) {
  const Cluster c = a100();
  EXPECT_EQ(group_link(c, 8, 1).name, "nvlink");                              // tp 8 inside a node
  EXPECT_EQ(group_link(c, 8, 8).name, "network");                             // pp across nodes
  EXPECT_EQ(group_link(c, 2, 4).name, "nvlink");                              // 2 members 4 apart: still one node
  EXPECT_DOUBLE_EQ(group_link(c, 8, 8).bytes_per_s, c.nic_gbps.value * 1e9);  // one NIC per GPU
  EXPECT_EQ(members_per_node(c, 64, 2), 4);
  // Hierarchical all-reduce beats a flat ring over the network when several members share a node.
  const double flat = ring_allreduce_seconds(64, 1e9, group_link(c, 64, 2));
  EXPECT_LT(hierarchical_allreduce_seconds(c, 64, 4, 1e9), flat);
  EXPECT_LE(allreduce_seconds(c, 64, 2, 1e9), flat);
}

// ---- compute ----------------------------------------------------------------------------------------------

TEST(ComputeCost, LayerFlopsMatchSixNTPlusAttentionCountedByHand) {
  const Cluster c = a100();
  const ModelConfig m = small_model();  // C = 64, 4 heads of 16, F = 256, T = 32
  const Shape s{1, 2, 32};              // 2 sequences of 32 tokens, no tensor parallelism
  Techniques t;
  t.recompute = Recompute::None;
  const LayerCost lc = layer_cost(m, c, s, t);
  // Matmul weights per layer: qkv 3*64*64 + proj 64*64 + fc 256*64 + proj 64*256 = 49152; 64 tokens.
  const double gemm = 2.0 * 64 * 49152;  // 6291456 forward
  // Attention, causal: 528 = 32*33/2 (query, key) pairs per sequence, 2 matmuls of 2*16 FLOPs per pair per head.
  const double attn = 4.0 * 4 * 16 * 528 * 2;  // 270336 forward
  EXPECT_DOUBLE_EQ(lc.fwd.flops, gemm + attn);
  EXPECT_DOUBLE_EQ(lc.bwd.flops, 2 * gemm + 2.5 * attn);  // flash backward: 5 matmuls against 2
  // The GEMM part, summed over the layers with the LM head, is ModelConfig's 6N per token.
  const LayerCost head = head_cost(m, c, s, t);
  const double per_token = (m.n_layer * 3 * gemm + head.fwd.flops + head.bwd.flops) / 64;
  const double attn_model = 12.0 * m.n_layer * m.d_model * 32;  // full-T convention of flops_per_token
  EXPECT_DOUBLE_EQ(per_token + attn_model, m.flops_per_token(32));
  // A window shortens the attended pairs: 32 keys, window 8: 8*32 - 8*7/2 = 228.
  EXPECT_DOUBLE_EQ(attended_pairs(32, 8), 228);
  EXPECT_DOUBLE_EQ(attended_pairs(32, 0), 528);
}

TEST(ComputeCost, WaveQuantizationAtKnownShapes) {
  Cluster c = a100();                                         // 108 SMs, 256 x 128 tiles
  EXPECT_DOUBLE_EQ(wave_efficiency(c, 256 * 108, 128), 1.0);  // exactly one full wave
  // 109 tiles of 256 x 128 spill one tile into a second wave (109/216); laid the other way, 218 tiles of 128 x 256
  // fill 3 waves better (218/324), and the library takes the better layout.
  EXPECT_DOUBLE_EQ(wave_efficiency(c, 256 * 109, 128), 218.0 / 324);
  EXPECT_DOUBLE_EQ(wave_efficiency(c, 2048, 12288), 768.0 / 864);  // 8 x 96 tiles in 8 waves
  EXPECT_DOUBLE_EQ(wave_efficiency(c, 100, 100), 1.0 / 108);
}

TEST(ComputeCost, TensorParallelOverlapAndParallelBlockHideCommunication) {
  const Cluster c = a100();
  ModelConfig m = small_model();
  m.d_model = 1024;
  m.n_head = 16;
  const Shape s{8, 1, 32};
  Techniques t;
  const LayerCost plain = layer_cost(m, c, s, t);
  t.tp_overlap = true;
  const LayerCost over = layer_cost(m, c, s, t);
  EXPECT_LE(over.fwd.tp_exposed, plain.fwd.tp_exposed);
  EXPECT_LE(over.bwd.tp_exposed, plain.bwd.tp_exposed);
  EXPECT_DOUBLE_EQ(over.fwd.tp_comm, plain.fwd.tp_comm);  // the same traffic, less of it exposed
  m.block = BlockKind::Parallel;
  EXPECT_DOUBLE_EQ(layer_cost(m, c, s, t).fwd.tp_comm, plain.fwd.tp_comm / 2);  // one all-gather/reduce-scatter pair
  // The LM head too, even where its GEMM (the small model's: microseconds) is too short to hide a chunk.
  const ModelConfig tiny = small_model();
  EXPECT_LE(head_cost(tiny, c, s, t).fwd.tp_exposed, head_cost(tiny, c, s, Techniques{}).fwd.tp_exposed);
  EXPECT_LE(head_cost(tiny, c, s, t).bwd.tp_exposed, head_cost(tiny, c, s, Techniques{}).bwd.tp_exposed);
}

// ---- memory -----------------------------------------------------------------------------------------------

TEST(Memory, ZeroShardsAndPerStageParametersAddUp) {
  ModelConfig m = small_model();
  const Shape s{2, 2, 32};
  Techniques t;
  const MemoryBreakdown a = memory_per_gpu(m, s, t, 1, 2, 1, 2), b = memory_per_gpu(m, s, t, 4, 2, 1, 2);
  EXPECT_DOUBLE_EQ(a.optimizer, 12 * params_per_gpu(m, 2, 2, 0));  // fp32 master + 2 moments, one dp rank
  EXPECT_DOUBLE_EQ(b.optimizer, a.optimizer / 4);                  // sharded over dp 4
  EXPECT_DOUBLE_EQ(b.params, a.params);                            // weights are not sharded by ZeRO-2
  // Every stage's share x tp adds up to the model, plus the LM head's second copy of the tied embedding.
  double sum = 0;
  for (int r = 0; r < 4; ++r) sum += params_per_gpu(m, 1, 4, r);
  EXPECT_NEAR(sum, double(m.num_params()) + double(m.vocab_size) * m.d_model, 1.0);
  // One stage holds the tied matrix once: exactly the model.
  EXPECT_NEAR(params_per_gpu(m, 1, 1, 0), double(m.num_params()), 1.0);
  // Activations: full recomputation keeps 2/34 of selective's.
  Techniques full = t;
  full.recompute = Recompute::Full;
  EXPECT_DOUBLE_EQ(layer_activation_bytes(m, s, full) * 17, layer_activation_bytes(m, s, t));
}

// ---- the step model -----------------------------------------------------------------------------------------

TEST(StepModel, NoOverlapSwitchAndNoExtraBandwidthEverMakesAStepSlower) {
  const Cluster c = a100();
  for (Job j : {small_job(c), [&] {
                  Job x = small_job(c);
                  x.layout = Layout{4, 4, 1, 2, 8, 1, 32, {}};
                  return x;
                }()}) {
    double prev = predict(j, c).step_seconds;
    for (int k = 0; k < 4; ++k) {
      (k == 0 ? j.tech.tp_overlap : k == 1 ? j.tech.pp_overlap : k == 2 ? j.tech.dp_overlap : j.tech.misc) = true;
      const double now = predict(j, c).step_seconds;
      EXPECT_LE(now, prev * (1 + 1e-12)) << "switch " << k;
      prev = now;
    }
    Cluster fast = c;
    fast.nic_gbps.value *= 2;
    fast.nvlink_gbps.value *= 2;
    EXPECT_LE(predict(j, fast).step_seconds, predict(j, c).step_seconds);
  }
}

TEST(StepModel, BreakdownAddsUpToTheStepAndMfuFollowsFromIt) {
  const Cluster c = a100();
  const Job j = small_job(c);
  const Prediction p = predict(j, c);
  const Breakdown& b = p.breakdown;
  EXPECT_NEAR(b.compute + b.tp + b.pp + b.dp + b.bubble + b.optimizer + b.straggler + b.shared_cores + b.dp_sync +
                  b.interference,
              p.step_seconds, 1e-9 * p.step_seconds);
  const double tokens = double(j.layout.global_batch()) * j.layout.seq;
  EXPECT_DOUBLE_EQ(p.mfu, j.model.flops_per_token(32) * tokens / (p.step_seconds * 8 * c.peak_flops()));
  EXPECT_DOUBLE_EQ(p.tokens_per_second, tokens / p.step_seconds);
  EXPECT_DOUBLE_EQ(predict_step_seconds(j, c), p.step_seconds);
}

// Overlapped traffic still costs a calibrated share of its time (Cluster::overlap_interference). Oracle: with pp 1
// and tp 1 the only traffic is the dp reduce-scatter / all-gather, and what overlap hides is exactly what the same
// job without overlap waits for (its exposed dp time). A job that overlaps nothing pays nothing.
TEST(StepModel, OverlapInterferenceChargesItsShareOfTheHiddenTrafficAndNothingWithoutOverlap) {
  Cluster c = a100();
  c.straggler_node_fraction.value = c.gpu_speed_range.value = 0;  // no straggler term scaling the difference
  Job j;
  j.model = small_model();
  j.model.tied_embeddings = false;
  j.layout = Layout{4, 1, 1, 1, 4, 2, 32, {}};  // dp 4, 4 micro-batches of 2
  Job hidden = j;
  hidden.tech.dp_overlap = true;
  const double exposed_dp = predict(j, c).breakdown.dp;
  ASSERT_GT(exposed_dp, 0);
  for (double share : {0.25, 1.0}) {
    Cluster ci = c;
    ci.overlap_interference.value = share;
    const Prediction with = predict(hidden, ci), without = predict(hidden, c);
    EXPECT_NEAR(with.breakdown.interference, share * exposed_dp, 1e-12 + 1e-9 * exposed_dp) << share;
    EXPECT_NEAR(with.step_seconds - without.step_seconds, share * exposed_dp, 1e-9 * with.step_seconds) << share;
    // No overlap switched on: nothing is hidden, nothing is charged.
    EXPECT_EQ(predict(j, ci).breakdown.interference, 0.0) << share;
    EXPECT_DOUBLE_EQ(predict(j, ci).step_seconds, predict(j, c).step_seconds) << share;
  }
}

namespace {
// A CPU host of `cores` cores whose ranks talk over loopback: link latency L, bandwidth `gbps`, no stragglers.
Cluster cpu_host(int cores, double latency_us, double gbps) {
  Cluster c = a100();
  c.topology = "single-host";
  c.host_cores = {double(cores), "test"};
  c.nic_latency_us.value = c.nvlink_latency_us.value = latency_us;
  c.nic_gbps.value = c.nvlink_gbps.value = gbps;
  c.nics_per_node.value = c.gpus_per_node.value;
  c.straggler_node_fraction.value = c.straggler_slowdown.value = c.gpu_speed_range.value = 0;
  return c;
}
}  // namespace

TEST(StepModel, OnASaturatedCpuHostEveryTpCollectiveIsExposedAndEachPiecePaysTheLatency) {
  // Oracle: a hand count of megatrain's tp collectives for the sequential block with sequence parallelism, at
  // (almost) infinite bandwidth so that each costs its latency steps only. tp 2: a ring all-gather or
  // reduce-scatter is 1 step, an all-reduce 2.
  //   per layer: forward all-gather + reduce-scatter around attention and around the MLP (4); backward their
  //     conjugates (4) and the re-gather of the two sequence-parallel inputs for the weight gradients (2): 10;
  //   embedding: reduce-scatter forward, all-gather backward (2); head: all-gather forward, two backward (3);
  //   cross-entropy: two all-reduces per micro-batch (row maxima; sums);
  //   once a step, the replicated gradients summed: one all-reduce per layer, one for ln_f, one for wpe.
  const double L = 100e-6;
  const Cluster c = cpu_host(2, L * 1e6, 1e9);
  Job j;
  j.model = small_model();  // 8 layers, learned positions, LayerNorm with biases
  j.layout = Layout{1, 1, 2, 1, 1, 1, 32, {}};
  j.tech.tp_overlap = true;
  j.tech.tp_chunks = 1;
  const int layers = j.model.n_layer;
  const double steps_chunked = 10.0 * layers + 2 + 3, steps_allreduce = 2 * 2 + 2 * (layers + 2);
  const Prediction one = predict(j, c);
  EXPECT_NEAR(one.breakdown.tp, (steps_chunked + steps_allreduce) * L, 1e-3 * L);
  // Cut into 4 pieces, every chunked collective pays 3 more latencies; nothing else changes.
  j.tech.tp_chunks = 4;
  EXPECT_NEAR(predict(j, c).breakdown.tp - one.breakdown.tp, 3 * steps_chunked * L, 1e-3 * L);
  // Without the overlap switch megatrain does not cut them, and with nothing to hide behind, the result is the
  // same as one piece.
  j.tech.tp_overlap = false;
  EXPECT_NEAR(predict(j, c).breakdown.tp, one.breakdown.tp, 1e-9);
  // With a core to spare for communication (4 cores, 2 ranks) the GPU overlap model applies instead, which does not
  // price the pieces one by one: the chunk count no longer changes anything.
  j.tech.tp_overlap = true;
  const Cluster spare = cpu_host(4, L * 1e6, 1e9);
  j.tech.tp_chunks = 1;
  const double tp1 = predict(j, spare).breakdown.tp;
  j.tech.tp_chunks = 4;
  EXPECT_DOUBLE_EQ(predict(j, spare).breakdown.tp, tp1);
}

TEST(StepModel, RanksBeyondTheCoresTakeTurns) {
  // dp 2 with one core: both ranks' compute and optimizer run on it one after the other. Oracle: the same job
  // with a core per rank, whose breakdown gives each rank's compute and optimizer.
  Job j;
  j.model = small_model();
  j.layout = Layout{2, 1, 1, 1, 4, 2, 32, {}};
  const Cluster own = cpu_host(2, 10, 10), shared = cpu_host(1, 10, 10);
  const Prediction a = predict(j, own), b = predict(j, shared);
  EXPECT_EQ(a.breakdown.shared_cores, 0.0);
  const double work = 2 * (a.breakdown.compute + a.breakdown.optimizer);
  ASSERT_GT(work, a.step_seconds);  // the test's premise: one core is the bottleneck
  EXPECT_NEAR(b.step_seconds, work, 1e-9 * work);
  EXPECT_NEAR(b.breakdown.shared_cores, work - a.step_seconds, 1e-9 * work);
  EXPECT_NEAR(predict_step_seconds(j, shared), b.step_seconds, 1e-12 * work);
  // A GPU cluster never shares: host_cores is absent there. A single-host file keeps it through a round trip.
  EXPECT_EQ(a100().host_cores.value, 0.0);
  EXPECT_EQ(parse_cluster(to_toml(shared), "roundtrip").host_cores.value, 1.0);
}

TEST(StepModel, TheStepWaitsForTheSlowestGpuNotForTheSumOfSlowdowns) {
  // Oracle: the slowest of n healthy GPUs is sigma * sqrt(2 ln n) behind (sigma = range / 2.847, the expected
  // range of 8 normal draws); a faulty node that is slower still replaces that maximum, one that is faster does not
  // matter, and evicting faulty nodes (misc) leaves the healthy maximum.
  Cluster c = a100();
  const Job j = small_job(c);  // 8 GPUs on one node
  const double healthy = c.gpu_speed_range.value / 2.847 * std::sqrt(2 * std::log(8.0));
  auto share = [&](const Cluster& cl, bool misc) {
    Job x = j;
    x.tech.misc = misc;
    const Prediction p = predict(x, cl);
    return p.breakdown.straggler / (p.step_seconds - p.breakdown.straggler);
  };
  c.straggler_node_fraction.value = 1;  // the node is surely faulty
  c.straggler_slowdown.value = 0.10;
  ASSERT_GT(0.10, healthy);
  EXPECT_NEAR(share(c, false), 0.10, 1e-12);
  EXPECT_NEAR(share(c, true), healthy, 1e-12);
  c.straggler_slowdown.value = healthy / 2;
  EXPECT_NEAR(share(c, false), healthy, 1e-12);
  c.straggler_node_fraction.value = 0.5;  // faulty with probability 1/2, and then 2 x healthy
  c.straggler_slowdown.value = 2 * healthy;
  EXPECT_NEAR(share(c, false), 1.5 * healthy, 1e-12);
}

TEST(StepModel, ImpossibleLayoutsAreRefusedNamingTheProblem) {
  const Cluster c = a100();
  Job j = small_job(c);
  EXPECT_NE(error_of([&] {
              validate_job(j, c, 16);
            }).find("dp * parallel.pp * parallel.tp = 2 * 2 * 2 = 8 but --gpus is 16"),
            std::string::npos);
  j.layout.pp = 3;
  EXPECT_NE(error_of([&] { predict(j, c); })
                .find("model.n_layer = 8 is not divisible by parallel.pp * "
                      "parallel.virtual_stages = 3 * 2"),
            std::string::npos);
  j = small_job(c);
  j.layout.microbatches = 3;
  EXPECT_NE(error_of([&] { predict(j, c); }).find("parallel.microbatches (3) must be a multiple of parallel.pp (2)"),
            std::string::npos);
  j = small_job(c);
  j.layout.tp = 3;
  EXPECT_NE(error_of([&] { predict(j, c); }).find("tp"), std::string::npos);
  j = small_job(c);
  j.layout.seq = 64;
  EXPECT_NE(error_of([&] { predict(j, c); }).find("data.seq_len = 64"), std::string::npos);
}

// parallel.stage_layers in the model: the even split written out gives the same prediction to the bit; moving
// layers off the last stage, which also computes the LM head, keeps the work and the parameters (known answers)
// and shortens a head-heavy step (the busiest rank computes less).
TEST(StepModel, AnUnevenSplitMovesWorkOffTheHeadsStage) {
  const Cluster c = a100();
  Job j;
  j.model = small_model();
  j.model.vocab_size = 8192;  // a head of 8192 x 64 = 524k weights: about ten of the model's 50k-weight layers
  j.layout = Layout{1, 4, 1, 1, 16, 2, 32, {}};  // pp 4, 16 micro-batches of 2
  const Prediction even = predict(j, c);
  Job same = j;
  same.layout.stage_layers = {2, 2, 2, 2};
  EXPECT_EQ(predict(same, c).step_seconds, even.step_seconds);
  EXPECT_EQ(predict(same, c).memory.params, even.memory.params);
  Job moved = j;
  moved.layout.stage_layers = {3, 2, 2, 1};
  const Prediction m = predict(moved, c);
  EXPECT_LT(m.breakdown.compute, even.breakdown.compute);
  EXPECT_LT(m.step_seconds, even.step_seconds);
  // Rank 0 holds one layer more: its parameters grow by exactly one layer's; the ranks' sum stays the model's.
  const double layer = (params_per_gpu(j.model, 1, 4, 1) + params_per_gpu(j.model, 1, 4, 2)) / 4;
  EXPECT_NEAR(params_per_gpu(j.model, 1, 4, 0, 1, {3, 2, 2, 1}) - params_per_gpu(j.model, 1, 4, 0), layer, 1e-6);
  double sum_even = 0, sum_moved = 0;
  for (int r = 0; r < 4; ++r) {
    sum_even += params_per_gpu(j.model, 1, 4, r);
    sum_moved += params_per_gpu(j.model, 1, 4, r, 1, {3, 2, 2, 1});
  }
  EXPECT_NEAR(sum_moved, sum_even, 1e-6);
  moved.layout.stage_layers = {3, 2, 2};
  EXPECT_NE(error_of([&] { predict(moved, c); }).find("parallel.stage_layers has 3 entries"), std::string::npos);
}

// The balancer: a valid split (one count per stage, each >= 1, summing to n_layer) whose stages are never busier
// than the even split's, with the fewest layers on the head's stage; the simulated refinement never predicts a
// slower step than either start, and leaves a model without a heavy head on the even split.
TEST(StepModel, BalancedStageLayersOffloadTheHeadAndNeverPredictASlowerStep) {
  const Cluster c = a100();
  Job j;
  j.model = small_model();
  j.model.vocab_size = 8192;
  j.model.n_layer = 16;
  j.layout = Layout{1, 4, 1, 1, 16, 2, 32, {}};
  const std::vector<int> k = balanced_stage_layers(j, c);
  ASSERT_EQ(k.size(), 4u);
  EXPECT_EQ(std::accumulate(k.begin(), k.end(), 0), 16);
  EXPECT_EQ(*std::min_element(k.begin(), k.end()), k.back()) << "the head's stage gets the fewest layers";
  EXPECT_LT(k.back(), 4);
  const double even = predict(j, c).step_seconds;
  Job b = j;
  b.layout.stage_layers = k;
  EXPECT_LT(predict(b, c).breakdown.compute, predict(j, c).breakdown.compute);
  const std::vector<int> best = best_stage_layers(j, c);
  b.layout.stage_layers = best;
  const double best_s = predict(b, c).step_seconds;
  EXPECT_LT(best_s, even);
  Job bal = j;
  bal.layout.stage_layers = k;
  EXPECT_LE(best_s, predict(bal, c).step_seconds);
  // Interleaved: 2 chunks a rank, 8 virtual stages; the head sits on the last one.
  Job v2 = j;
  v2.layout.virtual_stages = 2;
  const std::vector<int> k2 = balanced_stage_layers(v2, c);
  ASSERT_EQ(k2.size(), 8u);
  EXPECT_EQ(std::accumulate(k2.begin(), k2.end(), 0), 16);
  EXPECT_EQ(k2.back(), 1);
  // A head that weighs little: the even split stays.
  Job light = j;
  light.model.vocab_size = 64;
  EXPECT_EQ(best_stage_layers(light, c), std::vector<int>(4, 4));
}

// ---- presets ----------------------------------------------------------------------------------------------

TEST(Presets, EveryTable3StepShortensTheTimePerToken) {
  // The qualitative claim of the ablation: each technique makes training faster. (The MFU of the SWA step can
  // fall in the model: the window also removes model FLOPs from the MFU numerator. docs/perf-model.md.)
  const RunConfig cfg = load_run_config(std::string(MT_SOURCE_DIR) + "/configs/megascale-175b.toml");
  const Cluster c = a100();
  const auto rows = megascale_table3(cfg.model);
  ASSERT_EQ(rows.size(), 9u);
  double prev = 1e300;
  for (const auto& r : rows) {
    const Prediction p = predict(r.job, c);
    const double per_token = p.step_seconds / (double(r.batch) * 2048);
    EXPECT_LT(per_token, prev) << r.label;
    prev = per_token;
  }
}

// ---- search and scale costs ---------------------------------------------------------------------------------

TEST(Search, RanksLayoutsWithinMemoryAndBeatsAHandPickedOne) {
  const Cluster c = a100();
  SearchOptions o;
  o.gpus = 16;
  o.global_batch = 32;
  o.seq = 32;
  const SearchResult r = search_layouts(small_model(), c, o);
  ASSERT_FALSE(r.ranked.empty());
  for (size_t i = 1; i < r.ranked.size(); ++i) EXPECT_LE(r.ranked[i - 1].step_seconds, r.ranked[i].step_seconds);
  for (const auto& cand : r.ranked) EXPECT_LE(cand.memory_bytes, c.memory_gib.value * double(1 << 30));
  Job hand;
  hand.model = small_model();
  hand.layout = Layout{2, 4, 2, 1, 16, 1, 32, {}};
  EXPECT_LE(r.ranked.front().step_seconds, predict(hand, c).step_seconds);
  o.memory_limit = 1024;  // 1 KiB: nothing fits
  EXPECT_NE(error_of([&] { search_layouts(small_model(), c, o); }).find("raise --mem-limit"), std::string::npos);
  try {
    search_layouts(small_model(), c, o);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind, ErrorKind::Config);  // exit code 10: the request cannot be met, not an internal failure
  }
}

// The search also tries depths that do not divide the layers (the balanced split), and where a layout splits evenly
// it keeps the balanced split only when that predicts a strictly shorter step (a tie keeps the even split). The
// oracle for each row: the step model on the same layout with the other split. Two setups: a small model whose
// head weighs several layers, on 6 GPUs (pp 3 and 6 cannot divide its 8 layers), and the 1.3B model on 8 H100s,
// where some balanced splits tie with the even one.
TEST(Search, TriesDepthsThatDoNotDivideTheLayersAndKeepsTheFasterSplit) {
  ModelConfig small = small_model();
  small.vocab_size = 32768;
  const ModelConfig big = load_run_config(std::string(MT_SOURCE_DIR) + "/configs/gpt-1.3b.toml").model;
  const Cluster h100 = load_cluster(std::string(MT_SOURCE_DIR) + "/configs/clusters/h100-sxm.toml");
  struct Setup {
    ModelConfig m;
    Cluster c;
    int gpus, batch, seq;
  };
  int uneven_depths = 0, rebalanced = 0, ties_kept_even = 0;
  for (const Setup& u : {Setup{small, a100(), 6, 36, 32}, Setup{big, h100, 8, 64, 2048}}) {
    SearchOptions o;
    o.gpus = u.gpus;
    o.global_batch = u.batch;
    o.seq = u.seq;
    const SearchResult r = search_layouts(u.m, u.c, o);
    EXPECT_GE(r.simulated, int(r.ranked.size()));
    for (const Candidate& cand : r.ranked) {
      const Layout& L = cand.job.layout;
      const int S = L.pp * L.virtual_stages;
      if (L.stage_layers.empty()) {
        EXPECT_EQ(u.m.n_layer % S, 0) << "an even split of " << u.m.n_layer << " layers over " << S << " stages";
        if (L.pp > 1) {  // the balanced split, had it been kept, would not be faster
          Job b = cand.job;
          b.layout.stage_layers = balanced_stage_layers(b, u.c);
          const double other = predict_step_seconds(b, u.c);
          EXPECT_LE(cand.step_seconds, other);
          ties_kept_even += b.layout.stage_layers != std::vector<int>(size_t(S), u.m.n_layer / S) &&
                            other == cand.step_seconds;
        }
        continue;
      }
      ASSERT_EQ(int(L.stage_layers.size()), S);
      int sum = 0;
      for (int k : L.stage_layers) {
        EXPECT_GE(k, 1);
        sum += k;
      }
      EXPECT_EQ(sum, u.m.n_layer);
      if (u.m.n_layer % S) {
        ++uneven_depths;
      } else {  // kept over the even split: strictly faster
        ++rebalanced;
        Job e = cand.job;
        e.layout.stage_layers.clear();
        EXPECT_LT(cand.step_seconds, predict_step_seconds(e, u.c));
      }
    }
  }
  EXPECT_GT(uneven_depths, 0) << "no layout whose depth does not divide the layers was ranked";
  EXPECT_GT(rebalanced, 0) << "the heavy head never made a balanced split win";
  EXPECT_GT(ties_kept_even, 0) << "no tie between the even and the balanced split was met";
}

TEST(ScaleCosts, QuadraticInitGrowsFasterAndAvailabilityFallsWithScale) {
  const Cluster c = a100();
  Layout small{4, 8, 8, 6, 192, 1, 2048, {}}, big{192, 8, 8, 6, 32, 1, 2048, {}};
  const GroupInitCost gs = group_init_cost(c, small), gb = group_init_cost(c, big);
  const double n_ratio = double(big.gpus()) / small.gpus();
  EXPECT_DOUBLE_EQ(gb.requests_linear / gs.requests_linear, n_ratio);
  EXPECT_GT(gb.requests_quadratic / gs.requests_quadratic, n_ratio * 10);
  const RunConfig cfg = load_run_config(std::string(MT_SOURCE_DIR) + "/configs/megascale-175b.toml");
  const CheckpointCost ks = checkpoint_cost(c, cfg.model, small), kb = checkpoint_cost(c, cfg.model, big);
  EXPECT_LT(kb.bytes_per_gpu, ks.bytes_per_gpu);  // the fp32 shard shrinks with dp
  EXPECT_LE(ks.recovery_seconds, ks.recovery_naive_seconds);
  const Availability as = availability(c, ks, gs, small.gpus()), ab = availability(c, kb, gb, big.gpus());
  EXPECT_GT(as.effective_fraction, ab.effective_fraction);
  EXPECT_GT(ab.effective_fraction, 0);
  EXPECT_LT(as.effective_fraction, 1);
}

// ---- cluster files ------------------------------------------------------------------------------------------

TEST(ClusterFile, ShippedFilesParseAndRoundTrip) {
  for (const char* f : {"megascale-a100", "h100-sxm", "h200"}) {
    const Cluster c = load_cluster(std::string(MT_SOURCE_DIR) + "/configs/clusters/" + f + ".toml");
    for (auto& [k, s] : c.constants()) EXPECT_FALSE(s.source.empty()) << f << " " << k;
    const Cluster back = parse_cluster(to_toml(c), "roundtrip");
    EXPECT_EQ(back.constants().size(), c.constants().size());
    EXPECT_NEAR(back.peak_tflops.value, c.peak_tflops.value, 1e-9);
    EXPECT_EQ(back.gemm.points.size(), c.gemm.points.size());
  }
}

TEST(ClusterFile, BadFilesAreRefusedNamingTheKey) {
  const std::string good = read_text_file(kA100);
  auto with = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return t.replace(at, from.size(), to);
  };
  EXPECT_NE(error_of([&] {
              parse_cluster(with("[gpu]\n", "[gpu]\npeak_tflop = { value = 1, source = \"x\" }\n"), "f.toml");
            }).find("f.toml: unknown key 'gpu.peak_tflop'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { parse_cluster(with("[gpu]\n", "[gpus]\n"), "f.toml"); }).find("unknown key 'gpus'"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              parse_cluster(with("hbm_gbps = { value = 2039, source", "hbm_gbps = { value = 2039, sourc"), "f.toml");
            }).find("f.toml: gpu.hbm_gbps: unknown field 'sourc'"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              parse_cluster(with("memory_bound = { value = 0.88", "memory_bound = { value = 1.88"), "f.toml");
            }).find("efficiency.memory_bound = 1.88 is out of range"),
            std::string::npos);
  const size_t at = good.find("nic_latency_us");
  std::string missing = good;
  missing.erase(at, missing.find('\n', at) - at + 1);
  EXPECT_NE(error_of([&] { parse_cluster(missing, "f.toml"); }).find("f.toml: network.nic_latency_us is missing"),
            std::string::npos);
  // A single-host cluster must say how many cores its ranks share; the GPU clusters need not.
  EXPECT_NE(error_of([&] {
              parse_cluster(with("topology = \"rail-clos\"", "topology = \"single-host\""), "f.toml");
            }).find("f.toml: gpu.host_cores is missing (a single-host cluster must say how many cores"),
            std::string::npos);
  EXPECT_EQ(parse_cluster(with("[gpu]\n", "[gpu]\nhost_cores = { value = 4, source = \"x\" }\n"), "f.toml")
                .host_cores.value,
            4.0);
  EXPECT_NE(error_of([] {
              load_cluster("/nonexistent/cluster.toml");
            }).find("cluster file /nonexistent/cluster.toml does not exist"),
            std::string::npos);
  try {
    load_cluster("/nonexistent/cluster.toml");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind, ErrorKind::Config);
  }
}

// ---- least squares ------------------------------------------------------------------------------------------

TEST(LeastSquares, RecoversAKnownExponentialFromExactData) {
  // y = 2.5 exp(-0.7 t) at t = 0..7; from (1, -0.1) the fit must land on (2.5, -0.7).
  std::vector<double> t, y;
  for (int i = 0; i < 8; ++i) t.push_back(i), y.push_back(2.5 * std::exp(-0.7 * i));
  auto r = [&](const std::vector<double>& x) {
    std::vector<double> out;
    for (size_t i = 0; i < t.size(); ++i) out.push_back(x[0] * std::exp(x[1] * t[i]) - y[i]);
    return out;
  };
  const LeastSquaresResult f = levenberg_marquardt(r, {1.0, -0.1}, {{0, 10}, {-5, 5}});
  EXPECT_TRUE(f.converged);
  EXPECT_NEAR(f.x[0], 2.5, 1e-6);
  EXPECT_NEAR(f.x[1], -0.7, 1e-6);
  EXPECT_LT(f.sum_squares, 1e-12);
}

TEST(LeastSquares, FiniteDifferenceJacobianMatchesTheAnalyticOne) {
  // r_i(a, b) = a exp(b t_i): dr/da = exp(b t), dr/db = a t exp(b t).
  const std::vector<double> t = {0.5, 1, 2, 3};
  auto r = [&](const std::vector<double>& x) {
    std::vector<double> out;
    for (double ti : t) out.push_back(x[0] * std::exp(x[1] * ti));
    return out;
  };
  const std::vector<double> x = {1.7, -0.3};
  const auto J = finite_difference_jacobian(r, x, {{-10, 10}, {-10, 10}});
  ASSERT_EQ(J.size(), t.size());
  for (size_t i = 0; i < t.size(); ++i) {
    EXPECT_NEAR(J[i][0], std::exp(x[1] * t[i]), 1e-7);
    EXPECT_NEAR(J[i][1], x[0] * t[i] * std::exp(x[1] * t[i]), 1e-7);
  }
}

TEST(LeastSquares, AMinimumOutsideTheBoxStopsAtTheBound) {
  auto r = [](const std::vector<double>& x) { return std::vector<double>{x[0] - 5, 0.5 * (x[0] - 5)}; };
  const LeastSquaresResult f = levenberg_marquardt(r, {0.5}, {{0, 2}});
  EXPECT_DOUBLE_EQ(f.x[0], 2);
  EXPECT_NE(error_of([&] { levenberg_marquardt(r, {0.5}, {{3, 2}}); }).find("empty bounds"), std::string::npos);
}

// ---- calibration --------------------------------------------------------------------------------------------

namespace {
const std::string kA100Set = std::string(MT_SOURCE_DIR) + "/configs/calibration/megascale-a100.json";

ModelConfig paper_model() { return load_run_config(std::string(MT_SOURCE_DIR) + "/configs/megascale-175b.toml").model; }
}  // namespace

TEST(Calibration, RecoversConstantsFromPointsTheModelGeneratedWithThem) {
  // The oracle: the model's own predictions with known constants stand in for measurements; a fit from the
  // neutral values on the datasheet cluster must find the constants again.
  const Cluster truth_base = a100();
  Cluster truth = truth_base;
  truth.gemm_efficiency_scale.value = 0.93;
  truth.nvlink_efficiency.value = 0.6;
  truth.network_efficiency.value = 0.7;
  truth.overlap_interference.value = 0.4;
  std::vector<MeasuredPoint> pts;
  for (const MeasuredPoint& p : published_points(paper_model()))
    if (p.id == "korthikanti/22B full" || p.id == "korthikanti/22B selective" || p.id == "korthikanti/175B full" ||
        p.id == "table2/megatron 256" || p.id == "table2/megascale 256" || p.id == "table2/megatron 512" ||
        p.id == "table3/baseline" || p.id == "table3/+ DP overlap") {
      MeasuredPoint m = p;
      m.mfu = 0;
      m.seconds = predict_step_seconds(p.job, truth);
      pts.push_back(m);
    }
  ASSERT_EQ(pts.size(), 8u);
  const CalibrationFit f = fit_calibration(truth_base, pts,
                                           {"gemm_efficiency_scale", "nvlink_efficiency", "network_efficiency",
                                            "overlap_interference"});
  EXPECT_NEAR(f.values[0], 0.93, 0.01);
  EXPECT_NEAR(f.values[1], 0.6, 0.01);
  EXPECT_NEAR(f.values[2], 0.7, 0.01);
  EXPECT_NEAR(f.values[3], 0.4, 0.01);
  for (auto& [id, e] : f.residuals) EXPECT_NEAR(e, 0, 1e-3) << id;
}

TEST(Calibration, ShippedConstantsAreWhatTheCommandFitsAndRoundTripWithTheirSource) {
  const Cluster shipped = load_cluster(kA100);
  const CalibrationSet set = load_calibration_set(kA100Set);
  const CalibrationFit f =
      fit_calibration(shipped, select_points(published_points(paper_model()), set.calibrate, set.path), set.fit);
  for (size_t i = 0; i < f.fit.size(); ++i)
    for (const CalibrationConstant& k : calibration_constants())
      if (f.fit[i] == k.name) {
        EXPECT_NEAR((shipped.*k.member).value, f.values[i], 1e-4 * std::max(1.0, f.values[i])) << k.name;
        EXPECT_NE((shipped.*k.member).source.find("fitted on configs/calibration/megascale-a100.json"),
                  std::string::npos)
            << k.name;
        EXPECT_NE((shipped.*k.member).source.find("residuals"), std::string::npos) << k.name;
      }
  // Round trip: the written file reads back with the same values and sources.
  const Cluster written = with_calibration(shipped, f, "set.json");
  const Cluster back = parse_cluster(to_toml(written), "roundtrip.toml");
  for (const CalibrationConstant& k : calibration_constants()) {
    EXPECT_NEAR((back.*k.member).value, (written.*k.member).value, 1e-5 * std::max(1.0, (written.*k.member).value));
    EXPECT_EQ((back.*k.member).source, (written.*k.member).source);
  }
  // Without [calibration] every constant is neutral and none is written.
  const Cluster neutral = parse_cluster(to_toml(without_calibration(shipped)), "n.toml");
  EXPECT_EQ(neutral.gemm_efficiency_scale.value, 1.0);
  EXPECT_EQ(neutral.dp_sync_s.value, 0.0);
  EXPECT_EQ(to_toml(neutral).find("[calibration]"), std::string::npos);
  EXPECT_NE(error_of([&] {
              parse_cluster(to_toml(shipped) + "bogus = { value = 1, source = \"x\" }\n", "f.toml");
            }).find("f.toml: unknown key 'calibration.bogus'"),
            std::string::npos);
}

TEST(Calibration, MalformedSetsAreRefusedNamingTheFileAndField) {
  const std::string ok = R"({"description": "d", "model": "m.toml", "fit": ["dp_sync_s"], "calibrate": ["a", "b"]})";
  EXPECT_EQ(parse_calibration_set(ok, "s.json").calibrate.size(), 2u);
  auto err = [](const std::string& text) { return error_of([&] { parse_calibration_set(text, "s.json"); }); };
  EXPECT_NE(err("{").find("s.json: not valid JSON"), std::string::npos);
  EXPECT_NE(err(R"({"description": "d", "model": "m", "fit": ["gemm"], "calibrate": ["a"]})")
                .find("s.json: fit: unknown constant 'gemm'"),
            std::string::npos);
  EXPECT_NE(err(R"({"description": "d", "model": "m", "fit": ["dp_sync_s", "dp_sync_s", "a", "b", "c"],
                    "calibrate": ["a"]})")
                .find("s.json: 'fit' names 5 constants; at most 4"),
            std::string::npos);
  EXPECT_NE(err(R"({"description": "d", "model": "m", "fit": ["dp_sync_s"]})").find("s.json: 'calibrate' must be"),
            std::string::npos);
  EXPECT_NE(err(R"({"description": "d", "model": "m", "fit": ["dp_sync_s"], "calibrate": ["a"], "x": 1})")
                .find("s.json: unknown field 'x'"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              select_points(published_points(paper_model()), {"table2/megatron 257"}, "s.json");
            }).find("s.json: calibrate: unknown point 'table2/megatron 257'"),
            std::string::npos);
}

// ---- validation: the held-out errors as regressions ---------------------------------------------------------

// The targets (issue 39) and, where the model misses one, the figure it reaches today: a regression bound that
// fails when a held-out error grows past it. docs/perf-model.md reports both; a bound moves towards its target
// when the model improves, never away from it.
struct HeldOutBounds {
  double table2_mean_points, table2_worst_points;
  int table3_signs_right;
  double loo_mean, loo_worst;
};
constexpr HeldOutBounds kTargets = {1.5, 3.0, 8, 0.0365, 0.0887};
constexpr HeldOutBounds kToday = {1.5, 3.85, 7, 0.0365, 0.0887};  // missed ones: see docs/perf-model.md

TEST(Validation, HeldOutErrorsStayWithinTheirTargetsOrTodaysFigures) {
  const Cluster c = load_cluster(kA100);
  const CalibrationSet set = load_calibration_set(kA100Set);
  const Validation v = validate(c, set, published_points(paper_model()));
  // The split: 12 calibration points, 22 held out (14 Table 2 rows, 8 Table 3 steps); nothing held out is in the set.
  int cal = 0, held_t2 = 0, held_t3 = 0;
  for (const PointResult& r : v.points) {
    cal += r.calibration;
    held_t2 += !r.calibration && r.point.group == "table2";
    held_t3 += !r.calibration && r.point.group == "table3";
  }
  EXPECT_EQ(cal, 12);
  EXPECT_EQ(held_t2, 14);
  EXPECT_EQ(held_t3, 8);
  EXPECT_EQ(v.leave_one_out.size(), 9u);
  auto bound = [](double target, double today) { return std::max(target, today); };
  EXPECT_LE(v.table2_held_out_mean_points, bound(kTargets.table2_mean_points, kToday.table2_mean_points));
  EXPECT_LE(v.table2_held_out_worst_points, bound(kTargets.table2_worst_points, kToday.table2_worst_points));
  EXPECT_GE(v.table3_signs_right, std::min(kTargets.table3_signs_right, kToday.table3_signs_right));
  EXPECT_EQ(v.table3_steps, 8);
  EXPECT_LE(v.loo_mean, bound(kTargets.loo_mean, kToday.loo_mean));
  EXPECT_LE(v.loo_worst, bound(kTargets.loo_worst, kToday.loo_worst));
  // The JSON carries every error and the summary.
  const auto j = to_json(v, c);
  EXPECT_EQ(j["calibration"].size(), 12u);
  EXPECT_EQ(j["held_out"].size(), 22u);
  EXPECT_TRUE(j["summary"]["korthikanti_mean_met"].get<bool>());
  for (const char* k : {"table2_held_out_mean_abs_mfu_points", "table3_signs_right", "table3_order_right",
                        "korthikanti_leave_one_out_mean_abs_error", "korthikanti_leave_one_out_worst_abs_error"})
    EXPECT_TRUE(j["summary"].contains(k)) << k;
}
