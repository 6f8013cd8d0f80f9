// The grouped expert GEMMs' cuBLASLt calls (kernels/cuda/moe_grouped_calls.h), without a GPU (label `unit`): each
// call is evaluated on the host by the definition of a cuBLASLt matmul, D = op(A) @ op(B) + beta * C on column-major
// matrices with the call's transposes and leading dimensions, and the results are compared with a naive grouped
// product per expert in double. This checks the pointer arithmetic over the experts' row blocks and weight slices,
// that the experts without rows get no call, and that the calls of different experts write disjoint memory (so the
// lanes may run them concurrently). cuBLASLt itself is not involved; the calls' layouts are the linear layer's.
// Tolerances: the evaluation sums in double and rounds once to D's type, so a bf16 output is within 2^-8 relative of
// the naive value and an fp32 one within 2^-24 (doubled for the double sums' own error).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "megatrain/core/bf16.h"
#include "megatrain/core/rng.h"
#include "megatrain/kernels/cuda/moe_grouped_calls.h"

namespace mt {
namespace {

using Bits = std::vector<uint16_t>;

// Element (i, j) of a column-major matrix stored at p with leading dimension ld, as float.
double elem(const void* p, bool bf16, int64_t i, int64_t j, int64_t ld) {
  const int64_t at = i + j * ld;
  return bf16 ? bf16_to_float(static_cast<const uint16_t*>(p)[at]) : static_cast<const float*>(p)[at];
}

// c on host memory, by the definition: D[m, n] = op(A)[m, k] @ op(B)[k, n] + beta * C (C = D when unset).
void evaluate(const LtCall& c) {
  const bool ta = c.trans_a == CUBLAS_OP_T, tb = c.trans_b == CUBLAS_OP_T, d16 = c.d_type == CUDA_R_16BF;
  const void* C = c.C ? c.C : c.D;
  for (int64_t j = 0; j < c.n; ++j)
    for (int64_t i = 0; i < c.m; ++i) {
      double s = 0;
      for (int64_t l = 0; l < c.k; ++l)
        s += (ta ? elem(c.A, true, l, i, c.lda) : elem(c.A, true, i, l, c.lda)) *
             (tb ? elem(c.B, true, j, l, c.ldb) : elem(c.B, true, l, j, c.ldb));
      if (c.beta != 0) s += c.beta * elem(C, d16, i, j, c.ldd);
      if (d16) {
        static_cast<uint16_t*>(c.D)[i + j * c.ldd] = float_to_bf16(static_cast<float>(s));
      } else {
        static_cast<float*>(c.D)[i + j * c.ldd] = static_cast<float>(s);
      }
    }
}

// The bytes D spans.
std::pair<uintptr_t, uintptr_t> d_range(const LtCall& c) {
  const auto lo = reinterpret_cast<uintptr_t>(c.D);
  const int64_t elem_bytes = c.d_type == CUDA_R_16BF ? 2 : 4;
  return {lo, lo + static_cast<uintptr_t>(((c.n - 1) * c.ldd + c.m) * elem_bytes)};
}

Bits random_bf16(size_t n, uint64_t seed) {
  Rng rng(seed);
  Bits b(n);
  for (auto& x : b) x = float_to_bf16(rng.normal());
  return b;
}

double f(const Bits& b, int64_t i) { return bf16_to_float(b[i]); }

struct Fixture {
  GroupedDims g{5, 6, 7, 0};
  std::vector<int64_t> off = {0, 4, 4, 11, 11, 12};  // experts 1 and 3 have no rows; expert 4 has one
  Bits in, w, dout;
  Fixture() {
    g.A = off.back();
    in = random_bf16(size_t(g.A * g.I), 1), w = random_bf16(size_t(g.E * g.O * g.I), 2);
    dout = random_bf16(size_t(g.A * g.O), 3);
  }
};

// Every pair of calls of different experts writes disjoint bytes.
::testing::AssertionResult disjoint_writes(const std::vector<ExpertGemm>& gemms) {
  for (size_t a = 0; a < gemms.size(); ++a)
    for (size_t b = 0; b < gemms.size(); ++b) {
      if (gemms[a].expert == gemms[b].expert) continue;
      const auto [alo, ahi] = d_range(gemms[a].call);
      const auto [blo, bhi] = d_range(gemms[b].call);
      if (alo < bhi && blo < ahi)
        return ::testing::AssertionFailure()
               << "experts " << gemms[a].expert << " and " << gemms[b].expert << " write overlapping memory";
    }
  return ::testing::AssertionSuccess();
}

TEST(MoeGroupedCalls, ForwardComputesEachExpertsRowsAndSkipsTheEmptyOnes) {
  Fixture x;
  const GroupedDims& g = x.g;
  Bits out(size_t(g.A * g.O), float_to_bf16(std::numeric_limits<float>::quiet_NaN()));  // unwritten stays NaN
  const std::vector<ExpertGemm> gemms = grouped_forward_gemms(out.data(), x.in.data(), x.w.data(), g, x.off);
  ASSERT_EQ(gemms.size(), 3u);
  EXPECT_EQ(gemms[0].expert, 0);
  EXPECT_EQ(gemms[1].expert, 2);
  EXPECT_EQ(gemms[2].expert, 4);
  EXPECT_TRUE(disjoint_writes(gemms));
  for (const ExpertGemm& e : gemms) evaluate(e.call);
  for (int64_t e = 0; e < g.E; ++e)
    for (int64_t r = x.off[e]; r < x.off[e + 1]; ++r)
      for (int64_t o = 0; o < g.O; ++o) {
        double want = 0;
        for (int64_t i = 0; i < g.I; ++i) want += f(x.in, r * g.I + i) * f(x.w, (e * g.O + o) * g.I + i);
        const double got = f(out, r * g.O + o);
        ASSERT_LE(std::abs(got - want), 0x1p-8 * std::abs(want) + 1e-12) << "expert " << e << " row " << r;
      }
}

TEST(MoeGroupedCalls, BackwardComputesDinAndDwPerExpert) {
  Fixture x;
  const GroupedDims& g = x.g;
  for (bool acc : {false, true}) {
    Bits din(size_t(g.A * g.I), float_to_bf16(std::numeric_limits<float>::quiet_NaN()));
    std::vector<float> dw(size_t(g.E * g.O * g.I), 0.5f);  // the old gradient: kept by experts without rows
    const std::vector<ExpertGemm> gemms = grouped_backward_gemms(din.data(), dw.data(), x.dout.data(), x.in.data(),
                                                                 x.w.data(), g, x.off, acc);
    ASSERT_EQ(gemms.size(), 6u);  // din then dw, for experts 0, 2, 4
    EXPECT_TRUE(disjoint_writes(gemms));
    for (const ExpertGemm& e : gemms) evaluate(e.call);
    for (int64_t e = 0; e < g.E; ++e) {
      for (int64_t r = x.off[e]; r < x.off[e + 1]; ++r)
        for (int64_t i = 0; i < g.I; ++i) {
          double want = 0;
          for (int64_t o = 0; o < g.O; ++o) want += f(x.dout, r * g.O + o) * f(x.w, (e * g.O + o) * g.I + i);
          const double got = f(din, r * g.I + i);
          ASSERT_LE(std::abs(got - want), 0x1p-8 * std::abs(want) + 1e-12) << "din, expert " << e << " row " << r;
        }
      const bool empty = x.off[e] == x.off[e + 1];
      for (int64_t o = 0; o < g.O; ++o)
        for (int64_t i = 0; i < g.I; ++i) {
          double want = acc || empty ? 0.5 : 0.0;  // no call touches an empty expert (the op zeroes it apart)
          for (int64_t r = x.off[e]; r < x.off[e + 1]; ++r) want += f(x.dout, r * g.O + o) * f(x.in, r * g.I + i);
          const double got = dw[(e * g.O + o) * g.I + i];
          ASSERT_LE(std::abs(got - want), 0x1p-23 * std::abs(want) + 1e-12) << "dw, expert " << e << " acc " << acc;
        }
    }
  }
}

TEST(MoeGroupedCalls, WithoutDinOnlyTheWeightGradients) {
  Fixture x;
  std::vector<float> dw(size_t(x.g.E * x.g.O * x.g.I));
  const std::vector<ExpertGemm> gemms = grouped_backward_gemms(nullptr, dw.data(), x.dout.data(), x.in.data(),
                                                               x.w.data(), x.g, x.off, true);
  ASSERT_EQ(gemms.size(), 3u);
  for (const ExpertGemm& e : gemms) EXPECT_STREQ(e.what, "dw");
}

}  // namespace
}  // namespace mt
