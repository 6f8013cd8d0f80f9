// Memory and elementwise ops, and make_cpu_ops().
#include <cstring>

#include "megatrain/kernels/cpu/cpu_ops.h"
#include "megatrain/kernels/cpu/cpu_util.h"

namespace mt {

using namespace cpu;

std::unique_ptr<Ops> make_cpu_ops() { return std::make_unique<CpuOps>(); }

void CpuOps::zero(Tensor t) {
  MT_CHECK(t.device == Device::CPU, "zero: tensor must be a CPU tensor");
  if (t.numel() == 0) return;
  MT_CHECK(t.defined(), "zero: tensor {} is undefined", t.shape_str());
  std::memset(t.ptr, 0, t.nbytes());
}

void CpuOps::copy(Tensor dst, Tensor src) {
  MT_CHECK(dst.device == Device::CPU && src.device == Device::CPU, "copy: tensors must be CPU tensors");
  MT_CHECK(dst.dtype == src.dtype, "copy: dtype mismatch (dst {}, src {})", dtype_name(dst.dtype),
           dtype_name(src.dtype));
  check_numel(dst, src.numel(), "copy", "dst");
  if (src.numel() == 0) return;
  MT_CHECK(dst.defined() && src.defined(), "copy: undefined tensor");
  if (dst.ptr != src.ptr) std::memmove(dst.ptr, src.ptr, src.nbytes());
}

void CpuOps::add(Tensor out, Tensor a, Tensor b) {
  float* o = f32_arg(out, "add", "out");
  const float* x = f32_arg(a, "add", "a");
  const float* y = f32_arg(b, "add", "b");
  const int64_t n = out.numel();
  check_numel(a, n, "add", "a");
  check_numel(b, n, "add", "b");
#pragma omp parallel for simd if (n > kParallelMin) schedule(static)
  for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
}

void CpuOps::axpy(Tensor dst, Tensor src, float alpha) {
  float* d = f32_arg(dst, "axpy", "dst");
  const float* s = f32_arg(src, "axpy", "src");
  const int64_t n = dst.numel();
  check_numel(src, n, "axpy", "src");
#pragma omp parallel for simd if (n > kParallelMin) schedule(static)
  for (int64_t i = 0; i < n; ++i) d[i] += alpha * s[i];
}

void CpuOps::scale(Tensor t, float s) {
  float* x = f32_arg(t, "scale", "t");
  const int64_t n = t.numel();
#pragma omp parallel for simd if (n > kParallelMin) schedule(static)
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

double CpuOps::sum_squares(Tensor t) {
  const float* x = f32_arg(t, "sum_squares", "t");
  return block_sum(t.numel(), [x](int64_t begin, int64_t end) {
    return lane_sum(begin, end, [x](int64_t i) { return static_cast<double>(x[i]) * x[i]; });
  });
}

}  // namespace mt
