// Helpers shared by the CPU kernels: dtype and device checks (the shape checks are in op_shapes.h), a vectorisable
// exp, per-thread scratch, and a deterministic parallel sum.
#pragma once
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <exception>
#include <vector>

#include "megatrain/core/tensor.h"
#include "megatrain/kernels/op_shapes.h"

namespace mt::cpu {

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kParallelMin = 1 << 15;

// A required fp32 CPU tensor; names the op and argument when it is not one.
inline float* f32_arg(const Tensor& t, const char* op, const char* name) {
  MT_CHECK(t.defined(), "{}: {} is required but undefined", op, name);
  MT_CHECK(t.device == Device::CPU, "{}: {} must be a CPU tensor", op, name);
  MT_CHECK(t.dtype == DType::F32, "{}: {} must be F32 (got {})", op, name, dtype_name(t.dtype));
  return static_cast<float*>(t.ptr);
}

// An optional fp32 CPU tensor: nullptr when undefined.
inline float* f32_opt(const Tensor& t, const char* op, const char* name) {
  return t.defined() ? f32_arg(t, op, name) : nullptr;
}

inline const int32_t* i32_arg(const Tensor& t, const char* op, const char* name) {
  MT_CHECK(t.defined(), "{}: {} is required but undefined", op, name);
  MT_CHECK(t.device == Device::CPU, "{}: {} must be a CPU tensor", op, name);
  MT_CHECK(t.dtype == DType::I32, "{}: {} must be I32 (got {})", op, name, dtype_name(t.dtype));
  return static_cast<const int32_t*>(t.ptr);
}

// exp(x) to ~1 ulp, written so that GCC vectorises loops calling it (glibc's expf only vectorises under
// -ffast-math). Range reduction x = n ln2 + r (Cody-Waite split of ln2), Cephes' minimax polynomial for
// exp(r), 2^n applied as two exponent-bit factors so n = 128 (x up to 88.72) stays finite. Results below
// FLT_MIN are flushed to 0 (denormals are slow and meaningless in a softmax), overflow gives inf, NaN stays NaN.
inline float fast_exp(float x) {
  constexpr float kHi = 88.72283905206835f, kLo = -87.33654475055310f;  // ln(FLT_MAX), ln(FLT_MIN)
  float xc = x > kHi ? kHi : x;  // comparisons written so that a NaN passes through unchanged
  xc = xc < kLo ? kLo : xc;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding and subtracting rounds to the nearest integer
  const float n = (xc * 1.44269504088896341f + kRound) - kRound;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * (r * r) + r + 1.0f;
  const int32_t ni = static_cast<int32_t>(n), n1 = ni >> 1, n2 = ni - n1;
  float y = e * std::bit_cast<float>((n1 + 127) << 23) * std::bit_cast<float>((n2 + 127) << 23);
  y = x < kLo ? 0.0f : y;
  y = x > kHi ? INFINITY : y;
  return y;
}

inline float fast_sigmoid(float x) { return 1.0f / (1.0f + fast_exp(-x)); }

// fn(begin, end) over contiguous blocks of [0, n), in parallel when n is large. Loops inside fn carry
// `#pragma omp simd`, which vectorises bodies (e.g. with std::sqrt) that `parallel for simd` leaves scalar.
template <class Fn>
void parallel_blocks(int64_t n, Fn&& fn) {
  constexpr int64_t kBlock = 1 << 14;
  if (n <= kParallelMin) {
    if (n > 0) fn(int64_t{0}, n);
    return;
  }
  const int64_t nb = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < nb; ++b) fn(b * kBlock, std::min(n, (b + 1) * kBlock));
}

// Sum of f(i) for i in [begin, end) in double. kLanes independent accumulators let the adds vectorise (one
// accumulator is a serial chain of adds, 4x slower and memory-bound no more); the order is fixed at compile
// time, so the result is deterministic.
template <class F>
inline double lane_sum(int64_t begin, int64_t end, F&& f) {
  constexpr int kLanes = 16;
  double acc[kLanes] = {};
  int64_t i = begin;
  for (; i + kLanes <= end; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += f(i + l);
  double s = 0;
  for (; i < end; ++i) s += f(i);
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

// An exception must never leave an OpenMP region: the runtime then calls std::terminate (SIGABRT, no message).
// Code inside a region that can throw (an allocation) runs through run(), which keeps the first exception and
// returns a default value instead; the region's threads still meet every worksharing construct (a thread whose
// run() failed skips its iterations), and rethrow() after the region throws what was kept.
class RegionErrors {
 public:
  template <class F>
  auto run(F&& f) noexcept -> decltype(f()) {
    try {
      return f();
    } catch (...) {
#pragma omp critical(mt_region_errors)
      if (!first_) first_ = std::current_exception();
      return decltype(f()){};
    }
  }
  void rethrow() const {
    if (first_) std::rethrow_exception(first_);
  }

 private:
  std::exception_ptr first_;
};

// Per-thread scratch, grown on demand and reused across calls (no allocation in steady state).
inline float* thread_scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// Sum of partial(begin, end) over fixed blocks of [0, n), computed in parallel and added in block order:
// the result is the same for any thread count (a restart on another machine reproduces it bit for bit).
template <class Partial>
double block_sum(int64_t n, Partial&& partial) {
  constexpr int64_t kBlock = 1 << 16;
  const int64_t nb = (n + kBlock - 1) / kBlock;
  if (nb <= 1) return n > 0 ? partial(int64_t{0}, n) : 0.0;
  thread_local std::vector<double> parts;
  parts.resize(static_cast<size_t>(nb));
  double* p = parts.data();
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < nb; ++b) p[b] = partial(b * kBlock, std::min(n, (b + 1) * kBlock));
  double s = 0;
  for (int64_t b = 0; b < nb; ++b) s += p[b];
  return s;
}

}  // namespace mt::cpu
