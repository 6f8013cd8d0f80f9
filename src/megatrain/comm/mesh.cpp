#include "megatrain/comm/mesh.h"

#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"

namespace mt {
namespace {

void check_dims(const MeshShape& s) {
  MT_CHECK(s.dp >= 1, "parallel.dp must be >= 1, got {}", s.dp);
  MT_CHECK(s.pp >= 1, "parallel.pp must be >= 1, got {}", s.pp);
  MT_CHECK(s.tp >= 1, "parallel.tp must be >= 1, got {}", s.tp);
  MT_CHECK(s.ep >= 1 && s.dp % s.ep == 0,
           "parallel.ep ({}) must be >= 1 and divide parallel.dp ({}): the experts are sharded over ep ranks carved "
           "out of the data-parallel ranks",
           s.ep, s.dp);
}

// "tp[2-3]" for consecutive ranks, "dp[1,3,5,7]" for a short stride, "dp[1,3,...,63]" for a long one. Mesh groups
// are arithmetic progressions, so the first two and the last rank name one uniquely.
std::string group_name(const char* dim, const std::vector<int>& ranks) {
  std::string s = std::string(dim) + "[";
  const size_t n = ranks.size();
  if (n == 1) {
    s += std::to_string(ranks[0]);
  } else if (ranks[1] - ranks[0] == 1) {
    s += fmt::format("{}-{}", ranks[0], ranks[n - 1]);
  } else if (n <= 8) {
    for (size_t i = 0; i < n; ++i) {
      if (i) s += ',';
      s += std::to_string(ranks[i]);
    }
  } else {
    s += fmt::format("{},{},...,{}", ranks[0], ranks[1], ranks[n - 1]);
  }
  return s + "]";
}

std::unique_ptr<ProcessGroup> make_dim_group(Store& store, GroupRole dim, const std::vector<int>& ranks, int me,
                                             const GroupOptions& opt, const GroupFactory& make_group,
                                             const std::string& prefix) {
  std::string name = prefix + group_name(kind_name(dim), ranks);
  if (make_group) return make_group(store, dim, name, ranks, me, opt);
  if (ranks.size() == 1) return make_local_group(me, name);
  return make_gloo_group(store, name, ranks, me, opt);
}

}  // namespace

MeshCoord mesh_coord(const MeshShape& s, int rank) {
  check_dims(s);
  MT_CHECK(rank >= 0 && rank < s.world(), "rank {} out of range for a mesh of {} (dp {} x pp {} x tp {})", rank,
           s.world(), s.dp, s.pp, s.tp);
  MeshCoord c;
  c.tp = rank % s.tp;
  c.dp = (rank / s.tp) % s.dp;
  c.pp = rank / (s.tp * s.dp);
  return c;
}

int mesh_rank(const MeshShape& s, const MeshCoord& c) {
  check_dims(s);
  MT_CHECK(c.dp >= 0 && c.dp < s.dp && c.pp >= 0 && c.pp < s.pp && c.tp >= 0 && c.tp < s.tp,
           "mesh coordinate (dp {}, pp {}, tp {}) outside the mesh (dp {} x pp {} x tp {})", c.dp, c.pp, c.tp, s.dp,
           s.pp, s.tp);
  return (c.pp * s.dp + c.dp) * s.tp + c.tp;
}

void check_mesh(const MeshShape& s, int world) {
  check_dims(s);
  MT_CHECK(s.world() == world,
           "parallel.dp ({}) x parallel.pp ({}) x parallel.tp ({}) = {} does not match WORLD_SIZE {}", s.dp, s.pp, s.tp,
           s.world(), world);
}

std::vector<int> ep_group_ranks(const MeshShape& s, const MeshCoord& c) {
  check_dims(s);
  std::vector<int> ranks;
  const int first = c.dp / s.ep * s.ep;
  for (int i = 0; i < s.ep; ++i) ranks.push_back(mesh_rank(s, {first + i, c.pp, c.tp}));
  return ranks;
}

std::vector<int> edp_group_ranks(const MeshShape& s, const MeshCoord& c) {
  check_dims(s);
  std::vector<int> ranks;
  for (int i = c.dp % s.ep; i < s.dp; i += s.ep) ranks.push_back(mesh_rank(s, {i, c.pp, c.tp}));
  return ranks;
}

DeviceMesh::DeviceMesh(Store& store, const MeshShape& shape, int rank, const GroupOptions& opt,
                       const GroupFactory& make_group, const std::string& prefix)
    : shape_(shape), coord_(mesh_coord(shape, rank)), rank_(rank) {
  const double t0 = now_seconds();
  std::vector<int> tp, dp, pp;
  for (int i = 0; i < shape.tp; ++i) tp.push_back(mesh_rank(shape, {coord_.dp, coord_.pp, i}));
  for (int i = 0; i < shape.dp; ++i) dp.push_back(mesh_rank(shape, {i, coord_.pp, coord_.tp}));
  for (int i = 0; i < shape.pp; ++i) pp.push_back(mesh_rank(shape, {coord_.dp, i, coord_.tp}));
  // Every rank builds its groups in the same order (tp, dp, pp, ep, edp), so each group's rendezvous only waits for its own
  // members to finish the previous ones: no rank waits on the whole world.
  tp_ = make_dim_group(store, GroupRole::TP, tp, rank, opt, make_group, prefix);
  dp_ = make_dim_group(store, GroupRole::DP, dp, rank, opt, make_group, prefix);
  pp_ = make_dim_group(store, GroupRole::PP, pp, rank, opt, make_group, prefix);
  ep_ = make_dim_group(store, GroupRole::EP, ep_group_ranks(shape, coord_), rank, opt, make_group, prefix);
  if (shape.ep > 1)
    edp_ = make_dim_group(store, GroupRole::EDP, edp_group_ranks(shape, coord_), rank, opt, make_group, prefix);
  init_seconds_ = now_seconds() - t0;
}

void allreduce_all(DeviceMesh& mesh, Tensor t) {
  mesh.tp().allreduce(t)->wait();
  mesh.dp().allreduce(t)->wait();
  mesh.pp().allreduce(t)->wait();
}

}  // namespace mt
