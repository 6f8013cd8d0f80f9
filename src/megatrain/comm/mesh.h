// The 3D device mesh: WORLD = dp x pp x tp, with tensor-parallel ranks adjacent (as on one node), then data-
// parallel, then pipeline (slowest, across nodes):  rank = (pp_i * dp + dp_i) * tp + tp_i   (Megatron's order).
//
// Expert parallelism is carved out of the data-parallel ranks (Megatron's convention), ep dividing dp: the ranks
// with my (pp, tp) and a dp index in my block of ep consecutive dp indices [dp_i / ep * ep, ... + ep) form my "ep"
// group (they hold different experts; ep rank = dp_i % ep); the ranks with my (pp, tp) and my ep rank form my
// "edp" group, the dp/ep replicas of my experts (edp rank = dp_i / ep). ep = 1: the ep group is me alone and the
// edp group is the dp group itself.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "megatrain/comm/process_group.h"
#include "megatrain/core/kind.h"

namespace mt {

struct MeshShape {
  int dp = 1, pp = 1, tp = 1;
  int ep = 1;  // expert parallelism, inside dp (not a factor of the world size)
  int world() const { return dp * pp * tp; }
};

struct MeshCoord {
  int dp = 0, pp = 0, tp = 0;
};

MeshCoord mesh_coord(const MeshShape& s, int rank);
int mesh_rank(const MeshShape& s, const MeshCoord& c);
// Throws mt::Error saying which number is wrong when dp*pp*tp != world, a dimension is < 1 or ep does not divide dp.
void check_mesh(const MeshShape& s, int world);

// What a process group is for: one of the mesh's dimensions, or a group outside the mesh (the tied embedding's
// first and last pipeline stages; a rank and the buddy that holds its checkpoint snapshot). Spelt as in group names.
// EP and EDP: expert parallelism's groups (above).
enum class GroupRole {
  DP,
  PP,
  TP,
  Embedding,
  Snapshot,
  EP,
  EDP
};  // "dp" | "pp" | "tp" | "emb" | "snap" | "ep" | "edp"
inline constexpr std::array<const char*, 7> kGroupRoleNames = {"dp", "pp", "tp", "emb", "snap", "ep", "edp"};
inline const std::array<const char*, 7>& kind_names(GroupRole) { return kGroupRoleNames; }

// The global ranks of my ep group and of my edp group (see above), in group-rank order.
std::vector<int> ep_group_ranks(const MeshShape& s, const MeshCoord& c);
std::vector<int> edp_group_ranks(const MeshShape& s, const MeshCoord& c);

// Makes the group of one role (role: a mesh dimension, or a group outside the mesh; name: e.g. "tp[0-1]"). The
// mesh's default (an empty factory) builds Gloo groups, and a local group for a dimension of size 1. A set factory is
// called for every dimension, also those of size 1: a GPU run's groups must copy on the device, which a host local
// group cannot.
using GroupFactory = std::function<std::unique_ptr<ProcessGroup>(Store& store, GroupRole role, const std::string& name,
                                                                 const std::vector<int>& ranks, int my_global_rank,
                                                                 const GroupOptions& opt)>;

// My groups along each dimension (a group of size 1 is a trivial local group, no communication). There is no
// world group on purpose: a full-mesh world context costs O(n^2) connections and store reads; a reduction over
// all ranks is done along tp, then dp, then pp (allreduce_all), and group creation stays O(n) in total.
class DeviceMesh {
 public:
  // prefix: prepended to every group's name (e.g. "device/"), which is also its key in the store: two meshes over
  // one store (a GPU run's Gloo and NCCL planes) need different prefixes, or their rendezvous would collide.
  DeviceMesh(Store& store, const MeshShape& shape, int rank, const GroupOptions& opt = {},
             const GroupFactory& make_group = {}, const std::string& prefix = "");
  const MeshShape& shape() const { return shape_; }
  const MeshCoord& coord() const { return coord_; }
  int rank() const { return rank_; }
  ProcessGroup& dp() { return *dp_; }
  ProcessGroup& pp() { return *pp_; }
  ProcessGroup& tp() { return *tp_; }
  ProcessGroup& ep() { return *ep_; }
  ProcessGroup& edp() { return edp_ ? *edp_ : *dp_; }  // ep = 1: the dp group
  double init_seconds() const { return init_seconds_; }

 private:
  MeshShape shape_;
  MeshCoord coord_;
  int rank_;
  std::unique_ptr<ProcessGroup> dp_, pp_, tp_, ep_, edp_;
  double init_seconds_ = 0;
};

// Sum-allreduce of t over every rank of the mesh (tp, then dp, then pp), synchronously.
void allreduce_all(DeviceMesh& mesh, Tensor t);

// A group of one process: every collective is a copy or a no-op. Used for mesh dimensions of size 1.
std::unique_ptr<ProcessGroup> make_local_group(int global_rank, const std::string& name);

}  // namespace mt
