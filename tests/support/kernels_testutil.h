// Helpers for the kernel tests: random data, float <-> double copies, closeness checks with a useful message,
// and central finite differences of a double-precision reference.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "megatrain/core/rng.h"
#include "megatrain/core/tensor.h"

namespace mt::test {

using VecF = std::vector<float>;
using VecD = std::vector<double>;

inline VecF randn(size_t n, uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  VecF v(n);
  for (auto& x : v) x = scale * rng.normal();
  return v;
}

inline VecD to_d(const VecF& v) { return VecD(v.begin(), v.end()); }

inline Tensor tf(VecF& v, std::initializer_list<int64_t> shape) { return f32_view(v.data(), shape); }
inline Tensor ti(std::vector<int32_t>& v, std::initializer_list<int64_t> shape) {
  return Tensor(v.data(), shape, DType::I32);
}

// Every got[i] within atol + rtol * |want[i]|; reports the worst element.
inline ::testing::AssertionResult close(const float* got, const VecD& want, double rtol, double atol) {
  double worst = -1;
  size_t wi = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::abs(double(got[i]) - want[i]);
    const double excess = err - (atol + rtol * std::abs(want[i]));
    if (!(excess <= 0) && (worst < 0 || !(excess <= worst))) {  // NaN counts as the worst
      worst = std::isnan(excess) ? INFINITY : excess;
      wi = i;
    }
  }
  if (worst < 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "element " << wi << " of " << want.size() << ": got " << got[wi] << ", want "
                                       << want[wi] << " (rtol " << rtol << ", atol " << atol << ")";
}
inline ::testing::AssertionResult close(const VecF& got, const VecD& want, double rtol, double atol) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  return close(got.data(), want, rtol, atol);
}

// d f / d x_i by central differences, for each i in idx (all coordinates when idx is empty).
inline VecD fd_grad(const std::function<double(const VecD&)>& f, VecD x, std::vector<size_t> idx = {},
                    double eps = 1e-5) {
  if (idx.empty())
    for (size_t i = 0; i < x.size(); ++i) idx.push_back(i);
  VecD g;
  for (size_t i : idx) {
    const double x0 = x[i];
    x[i] = x0 + eps;
    const double fp = f(x);
    x[i] = x0 - eps;
    const double fm = f(x);
    x[i] = x0;
    g.push_back((fp - fm) / (2 * eps));
  }
  return g;
}

// sum_i a[i] * w[i]: the scalar whose gradient with respect to a is w (turns dout into a loss).
inline double dot(const VecD& a, const VecF& w) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * w[i];
  return s;
}

// got[i] - base[i] for a tensor the op accumulated into (compared against a gradient).
inline VecF minus(const VecF& got, const VecF& base) {
  VecF d(got.size());
  for (size_t i = 0; i < got.size(); ++i) d[i] = got[i] - base[i];
  return d;
}

inline VecF pick(const VecF& v, const std::vector<size_t>& idx) {
  VecF out;
  for (size_t i : idx) out.push_back(v[i]);
  return out;
}

}  // namespace mt::test
