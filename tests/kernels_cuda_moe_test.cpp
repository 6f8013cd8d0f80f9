// The CUDA backend's MoE ops (kernels/cuda/moe.cpp, moe_grouped_gemm.cpp and their kernels) against the CPU
// backend's (the fp32 reference) on the same bf16-rounded inputs and the same host routing: one expert and eight,
// top-1 and top-2, row widths on the 16-byte vector path (C a multiple of 8) and off it, capacity drops, and experts
// the router never picks (no rows). The backwards repeat bit for bit, and the grouped GEMM's result does not depend
// on how many streams it is spread over. Skipped without a GPU.
//
// Tolerances, from the arithmetic. u = 2^-24 is fp32's unit roundoff; bf16 keeps 8 significant bits, so rounding a
// value v to bf16 moves it by at most 2^-8 |v|. gamma(n) = n u' / (1 - n u') bounds the error of any order of n fp32
// additions relative to the sum of the terms' magnitudes S (Higham, Accuracy and Stability of Numerical
// Algorithms, 3.1), u' = u for the kernels and the CPU, u' = 2u for the GEMMs: the tensor cores' fp32 accumulation
// is not specified to round to nearest at each addition, and truncation errs by up to one ulp, 2u. Products of two
// bf16 values are exact in fp32 (8 + 8 significant bits), so GEMMs on bf16 inputs err only in their additions.
//   * permute: a copy, exact.
//   * permute backward: dx0 + the token's k rows, both sides in fp32 (each within gamma(k) S of the exact sum), the
//     GPU's rounded once to bf16: |got - want| <= 2^-8 |want| + 3 gamma(k + 1) S (a term of slack),
//     S = |dx0| + sum |dxp|.
//   * combine: k products and additions per side (gamma(2k)); the same form with S = sum |gate * yp|.
//   * combine backward: dyp = gate * dy is one fp32 product on both sides, the GPU's then rounded: 2^-8 |want|.
//     dgate is a C-term dot, the CPU's in double (one rounding to float), the GPU's in fp32 in a fixed tree:
//     gamma(C) S + 2u |want|.
//   * grouped GEMM: out, din (bf16) 2^-8 |want| + 3 gamma'(n) S with n the summed dimension; dw (fp32) 3 gamma'(n) S
//     (plus dw's old value in S and n + 1 terms when accumulating). S is the same op run on |in| and |w| (its own
//     fp32 error is a factor 1 + gamma(n), covered by the 3).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "megatrain/core/bf16.h"
#include "megatrain/core/buffer.h"
#include "megatrain/kernels/cpu/moe.h"
#include "megatrain/kernels/cuda/cuda_ops.h"
#include "megatrain/kernels/moe_routing.h"
#include "megatrain/kernels/ops.h"
#include "support/device_tensors.h"
#include "support/kernels_testutil.h"

namespace mt {
namespace {

using test::randn;
using test::tf;
using test::VecF;

constexpr double kU = 0x1p-24;    // fp32 unit roundoff
constexpr double kBf16 = 0x1p-8;  // bf16's relative rounding bound

double gamma(int64_t n, double u = kU) { return n * u / (1 - n * u); }

struct Case {
  int64_t N, C;
  int E, k;
  float capacity_factor;
  std::vector<int> starved;  // experts pushed far down the router's order: they get no rows
};

std::string case_name(const Case& c) {
  return "E" + std::to_string(c.E) + "_k" + std::to_string(c.k) + "_C" + std::to_string(c.C) +
         (c.capacity_factor > 0 ? "_drops" : "") + (c.starved.empty() ? "" : "_starved");
}
void PrintTo(const Case& c, std::ostream* os) { *os << case_name(c); }

MoeRouting route(const Case& c, uint64_t seed) {
  VecF logits = randn(size_t(c.N * c.E), seed);
  for (int64_t t = 0; t < c.N; ++t)
    for (int e : c.starved) logits[t * c.E + e] -= 30.0f;
  MoeRouting r;
  moe_route(r, logits.data(), c.N, c.E, c.k, MoeRouter::Softmax, nullptr, c.capacity_factor);
  return r;
}

VecF abs_of(VecF v) {
  for (float& x : v) x = std::abs(x);
  return v;
}

// Every |got[i] - want[i]| <= rel * |want[i]| + abs_coef * mag[i] (mag empty: 0); reports the worst.
::testing::AssertionResult within(const VecF& got, const VecF& want, double rel, const VecF& mag, double abs_coef) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  for (size_t i = 0; i < want.size(); ++i) {
    const double bound = rel * std::abs(double(want[i])) + (mag.empty() ? 0.0 : abs_coef * mag[i]);
    if (!(std::abs(double(got[i]) - want[i]) <= bound))
      return ::testing::AssertionFailure() << "element " << i << " of " << want.size() << ": got " << got[i]
                                           << ", want " << want[i] << ", bound " << bound;
  }
  return ::testing::AssertionSuccess();
}

bool same_bits(const VecF& a, const VecF& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class CudaMoeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
    gpu_ = make_cuda_ops(-1, CudaOptions{"flash"});
    cpu_ = make_cpu_ops();
    mem_ = std::make_unique<test::DeviceTensors>(*gpu_);
  }
  // Device tensors (support/device_tensors.h): BF16 ones rounded in place first, so the CPU sees the same numbers.
  Tensor dev(VecF& v, std::initializer_list<int64_t> shape, DType dt = DType::BF16) {
    return mem_->upload(v, shape, dt);
  }
  VecF host(const Tensor& t) { return mem_->host(t); }
  std::unique_ptr<Ops> gpu_, cpu_;
  std::unique_ptr<test::DeviceTensors> mem_;
};

class CudaMoeCaseTest : public CudaMoeTest, public ::testing::WithParamInterface<Case> {};

TEST_P(CudaMoeCaseTest, PermuteAndCombineMatchTheCpu) {
  const Case c = GetParam();
  const MoeRouting r = route(c, 11);
  for (int e : c.starved) {
    ASSERT_EQ(r.offsets[e + 1], r.offsets[e]) << "expert " << e << " should have no rows";
  }
  if (c.capacity_factor > 0) {
    ASSERT_GT(r.dropped, 0);
  }
  MoeRoutingBuffers gbufs, cbufs;
  gbufs.allocate(*gpu_, c.N, c.k);
  cbufs.allocate(*cpu_, c.N, c.k);
  const MoeDeviceRouting gr = gbufs.upload(*gpu_, r), cr = cbufs.upload(*cpu_, r);
  const int64_t N = c.N, C = c.C, A = r.rows(), k = c.k;

  VecF x = randn(size_t(N * C), 1), xp(size_t(A * C), 9.0f);
  Tensor xg = dev(x, {N, C}), xpg = dev(xp, {A, C});
  gpu_->moe_permute(xpg, xg, gr);
  cpu_->moe_permute(tf(xp, {A, C}), tf(x, {N, C}), cr);
  EXPECT_TRUE(same_bits(host(xpg), xp)) << "permute is a copy";

  VecF dxp = randn(size_t(A * C), 2), dx = randn(size_t(N * C), 3);
  Tensor dxpg = dev(dxp, {A, C}), dxg = dev(dx, {N, C});
  VecF mag = abs_of(dx), adxp = abs_of(dxp);  // S = |dx0| + the magnitudes of the rows added
  cpu_->moe_permute_backward(tf(mag, {N, C}), tf(adxp, {A, C}), cr);
  gpu_->moe_permute_backward(dxg, dxpg, gr);
  cpu_->moe_permute_backward(tf(dx, {N, C}), tf(dxp, {A, C}), cr);
  EXPECT_TRUE(within(host(dxg), dx, kBf16, mag, 3 * gamma(k + 1))) << "permute backward";

  VecF yp = randn(size_t(A * C), 4), y(size_t(N * C), 9.0f);
  Tensor ypg = dev(yp, {A, C}), yg = dev(y, {N, C});
  VecF ymag(size_t(N * C)), ayp = abs_of(yp);
  cpu_->moe_combine(tf(ymag, {N, C}), tf(ayp, {A, C}), cr);  // gates are positive: sum |g yp|
  gpu_->moe_combine(yg, ypg, gr);
  cpu_->moe_combine(tf(y, {N, C}), tf(yp, {A, C}), cr);
  EXPECT_TRUE(within(host(yg), y, kBf16, ymag, 3 * gamma(2 * k))) << "combine";

  VecF dy = randn(size_t(N * C), 5), dyp(size_t(A * C), 9.0f), dg(size_t(N * k), 9.0f);
  Tensor dyg = dev(dy, {N, C}), dypg = dev(dyp, {A, C}), dgg = dev(dg, {N, k}, DType::F32);
  VecF dgmag(size_t(N * k)), scratch(size_t(A * C)), ady = abs_of(dy);
  cpu_->moe_combine_backward(tf(scratch, {A, C}), tf(dgmag, {N, k}), tf(ady, {N, C}), tf(ayp, {A, C}), cr);
  gpu_->moe_combine_backward(dypg, dgg, dyg, ypg, gr);
  cpu_->moe_combine_backward(tf(dyp, {A, C}), tf(dg, {N, k}), tf(dy, {N, C}), tf(yp, {A, C}), cr);
  EXPECT_TRUE(within(host(dypg), dyp, kBf16, {}, 0)) << "combine backward: dyp";
  EXPECT_TRUE(within(host(dgg), dg, 2 * kU, dgmag, gamma(C))) << "combine backward: dgate";
}

TEST_P(CudaMoeCaseTest, GroupedMatmulMatchesTheCpu) {
  const Case c = GetParam();
  const MoeRouting r = route(c, 12);
  const std::vector<int64_t>& off = r.offsets;
  const int64_t A = r.rows(), E = c.E, I = c.C, O = 48;
  VecF in = randn(size_t(A * I), 6), w = randn(size_t(E * O * I), 7, 0.1f), out(size_t(A * O));
  Tensor ing = dev(in, {A, I}), wg = dev(w, {E, O, I}), outg = dev(out, {A, O});
  VecF mag(size_t(A * O)), ain = abs_of(in), aw = abs_of(w);
  cpu_->moe_grouped_matmul_forward(tf(mag, {A, O}), tf(ain, {A, I}), tf(aw, {E, O, I}), off);
  gpu_->moe_grouped_matmul_forward(outg, ing, wg, off);
  cpu_->moe_grouped_matmul_forward(tf(out, {A, O}), tf(in, {A, I}), tf(w, {E, O, I}), off);
  EXPECT_TRUE(within(host(outg), out, kBf16, mag, 3 * gamma(I, 2 * kU))) << "forward";

  VecF dout = randn(size_t(A * O), 8), din(size_t(A * I));
  Tensor doutg = dev(dout, {A, O}), ding = dev(din, {A, I});
  VecF adout = abs_of(dout);
  for (bool acc : {false, true}) {
    VecF dw = randn(size_t(E * O * I), 9), dw0 = dw;
    Tensor dwg = dev(dw, {E, O, I}, DType::F32);
    VecF dinmag(size_t(A * I)), dwmag = abs_of(dw0);
    cpu_->moe_grouped_matmul_backward(tf(dinmag, {A, I}), tf(dwmag, {E, O, I}), tf(adout, {A, O}), tf(ain, {A, I}),
                                      tf(aw, {E, O, I}), off, acc);
    gpu_->moe_grouped_matmul_backward(ding, dwg, doutg, ing, wg, off, acc);
    cpu_->moe_grouped_matmul_backward(tf(din, {A, I}), tf(dw, {E, O, I}), tf(dout, {A, O}), tf(in, {A, I}),
                                      tf(w, {E, O, I}), off, acc);
    const VecF dw_got = host(dwg);
    EXPECT_TRUE(within(host(ding), din, kBf16, dinmag, 3 * gamma(O, 2 * kU))) << "din, accumulate_dw " << acc;
    EXPECT_TRUE(within(dw_got, dw, 0, dwmag, 3 * gamma(A + 1, 2 * kU))) << "dw, accumulate_dw " << acc;
    for (int e : c.starved) {  // no rows: zeros when overwriting, the old gradient untouched when accumulating
      for (int64_t i = 0; i < O * I; ++i) {
        ASSERT_EQ(dw_got[e * O * I + i], acc ? dw0[e * O * I + i] : 0.0f) << "expert " << e << " acc " << acc;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Routings, CudaMoeCaseTest,
                         ::testing::Values(Case{67, 64, 1, 1, 0.0f, {}}, Case{67, 64, 8, 1, 0.0f, {}},
                                           Case{67, 64, 8, 2, 0.0f, {}}, Case{80, 37, 8, 2, 0.5f, {}},
                                           Case{67, 64, 8, 2, 0.0f, {1, 4, 7}}, Case{67, 37, 8, 1, 0.0f, {0, 3}}),
                         [](const ::testing::TestParamInfo<Case>& p) { return case_name(p.param); });

// The backwards twice from the same inputs: the same bits (gathers and fixed-order reductions, no atomics), and the
// grouped GEMM the same on one stream as spread over the lanes.
TEST_F(CudaMoeTest, BackwardsRepeatBitForBitAndTheLanesDoNotChangeTheResult) {
  const Case c{1024, 256, 8, 2, 0.0f, {5}};
  const MoeRouting r = route(c, 13);
  MoeRoutingBuffers bufs;
  bufs.allocate(*gpu_, c.N, c.k);
  const MoeDeviceRouting gr = bufs.upload(*gpu_, r);
  const int64_t N = c.N, C = c.C, A = r.rows(), E = c.E, k = c.k, O = 512;
  VecF dxp = randn(size_t(A * C), 1), dy = randn(size_t(N * C), 2), yp = randn(size_t(A * C), 3);
  VecF in = randn(size_t(A * C), 4), w = randn(size_t(E * O * C), 5, 0.05f), dout = randn(size_t(A * O), 6);
  Tensor dxpg = dev(dxp, {A, C}), dyg = dev(dy, {N, C}), ypg = dev(yp, {A, C});
  Tensor ing = dev(in, {A, C}), wg = dev(w, {E, O, C}), doutg = dev(dout, {A, O});
  VecF zn(size_t(N * C)), za(size_t(A * C)), zg(size_t(N * k)), zw(size_t(E * O * C)), zo(size_t(A * O));
  Tensor dxg = dev(zn, {N, C}), dypg = dev(za, {A, C}), dgg = dev(zg, {N, k}, DType::F32);
  Tensor ding = dev(za, {A, C}), dwg = dev(zw, {E, O, C}, DType::F32), outg = dev(zo, {A, O});
  auto run = [&] {
    std::vector<VecF> got;
    gpu_->zero(dxg);
    gpu_->moe_permute_backward(dxg, dxpg, gr);
    gpu_->moe_combine_backward(dypg, dgg, dyg, ypg, gr);
    gpu_->moe_grouped_matmul_backward(ding, dwg, doutg, ing, wg, r.offsets, false);
    gpu_->moe_grouped_matmul_forward(outg, ing, wg, r.offsets);
    for (const Tensor& t : {dxg, dypg, dgg, ding, dwg, outg}) got.push_back(host(t));
    return got;
  };
  auto& cuda = dynamic_cast<CudaOps&>(*gpu_);
  ASSERT_GT(cuda.expert_lanes(), 1);
  const std::vector<VecF> first = run(), second = run();
  cuda.set_expert_lanes(1);
  const std::vector<VecF> one_stream = run();
  const char* names[] = {"dx", "dyp", "dgate", "din", "dw", "out"};
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_TRUE(same_bits(first[i], second[i])) << names[i] << " differs between two runs";
    EXPECT_TRUE(same_bits(first[i], one_stream[i])) << names[i] << " differs between 4 lanes and 1";
  }
}

TEST_F(CudaMoeTest, RefusesARoutingNotOnTheDevice) {
  const MoeRouting r = route(Case{8, 16, 4, 2, 0.0f, {}}, 14);
  MoeRoutingBuffers cbufs;
  cbufs.allocate(*cpu_, 8, 2);
  const MoeDeviceRouting cr = cbufs.upload(*cpu_, r);  // host views: not for the CUDA ops
  VecF x = randn(8 * 16, 1), xp(size_t(r.rows() * 16));
  Tensor xg = dev(x, {8, 16}), xpg = dev(xp, {r.rows(), 16});
  EXPECT_THROW(gpu_->moe_permute(xpg, xg, cr), Error);
}

}  // namespace
}  // namespace mt
