// Agreement among every rank of a mesh: the one place that turns each rank's local fact into something every rank
// knows alike, so that all of them take the same branch afterwards (fail together, stop together, wait together).
//
// Protocol: every call is a collective over every rank of the mesh (the host plane's groups, comm/mesh.h: there is
// no world group, so a call runs along tp, then dp, then pp). Every rank must make the same calls in the same
// order, as with any collective; a rank that skips one leaves the others waiting until the groups' timeout. A
// null mesh is a single process: every call is trivial (no communication) and returns what this process said.
//
// Invariants:
//  * any_rank and which_ranks return the same value on every rank (a sum of 0/1 flags in fp32, exact for any
//    world below 2^24 ranks);
//  * barrier returns on a rank only after every rank entered it (dp, then tp, then pp group barriers: rank (d,t,p)
//    leaves its pp barrier only after every (d,t,*) passed its tp barrier, each of those only after every (d,*,*)
//    passed its dp barrier, i.e. after every rank arrived);
//  * broadcast returns the root's bytes, byte for byte, on every rank (three group broadcasts, of the length and
//    then of the bytes: along tp from the root's tp rank, along dp from its dp rank, along pp from its pp rank).
// The tensors handed to the groups are host memory of this object's own (the host plane never touches a backend's
// memory: a GPU run would hand Gloo a device pointer).
#pragma once
#include <string>
#include <vector>

namespace mt {

class DeviceMesh;

class Agreement {
 public:
  explicit Agreement(DeviceMesh* mesh) : mesh_(mesh) {}

  // True on every rank when any rank says true.
  bool any_rank(bool mine);
  // The ranks (global, ascending) that said true, on every rank; empty when none did.
  std::vector<int> which_ranks(bool mine);
  // Returns once every rank has entered it.
  void barrier();
  // The root's `bytes` on every rank (what the other ranks pass is ignored). root: a global rank.
  std::string broadcast(const std::string& bytes, int root = 0);

 private:
  DeviceMesh* mesh_;
};

}  // namespace mt
