// Calibrates a cluster file for THIS machine, for the performance model (megatrain simulate --cluster): what one
// rank of a CPU run of N ranks gets. Started with as many ranks as the run it calibrates for, every rank times, at
// the same moment, OpenBLAS sgemm at the tiny model's GEMM shapes (forward, input-gradient and weight-gradient
// shapes, tp 1 and 2), memory bandwidth (a triad), the CPU backend's attention and a small kernel's fixed cost, one
// thread each, over half-second windows: so ranks that share cores (or a machine others use) measure the share they
// get. Then all ranks time Gloo all-reduces over loopback for the link's bandwidth and latency. Rank 0 writes the
// cluster file and prints a JSON summary.
//   build/megatrain launch --nproc 2 --exec -- build/bench/calibrate_cpu --out runs/local     # writes runs/local-2.toml
#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <vector>

#include "megatrain/comm/env.h"
#include "megatrain/comm/mesh.h"
#include "megatrain/comm/store.h"
#include "bench_util.h"
#include "megatrain/core/buffer.h"
#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"
#include "megatrain/core/rng.h"
#include "megatrain/kernels/ops.h"
#include "megatrain/perf/cluster.h"

using namespace mt;
using mt::bench::Buf;
using mt::bench::time_median;
using nlohmann::json;

namespace {


// Mean seconds per call over at least `window` seconds of calls, after one warm-up. A mean over a window, not the
// median of single calls: on a machine whose cores are shared, a short call often runs inside one time slice at full
// speed while a long one pays for the sharing; over a window both see the same share.
double time_window(const std::function<void()>& fn, double window) {
  fn();
  int calls = 0;
  const double t0 = now_seconds();
  double t = t0;
  do {
    fn();
    ++calls;
    t = now_seconds();
  } while (t - t0 < window);
  return (t - t0) / calls;
}

double sgemm_seconds(int M, int N, int K, double window) {
  Buf a(int64_t{M} * K), b(int64_t{N} * K), c(int64_t{M} * N);
  return time_window(
      [&] { cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a.p(), K, b.p(), K, 0.0f, c.p(), N); },
      window);
}

perf::Sourced src(double v, const std::string& s) { return perf::Sourced{v, s}; }

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string out = "runs/local";
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "--out" && i + 1 < argc)
        out = argv[++i];
      else
        fail("calibrate_cpu: unknown argument '{}' (--out PREFIX)", a);
    }
    omp_set_num_threads(1);
    openblas_set_num_threads(1);
    RankInfo ri = rank_info_from_env();
    const int n = ri.world_size;
    MT_CHECK(n >= 2, "run under `megatrain launch --nproc N --exec -- calibrate_cpu ...` with the run's N >= 2 ranks");
    auto store = open_store(ri.store_url);
    DeviceMesh mesh(*store, MeshShape{n, 1, 1}, ri.rank, {});
    mesh.dp().barrier()->wait();

    json summary;
    perf::Cluster cl;
    {
      // GEMMs of the tiny model (configs/tiny.toml: C 256, F 1024, vocab padded to 50304; 8 x 128 tokens per
      // micro-batch) for tp 1 and 2, in their forward, input-gradient and weight-gradient shapes.
      const int N = 1024, C = 256, F = 1024, V = 50304;
      std::map<double, std::vector<double>> rate_by_flops;
      double peak = 0;
      for (int tp : {1, 2})
        for (auto [o, in] :
             std::vector<std::pair<int, int>>{{3 * C / tp, C}, {C, C / tp}, {F / tp, C}, {C, F / tp}, {V / tp, C}})
          for (auto [m, n, k] : std::vector<std::tuple<int, int, int>>{{N, o, in}, {N, in, o}, {o, in, N}}) {
            const double fl = 2.0 * m * n * k;
            const double r = fl / sgemm_seconds(m, n, k, 0.5);
            rate_by_flops[fl].push_back(r);
            peak = std::max(peak, r);
          }
      peak = std::max(peak, 2.0 * 1024 * 1024 * 1024 / sgemm_seconds(1024, 1024, 1024, 0.5));
      perf::Curve curve;
      for (auto& [fl, rs] : rate_by_flops) {
        double mean = 0;
        for (double r : rs) mean += r;
        curve.points.emplace_back(fl, std::min(1.0, mean / rs.size() / peak));
      }
      curve.source = "our benchmark (bench/calibrate_cpu): OpenBLAS sgemm, 1 thread, at the tiny model's GEMM shapes, "
                     "as a fraction of the fastest shape";
      // Triad a = b + s*c over 3 x 32 MiB: 12 bytes moved per element.
      const int64_t E = 8 << 20;
      Buf a(E), b(E), c(E);
      const double t_triad = time_window(
          [&] {
            float* pa = a.p();
            const float* pb = b.p();
            const float* pc = c.p();
            for (int64_t i = 0; i < E; ++i) pa[i] = pb[i] + 0.5f * pc[i];
          },
          0.5);
      const double mem_bps = 12.0 * E / t_triad;
      // The CPU backend's attention at the tiny shape (flash-style: it recomputes the scores in backward).
      auto ops = make_cpu_ops();
      AttnShape s{8, 128, 4, 4, 64, 0};
      Buf qkv(int64_t{N} * s.qkv_width(), 1.0f), o(int64_t{N} * C), lse(8 * 4 * 128), dout(int64_t{N} * C),
          dqkv(int64_t{N} * s.qkv_width());
      const double tf = time_window(
          [&] {
            ops->attention_forward(o.t({N, C}), lse.t({lse.n}), qkv.t({qkv.n}), s);
          },
          0.5);
      const double tb = time_window(
          [&] {
            ops->attention_backward(dqkv.t({dqkv.n}), dout.t({N, C}), qkv.t({qkv.n}), o.t({N, C}), lse.t({lse.n}), s);
          },
          0.5);
      const double attn_fwd_flops = 4.0 * 8 * 4 * 64 * (128.0 * 129 / 2);
      const double attn_eff = 3.5 * attn_fwd_flops / (tf + tb) / peak;
      // A kernel's fixed cost: GeLU over 64 floats is all overhead.
      Buf gi(64), go(64);
      const double launch = time_median([&] { ops->gelu_forward(go.t({64}), gi.t({64})); }, 101);
      const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
      mesh.dp().barrier()->wait();
      // Gloo all-reduce over loopback, ring of n: 2(n-1)/n S/B + 2(n-1) alpha.
      auto allreduce_s = [&](int64_t floats, int reps) {
        Buf x(floats);
        return time_median([&] { mesh.dp().allreduce(x.t({floats}))->wait(); }, reps);
      };
      // The latency as a mean over many calls, not a median: on a VM whose two cores are shared, a wake-up now
      // and then takes milliseconds, and a run pays the mean of its hundreds of small collectives (medians of 50
      // calls ranged 200-1,500 us between runs here). Both ranks make the same number of calls.
      const double t_small = [&] {
        Buf x(16);
        mesh.dp().allreduce(x.t({16}))->wait();
        const int reps = 400;
        const double t0 = now_seconds();
        for (int i = 0; i < reps; ++i) mesh.dp().allreduce(x.t({16}))->wait();
        return (now_seconds() - t0) / reps;
      }();
      const double big = 4 << 20;  // 16 MiB of fp32
      const double t_big = allreduce_s(int64_t(big), 9);
      const double alpha = t_small / (2.0 * (n - 1));
      const double link_bps = 2.0 * (n - 1) / n * big * 4 / std::max(1e-9, t_big - 2.0 * (n - 1) * alpha);

      {
        const std::string note = fmt::format(" (one thread per rank, {} ranks on {} cores, measured together)", n,
                                             cores);
        cl.name = fmt::format("local-cpu-{}ranks", n);
        cl.topology = "single-host";
        const std::string own = "our benchmark (bench/calibrate_cpu) on this machine: ";
        cl.peak_tflops = src(peak * 1e-12, own + "fastest OpenBLAS sgemm" + note);
        cl.hbm_gbps = src(mem_bps * 1e-9, own + "triad bandwidth" + note);
        cl.memory_gib = src(double(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE) / n / double(1 << 30),
                            "this machine's memory / ranks (sysconf)");
        cl.gpus_per_node = src(n, "every rank of the run is on this one host");
        cl.dtype_bytes = src(4, "the CPU backend computes in fp32");
        cl.sm_count = src(1, "one thread per rank: no tile waves");
        cl.host_cores = src(cores, "std::thread::hardware_concurrency() on this machine: the cores every rank shares");
        cl.nvlink_gbps = src(link_bps * 1e-9, own + fmt::format("Gloo all-reduce over loopback, {} ranks, 16 MiB: "
                                                                "2(n-1)/n S / (t - 2(n-1) alpha)",
                                                                n));
        cl.nvlink_latency_us = src(alpha * 1e6, own + "Gloo all-reduce of 64 bytes / 2(n-1) steps");
        cl.nic_gbps = cl.nvlink_gbps;
        cl.nics_per_node = src(n, "loopback: each rank has the link to itself");
        cl.nic_latency_us = cl.nvlink_latency_us;
        cl.gemm = curve;
        cl.gemm.source += note;
        cl.gemm_tile_m = src(1, "no wave quantization on a CPU");
        cl.gemm_tile_n = src(1, "no wave quantization on a CPU");
        cl.attention = src(std::min(1.0, attn_eff), own +
                                                        "CPU backend attention fwd+bwd at B 8, T 128, 4 heads of 64, "
                                                        "as a fraction of the sgemm peak" +
                                                        note);
        cl.attention_fused = cl.attention;
        cl.memory_bound = src(1, "the hbm figure is already the achieved triad bandwidth");
        cl.kernel_launch_us = src(launch * 1e6, own + "GeLU over 64 floats (all fixed cost)" + note);
        cl.optimizer_bytes_per_param =
            src(28, "AdamW in fp32 without master copy: read p, g, m, v, write p, m, v (bench_ops counts the same 28)");
        cl.straggler_node_fraction = src(0, "one host");
        cl.straggler_slowdown = src(0, "one host");
        cl.gpu_speed_range = src(0, "one host: the ranks share one CPU");
        for (auto* f : {&cl.store_op_us, &cl.store_async_op_us, &cl.host_copy_gbps, &cl.storage_gbps_per_node,
                        &cl.storage_read_gbps_per_node, &cl.failure_detect_s, &cl.node_mtbf_hours})
          *f = src(1, "not measured here (scale costs are not modelled for a single CPU host)");
      }
      summary = {{"sgemm_peak_gflops_1thread", peak * 1e-9},
                 {"triad_GBps_1thread", mem_bps * 1e-9},
                 {"attention_efficiency", attn_eff},
                 {"gelu64_us", launch * 1e6},
                 {"gloo_allreduce_alpha_us", alpha * 1e6},
                 {"gloo_link_GBps", link_bps * 1e-9},
                 {"ranks", n},
                 {"cores", cores}};
    }
    if (ri.rank == 0) {
      const std::string path = fmt::format("{}-{}.toml", out, n);
      std::ofstream f(path);
      MT_CHECK(f.good(), "cannot write {}", path);
      f << "# Written by bench/calibrate_cpu: constants measured on this machine for " << n << " ranks.\n"
        << perf::to_toml(cl);
      summary["file"] = path;
      std::cout << summary.dump(2) << std::endl;
    }
    mesh.dp().barrier()->wait();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "calibrate_cpu: " << e.what() << "\n";
    return 1;
  }
}
