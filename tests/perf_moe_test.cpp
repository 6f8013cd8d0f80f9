// The performance model of mixture-of-experts layers and expert parallelism against independent checks:
//  * a MoE layer's FLOPs against a hand count (router, k routed SwiGLU experts, shared experts, attention), and the
//    step's model FLOPs (MFU's numerator) against the active parameters of Mixtral 8x7B counted by hand;
//  * the expert all-to-all against its formula written here (routed rows x (ep-1)/ep over the link bandwidth, plus
//    a latency per step), NVLink when tp x ep GPUs fit in a node and the network otherwise, 4 per layer and
//    micro-batch (6 with full recomputation), ep_overlap hiding them behind the shared experts and the router;
//  * ep = 1 is the replicated-expert case: no all-to-all, every expert's weights on every GPU, their optimizer state
//    over all of dp (hand counts); sharding the experts divides their weights by ep and their state by dp / ep, in
//    memory and in a checkpoint; hidden all-to-alls pay overlap_interference;
//  * a dense model carries no expert cost anywhere;
//  * --search: on Mixtral at a memory limit no replicated-expert layout can meet (hand bound), every layout it returns
//    has ep > 1; it never tries an ep that does not divide the experts;
//  * tensor parallelism (tp = 2, sequence parallel; the experts replicated over tp, each rank routing its own rows):
//    a MoE layer's FLOPs per rank, its all-to-all bytes per rank and link class, its tp collectives (the
//    attention's pair only), its activations and a rank's parameters, gradients and optimizer state, and the
//    replicated weights' gradient all-reduce over tp per step, each against a hand count;
//  * --search weighs tp against ep: every layout it returns is valid (tp divides the heads, ep the experts and dp)
//    and the explanation names the winner's tp and ep;
//  * bad input: ep not dividing dp or the experts, ep with a dense model, ep_overlap not a bool, a tp not dividing
//    the KV heads, each named in the error; the two configs load for training too, which names the CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "megatrain/core/error.h"
#include "megatrain/perf/calibration.h"
#include "megatrain/perf/cluster.h"
#include "megatrain/perf/collectives.h"
#include "megatrain/perf/compute_cost.h"
#include "megatrain/perf/memory.h"
#include "megatrain/perf/moe_cost.h"
#include "megatrain/perf/scale_costs.h"
#include "megatrain/perf/search.h"
#include "megatrain/perf/step_model.h"
#include "megatrain/train/run_config.h"
#include "support/test_util.h"

using namespace mt;
using namespace mt::perf;
using mt::test::error_of;

namespace {

const std::string kRoot = MT_SOURCE_DIR;
Cluster h100() { return without_calibration(load_cluster(kRoot + "/configs/clusters/h100-sxm.toml")); }
ModelConfig mixtral() { return load_run_config(kRoot + "/configs/mixtral-8x7b.toml", {}, ConfigUse::Simulate).model; }

// A small MoE model: 4 heads of 16 with 2 KV heads, 4 experts (top 2) of width 96, one shared expert.
ModelConfig small_moe() {
  ModelConfig m;
  m.vocab_size = 512;
  m.n_layer = 4;
  m.n_head = 4;
  m.n_kv_head = 2;
  m.d_model = 64;
  m.max_seq_len = 64;
  m.norm = NormKind::RmsNorm;
  m.mlp = MlpKind::SwiGlu;
  m.pos = PosKind::Rope;
  m.bias = false;
  m.moe_experts = 4;
  m.moe_top_k = 2;
  m.moe_d_ff = 96;
  m.moe_shared_experts = 1;
  m.validate();
  return m;
}

Job mixtral_job(int dp, int pp, int ep, int microbatches) {
  Job j;
  j.model = mixtral();
  j.layout = Layout{dp, pp, 1, 1, microbatches, 1, 4096, {}, ep};
  return j;
}

}  // namespace

TEST(MoeCompute, LayerFlopsAreAttentionRouterTopKExpertsAndSharedExpertsCountedByHand) {
  const ModelConfig m = small_moe();
  const Cluster c = h100();
  const Shape s{1, 2, 32};  // 64 tokens
  const double N = 64, C = 64, hd = 16;
  // Forward GEMMs, 2 FLOPs per multiply-add: q, k, v (4 + 2 + 2 heads of 16), the output projection, the router
  // (4 experts), 2 routed experts per token and 1 shared, each gate, up and down of 96 x 64.
  const double qkv = 2 * N * C * (8 * hd), proj = 2 * N * C * C, router = 2 * N * C * 4;
  const double experts = 2 * N * 3 * 96 * C * 2, shared = 2 * N * 3 * 96 * C * 1;
  // Causal attention: 4 FLOPs per head dim per visible (query, key) pair, 32 x 33 / 2 pairs per sequence.
  const double attn = 4 * 4 * hd * (32.0 * 33 / 2) * 2;
  const double gemm = qkv + proj + router + experts + shared;
  for (int ep : {1, 2, 4}) {
    Techniques t;
    const LayerCost lc = moe_layer_cost(m, c, s, t, ep);
    EXPECT_NEAR(lc.fwd.flops, gemm + attn, 1e-9 * gemm) << "ep " << ep;
    EXPECT_NEAR(lc.bwd.flops, 2 * gemm + 2.5 * attn, 1e-9 * gemm) << "ep " << ep;
  }
}

TEST(MoeCompute, StepFlopsAreMixtralsActiveParametersCountedByHand) {
  // Mixtral 8x7B per layer: q, k, v (4096 x (4096 + 2 x 1024)), output (4096 x 4096), the router (8 x 4096) and 2 of
  // the 8 experts (3 x 14336 x 4096 each); the LM head 32000 x 4096. Training FLOPs per token 6 x those, plus
  // attention 12 x layers x d_model x T (the convention of ModelConfig::flops_per_token: full T).
  const double per_layer = 4096.0 * 6144 + 4096.0 * 4096 + 8 * 4096 + 2 * 3 * 14336.0 * 4096;
  const double active = 32 * per_layer + 32000.0 * 4096;
  const double per_token = 6 * active + 12.0 * 32 * 4096 * 4096;
  Job j = mixtral_job(16, 4, 8, 64);
  const Cluster c = h100();
  const Prediction p = predict(j, c);
  const double tokens = 1024.0 * 4096;
  EXPECT_NEAR(p.model_flops_per_step, per_token * tokens, 1e-9 * per_token * tokens);
  EXPECT_NEAR(p.mfu, per_token * tokens / (p.step_seconds * 64 * 989e12), 1e-9);
  // Mixtral has 46,702,792,704 parameters (HF's config: 46.7B): per layer attention, norms, router and 8 experts,
  // plus untied embedding and head and the final norm.
  const double layer = 4096.0 * 6144 + 4096.0 * 4096 + 2 * 4096 + 8 * 4096 + 8 * 3 * 14336.0 * 4096;
  EXPECT_EQ(double(j.model.num_params()), 32 * layer + 2 * 32000.0 * 4096 + 4096);
}

TEST(MoeAllToAll, CostIsTheRoutedRowsOverTheLinkOfTheGroupsClass) {
  const Cluster c = h100();  // 8 GPUs a node; NVLink 370 GB/s, 5 us; one 45 GB/s NIC a GPU, 10 us
  const ModelConfig m = mixtral();
  const Shape s{1, 1, 4096};
  const double bytes = 4096.0 * 2 * 4096 * 2;  // tokens x top-k x d_model x bf16
  for (int ep : {2, 4, 8}) {                   // tp x ep <= 8: inside a node
    const double want = (ep - 1.0) / ep * bytes / 370e9 + (ep - 1) * 5e-6;
    EXPECT_NEAR(expert_all_to_all_seconds(m, c, s, ep), want, 1e-12) << "ep " << ep;
  }
  ModelConfig wide = m;
  wide.moe_experts = 64;
  for (int ep : {16, 64}) {  // beyond a node: the network
    const double want = (ep - 1.0) / ep * bytes / 45e9 + (ep - 1) * 10e-6;
    EXPECT_NEAR(expert_all_to_all_seconds(wide, c, s, ep), want, 1e-12) << "ep " << ep;
  }
  // The class follows tp x ep, as every group's does: 2 x 4 fits a node, 2 x 8 does not.
  EXPECT_EQ(group_link(c, 4, 2).name, "nvlink");
  EXPECT_EQ(group_link(c, 8, 2).name, "network");
  // Per layer and micro-batch: dispatch and combine forward, their gradients backward, and the forward's two again
  // under full recomputation; without ep_overlap every one is exposed.
  const double a2a = 7.0 / 8 * bytes / 370e9 + 7 * 5e-6;
  Techniques t;
  t.ep_overlap = false;
  LayerCost lc = moe_layer_cost(m, c, s, t, 8);
  EXPECT_NEAR(lc.fwd.ep_comm, 2 * a2a, 1e-12);
  EXPECT_NEAR(lc.bwd.ep_comm, 2 * a2a, 1e-12);
  EXPECT_NEAR(lc.fwd.ep_exposed, 2 * a2a, 1e-12);
  EXPECT_NEAR(lc.bwd.ep_exposed, 2 * a2a, 1e-12);
  // With ep_overlap, as megatrain runs the layer: the dispatch hides behind the shared experts' forward, the
  // backward's exchanges behind the shared experts' backward and the router's, each up to that compute's time. One
  // shared expert of width 14336 over the 4096 tokens: gate+up (4096 x 28672 x 4096), down (4096 x 4096 x 14336).
  ModelConfig shared = m;
  shared.moe_shared_experts = 1;
  const double N = 4096, C = 4096, F = 14336, E = 8;
  auto bwd = [&](double n, double out, double in) { return gemm_seconds(c, n, in, out) + gemm_seconds(c, out, in, n); };
  const double s_fwd = gemm_seconds(c, N, 2 * F, C) + gemm_seconds(c, N, C, F);
  const double s_bwd = bwd(N, 2 * F, C) + bwd(N, C, F), r_bwd = bwd(N, E, C);
  const ExpertOverlap o = expert_overlap_seconds(shared, c, s);
  EXPECT_NEAR(o.shared_fwd, s_fwd, 1e-15);
  EXPECT_NEAR(o.shared_bwd, s_bwd, 1e-15);
  EXPECT_NEAR(o.router_bwd, r_bwd, 1e-15);
  EXPECT_EQ(expert_overlap_seconds(m, c, s).shared_fwd, 0.0);  // Mixtral: no shared experts
  t.ep_overlap = true;
  lc = moe_layer_cost(shared, c, s, t, 8);
  EXPECT_NEAR(lc.fwd.ep_exposed, 2 * a2a - std::min(a2a, s_fwd), 1e-12);
  EXPECT_NEAR(lc.bwd.ep_exposed, 2 * a2a - std::min(a2a, s_bwd) - std::min(a2a, r_bwd), 1e-12);
  EXPECT_LT(lc.fwd.ep_exposed, 2 * a2a);  // the shared expert's GEMMs outlast nothing here: something is hidden
  t.recompute = Recompute::Full;
  lc = moe_layer_cost(shared, c, s, t, 8);
  EXPECT_NEAR(lc.bwd.ep_comm, 4 * a2a, 1e-12);
  // The recomputed forward's dispatch hides behind the shared experts' forward again.
  EXPECT_NEAR(lc.bwd.ep_exposed, 4 * a2a - std::min(a2a, s_fwd) - std::min(a2a, s_bwd) - std::min(a2a, r_bwd), 1e-12);
  // A host whose cores the ranks use up hides nothing.
  t.comm_overlaps_compute = false;
  EXPECT_NEAR(moe_layer_cost(shared, c, s, t, 8).bwd.ep_exposed, 4 * a2a, 1e-12);
}

TEST(MoeAllToAll, StepPaysTheExposedAllToAllsOfEveryMoeLayerAndMicroBatch) {
  // pp 1: the one rank runs all 32 MoE layers for each of 4 micro-batches, 4 all-to-alls each (selective).
  Job j = mixtral_job(8, 1, 8, 4);
  j.tech.recompute = Recompute::Full;  // 6 each
  j.tech.ep_overlap = false;
  const double bytes = 4096.0 * 2 * 4096 * 2, a2a = 7.0 / 8 * bytes / 370e9 + 7 * 5e-6;
  const Prediction p = predict(j, h100());
  EXPECT_NEAR(p.breakdown.ep, 32 * 4 * 6 * a2a, 1e-9);
  // With ep_overlap Mixtral (no shared experts) hides one backward exchange behind the router's backward only.
  j.tech.ep_overlap = true;
  const double router = expert_overlap_seconds(j.model, h100(), Shape{1, 1, 4096}).router_bwd;
  EXPECT_GT(router, 0.0);
  EXPECT_NEAR(predict(j, h100()).breakdown.ep, 32 * 4 * (6 * a2a - std::min(a2a, router)), 1e-9);
  EXPECT_LT(predict(j, h100()).step_seconds, p.step_seconds);
}

TEST(MoeAllToAll, HiddenAllToAllsPayTheOverlapInterferenceLikeOtherOverlappedTraffic) {
  // pp 1, tp 1, no dp overlap: the only traffic behind compute is the hidden all-to-alls, 32 layers x 4 micro-batches,
  // each hiding min(all-to-all, the router's backward) (Mixtral has no shared experts); the step pays
  // overlap_interference of them.
  Cluster c = h100();
  c.overlap_interference.value = 0.4;
  Job j = mixtral_job(8, 1, 8, 4);
  j.tech.recompute = Recompute::Full;
  j.tech.ep_overlap = true;
  const double bytes = 4096.0 * 2 * 4096 * 2, a2a = 7.0 / 8 * bytes / 370e9 + 7 * 5e-6;
  const double hidden = std::min(a2a, expert_overlap_seconds(j.model, c, Shape{1, 1, 4096}).router_bwd);
  const Prediction p = predict(j, c);
  EXPECT_NEAR(p.breakdown.interference, 0.4 * 32 * 4 * hidden, 1e-9);
  EXPECT_NEAR(p.breakdown.ep, 32 * 4 * (6 * a2a - hidden), 1e-9);
}

TEST(ExpertParallel, EpOneIsTheReplicatedExpertCase) {
  const ModelConfig m = mixtral();
  const Cluster c = h100();
  // No all-to-all at ep 1: every rank holds every expert.
  EXPECT_EQ(expert_all_to_all_seconds(m, c, Shape{1, 1, 4096}, 1), 0.0);
  const Prediction p = predict(mixtral_job(16, 4, 1, 64), c);
  EXPECT_EQ(p.breakdown.ep, 0.0);
  // Memory of pipeline rank 0 (layers 0-7 and the embedding), by hand: every parameter whole on every GPU, bf16
  // weights and fp32 gradients, the optimizer's 12 bytes a parameter over all 16 dp ranks. (The final norm's 4096
  // are spread over the layers, a 32nd each, as the dense model's accounting does.)
  const double experts = 8 * (8 * 3 * 14336.0 * 4096);
  const double dense = 8 * (4096.0 * 6144 + 4096.0 * 4096 + 2 * 4096 + 8 * 4096 + 4096.0 / 32) + 32000.0 * 4096;
  const MemoryBreakdown one = memory_per_gpu(m, Shape{1, 1, 4096}, Techniques{}, 16, 4, 1, 4, {}, 1);
  EXPECT_NEAR(one.params, 2 * (dense + experts), 1);
  EXPECT_NEAR(one.grads, 4 * (dense + experts), 1);
  EXPECT_NEAR(one.optimizer, 12 * (dense + experts) / 16, 1);
  EXPECT_NEAR(one.experts, 6 * experts + 12 * experts / 16, 1);
  // ep 8: each GPU holds one expert of each layer, whose optimizer state is sharded over the 16 / 8 = 2 GPUs holding
  // the same expert.
  const MemoryBreakdown eight = memory_per_gpu(m, Shape{1, 1, 4096}, Techniques{}, 16, 4, 1, 4, {}, 8);
  EXPECT_NEAR(eight.params, 2 * (dense + experts / 8), 1);
  EXPECT_NEAR(eight.optimizer, 12 * dense / 16 + 12 * (experts / 8) / 2, 1);
  EXPECT_EQ(eight.activations, one.activations);
  // A checkpoint of the fullest GPU holds the same weights and optimizer shard (ranks 0 and 3, with the embedding
  // and the untied head, tie).
  const Layout L{16, 4, 1, 1, 64, 1, 4096, {}, 8};
  EXPECT_NEAR(checkpoint_cost(c, m, L).bytes_per_gpu, eight.params + eight.optimizer, 1);
  EXPECT_NEAR(checkpoint_cost(c, m, L).bytes_per_gpu, 2 * (dense + experts / 8) + 12 * dense / 16 + 12 * experts / 16,
              1);
}

TEST(ExpertParallel, ActivationsKeepTheRoutedRows) {
  // One MoE layer of the small model, selective recomputation, by hand (bytes): attention and norms 15 N C, the
  // MoE input 2 N C, routed rows 2 N k C, gate / up / product 6 N k F, expert outputs 2 N k C, fp32 router scores
  // 4 N E, shared hidden 6 N S F, dropout mask N C.
  const ModelConfig m = small_moe();
  const double N = 64, C = 64, k = 2, F = 96, E = 4, S = 1;
  const double want = 15 * N * C + 2 * N * C + 2 * N * k * C + 6 * N * k * F + 2 * N * k * C + 4 * N * E +
                      6 * N * S * F + N * C;
  EXPECT_NEAR(moe_layer_activation_bytes(m, Shape{1, 2, 32}, Techniques{}), want, 1e-6);
  Techniques full;
  full.recompute = Recompute::Full;
  EXPECT_NEAR(moe_layer_activation_bytes(m, Shape{1, 2, 32}, full), 2 * N * C, 1e-6);
}

TEST(ExpertParallel, DenseModelsCarryNoExpertCost) {
  ModelConfig m;  // GPT-2 small
  const Cluster c = h100();
  const LayerCost lc = layer_cost(m, c, Shape{1, 4, 1024}, Techniques{});
  EXPECT_EQ(lc.fwd.ep_comm + lc.bwd.ep_comm + lc.fwd.ep_exposed + lc.bwd.ep_exposed, 0.0);
  EXPECT_EQ(lc.fwd.total(), lc.fwd.compute + lc.fwd.tp_exposed);
  Job j;
  j.model = m;
  j.layout = Layout{4, 2, 2, 1, 8, 4, 1024, {}};
  const Prediction p = predict(j, c);
  EXPECT_EQ(p.breakdown.ep, 0.0);
  EXPECT_EQ(p.memory.experts, 0.0);
  EXPECT_EQ(p.memory_rank, 0);
  EXPECT_EQ(expert_parallel_sizes(m, 16), std::vector<int>{1});
}

TEST(ExpertParallelSearch, ChoosesEpAboveOneWhenReplicatedExpertsCannotFit) {
  // Mixtral on 256 GPUs. Without expert parallelism a GPU holds every expert of its layers; with at most 32
  // pipeline stages (one layer each) that is 8 experts x 3 x 14336 x 4096 = 1.409e9 parameters, 6 bytes each
  // (bf16 weights, fp32 gradients) before any optimizer state or activation: 7.87 GiB. The limit leaves 7.2 GiB.
  const double replicated_floor = 6 * 8 * 3 * 14336.0 * 4096;
  SearchOptions o;
  o.gpus = 256;
  o.global_batch = 1024;
  o.seq = 4096;
  o.memory_limit = 8.0 * (1 << 30);
  ASSERT_GT(replicated_floor, o.memory_limit * (1 - o.memory_reserve));
  const SearchResult r = search_layouts(mixtral(), h100(), o);
  ASSERT_FALSE(r.ranked.empty());
  for (const Candidate& cand : r.ranked) {
    EXPECT_GT(cand.job.layout.ep, 1);
    EXPECT_EQ(8 % cand.job.layout.ep, 0);
    EXPECT_EQ(cand.job.layout.dp % cand.job.layout.ep, 0);
    EXPECT_LE(cand.memory_bytes, o.memory_limit * (1 - o.memory_reserve));
  }
  EXPECT_NE(explain(r, h100()).find("no layout with ep 1"), std::string::npos);
  // With room for the replicated experts, ep 1 layouts are searched too.
  o.memory_limit = 200.0 * (1 << 30);
  bool ep1 = false;
  for (const Candidate& cand : search_layouts(mixtral(), h100(), o).ranked) ep1 = ep1 || cand.job.layout.ep == 1;
  EXPECT_TRUE(ep1);
}

TEST(ExpertParallelSearch, TriesOnlyEpsDividingBothDpAndTheExperts) {
  EXPECT_EQ(expert_parallel_sizes(mixtral(), 48), (std::vector<int>{1, 2, 4, 8}));
  EXPECT_EQ(expert_parallel_sizes(mixtral(), 12), (std::vector<int>{1, 2, 4}));
  SearchOptions o;
  o.gpus = 128;
  o.global_batch = 256;
  o.seq = 4096;
  const SearchResult r = search_layouts(mixtral(), h100(), o);
  for (const Candidate& cand : r.ranked) EXPECT_EQ(8 % cand.job.layout.ep, 0) << "ep " << cand.job.layout.ep;
}

TEST(ExpertParallelBadInput, ImpossibleLayoutsAreNamed) {
  const Cluster c = h100();
  Job j = mixtral_job(8, 4, 3, 8);
  EXPECT_NE(error_of([&] { validate_job(j, c); }).find("parallel.ep = 3 must divide parallel.dp = 8"),
            std::string::npos);
  j = mixtral_job(16, 4, 16, 8);
  EXPECT_NE(error_of([&] { validate_job(j, c); }).find("parallel.ep = 16 must divide model.moe_experts = 8"),
            std::string::npos);
  j = mixtral_job(8, 4, 8, 8);
  j.layout.tp = 16;  // Mixtral has 8 KV heads
  EXPECT_NE(error_of([&] { validate_job(j, c); }).find("must be divisible by parallel.tp (16)"), std::string::npos);
  Job dense;
  dense.layout = Layout{4, 1, 1, 1, 1, 1, 1024, {}, 2};
  EXPECT_NE(error_of([&] { validate_job(dense, c); }).find("parallel.ep = 2 needs a mixture-of-experts model"),
            std::string::npos);
}

TEST(ExpertParallelBadInput, TheSimulateConfigsAreTrainableLayoutsAndWhatTrainingCannotRunIsNamed) {
  for (const char* cfg : {"/configs/mixtral-8x7b.toml", "/configs/deepseek-v3.toml"}) {
    const std::string path = kRoot + cfg;
    EXPECT_NO_THROW(load_run_config(path, {}, ConfigUse::Simulate)) << cfg;
    // MoE trains under dp, ep, tp and pp on the CPU: the layouts load for training too; on the CUDA device (one
    // process or dp only, with MoE) their ep and pp are refused, naming the device.
    EXPECT_NO_THROW(load_run_config(path)) << cfg;
    const std::string e = error_of([&] { load_run_config(path, {"train.device=cuda"}); });
    EXPECT_NE(e.find("train.device"), std::string::npos) << e;
  }
  const std::string tiny = kRoot + "/configs/tiny.toml";
  EXPECT_NE(error_of([&] {
              load_run_config(tiny, {"parallel.ep=2"}, ConfigUse::Simulate);
            }).find("parallel.ep = 2 shards the experts of a mixture-of-experts model, and this one has none"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              load_run_config(kRoot + "/configs/mixtral-8x7b.toml", {"parallel.ep_overlap=2"});
            }).find("parallel.ep_overlap must be true or false"),
            std::string::npos);
}

TEST(MoeTensorParallel, LayerFlopsPerRankAreTheAttentionShareAndTheMoeOnTheRanksRowsCountedByHand) {
  // tp 2 over the small model: each rank computes half the heads (2 of 4: q, k, v of 4 + 2 + 2 heads of 16, split)
  // and, on its own 32 of the 64 tokens, the router (4 experts), 2 routed experts and 1 shared expert per token,
  // each gate, up and down of 96 x 64.
  const ModelConfig m = small_moe();
  const Cluster c = h100();
  const Shape s{2, 2, 32};
  const double N = 64, rows = 32, C = 64, hd = 16;
  const double qkv = 2 * N * C * (8 * hd / 2), proj = 2 * N * C * (C / 2), router = 2 * rows * C * 4;
  const double experts = 2 * rows * 3 * 96 * C * 2, shared = 2 * rows * 3 * 96 * C * 1;
  const double attn = 4 * 2 * hd * (32.0 * 33 / 2) * 2;
  const double gemm = qkv + proj + router + experts + shared;
  for (int ep : {1, 2, 4}) {
    const LayerCost lc = moe_layer_cost(m, c, s, Techniques{}, ep);
    EXPECT_NEAR(lc.fwd.flops, gemm + attn, 1e-9 * gemm) << "ep " << ep;
    EXPECT_NEAR(lc.bwd.flops, 2 * gemm + 2.5 * attn, 1e-9 * gemm) << "ep " << ep;
  }
  // The MoE needs no all-gather before it nor reduce-scatter after it: only the attention's pair remains, an
  // all-gather of the 64 x 64 bf16 stream over 2 ranks on NVLink ((n-1)/n x bytes / 370 GB/s + 5 us) each, 2
  // forward and 3 backward (the input re-gathered for the weight gradient); the dense layer has twice as many.
  const double one = 0.5 * N * C * 2 / 370e9 + 5e-6;
  const LayerCost lc = moe_layer_cost(m, c, s, Techniques{}, 2);
  EXPECT_NEAR(lc.fwd.tp_comm, 2 * one, 1e-15);
  EXPECT_NEAR(lc.bwd.tp_comm, 3 * one, 1e-15);
  EXPECT_NEAR(layer_cost(m, c, s, Techniques{}).fwd.tp_comm, 4 * one, 1e-15);
}

TEST(MoeTensorParallel, AllToAllCarriesTheRanksRowsWithinItsTpCoordinate) {
  // Mixtral, tp 2: a rank dispatches its 2,048 sequence-parallel tokens x top 2 x d_model in bf16. Its ep group is
  // the ranks of its tp coordinate, 2 apart: 2 x 4 GPUs fit a node of 8 (NVLink), 2 x 8 do not (the network).
  const Cluster c = h100();
  const ModelConfig m = mixtral();
  const Shape s{2, 1, 4096};
  const double bytes = 2048.0 * 2 * 4096 * 2;
  EXPECT_NEAR(expert_all_to_all_seconds(m, c, s, 4), 3.0 / 4 * bytes / 370e9 + 3 * 5e-6, 1e-12);
  EXPECT_NEAR(expert_all_to_all_seconds(m, c, s, 8), 7.0 / 8 * bytes / 45e9 + 7 * 10e-6, 1e-12);
}

TEST(MoeTensorParallel, MemoryReplicatesTheMoeWeightsOverTpAndKeepsTheRanksRoutedRows) {
  // Mixtral, dp 8 x pp 4 x tp 2, ep 8; pipeline rank 0 (layers 0-7 and the embedding), by hand. Split over tp: the
  // attention, the norms (the final norm's 4096 spread over the layers as in the dense accounting) and the
  // embedding's rows; whole on every tp rank: the router, and 8 / ep = 1 expert of each layer.
  const ModelConfig m = mixtral();
  const double experts = 8 * (8 * 3 * 14336.0 * 4096);
  const double dense = 8 * ((4096.0 * 6144 + 4096.0 * 4096 + 2 * 4096 + 4096.0 / 32) / 2 + 8 * 4096) +
                       32000.0 * 4096 / 2;
  const MemoryBreakdown b = memory_per_gpu(m, Shape{2, 1, 4096}, Techniques{}, 8, 4, 1, 4, {}, 8);
  EXPECT_NEAR(b.params, 2 * (dense + experts / 8), 1);
  EXPECT_NEAR(b.grads, 4 * (dense + experts / 8), 1);
  // The dense state over dp 8; the expert's over dp / ep = 1 (no other rank of the tp coordinate holds it).
  EXPECT_NEAR(b.optimizer, 12 * dense / 8 + 12 * experts / 8, 1);
  EXPECT_NEAR(b.experts, 6 * experts / 8 + 12 * experts / 8, 1);
  // A layer's activations on a rank: the tp 1 count (ActivationsKeepTheRoutedRows) over its 32 of the 64 rows.
  const ModelConfig sm = small_moe();
  const double N = 64, C = 64, k = 2, F = 96, E = 4, S = 1;
  const double whole = 15 * N * C + 2 * N * C + 2 * N * k * C + 6 * N * k * F + 2 * N * k * C + 4 * N * E +
                       6 * N * S * F + N * C;
  EXPECT_NEAR(moe_layer_activation_bytes(sm, Shape{2, 2, 32}, Techniques{}), whole / 2, 1e-6);
  Techniques full;
  full.recompute = Recompute::Full;
  EXPECT_NEAR(moe_layer_activation_bytes(sm, Shape{2, 2, 32}, full), N * C, 1e-6);
}

TEST(MoeTensorParallel, StepSumsTheReplicatedMoeGradientsOverTpOncePerLayer) {
  // Mixtral, dp 8 x tp 2, pp 1, ep 8, 2 micro-batches. Once a step each layer all-reduces over tp (NVLink ring of 2:
  // bytes / 370 GB/s + 2 x 5 us) the fp32 gradients of its replicated tensors: 2 norms, the router, and the one
  // expert of 3 x 14336 x 4096 it holds; the final norm once more. They count as exposed tp time, after the
  // layers' own exposed tp collectives (their 2 micro-batches, with the embedding's and the head's).
  const Cluster c = h100();
  Job j;
  j.model = mixtral();
  j.layout = Layout{8, 1, 2, 1, 2, 1, 4096, {}, 8};
  const double layer = 4 * (2 * 4096 + 8 * 4096 + 3 * 14336.0 * 4096);
  const double sync = 32 * (layer / 370e9 + 2 * 5e-6) + (4 * 4096.0 / 370e9 + 2 * 5e-6);
  const Shape s{2, 1, 4096};
  auto exposed = [](const LayerCost& x) { return x.fwd.tp_exposed + x.bwd.tp_exposed; };
  const double per_microbatch = 32 * exposed(moe_layer_cost(j.model, c, s, j.tech, 8)) +
                                exposed(embedding_cost(j.model, c, s, j.tech)) +
                                exposed(head_cost(j.model, c, s, j.tech));
  EXPECT_NEAR(predict(j, c).breakdown.tp, 2 * per_microbatch + sync, 1e-9);
}

TEST(MoeTensorParallelSearch, WeighsTpAgainstEpAndReturnsOnlyValidLayouts) {
  SearchOptions o;
  o.gpus = 64;
  o.global_batch = 256;
  o.seq = 4096;
  const ModelConfig m = mixtral();
  const SearchResult r = search_layouts(m, h100(), o);
  ASSERT_FALSE(r.ranked.empty());
  bool tp_above_one = false;
  for (const Candidate& cand : r.ranked) {
    const Layout& L = cand.job.layout;
    EXPECT_EQ(L.dp * L.pp * L.tp, 64);
    EXPECT_EQ(m.n_head % L.tp, 0) << "tp " << L.tp;
    EXPECT_EQ(m.kv_heads() % L.tp, 0) << "tp " << L.tp;
    EXPECT_EQ(m.moe_experts % L.ep, 0) << "ep " << L.ep;
    EXPECT_EQ(L.dp % L.ep, 0) << "ep " << L.ep << " dp " << L.dp;
    tp_above_one = tp_above_one || L.tp > 1;
  }
  EXPECT_TRUE(tp_above_one);
  const Layout& best = r.ranked.front().job.layout;
  const std::string why = explain(r, h100());
  EXPECT_NE(why.find(fmt::format("tp {} x ep {} ", best.tp, best.ep)), std::string::npos) << why;
}
