// Shared by the GPU attention tests (kernels_flash_attention_test, kernels_cudnn_attention_test): shapes, bf16
// inputs, the CPU backend as the oracle, and the comparisons at a tensor's scale with the tolerances argued at the
// top of kernels_flash_attention_test.cpp (bf16 inputs and outputs, fp32 accumulation):
//   max |got - want| <= kMaxTol * max |want| and rms(got - want) <= kRmsTol * rms(want), the scale floored at
//   kScaleFloor (window 1 / T = 1 make dq and dk pure rounding noise); lse within kLseTol.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "megatrain/core/bf16.h"
#include "megatrain/kernels/ops.h"

namespace mt::attn_test {

constexpr double kMaxTol = 2e-2, kRmsTol = 1e-2, kLseTol = 2e-3, kScaleFloor = 0.05;

inline bool have_gpu() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  if (!ok) cudaGetLastError();  // clear the sticky "no device" error
  return ok;
}

inline AttnShape shape(int B, int T, int H, int Hkv, int hd, int W) {
  AttnShape s;
  s.B = B;
  s.T = T;
  s.n_head = H;
  s.n_kv_head = Hkv;
  s.head_dim = hd;
  s.window = W;
  return s;
}

inline std::string shape_name(const AttnShape& s) {
  std::ostringstream os;
  os << "B" << s.B << "_T" << s.T << "_H" << s.n_head << "_Hkv" << s.n_kv_head << "_hd" << s.head_dim << "_W"
     << s.window;
  return os.str();
}

inline int64_t out_width(const AttnShape& s) { return int64_t{s.n_head} * s.head_dim; }
inline size_t n_qkv(const AttnShape& s) { return size_t(s.B) * s.T * s.qkv_width(); }
inline size_t n_out(const AttnShape& s) { return size_t(s.B) * s.T * out_width(s); }
inline size_t n_lse(const AttnShape& s) { return size_t(s.B) * s.n_head * s.T; }

// N(0, 1) values rounded to bf16: q.k / sqrt(hd) is then ~N(0, 1), so softmax rows are neither flat nor one-hot.
inline std::vector<float> random_bf16(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = round_bf16(dist(rng));
  return v;
}

struct Inputs {
  std::vector<float> qkv, dout;  // bf16-exact values
};

inline Inputs make_inputs(const AttnShape& s, uint32_t seed) {
  return {random_bf16(n_qkv(s), seed), random_bf16(n_out(s), seed + 1)};
}

struct Results {
  std::vector<float> out, lse, dqkv;
};

inline std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = float_to_bf16(v[i]);
  return h;
}

inline std::vector<float> from_bf16(const std::vector<uint16_t>& h) {
  std::vector<float> v(h.size());
  for (size_t i = 0; i < h.size(); ++i) v[i] = bf16_to_float(h[i]);
  return v;
}

// ---- the oracle: the fp32 CPU backend ------------------------------------------------------------------------------

inline Results cpu_forward(const AttnShape& s, const Inputs& in) {
  auto cpu = make_cpu_ops();
  Results r;
  std::vector<float> qkv = in.qkv;
  r.out.resize(n_out(s));
  r.lse.resize(n_lse(s));
  cpu->attention_forward(f32_view(r.out.data(), {s.B, s.T, out_width(s)}), f32_view(r.lse.data(), {s.B, s.n_head, s.T}),
                         f32_view(qkv.data(), {s.B, s.T, s.qkv_width()}), s);
  return r;
}

// The CPU backward fed exactly what the GPU backward consumed: the same qkv and dout, and the GPU's out and lse.
inline std::vector<float> cpu_backward(const AttnShape& s, const Inputs& in, std::vector<float> out,
                                       std::vector<float> lse) {
  auto cpu = make_cpu_ops();
  std::vector<float> qkv = in.qkv, dout = in.dout, dqkv(in.qkv.size());
  cpu->attention_backward(f32_view(dqkv.data(), {s.B, s.T, s.qkv_width()}),
                          f32_view(dout.data(), {s.B, s.T, out_width(s)}),
                          f32_view(qkv.data(), {s.B, s.T, s.qkv_width()}),
                          f32_view(out.data(), {s.B, s.T, out_width(s)}), f32_view(lse.data(), {s.B, s.n_head, s.T}),
                          s);
  return dqkv;
}

// ---- comparison ----------------------------------------------------------------------------------------------------

// Columns of every qkv row holding the q, k or v part.
inline std::vector<float> qkv_part(const AttnShape& s, const std::vector<float>& x, char which) {
  const int64_t W = s.qkv_width(), qw = out_width(s), kw = int64_t{s.n_kv_head} * s.head_dim;
  const int64_t c0 = which == 'q' ? 0 : which == 'k' ? qw : qw + kw, width = which == 'q' ? qw : kw;
  std::vector<float> p;
  for (int64_t r = 0; r < int64_t{s.B} * s.T; ++r)
    for (int64_t c = 0; c < width; ++c) p.push_back(x[r * W + c0 + c]);
  return p;
}

// got against want at the scale of want (see the top of this file).
inline void expect_close(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
                         double max_tol = kMaxTol, double rms_tol = kRmsTol, double floor = kScaleFloor) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double max_ref = 0, ss_ref = 0, max_err = 0, ss_err = 0;
  size_t worst = 0, bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) ++bad;
    const double e = std::fabs(double{got[i]} - want[i]);
    max_ref = std::max(max_ref, std::fabs(double{want[i]}));
    ss_ref += double{want[i]} * want[i];
    ss_err += e * e;
    if (e > max_err) {
      max_err = e;
      worst = i;
    }
  }
  ASSERT_EQ(bad, 0u) << what << ": " << bad << " non-finite values (never written?)";
  const double n = static_cast<double>(std::max<size_t>(got.size(), 1));
  const double rms_ref = std::sqrt(ss_ref / n), rms_err = std::sqrt(ss_err / n);
  EXPECT_LE(max_err, max_tol * std::max(max_ref, floor))
      << what << ": worst element " << worst << " got " << got[worst] << " want " << want[worst] << " (max |want| "
      << max_ref << ")";
  EXPECT_LE(rms_err, rms_tol * std::max(rms_ref, floor)) << what << ": rms error " << rms_err << ", rms " << rms_ref;
}

inline void expect_lse_close(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
                             double tol = kLseTol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << ": lse[" << i << "] = " << got[i];
    ASSERT_NEAR(got[i], want[i], tol) << what << ": lse[" << i << "]";
  }
}

inline void expect_dqkv_close(const std::string& what, const AttnShape& s, const std::vector<float>& got,
                              const std::vector<float>& want) {
  for (char part : {'q', 'k', 'v'}) expect_close(what + " d" + part, qkv_part(s, got, part), qkv_part(s, want, part));
}

}  // namespace mt::attn_test
