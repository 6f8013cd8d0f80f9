#include "megatrain/launch/diagnose.h"

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <vector>

#include "megatrain/comm/process_group.h"
#include "megatrain/comm/store.h"
#include "megatrain/core/buffer.h"
#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"
#include "megatrain/kernels/ops.h"
#include "megatrain/comm/node_gpu_allreduce.h"
#include "megatrain/launch/gpu_probe.h"
#include "megatrain/train/faults.h"

namespace mt::launch {

namespace {

// Best of a few runs: the question is what the node can do, not what a noisy neighbour let it do once.
template <typename F>
double best_seconds(int reps, F&& f) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_seconds();
    f();
    best = std::min(best, now_seconds() - t0);
  }
  return best;
}

CheckResult named(const char* name, const char* unit) {
  CheckResult c;
  c.name = name;
  c.unit = unit;
  return c;
}

constexpr int64_t kAllreduceFloats = 1 << 22;  // 16 MiB: past latency, into bandwidth

// Rank r contributes r + 1 everywhere; every element of the sum must be n(n+1)/2 exactly (small integers are exact
// in fp32 whatever the reduction order). Returns the bus bandwidth (GB/s, ring convention 2(n-1)/n x bytes / time),
// or throws naming the first wrong element.
double allreduce_exact(ProcessGroup& g, int rank, int n) {
  std::vector<float> buf(static_cast<size_t>(kAllreduceFloats));
  const float want = float(n * (n + 1) / 2);
  double secs = best_seconds(3, [&] {
    std::fill(buf.begin(), buf.end(), float(rank + 1));
    g.allreduce(f32_view(buf.data(), {kAllreduceFloats}))->wait();
  });
  for (int64_t i = 0; i < kAllreduceFloats; ++i)
    MT_CHECK(buf[size_t(i)] == want, "all-reduce element {} is {}, expected {}", i, buf[size_t(i)], want);
  return 2.0 * (n - 1) / n * double(kAllreduceFloats) * 4 / secs / 1e9;
}

double allreduce_rank(const std::string& dir, int rank, int n) {
  auto store = make_file_store(dir);
  std::vector<int> ranks(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ranks[size_t(i)] = i;
  GroupOptions go;
  go.timeout = Millis(60000);
  auto g = make_gloo_group(*store, "diagnose", ranks, rank, go);
  return allreduce_exact(*g, rank, n);
}

CheckResult check_local_allreduce(int n) {
  CheckResult c = named("local_allreduce", "GB/s");
  if (n < 2) {
    c.ran = false;
    c.pass = true;
    c.detail = "one local rank: nothing to all-reduce";
    return c;
  }
  const std::string dir = fmt::format("{}/mt-diagnose-{}", std::filesystem::temp_directory_path().string(), ::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // Ranks 1..n-1 are forked before this process starts any thread (Gloo's, OpenMP's): a fork is safe only then.
  std::vector<pid_t> kids;
  for (int r = 1; r < n; ++r) {
    pid_t p = ::fork();
    if (p == 0) {
      try {
        allreduce_rank(dir, r, n);
        ::_exit(0);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "diagnose: local rank %d: %s\n", r, e.what());
        ::_exit(1);
      }
    }
    MT_CHECK(p > 0, "fork: {}", std::strerror(errno));
    kids.push_back(p);
  }
  try {
    c.value = allreduce_rank(dir, 0, n);
    c.detail = fmt::format("{} ranks, {} MiB, every element exact", n, kAllreduceFloats * 4 >> 20);
    c.pass = true;
  } catch (const std::exception& e) {
    c.pass = false;
    c.detail = e.what();
  }
  for (pid_t p : kids) {
    int st = 0;
    ::waitpid(p, &st, 0);
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
      c.pass = false;
      c.detail += fmt::format("; a local rank (pid {}) failed", p);
    }
  }
  std::filesystem::remove_all(dir);
  return c;
}

// This node and one neighbour all-reduce a known tensor over the network (the job store for the rendezvous): the
// link between them, its bandwidth and the sum's exactness. A neighbour that never comes (it died meanwhile) makes
// the check not run, not fail: a missing peer says nothing about this node.
CheckResult check_pairwise(const DiagnoseOptions& o) {
  CheckResult c = named("pairwise_bandwidth", "GB/s");
  if (o.pair_store.empty()) {
    c.ran = false;
    c.pass = true;
    c.detail = "not run: no neighbour given (--pair-store, --pair-group, --pair-rank; the job driver pairs nodes)";
    return c;
  }
  std::unique_ptr<Store> store;
  std::unique_ptr<ProcessGroup> g;
  try {
    store = open_store(o.pair_store, Millis(int64_t(o.pair_timeout_s * 1000)));
    GroupOptions go;
    go.timeout = Millis(int64_t(o.pair_timeout_s * 1000));
    go.iface = o.iface;
    g = make_gloo_group(*store, o.pair_group, {0, 1}, o.pair_rank, go);
  } catch (const std::exception& e) {
    c.ran = false;
    c.pass = true;
    c.detail = fmt::format("not run: the neighbour of group {} did not come: {}", o.pair_group, e.what());
    return c;
  }
  try {
    c.value = allreduce_exact(*g, o.pair_rank, 2);
    c.detail = fmt::format("with the neighbour of group {} on {}, {} MiB, every element exact", o.pair_group, o.iface,
                           kAllreduceFloats * 4 >> 20);
    c.pass = true;
  } catch (const std::exception& e) {
    c.pass = false;
    c.detail = fmt::format("with the neighbour of group {}: {}", o.pair_group, e.what());
  }
  return c;
}

CheckResult check_gemm() {
  CheckResult c = named("gemm", "GFLOP/s");
  auto ops = make_cpu_ops();
  constexpr int64_t n = 1024;
  std::vector<float> a(size_t(n * n), 0.5f), w(size_t(n * n), 0.25f), out(size_t(n * n));
  const double secs = best_seconds(4, [&] {
    ops->matmul_forward(f32_view(out.data(), {n, n}), f32_view(a.data(), {n, n}), f32_view(w.data(), {n, n}), Tensor());
  });
  // Every element is n x 0.5 x 0.25 exactly: a wrong answer is a failure whatever the speed.
  const float want = float(n) * 0.125f;
  const bool right = std::all_of(out.begin(), out.end(), [&](float v) { return v == want; });
  c.value = 2.0 * n * n * n / secs / 1e9;
  c.detail = fmt::format("fp32 {}x{}x{} on the CPU backend{}", n, n, n, right ? "" : ": WRONG RESULT");
  c.pass = right;
  return c;
}

CheckResult check_memory_bandwidth() {
  CheckResult c = named("memory_bandwidth", "GB/s");
  // 128 MiB: past the last-level cache a one-thread copy sees (at most 96 MiB per core complex on today's x86 parts).
  // Not more: a fresh process pays for first touching every page (the kernel zeroes it; on a virtual machine 512 MiB
  // took seconds), and every diagnose round after a failure waits for it. HostBuffer uses huge pages, so that is a
  // few hundred faults, not tens of thousands.
  constexpr size_t bytes = size_t(128) << 20;
  HostBuffer src(bytes, false), dst(bytes);
  std::memset(src.data(), 1, bytes);
  const double secs = best_seconds(3, [&] { std::memcpy(dst.data(), src.data(), bytes); });
  c.value = 2.0 * double(bytes) / secs / 1e9;
  c.detail = "128 MiB memcpy, bytes read + written";
  c.pass = static_cast<const char*>(dst.data())[bytes / 2] == 1;
  return c;
}

}  // namespace

void judge(CheckResult& c, double tolerance) {
  if (!c.ran || !c.pass) return;  // a check that failed on correctness stays failed
  if (c.expected <= 0) {
    c.detail += "; no expectation to compare with";
    return;
  }
  c.pass = c.value >= tolerance * c.expected;
  c.detail += fmt::format("; {:.3g} {} against {:.3g} expected ({:.0f}%, the floor is {:.0f}%)", c.value, c.unit,
                          c.expected, 100 * c.value / c.expected, 100 * tolerance);
}

bool DiagnoseReport::pass() const {
  return std::all_of(checks.begin(), checks.end(), [](const CheckResult& c) { return c.pass; });
}

nlohmann::json DiagnoseReport::to_json() const {
  nlohmann::json cs = nlohmann::json::array();
  for (const auto& c : checks) {
    nlohmann::json j = {{"name", c.name}, {"ran", c.ran}, {"pass", c.pass}, {"detail", c.detail}};
    if (c.ran) j["value"] = c.value, j["unit"] = c.unit;
    j["expected"] = c.expected > 0 ? nlohmann::json(c.expected) : nlohmann::json();
    cs.push_back(j);
  }
  return {{"node", node}, {"pass", pass()}, {"checks", cs}, {"notes", notes}};
}

nlohmann::json DiagnoseReport::values() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& c : checks)
    if (c.ran) j[c.name] = c.value;
  return j;
}

DiagnoseReport run_diagnose(const DiagnoseOptions& opt) {
  DiagnoseReport r;
  r.node = opt.node;
  r.checks.push_back(check_local_allreduce(opt.local_ranks));  // first: it forks
  r.checks.push_back(check_gemm());
  r.checks.push_back(check_memory_bandwidth());
  r.checks.push_back(check_pairwise(opt));
  // The badnode fault (MEGATRAIN_FAULTS=badnode:node=N) makes this node's matmul check fail, as a node with a
  // throttled or faulty GPU would: what the supervisor's eviction path is tested with.
  if (fault_badnode(opt.node)) {
    r.checks[1].pass = false;
    r.checks[1].detail += fmt::format("; failed by the injected fault badnode:node={}", opt.node);
  }
  for (auto& c : r.checks) {
    if (opt.expect.is_object() && opt.expect.contains(c.name) && opt.expect[c.name].is_number())
      c.expected = opt.expect[c.name].get<double>();
    judge(c, opt.tolerance);
  }
  std::string no_gpus;
  const std::vector<GpuHealth> gpus = probe_gpus(&no_gpus);
  for (CheckResult& c : judge_gpus(gpus)) r.checks.push_back(std::move(c));
  if (gpus.empty()) r.notes.push_back("GPU checks not run: " + no_gpus);
  if (gpus.size() >= 2) {
    const NodeAllreduce a = node_gpu_allreduce();
    r.checks.push_back(judge_gpu_allreduce({a.gpus, a.ran, a.busbw_gbps, a.exact, a.why}, gpus[0].name));
  }
  return r;
}

}  // namespace mt::launch
