#include "megatrain/comm/agreement.h"

#include <cstdint>
#include <cstring>

#include "megatrain/comm/mesh.h"
#include "megatrain/core/error.h"

namespace mt {

bool Agreement::any_rank(bool mine) {
  if (!mesh_) return mine;
  float flag = mine ? 1.0f : 0.0f;
  allreduce_all(*mesh_, f32_view(&flag, {1}));
  return flag > 0;
}

std::vector<int> Agreement::which_ranks(bool mine) {
  if (!mesh_) return mine ? std::vector<int>{0} : std::vector<int>{};
  const int world = mesh_->shape().world();
  std::vector<float> flags(static_cast<size_t>(world), 0.0f);
  flags[static_cast<size_t>(mesh_->rank())] = mine ? 1.0f : 0.0f;
  allreduce_all(*mesh_, f32_view(flags.data(), {static_cast<int64_t>(world)}));  // every rank's flag, everywhere
  std::vector<int> ranks;
  for (int r = 0; r < world; ++r)
    if (flags[static_cast<size_t>(r)] != 0.0f) ranks.push_back(r);
  return ranks;
}

void Agreement::barrier() {
  if (!mesh_) return;
  mesh_->dp().barrier()->wait();
  mesh_->tp().barrier()->wait();
  mesh_->pp().barrier()->wait();
}

std::string Agreement::broadcast(const std::string& bytes, int root) {
  if (!mesh_) return bytes;
  MT_CHECK(root >= 0 && root < mesh_->shape().world(), "broadcast root {} outside the world of {} ranks", root,
           mesh_->shape().world());
  const MeshCoord rc = mesh_coord(mesh_->shape(), root);
  const bool me = mesh_->rank() == root;
  // Along tp from the root's tp rank, then dp, then pp: after the three, every rank holds what the root held (the
  // other ranks' words, broadcast in groups without the root, are overwritten by a later stage).
  auto bcast = [&](int32_t* p, int64_t n) {
    mesh_->tp().broadcast(Tensor(p, {n}, DType::I32), rc.tp)->wait();
    mesh_->dp().broadcast(Tensor(p, {n}, DType::I32), rc.dp)->wait();
    mesh_->pp().broadcast(Tensor(p, {n}, DType::I32), rc.pp)->wait();
  };
  MT_CHECK(bytes.size() <= INT32_MAX || !me, "broadcast of {} bytes: at most 2^31-1", bytes.size());
  int32_t n = me ? static_cast<int32_t>(bytes.size()) : 0;
  bcast(&n, 1);
  if (n == 0) return "";
  std::vector<int32_t> words((static_cast<size_t>(n) + 3) / 4, 0);
  if (me) std::memcpy(words.data(), bytes.data(), bytes.size());
  bcast(words.data(), static_cast<int64_t>(words.size()));
  return std::string(reinterpret_cast<const char*>(words.data()), static_cast<size_t>(n));
}

}  // namespace mt
