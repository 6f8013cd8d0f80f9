// The fixed cost of one collective of our Gloo process groups, against this machine's own inter-process round trip.
// Small collectives are latency-bound: a step of a tp-sharded model issues dozens of them, and on a small host they
// set the step time (see docs/performance.md's CPU figures). The baseline, measured in the same run, is a one-byte
// ping-pong between two processes over a socketpair: the cheapest round trip the kernel offers. The ratio says how
// many such round trips one collective costs (its messages, Gloo's handshakes and our thread hand-offs).
//   megatrain launch --nproc 2 --exec -- build/bench/bench_pg_latency [--reps N]
// Prints one JSON line (rank 0): median and mean microseconds per op over --reps calls (default 1000, after 50
// warm-ups).
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "megatrain/comm/env.h"
#include "megatrain/comm/mesh.h"
#include "megatrain/comm/store.h"
#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"

using namespace mt;
using mt::bench::Buf;

namespace {

// Timings of `reps` calls of fn: the median, and the mean (what a run of many collectives pays: on a shared or
// virtualised host a wake-up now and then takes milliseconds, so the mean sits well above the median).
struct Timing {
  double median = 0, mean = 0;
};
template <typename F>
Timing time_calls(int reps, F&& fn) {
  std::vector<double> t(static_cast<size_t>(reps));
  double sum = 0;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_seconds();
    fn();
    t[size_t(i)] = now_seconds() - t0;
    sum += t[size_t(i)];
  }
  std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  return {t[size_t(reps / 2)], sum / reps};
}

// One-byte round trips between this process and a forked child over a socketpair.
double socket_round_trip_seconds(int reps) {
  int sv[2];
  MT_CHECK(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair failed");
  const pid_t child = ::fork();
  MT_CHECK(child >= 0, "fork failed");
  char c = 1;
  if (child == 0) {
    ::close(sv[0]);
    while (::read(sv[1], &c, 1) == 1 && c != 0) (void)!::write(sv[1], &c, 1);
    ::_exit(0);
  }
  ::close(sv[1]);
  auto ping = [&] {
    (void)!::write(sv[0], &c, 1);
    (void)!::read(sv[0], &c, 1);
  };
  for (int i = 0; i < 50; ++i) ping();
  const double t = time_calls(reps, ping).median;
  c = 0;
  (void)!::write(sv[0], &c, 1);
  ::close(sv[0]);
  ::waitpid(child, nullptr, 0);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    int reps = 1000;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--reps" && i + 1 < argc)
        reps = std::max(1, std::atoi(argv[++i]));
      else
        fail("bench_pg_latency: unknown argument '{}' (--reps N)", a);
    }
    RankInfo ri = rank_info_from_env();
    MT_CHECK(ri.world_size >= 2, "run under `megatrain launch --nproc N --exec -- bench_pg_latency` with N >= 2");
    auto store = open_store(ri.store_url);
    DeviceMesh mesh(*store, MeshShape{ri.world_size, 1, 1}, ri.rank, {});
    ProcessGroup& g = mesh.dp();
    g.barrier()->wait();

    nlohmann::json out{{"benchmark", "pg_latency"}, {"ranks", ri.world_size}, {"reps", reps}};
    auto put = [&](const std::string& name, Timing t) {
      out[name + "_median_us"] = 1e6 * t.median;
      out[name + "_mean_us"] = 1e6 * t.mean;
    };
    for (int64_t floats : {int64_t{16}, int64_t{4096}}) {
      Buf x(floats);
      for (int i = 0; i < 50; ++i) g.allreduce(x.t({floats}))->wait();
      put(fmt::format("allreduce_{}B", floats * 4), time_calls(reps, [&] { g.allreduce(x.t({floats}))->wait(); }));
    }
    {
      // The shapes of a sequence-parallel tp layer: all-gather and reduce-scatter of 4 KiB per rank.
      const int64_t per = 1024, n = ri.world_size;
      Buf shard(per), full(per * n);
      put("all_gather_4096B", time_calls(reps, [&] { g.all_gather(full.t({per * n}), shard.t({per}))->wait(); }));
      put("reduce_scatter_4096B",
          time_calls(reps, [&] { g.reduce_scatter(shard.t({per}), full.t({per * n}))->wait(); }));
    }
    put("barrier", time_calls(reps, [&] { g.barrier()->wait(); }));
    g.barrier()->wait();
    if (ri.rank == 0) {
      const double rtt = socket_round_trip_seconds(reps);
      out["socket_round_trip_median_us"] = 1e6 * rtt;
      out["allreduce_64B_median_in_round_trips"] = out["allreduce_64B_median_us"].get<double>() / (1e6 * rtt);
      std::printf("%s\n", out.dump().c_str());
    }
    g.barrier()->wait();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_pg_latency: %s\n", e.what());
    return 1;
  }
}
