// Process groups rendezvousing over every store kind: file://, tcp:// (our server, in a process of its own) and
// redis:// (a real redis-server started here). Per store, 4 forked ranks build a 2 x 2 mesh (dp x tp) and a group
// of all four, and check allreduce, all_gather, broadcast and a p2p exchange against the answers each rank
// computes itself from every rank's (deterministic) input.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "support/comm_fork_util.h"
#include "support/comm_servers.h"
#include "support/files.h"
#include "megatrain/comm/mesh.h"
#include "megatrain/comm/process_group.h"
#include "megatrain/comm/store.h"

using namespace mt;

namespace {

// Distinct small integers: sums over four ranks are exact in fp32.
float val(int global_rank, int j) { return static_cast<float>((global_rank * 13 + j * 7) % 23 - 11); }

void check(bool ok, const std::string& what) {
  if (!ok) throw Error(what);
}

void check_group(ProcessGroup& g, const std::string& what) {
  const int n = g.size(), me = g.rank();
  const int len = 5;
  std::vector<float> x(len);
  for (int j = 0; j < len; ++j) x[j] = val(g.global_rank(me), j);
  g.allreduce(f32_view(x.data(), {len}))->wait();
  for (int j = 0; j < len; ++j) {
    float want = 0;
    for (int r = 0; r < n; ++r) want += val(g.global_rank(r), j);
    check(x[j] == want, fmt::format("{} {}: allreduce element {} is {}, expected {}", what, g.name(), j, x[j], want));
  }
  std::vector<float> mine(len), all(static_cast<size_t>(len) * n, -99.f);
  for (int j = 0; j < len; ++j) mine[j] = val(g.global_rank(me), j);
  g.all_gather(f32_view(all.data(), {len * n}), f32_view(mine.data(), {len}))->wait();
  for (int r = 0; r < n; ++r)
    for (int j = 0; j < len; ++j)
      check(all[r * len + j] == val(g.global_rank(r), j),
            fmt::format("{} {}: all_gather block {} element {} is {}", what, g.name(), r, j, all[r * len + j]));
  int32_t token[2] = {me == n - 1 ? 4242 : -1, me == n - 1 ? g.global_rank(me) : -1};
  g.broadcast(Tensor(token, {2}, DType::I32), n - 1)->wait();
  check(token[0] == 4242 && token[1] == g.global_rank(n - 1),
        fmt::format("{} {}: broadcast gave {}, {}", what, g.name(), token[0], token[1]));
  // A ring exchange: send my values to the next rank, receive the previous rank's.
  if (n > 1) {
    std::vector<float> got(len, -99.f);
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    WorkPtr s = g.send(f32_view(mine.data(), {len}), next, 7);
    g.recv(f32_view(got.data(), {len}), prev, 7)->wait();
    s->wait();
    for (int j = 0; j < len; ++j)
      check(got[j] == val(g.global_rank(prev), j),
            fmt::format("{} {}: recv element {} is {}", what, g.name(), j, got[j]));
  }
}

void rank_main(const std::string& url, int rank) {
  auto store = open_store(url, Millis(60000));
  DeviceMesh mesh(*store, {2, 1, 2}, rank);
  check_group(mesh.tp(), url);
  check_group(mesh.dp(), url);
  float x = static_cast<float>(rank);
  allreduce_all(mesh, f32_view(&x, {1}));
  check(x == 6.0f, fmt::format("{}: allreduce_all of the ranks gave {}", url, x));
  auto world = make_gloo_group(*store, "world", {0, 1, 2, 3}, rank);
  check(world->size() == 4 && world->rank() == rank, "world group size/rank");
  check_group(*world, url);
}

class GroupsOverStore : public ::testing::TestWithParam<std::string> {};

TEST_P(GroupsOverStore, MeshAndWorldGroupCollectivesAreCorrect) {
  const std::string kind = GetParam();
  // The servers live in processes of their own; only this process's children (the ranks) use them.
  std::unique_ptr<comm_test::TcpServerProcess> tcp;
  std::unique_ptr<comm_test::RedisServer> redis;
  std::unique_ptr<mt::test::ScratchDir> dir;
  std::string url;
  if (kind == "file") {
    dir = std::make_unique<mt::test::ScratchDir>();
    url = "file://" + dir->path;
  } else if (kind == "tcp") {
    tcp = std::make_unique<comm_test::TcpServerProcess>();
    ::setenv(kStoreSecretEnv, comm_test::kSecret.c_str(), 1);  // what open_store presents (a launcher sets it)
    url = fmt::format("tcp://127.0.0.1:{}", tcp->port());
  } else {
    redis = std::make_unique<comm_test::RedisServer>();
    url = fmt::format("redis://127.0.0.1:{}/mt-groups", redis->port());
  }
  EXPECT_EQ(comm_test::run_procs(4, [&](int r) { rank_main(url, r); }), "") << url;
}

INSTANTIATE_TEST_SUITE_P(Stores, GroupsOverStore, ::testing::Values("file", "tcp", "redis"),
                         [](const auto& info) { return info.param; });

}  // namespace
