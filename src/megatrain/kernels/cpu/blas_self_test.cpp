// blas_self_test (blas_probe.h): the check a candidate OpenBLAS core passes before megatrain runs under it.
#include <cblas.h>
#include <fmt/format.h>

#include <cfloat>
#include <cmath>
#include <vector>

#include "megatrain/kernels/cpu/blas_probe.h"

namespace mt {
namespace {

struct Case {
  int m, n, k;
  bool ta, tb;
};

// One sgemm of the case against the naive GEMM in double; "" when every element is within the bound.
std::string check(const SgemmFn& sgemm, const Case& c, unsigned seed) {
  const int lda = (c.ta ? c.m : c.k) + 3, ldb = (c.tb ? c.k : c.n) + 5, ldc = c.n + 7;
  const int arows = c.ta ? c.k : c.m, brows = c.tb ? c.n : c.k;
  std::vector<float> a(size_t(arows) * lda), b(size_t(brows) * ldb), cm(size_t(c.m) * ldc);
  unsigned s = seed;
  auto next = [&] {  // a small LCG: values in [-1, 1), no library RNG whose sequence could change
    s = s * 1664525u + 1013904223u;
    return float(int(s >> 9) - (1 << 22)) / float(1 << 22);
  };
  for (float& x : a) x = next();
  for (float& x : b) x = next();
  for (float& x : cm) x = next();
  const std::vector<float> c0 = cm;
  const float alpha = 0.75f, beta = -0.5f;
  sgemm(c.ta, c.tb, c.m, c.n, c.k, alpha, a.data(), lda, b.data(), ldb, beta, cm.data(), ldc);
  for (int i = 0; i < c.m; ++i)
    for (int j = 0; j < c.n; ++j) {
      double sum = 0, mag = 0;
      for (int l = 0; l < c.k; ++l) {
        const double x = c.ta ? a[size_t(l) * lda + i] : a[size_t(i) * lda + l];
        const double y = c.tb ? b[size_t(j) * ldb + l] : b[size_t(l) * ldb + j];
        sum += x * y;
        mag += std::fabs(x * y);
      }
      const double c_in = c0[size_t(i) * ldc + j];
      const double want = alpha * sum + beta * c_in;
      const double bound = 4.0 * (c.k + 2) * FLT_EPSILON * (std::fabs(alpha) * mag + std::fabs(beta * c_in)) + 1e-30;
      const double got = cm[size_t(i) * ldc + j];
      if (!(std::fabs(got - want) <= bound))
        return fmt::format("sgemm {}x{}x{} ({}{}): C[{}][{}] = {} where the naive GEMM gives {} (bound {:.3g})", c.m,
                           c.n, c.k, c.ta ? "T" : "N", c.tb ? "T" : "N", i, j, got, want, bound);
    }
  return "";
}

}  // namespace

bool sgemm_self_test(const SgemmFn& sgemm, std::string* why) {
  // Odd sizes exercise the edge kernels; 160 x 144 x 300 is above every x86 core's register block and its k block
  // reaches past OpenBLAS's smallest GEMM_Q, so the packed main kernels run too.
  const Case cases[] = {{1, 1, 1, false, false},      {7, 5, 3, false, false},     {33, 17, 65, false, true},
                        {31, 47, 129, true, false},   {64, 64, 64, true, true},    {160, 144, 300, false, false},
                        {160, 144, 300, false, true}, {97, 131, 257, true, false}, {1, 200, 300, false, true}};
  unsigned seed = 1;
  for (const Case& c : cases)
    if (std::string e = check(sgemm, c, seed++); !e.empty()) {
      if (why) *why = e;
      return false;
    }
  return true;
}

bool blas_self_test(std::string* why) {
  return sgemm_self_test(
      [](bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
         float beta, float* c, int ldc) {
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a,
                    lda, b, ldb, beta, c, ldc);
      },
      why);
}

}  // namespace mt
