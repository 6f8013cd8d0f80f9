// The 3D mesh: rank <-> (dp, pp, tp) in Megatron's order, layout checks, and the groups each rank gets.
#include <gtest/gtest.h>

#include "support/comm_fork_util.h"
#include "support/files.h"
#include "support/test_util.h"
#include "megatrain/core/clock.h"
#include "megatrain/comm/mesh.h"

namespace mt {
// Readable parameter names in ctest's list.
void PrintTo(const MeshShape& s, std::ostream* os) { *os << "dp" << s.dp << " pp" << s.pp << " tp" << s.tp; }
}  // namespace mt

using namespace mt;
using comm_test::run_procs;
using mt::test::ScratchDir;

namespace {

using mt::test::error_of;

std::vector<MeshShape> shapes_of(int world) {
  std::vector<MeshShape> out;
  for (int dp = 1; dp <= world; ++dp)
    for (int pp = 1; pp <= world; ++pp)
      for (int tp = 1; tp <= world; ++tp)
        if (dp * pp * tp == world) out.push_back({dp, pp, tp});
  return out;
}

TEST(Mesh, CoordinatesFollowMegatronOrderForEveryLayoutOfEight) {
  auto shapes = shapes_of(8);
  ASSERT_EQ(shapes.size(), 10u);
  for (const auto& s : shapes) {
    // Megatron: tp fastest, then dp, then pp; so counting with pp outermost enumerates ranks 0, 1, 2, ...
    int rank = 0;
    for (int p = 0; p < s.pp; ++p)
      for (int d = 0; d < s.dp; ++d)
        for (int t = 0; t < s.tp; ++t, ++rank) {
          MeshCoord c = mesh_coord(s, rank);
          EXPECT_TRUE(c.dp == d && c.pp == p && c.tp == t)
              << "dp" << s.dp << " pp" << s.pp << " tp" << s.tp << " rank " << rank << " -> (" << c.dp << ", " << c.pp
              << ", " << c.tp << ")";
          EXPECT_EQ(mesh_rank(s, {d, p, t}), rank);
        }
    EXPECT_EQ(rank, 8);
    check_mesh(s, 8);
  }
}

TEST(Mesh, BadLayoutsAreRefused) {
  EXPECT_EQ(error_of([] {
              check_mesh({2, 2, 3}, 8);
            }),
            "parallel.dp (2) x parallel.pp (2) x parallel.tp (3) = 12 does not match WORLD_SIZE 8");
  EXPECT_EQ(error_of([] { check_mesh({2, 0, 4}, 8); }), "parallel.pp must be >= 1, got 0");
  EXPECT_EQ(error_of([] { check_mesh({-1, 1, 1}, 1); }), "parallel.dp must be >= 1, got -1");
  EXPECT_NE(error_of([] { mesh_coord({2, 2, 2}, 8); }).find("rank 8 out of range"), std::string::npos);
  EXPECT_NE(error_of([] { mesh_rank({2, 2, 2}, {0, 2, 0}); }).find("outside the mesh"), std::string::npos);
  ScratchDir dir;
  auto store = make_file_store(dir.path);
  EXPECT_NE(error_of([&] { DeviceMesh m(*store, {1, 1, 2}, 2); }).find("rank 2 out of range"), std::string::npos);
  EXPECT_NE(error_of([&] { DeviceMesh m(*store, {1, 1, 0}, 0); }).find("parallel.tp must be >= 1"), std::string::npos);
}

TEST(Mesh, SingleProcessMeshHasOnlyLocalGroups) {
  ScratchDir dir;
  auto store = make_file_store(dir.path);
  DeviceMesh m(*store, {1, 1, 1}, 0);
  EXPECT_EQ(m.tp().size() + m.dp().size() + m.pp().size(), 3);
  EXPECT_EQ(m.tp().name(), "tp[0]");
  float x = 3;
  allreduce_all(m, f32_view(&x, {1}));
  EXPECT_EQ(x, 3);
  EXPECT_FALSE(store->check("tp[0]/arrived/0"));  // no store traffic for size-1 groups
}

// Each rank checks its three groups: members (global ranks, in order), its rank within each, the names, and that a
// sum of global ranks over each group equals the sum over the members the coordinates say it should have.
void mesh_child(const std::string& dir, MeshShape s, int rank) {
  auto store = make_file_store(dir);
  const double t0 = now_seconds();
  DeviceMesh m(*store, s, rank);
  const double took = now_seconds() - t0;
  MeshCoord c = m.coord();
  MT_CHECK(m.rank() == rank && c.dp == mesh_coord(s, rank).dp && c.tp == mesh_coord(s, rank).tp, "coord");
  // Seconds on the same clock, within the time the constructor took (not milliseconds, not a timestamp).
  MT_CHECK(m.init_seconds() > 0 && m.init_seconds() <= took, "init_seconds {} of {}", m.init_seconds(), took);
  struct Dim {
    const char* name;
    ProcessGroup& g;
    int size, me;
    std::function<MeshCoord(int)> member;
  } dims[] = {
      {"tp", m.tp(), s.tp, c.tp,
       [&](int i) {
         return MeshCoord{c.dp, c.pp, i};
       }},
      {"dp", m.dp(), s.dp, c.dp,
       [&](int i) {
         return MeshCoord{i, c.pp, c.tp};
       }},
      {"pp", m.pp(), s.pp, c.pp,
       [&](int i) {
         return MeshCoord{c.dp, i, c.tp};
       }},
  };
  for (auto& d : dims) {
    MT_CHECK(d.g.size() == d.size && d.g.rank() == d.me, "{} group: size {} rank {}, expected {} {}", d.name,
             d.g.size(), d.g.rank(), d.size, d.me);
    float sum = 0;
    std::string members;
    for (int i = 0; i < d.size; ++i) {
      int r = mesh_rank(s, d.member(i));
      MT_CHECK(d.g.global_rank(i) == r, "{} group rank {} is global {}, expected {}", d.name, i, d.g.global_rank(i), r);
      sum += static_cast<float>(r);
      if (i) members += ',';
      members += std::to_string(r);
    }
    MT_CHECK(d.g.name().rfind(std::string(d.name) + "[", 0) == 0, "group name {}", d.g.name());
    float v[2] = {static_cast<float>(rank), 1.f};
    d.g.allreduce(f32_view(v, {2}))->wait();
    MT_CHECK(v[0] == sum && v[1] == static_cast<float>(d.size), "{} group [{}]: allreduce of global ranks = {}, {}",
             d.name, members, v[0], v[1]);
  }
  float all[2] = {static_cast<float>(rank), 1.f};
  allreduce_all(m, f32_view(all, {2}));
  const int w = s.world();
  MT_CHECK(all[0] == static_cast<float>(w * (w - 1) / 2) && all[1] == static_cast<float>(w),
           "allreduce_all gave {}, {}", all[0], all[1]);
}

class MeshGroups : public ::testing::TestWithParam<MeshShape> {};

TEST_P(MeshGroups, ContainTheRightGlobalRanks) {
  ScratchDir dir;
  std::string path = dir.path;
  MeshShape s = GetParam();
  EXPECT_EQ(run_procs(s.world(), [&](int r) { mesh_child(path, s, r); }), "");
}

INSTANTIATE_TEST_SUITE_P(World8, MeshGroups, ::testing::ValuesIn(shapes_of(8)), [](const auto& info) {
  return fmt::format("dp{}_pp{}_tp{}", info.param.dp, info.param.pp, info.param.tp);
});

TEST(Mesh, GroupNamesSayWhoIsInThem) {
  ScratchDir dir;
  std::string path = dir.path;
  auto report = run_procs(8, [&](int r) {
    auto store = make_file_store(path);
    DeviceMesh m(*store, {2, 2, 2}, r);
    if (r == 5) {  // (dp 0, pp 1, tp 1)
      MT_CHECK(m.tp().name() == "tp[4-5]" && m.dp().name() == "dp[5,7]" && m.pp().name() == "pp[1,5]", "{} {} {}",
               m.tp().name(), m.dp().name(), m.pp().name());
    }
    // No rank leaves before every group is connected on both sides: a rank that exits while a peer still completes
    // its handshake fails that peer ("Connection closed by peer", seen under ctest -j 4). A barrier per dimension
    // covers every pair.
    for (ProcessGroup* g : {&m.tp(), &m.dp(), &m.pp()}) g->barrier()->wait();
  });
  EXPECT_EQ(report, "");
}

}  // namespace

namespace {

// Expert parallelism inside dp (Megatron's convention), on dp 4 x tp 2 with ep 2: the ep groups are pairs of
// consecutive dp indices with the same tp rank, the edp groups the dp indices of one parity; together every (ep rank,
// edp rank) pair is one dp index. Known answers written out by hand, then the partition checked for every shape of
// eight ranks and every ep dividing its dp.
TEST(Mesh, ExpertGroupsSplitEachDataParallelGroup) {
  const MeshShape s{4, 1, 2, 2};
  EXPECT_EQ(ep_group_ranks(s, mesh_coord(s, 0)), (std::vector<int>{0, 2}));   // dp 0,1 of tp 0
  EXPECT_EQ(ep_group_ranks(s, mesh_coord(s, 5)), (std::vector<int>{5, 7}));   // dp 2,3 of tp 1
  EXPECT_EQ(edp_group_ranks(s, mesh_coord(s, 0)), (std::vector<int>{0, 4}));  // dp 0,2 of tp 0
  EXPECT_EQ(edp_group_ranks(s, mesh_coord(s, 7)), (std::vector<int>{3, 7}));  // dp 1,3 of tp 1
  for (MeshShape shape : shapes_of(8))
    for (int ep = 1; ep <= shape.dp; ++ep) {
      if (shape.dp % ep) continue;
      shape.ep = ep;
      for (int r = 0; r < shape.world(); ++r) {
        const MeshCoord c = mesh_coord(shape, r);
        const std::vector<int> e = ep_group_ranks(shape, c), d = edp_group_ranks(shape, c);
        ASSERT_EQ(e.size(), size_t(ep));
        ASSERT_EQ(d.size(), size_t(shape.dp / ep));
        EXPECT_EQ(e[c.dp % ep], r) << "my ep rank is dp % ep";
        EXPECT_EQ(d[c.dp / ep], r) << "my edp rank is dp / ep";
        for (int q : e) {
          const MeshCoord o = mesh_coord(shape, q);
          EXPECT_TRUE(o.pp == c.pp && o.tp == c.tp && o.dp / ep == c.dp / ep) << "ep group of rank " << r;
        }
        for (int q : d) {
          const MeshCoord o = mesh_coord(shape, q);
          EXPECT_TRUE(o.pp == c.pp && o.tp == c.tp && o.dp % ep == c.dp % ep) << "edp group of rank " << r;
        }
      }
    }
  EXPECT_NE(error_of([] {
              ep_group_ranks(MeshShape{4, 1, 1, 3}, {});
            }).find("parallel.ep (3) must be >= 1 and divide"),
            std::string::npos);
}

}  // namespace
