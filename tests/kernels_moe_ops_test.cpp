// The MoE entry points of Ops on the CPU backend (kernels/ops.h, cpu/moe_ops.cpp):
//  * each equals the reference function of kernels/cpu/moe.h bit for bit (it wraps it), on routings with and
//    without capacity drops, top-1 and top-2, one expert and eight;
//  * the grouped matmul, with experts that get no rows, against a naive double product per expert, within the fp32
//    accumulation bound (below); with accumulate_dw false an expert without rows gets zeros, with it true it keeps
//    its gradient;
//  * MoeRoutingBuffers on the CPU backend views the host routing's own vectors; the ops refuse bad offsets.
// Tolerance of the grouped matmul: OpenBLAS sums each output's n = I (forward) or n = rows (dw) products of fp32
// values in some order; each product and each addition rounds by at most u = 2^-24 relative, so the result is within
// gamma_n * sum |a_i b_i| of the exact sum, gamma_n = n u / (1 - n u) (Higham, Accuracy and Stability of Numerical
// Algorithms, 3.1). The double oracle's own error is negligible beside it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "megatrain/core/rng.h"
#include "megatrain/kernels/cpu/moe.h"
#include "megatrain/kernels/moe_routing.h"
#include "megatrain/kernels/ops.h"
#include "support/kernels_testutil.h"

namespace mt {
namespace {

using test::randn;
using test::tf;
using test::VecF;

struct Case {
  int64_t N;
  int E, k;
  float capacity_factor;
  std::vector<int> starved;  // experts whose logits are pushed far down: the router never picks them (no rows)
};

// Routes N tokens of random logits (the starved experts' lowered by 30, far below any other).
MoeRouting route(const Case& c, uint64_t seed) {
  VecF logits = randn(size_t(c.N * c.E), seed);
  for (int64_t t = 0; t < c.N; ++t)
    for (int e : c.starved) logits[t * c.E + e] -= 30.0f;
  MoeRouting r;
  moe_route(r, logits.data(), c.N, c.E, c.k, MoeRouter::Softmax, nullptr, c.capacity_factor);
  return r;
}

bool same_bits(const VecF& a, const VecF& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// "E8_k2", with "_drops" (capacity) or "_starved" (experts without rows).
std::string case_name(const Case& c) {
  return "E" + std::to_string(c.E) + "_k" + std::to_string(c.k) + (c.capacity_factor > 0 ? "_drops" : "") +
         (c.starved.empty() ? "" : "_starved");
}

void PrintTo(const Case& c, std::ostream* os) { *os << case_name(c); }

class MoeOpsTest : public ::testing::TestWithParam<Case> {
 protected:
  std::unique_ptr<Ops> ops_ = make_cpu_ops();
};

TEST_P(MoeOpsTest, EntryPointsEqualTheReferenceBitForBit) {
  const Case c = GetParam();
  const MoeRouting r = route(c, 7);
  MoeRoutingBuffers bufs;
  bufs.allocate(*ops_, c.N, c.k);
  const MoeDeviceRouting dr = bufs.upload(*ops_, r);
  const int64_t N = c.N, C = 24, A = r.rows();
  for (int e : c.starved) {
    EXPECT_EQ(r.offsets[e + 1], r.offsets[e]) << "expert " << e << " should have no rows";
  }
  if (c.capacity_factor > 0) {
    EXPECT_GT(r.dropped, 0) << "the case should drop assignments";
  }

  VecF x = randn(size_t(N * C), 1), xp_ops(size_t(A * C)), xp_ref(size_t(A * C));
  ops_->moe_permute(tf(xp_ops, {A, C}), tf(x, {N, C}), dr);
  moe_permute(tf(xp_ref, {A, C}), tf(x, {N, C}), r);
  EXPECT_TRUE(same_bits(xp_ops, xp_ref));

  VecF dxp = randn(size_t(A * C), 2), dx_ops = randn(size_t(N * C), 3), dx_ref = dx_ops;  // accumulated into
  ops_->moe_permute_backward(tf(dx_ops, {N, C}), tf(dxp, {A, C}), dr);
  moe_permute_backward(tf(dx_ref, {N, C}), tf(dxp, {A, C}), r);
  EXPECT_TRUE(same_bits(dx_ops, dx_ref));

  VecF yp = randn(size_t(A * C), 4), y_ops(size_t(N * C), 9.0f), y_ref(size_t(N * C), -9.0f);  // overwritten
  ops_->moe_combine(tf(y_ops, {N, C}), tf(yp, {A, C}), dr);
  moe_combine(tf(y_ref, {N, C}), tf(yp, {A, C}), r);
  EXPECT_TRUE(same_bits(y_ops, y_ref));

  VecF dy = randn(size_t(N * C), 5), dyp_ops(size_t(A * C), 9.0f), dyp_ref(size_t(A * C), -9.0f);
  VecF dg_ops(size_t(N * c.k), 9.0f), dg_ref(size_t(N * c.k), -9.0f);
  ops_->moe_combine_backward(tf(dyp_ops, {A, C}), tf(dg_ops, {N, c.k}), tf(dy, {N, C}), tf(yp, {A, C}), dr);
  moe_combine_backward(tf(dyp_ref, {A, C}), dg_ref.data(), tf(dy, {N, C}), tf(yp, {A, C}), r);
  EXPECT_TRUE(same_bits(dyp_ops, dyp_ref));
  EXPECT_TRUE(same_bits(dg_ops, dg_ref));

  const int64_t O = 12, I = C, E = c.E;
  VecF w = randn(size_t(E * O * I), 6, 0.2f), out_ops(size_t(A * O)), out_ref(size_t(A * O));
  ops_->moe_grouped_matmul_forward(tf(out_ops, {A, O}), tf(xp_ref, {A, I}), tf(w, {E, O, I}), r.offsets);
  moe_grouped_forward(*ops_, tf(out_ref, {A, O}), tf(xp_ref, {A, I}), tf(w, {E, O, I}), r.offsets);
  EXPECT_TRUE(same_bits(out_ops, out_ref));

  VecF dout = randn(size_t(A * O), 8), din_ops(size_t(A * I)), din_ref(size_t(A * I));
  for (bool acc : {false, true}) {
    VecF dw_ops = randn(size_t(E * O * I), 10), dw_ref = dw_ops;
    ops_->moe_grouped_matmul_backward(tf(din_ops, {A, I}), tf(dw_ops, {E, O, I}), tf(dout, {A, O}), tf(xp_ref, {A, I}),
                                      tf(w, {E, O, I}), r.offsets, acc);
    moe_grouped_backward(*ops_, tf(din_ref, {A, I}), tf(dw_ref, {E, O, I}), tf(dout, {A, O}), tf(xp_ref, {A, I}),
                         tf(w, {E, O, I}), r.offsets, acc);
    EXPECT_TRUE(same_bits(din_ops, din_ref)) << "accumulate_dw " << acc;
    EXPECT_TRUE(same_bits(dw_ops, dw_ref)) << "accumulate_dw " << acc;
  }
}

INSTANTIATE_TEST_SUITE_P(Routings, MoeOpsTest,
                         ::testing::Values(Case{37, 8, 2, 0.0f, {}}, Case{37, 8, 1, 0.0f, {}}, Case{37, 1, 1, 0.0f, {}},
                                           Case{40, 8, 2, 0.5f, {}}, Case{37, 8, 2, 0.0f, {2, 5, 6}}),
                         [](const ::testing::TestParamInfo<Case>& p) { return case_name(p.param); });

// out[A, O] of the grouped product in double: row r of expert e is in[r] @ w[e]^T; and the same of |in| |w| (the
// sum of the products' magnitudes, for the error bound).
void naive_grouped(std::vector<double>& out, std::vector<double>& mag, const VecF& in, const VecF& w, int64_t O,
                   int64_t I, const std::vector<int64_t>& offsets) {
  const int64_t A = offsets.back();
  out.assign(size_t(A * O), 0.0);
  mag.assign(size_t(A * O), 0.0);
  for (size_t e = 0; e + 1 < offsets.size(); ++e)
    for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r)
      for (int64_t o = 0; o < O; ++o)
        for (int64_t i = 0; i < I; ++i) {
          const double p = double(in[r * I + i]) * w[(int64_t(e) * O + o) * I + i];
          out[r * O + o] += p;
          mag[r * O + o] += std::abs(p);
        }
}

double gamma(int64_t n) { return n * 0x1p-24 / (1 - n * 0x1p-24); }

::testing::AssertionResult within_bound(const VecF& got, const std::vector<double>& want,
                                        const std::vector<double>& mag, double g) {
  for (size_t i = 0; i < want.size(); ++i)
    if (!(std::abs(got[i] - want[i]) <= g * mag[i]))
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << got[i] << ", want " << want[i] << ", bound " << g * mag[i];
  return ::testing::AssertionSuccess();
}

TEST(MoeGroupedMatmul, ExpertsWithoutRowsAgainstANaiveProduct) {
  auto ops = make_cpu_ops();
  const int64_t E = 5, O = 7, I = 9;
  const std::vector<int64_t> offsets = {0, 0, 6, 6, 13, 13};  // experts 0, 2 and 4 have no rows
  const int64_t A = offsets.back();
  VecF in = randn(size_t(A * I), 21), w = randn(size_t(E * O * I), 22), out(size_t(A * O), 99.0f);
  ops->moe_grouped_matmul_forward(tf(out, {A, O}), tf(in, {A, I}), tf(w, {E, O, I}), offsets);
  std::vector<double> want, mag;
  naive_grouped(want, mag, in, w, O, I, offsets);
  EXPECT_TRUE(within_bound(out, want, mag, gamma(I)));

  // Backward: din[r] = dout[r] @ w[e]; dw[e] = dout[rows]^T @ in[rows]. Naive in double.
  VecF dout = randn(size_t(A * O), 23), din(size_t(A * I), 99.0f);
  VecF dw(size_t(E * O * I), 5.0f);
  ops->moe_grouped_matmul_backward(tf(din, {A, I}), tf(dw, {E, O, I}), tf(dout, {A, O}), tf(in, {A, I}),
                                   tf(w, {E, O, I}), offsets, false);
  std::vector<double> din_want(size_t(A * I), 0.0), din_mag(size_t(A * I), 0.0);
  std::vector<double> dw_want(size_t(E * O * I), 0.0), dw_mag(size_t(E * O * I), 0.0);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r)
      for (int64_t o = 0; o < O; ++o)
        for (int64_t i = 0; i < I; ++i) {
          const double g = dout[r * O + o], wv = w[(e * O + o) * I + i], x = in[r * I + i];
          din_want[r * I + i] += g * wv, din_mag[r * I + i] += std::abs(g * wv);
          dw_want[(e * O + o) * I + i] += g * x, dw_mag[(e * O + o) * I + i] += std::abs(g * x);
        }
  EXPECT_TRUE(within_bound(din, din_want, din_mag, gamma(O)));
  EXPECT_TRUE(within_bound(dw, dw_want, dw_mag, gamma(A)));  // the experts without rows: exactly 0 (bound 0)

  // Accumulating: dw += the same gradient, the experts without rows keep what they had.
  VecF dw2(size_t(E * O * I), 5.0f);
  ops->moe_grouped_matmul_backward(Tensor{}, tf(dw2, {E, O, I}), tf(dout, {A, O}), tf(in, {A, I}), tf(w, {E, O, I}),
                                   offsets, true);
  for (size_t i = 0; i < dw_want.size(); ++i) dw_want[i] += 5.0, dw_mag[i] += 5.0;
  EXPECT_TRUE(within_bound(dw2, dw_want, dw_mag, gamma(A + 1)));
  for (int64_t e : {0, 2, 4}) {
    for (int64_t i = 0; i < O * I; ++i) {
      ASSERT_EQ(dw2[e * O * I + i], 5.0f) << "expert " << e;
    }
  }
}

TEST(MoeGroupedMatmul, RefusesBadOffsets) {
  auto ops = make_cpu_ops();
  VecF in(12), w(2 * 3 * 4), out(9);
  EXPECT_THROW(ops->moe_grouped_matmul_forward(tf(out, {3, 3}), tf(in, {3, 4}), tf(w, {2, 3, 4}), {0, 2, 1}), Error);
  EXPECT_THROW(ops->moe_grouped_matmul_forward(tf(out, {3, 3}), tf(in, {3, 4}), tf(w, {2, 3, 4}), {0, 3}), Error);
  EXPECT_THROW(ops->moe_grouped_matmul_forward(tf(out, {3, 3}), tf(in, {3, 4}), tf(w, {2, 3, 4}), {1, 2, 3}), Error);
  EXPECT_THROW(ops->moe_grouped_matmul_forward(tf(out, {3, 3}), tf(in, {3, 4}), tf(w, {2, 3, 4}), {0, 1, 2}), Error);
  EXPECT_NO_THROW(ops->moe_grouped_matmul_forward(tf(out, {3, 3}), tf(in, {3, 4}), tf(w, {2, 3, 4}), {0, 1, 3}));
}

TEST(MoeRoutingBuffers, CpuViewsTheHostRoutingAndChecksItsSize) {
  auto ops = make_cpu_ops();
  const MoeRouting r = route(Case{10, 4, 2, 0.0f, {}}, 3);
  MoeRoutingBuffers bufs;
  bufs.allocate(*ops, 10, 2);
  const MoeDeviceRouting d = bufs.upload(*ops, r);
  EXPECT_EQ(d.host, &r);
  EXPECT_EQ(d.row.ptr, r.row.data());
  EXPECT_EQ(d.token.ptr, r.token.data());
  EXPECT_EQ(d.gate.ptr, r.gate.data());
  EXPECT_EQ(d.row.dtype, DType::I32);
  EXPECT_EQ(d.token.numel(), r.rows());
  MoeRoutingBuffers small;
  small.allocate(*ops, 9, 2);
  EXPECT_THROW(small.upload(*ops, r), Error);
  // An op without its host routing, or with rows that do not match it, names the problem.
  VecF x(10 * 3), xp(size_t(r.rows()) * 3);
  EXPECT_THROW(ops->moe_permute(tf(xp, {r.rows(), 3}), tf(x, {10, 3}), MoeDeviceRouting{}), Error);
  EXPECT_THROW(ops->moe_permute(tf(xp, {r.rows() - 1, 3}), tf(x, {10, 3}), d), Error);
}

}  // namespace
}  // namespace mt
