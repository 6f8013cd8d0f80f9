// The scale costs (perf/scale_costs.h) against known answers:
//  * store requests of small 3D layouts against a brute-force enumeration of the groups as rank sets;
//  * seconds = requests x the per-request cost of the cluster's [scale] section;
//  * checkpoint bytes, stall, persist and recovery of a hand-counted tiny GPT-2 shape;
//  * where each figure's constants come from: the shipped clusters' store constants are measured by our own
//    bench_mesh_init (not set from the paper's group-init figures they are compared with), and a cluster whose store
//    constants cite the paper is reported as not being a check.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "megatrain/perf/cluster.h"
#include "megatrain/perf/scale_costs.h"

using namespace mt;
using namespace mt::perf;

namespace {

const std::string kClusters = std::string(MT_SOURCE_DIR) + "/configs/clusters/";

Cluster a100() { return load_cluster(kClusters + "megascale-a100.toml"); }

// The groups of a dp x pp x tp grid as explicit rank sets (rank = (d * pp + p) * tp + t), one set per kind.
struct Enumerated {
  double groups = 0, memberships = 0;
};
Enumerated enumerate_groups(int dp, int pp, int tp) {
  auto rank = [&](int d, int p, int t) { return (d * pp + p) * tp + t; };
  std::set<std::vector<int>> tp_g, pp_g, dp_g, emb_g;
  for (int d = 0; d < dp; ++d)
    for (int p = 0; p < pp; ++p)
      for (int t = 0; t < tp; ++t) {
        std::vector<int> a, b, c;
        for (int x = 0; x < tp; ++x) a.push_back(rank(d, p, x));
        for (int x = 0; x < pp; ++x) b.push_back(rank(d, x, t));
        for (int x = 0; x < dp; ++x) c.push_back(rank(x, p, t));
        tp_g.insert(a);
        pp_g.insert(b);
        dp_g.insert(c);
        if (pp > 1) emb_g.insert({rank(d, 0, t), rank(d, pp - 1, t)});
      }
  Enumerated e;
  for (const auto* kind : {&tp_g, &pp_g, &dp_g, &emb_g}) {
    e.groups += static_cast<double>(kind->size());
    for (const auto& g : *kind) e.memberships += static_cast<double>(g.size());
  }
  return e;
}

}  // namespace

TEST(ScaleCosts, GroupInitRequestsMatchAnEnumerationOfTheGroups) {
  const Cluster c = a100();
  for (auto [dp, pp, tp] : std::vector<std::tuple<int, int, int>>{{2, 2, 2}, {4, 1, 2}, {3, 4, 2}, {1, 8, 1}}) {
    const Layout L{dp, pp, tp, 1, 1, 1, 1024, {}};
    const Enumerated e = enumerate_groups(dp, pp, tp);
    const GroupInitCost g = group_init_cost(c, L);
    EXPECT_DOUBLE_EQ(g.groups, e.groups) << dp << "x" << pp << "x" << tp;
    // Every rank joins every group's creation (torch's new_group and its world barrier) ...
    EXPECT_DOUBLE_EQ(g.requests_quadratic, L.gpus() * e.groups) << dp << "x" << pp << "x" << tp;
    // ... against a set and a get per group a rank is a member of.
    EXPECT_DOUBLE_EQ(g.requests_linear, 2 * e.memberships) << dp << "x" << pp << "x" << tp;
  }
  // By hand, tp2 pp2 dp2: 4 tp + 4 pp + 4 dp + 4 embedding groups = 16; 8 x 16 = 128 requests; memberships
  // 8 ranks x 3 + 4 embedding groups x 2 = 32, so 64 requests.
  const GroupInitCost g = group_init_cost(c, Layout{2, 2, 2, 1, 1, 1, 1024, {}});
  EXPECT_EQ(g.groups, 16);
  EXPECT_EQ(g.requests_quadratic, 128);
  EXPECT_EQ(g.requests_linear, 64);
}

TEST(ScaleCosts, GroupInitSecondsAreRequestsTimesThePerRequestCost) {
  Cluster c = a100();
  c.store_op_us.value = 10;
  c.store_async_op_us.value = 4;
  const GroupInitCost g = group_init_cost(c, Layout{2, 2, 2, 1, 1, 1, 1024, {}});  // 128 and 64 requests (above)
  EXPECT_NEAR(g.seconds_quadratic, 128 * 10e-6, 1e-15);
  EXPECT_NEAR(g.seconds_async, 128 * 4e-6, 1e-15);
  EXPECT_NEAR(g.seconds_linear, 64 * 4e-6, 1e-15);
}

TEST(ScaleCosts, CheckpointBytesAndSecondsOfAHandCountedModel) {
  // GPT-2 shape, vocab 64 (no padding), d 8, 2 layers, 16 positions, tied head: 64*8 + 16*8 + 2*(12*64 + 13*8)
  // + 2*8 (final norm) = 512 + 128 + 1744 + 16 = 2400 parameters.
  ModelConfig m;
  m.vocab_size = 64;
  m.d_model = 8;
  m.n_layer = 2;
  m.n_head = 2;
  m.max_seq_len = 16;
  ASSERT_EQ(m.num_params(), 2400);
  Cluster c = a100();
  c.host_copy_gbps.value = 2;                // 2e9 B/s
  c.storage_gbps_per_node.value = 1;         // 1e9 B/s written
  c.storage_read_gbps_per_node.value = 0.5;  // 5e8 B/s read
  // dp 4 on 4 GPUs (one node): bf16 weights 2 x 2400 + the fp32 shard 12 x 2400 / 4 = 4800 + 7200 = 12000 bytes.
  const CheckpointCost k4 = checkpoint_cost(c, m, Layout{4, 1, 1, 1, 1, 1, 16, {}});
  EXPECT_EQ(k4.bytes_per_gpu, 12000);
  EXPECT_NEAR(k4.stall_seconds, 12000 / 2e9, 1e-18);
  EXPECT_NEAR(k4.persist_seconds, 4 * 12000 / 1e9, 1e-18);         // the node's 4 GPUs share its storage link
  EXPECT_NEAR(k4.recovery_naive_seconds, 4 * 12000 / 5e8, 1e-18);  // each reads all it needs
  // dp 1: no broadcast; the one reader reads 2 x 2400 + 12 x 2400 = 33600 bytes.
  const CheckpointCost k1 = checkpoint_cost(c, m, Layout{1, 1, 1, 1, 1, 1, 16, {}});
  EXPECT_EQ(k1.bytes_per_gpu, 33600);
  EXPECT_NEAR(k1.recovery_seconds, 33600 / 5e8, 1e-18);
}

TEST(ScaleCosts, ConstantOriginIsReadFromTheSource) {
  EXPECT_EQ(constant_origin({1, "measured by bench_mesh_init (tcp) on a host"}), ConstantOrigin::Measured);
  EXPECT_EQ(constant_origin({1, "paper §3.5: 1047 s"}), ConstantOrigin::Paper);
  EXPECT_EQ(constant_origin({1, "PCIe Gen4 x16 datasheet"}), ConstantOrigin::Datasheet);
  EXPECT_EQ(constant_origin({1, "see the paper §3.5"}), ConstantOrigin::Datasheet);  // the start decides
}

TEST(ScaleCosts, ShippedStoreConstantsAreMeasuredByBenchMeshInitNotTakenFromThePaper) {
  for (const char* f : {"megascale-a100", "h100-sxm", "h200"}) {
    const Cluster c = load_cluster(kClusters + f + ".toml");
    for (const Sourced* s : {&c.store_op_us, &c.store_async_op_us}) {
      EXPECT_EQ(constant_origin(*s), ConstantOrigin::Measured) << f << ": " << s->source;
      EXPECT_NE(s->source.find("bench_mesh_init"), std::string::npos) << f << ": " << s->source;
      EXPECT_EQ(s->source.find("1047"), std::string::npos) << f << ": derived from the paper's figure?";
    }
    for (const Sourced* s : {&c.storage_gbps_per_node, &c.storage_read_gbps_per_node})
      EXPECT_NE(s->source.find("bench_ckpt"), std::string::npos) << f << ": " << s->source;
    const std::vector<FigureBasis> b = figure_bases(c);
    ASSERT_EQ(b.size(), 5u);
    EXPECT_EQ(b[0].figure, "group_init");
    EXPECT_TRUE(b[0].prediction) << b[0].note;
    EXPECT_NE(b[0].note.find("bench_mesh_init"), std::string::npos) << b[0].note;
  }
}

TEST(ScaleCosts, StoreConstantsFromThePaperAreReportedAsNotACheck) {
  Cluster c = a100();
  c.store_op_us = {614, "paper §3.5: 1047 s / 1.704e6 requests"};
  const std::vector<FigureBasis> b = figure_bases(c);
  EXPECT_EQ(b[0].figure, "group_init");
  EXPECT_FALSE(b[0].prediction);
  EXPECT_NE(b[0].note.find("not an independent check"), std::string::npos) << b[0].note;
  EXPECT_NE(b[0].note.find("store_op_us taken from the paper"), std::string::npos) << b[0].note;
}
