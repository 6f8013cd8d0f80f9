#include "megatrain/train/peak.h"

#include <fmt/format.h>
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "megatrain/core/buffer.h"
#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"
#include "megatrain/core/rng.h"

namespace mt {

double measure_cpu_matmul_flops(Ops& ops, int rows, int in, int out, int reps) {
  HostBuffer a(size_t(rows) * in * 4), w(size_t(out) * in * 4), c(size_t(rows) * out * 4);
  Rng r(1);
  for (size_t i = 0; i < size_t(rows) * in; ++i) a.f32()[i] = r.uniform();
  for (size_t i = 0; i < size_t(out) * in; ++i) w.f32()[i] = r.uniform();
  Tensor A = f32_view(a.f32(), {rows, in}), W = f32_view(w.f32(), {out, in}), Cc = f32_view(c.f32(), {rows, out});
  ops.matmul_forward(Cc, A, W, Tensor{});  // warm-up
  auto cpu_seconds = [] {
    timespec ts{};
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  };
  double best = 1e300;  // the least disturbed GEMM: a bound errs high
  for (int i = 0; i < reps; ++i) {
    const double t0 = cpu_seconds();
    ops.matmul_forward(Cc, A, W, Tensor{});
    best = std::min(best, cpu_seconds() - t0);
  }
  return 2.0 * rows * in * out / std::max(best, 1e-9);
}

double cpu_peak_per_rank(double per_cpu_flops, const CpuShare& s) {
  if (s.threads < 1 || s.local_ranks < 1 || s.cpus < 1)
    fail_as(ErrorKind::Config, "a CPU share needs at least 1 thread, rank and CPU (got {} threads, {} ranks, {} CPUs)",
            s.threads, s.local_ranks, s.cpus);
  return per_cpu_flops * std::min(double(s.threads), double(s.cpus) / s.local_ranks);
}

int affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return std::max(1, int(std::thread::hardware_concurrency()));
  return std::max(1, CPU_COUNT(&set));
}

double datasheet_peak_flops(const std::string& name) {
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  // NVIDIA's datasheets, dense (no sparsity) BF16 tensor-core TFLOP/s. The PCIe and NVL H100 run lower clocks and
  // fewer SMs than the SXM part, so a name must be told apart before the bare "H100" matches.
  struct Row {
    std::vector<const char*> all;  // every substring must be in the name
    double tflops;
  };
  static const std::vector<Row> table = {
      {{"H200"}, 989.4}, {{"GH200"}, 989.4}, {{"H100", "PCIe"}, 756.0}, {{"H100", "NVL"}, 835.5},
      {{"H100"}, 989.4}, {{"A100"}, 312.0},  {{"A800"}, 312.0},         {{"H800"}, 989.4},
  };
  for (const Row& r : table)
    if (std::all_of(r.all.begin(), r.all.end(), has)) return r.tflops * 1e12;
  return 0;
}

PeakFlops peak_flops(double configured_tflops, Ops& ops, const CpuShare& share) {
  if (configured_tflops > 0) return {configured_tflops * 1e12, "configured"};
  if (ops.device() == Device::CPU) {
    const double per_cpu = measure_cpu_matmul_flops(ops), peak = cpu_peak_per_rank(per_cpu, share);
    const auto n = [](int k, const char* what) { return fmt::format("{} {}{}", k, what, k == 1 ? "" : "s"); };
    return {peak, fmt::format("peak {:.1f} GFLOP/s a rank: sgemm {:.1f} GFLOP/s per CPU, this node's {} {} {} of {}",
                              peak / 1e9, per_cpu / 1e9, n(share.cpus, "CPU"),
                              share.local_ranks * share.threads > share.cpus ? "shared by" : "for",
                              n(share.local_ranks, "rank"), n(share.threads, "thread"))};
  }
  const std::string name = ops.device_name();
  const double p = datasheet_peak_flops(name);
  if (p <= 0)
    fail_as(ErrorKind::Config,
            "no datasheet peak is known for the GPU \"{}\": set train.peak_tflops (its dense bf16 "
            "TFLOP/s) so MFU can be computed",
            name);
  return {p, name + " datasheet, dense bf16"};
}

}  // namespace mt
