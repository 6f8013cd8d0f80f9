#include "megatrain/launch/gpu_probe.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <cmath>
#include <vector>

#include "megatrain/core/buffer.h"
#include "megatrain/core/clock.h"
#include "megatrain/kernels/gpu_identity.h"
#include "megatrain/kernels/ops.h"
#include "megatrain/launch/nvml_reader.h"
#include "megatrain/train/peak.h"

namespace mt::launch {
namespace {

// The median over `reps` timed batches of `per` runs of f, each batch finished on the device, in seconds per run. A
// batch spans tens of milliseconds, several of the time slices in which a GPU shared with another process's context
// runs each: a single short run could land inside one slice and show the full rate while the GPU is contended.
template <typename F>
double median_device_seconds(Ops& ops, int reps, int per, F&& f) {
  f();  // warm-up (the GEMM's algorithm choice, first-touch of the memory)
  ops.synchronize();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_seconds();
    for (int j = 0; j < per; ++j) f();
    ops.synchronize();
    t.push_back((now_seconds() - t0) / per);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// A bf16 device matrix filled from host floats (uploaded as F32, converted on the device).
Tensor upload_bf16(Ops& ops, std::vector<Buffer>& keep, const std::vector<float>& v, int64_t rows, int64_t cols) {
  keep.push_back(ops.alloc(v.size() * 4));
  Tensor f = keep.back().view({rows, cols}, DType::F32);
  ops.to_device(f, v.data());
  keep.push_back(ops.alloc(v.size() * 2));
  Tensor b = keep.back().view({rows, cols}, DType::BF16);
  ops.convert(b, f);
  return b;
}

// out = a . w^T for a GEMM whose every sum is a small integer: exact in fp32 accumulation and in the bf16 result
// (|sum| <= K = 256 needs 9 bits; bf16 holds 8 and an implicit one: integers up to 256 are exact). A faulty GPU that
// flips a bit anywhere in the product or the sum shows here.
bool self_test(Ops& ops) {
  constexpr int64_t M = 2048, N = 2048, K = 256;
  auto pattern = [](int64_t i, int64_t k, int s) { return float(int((i * 131 + k * 71 + s) % 3) - 1); };
  std::vector<float> a(size_t(M * K)), w(size_t(N * K));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k) a[size_t(i * K + k)] = pattern(i, k, 0);
  for (int64_t j = 0; j < N; ++j)
    for (int64_t k = 0; k < K; ++k) w[size_t(j * K + k)] = pattern(j, k, 1);
  std::vector<Buffer> keep;
  Tensor A = upload_bf16(ops, keep, a, M, K), W = upload_bf16(ops, keep, w, N, K);
  keep.push_back(ops.alloc(size_t(M * N) * 2));
  Tensor C = keep.back().view({M, N}, DType::BF16);
  keep.push_back(ops.alloc(size_t(M * N) * 4));
  Tensor Cf = keep.back().view({M, N}, DType::F32);
  ops.matmul_forward(C, A, W, Tensor{});
  ops.convert(Cf, C);
  std::vector<float> got(size_t(M * N));
  ops.to_host(got.data(), Cf);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      int sum = 0;
      for (int64_t k = 0; k < K; ++k) sum += int(a[size_t(i * K + k)]) * int(w[size_t(j * K + k)]);
      if (got[size_t(i * N + j)] != float(sum)) return false;
    }
  return true;
}

GpuHealth measure(int index) {
  GpuHealth g;
  g.index = index;
  auto ops = make_cuda_ops(index);
  g.name = ops->device_name();
  g.datasheet_tflops = datasheet_peak_flops(g.name) / 1e12;
  g.datasheet_hbm_gbps = datasheet_hbm_gbps(g.name);
  {  // cuBLASLt bf16 8192^3 through the backend's own GEMM, on values drawn in [-1, 1) (zeros run faster than real
     // data: measured 13% on an H200), 20 GEMMs (~30 ms on a healthy H100/H200) per timed batch
    constexpr int64_t n = 8192;
    std::vector<float> v(size_t(n * n));
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (float& e : v) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      e = float(int64_t(x >> 40) - (int64_t(1) << 23)) / float(int64_t(1) << 23);
    }
    std::vector<Buffer> keep;
    Tensor a = upload_bf16(*ops, keep, v, n, n);
    keep.push_back(ops->alloc(size_t(n * n) * 2));
    Tensor c = keep.back().view({n, n}, DType::BF16);
    const double s = median_device_seconds(*ops, 5, 20, [&] { ops->matmul_forward(c, a, a, Tensor{}); });
    g.gemm_tflops = 2.0 * double(n) * n * n / s / 1e12;
  }
  {  // a 1 GiB device-to-device copy, bytes read + written
    constexpr size_t bytes = size_t(1) << 30;
    Buffer src = ops->alloc(bytes), dst = ops->alloc(bytes);
    const int64_t n = int64_t(bytes / 4);
    Tensor s = src.view({n}, DType::F32), d = dst.view({n}, DType::F32);
    const double sec = median_device_seconds(*ops, 5, 10, [&] { ops->copy(d, s); });
    g.hbm_gbps = 2.0 * double(bytes) / sec / 1e9;
  }
  std::tie(g.h2d_gbps, g.d2h_gbps) = cuda_host_link_gbps(index);
  g.self_test_ran = true;
  g.self_test_exact = self_test(*ops);
  if (std::string why; !read_nvml(cuda_pci_bus_id(index), g, &why)) g.nvml_why = why;
  return g;
}

}  // namespace

std::vector<GpuHealth> probe_gpus(std::string* why_none) {
  const int n = cuda_device_count();
  if (n == 0) {
    *why_none = cuda_versions().rfind("not built", 0) == 0 ? "this megatrain was built without CUDA"
                                                           : "no GPU is visible";
    return {};
  }
  std::vector<GpuHealth> gpus;
  for (int i = 0; i < n; ++i) gpus.push_back(measure(i));
  return gpus;
}

}  // namespace mt::launch
