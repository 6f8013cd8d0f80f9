// CPU backend: elementwise, matmul, embedding, norms and activations against naive double references, and
// every backward against central finite differences of the reference forward.
#include <omp.h>

#include <limits>

#include "support/kernels_testutil.h"
#include "megatrain/kernels/cpu/cpu_util.h"
#include "megatrain/kernels/ops.h"

namespace mt::test {
namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

class Kernels : public ::testing::Test {
 protected:
  std::unique_ptr<Ops> ops = make_cpu_ops();
};

// ---- OpenMP regions never let an exception escape ----------------------------------------------------------

// An exception inside a parallel region must come out after it as that exception, not std::terminate (SIGABRT):
// here thread 0's scratch request is impossibly large (std::length_error, as a window of 2^31-1 once caused), the
// other threads' succeed, and every thread still reaches the worksharing loop (no deadlock).
TEST(RegionErrors, AnExceptionInsideAParallelRegionIsRethrownAfterIt) {
  cpu::RegionErrors errors;
  int done = 0, threads = 0;
#pragma omp parallel num_threads(3) reduction(+ : done, threads)
  {
    threads = 1;
    float* s = errors.run([] {
      return cpu::thread_scratch(omp_get_thread_num() == 0 ? std::numeric_limits<size_t>::max() / 2 : 16);
    });
#pragma omp for schedule(static)
    for (int i = 0; i < 30; ++i) {
      if (!s) continue;
      s[0] = static_cast<float>(i);
      ++done;
    }
  }
  EXPECT_THROW(errors.rethrow(), std::length_error);
  EXPECT_LT(done, 30);  // thread 0's share was skipped
  if (threads > 1) {
    EXPECT_GT(done, 0);  // the others' ran
  }
  cpu::RegionErrors none;
  float* s = none.run([] { return cpu::thread_scratch(4); });
  EXPECT_NE(s, nullptr);
  EXPECT_NO_THROW(none.rethrow());
}

// ---- elementwise ------------------------------------------------------------------------------------------

TEST_F(Kernels, ElementwiseOps) {
  const size_t n = 100003;  // above the parallel threshold, not a multiple of any vector width
  VecF a = randn(n, 1), b = randn(n, 2), out(n, kNaN);
  ops->add(tf(out, {int64_t(n)}), tf(a, {int64_t(n)}), tf(b, {int64_t(n)}));
  VecD want(n);
  for (size_t i = 0; i < n; ++i) want[i] = double(a[i]) + b[i];
  EXPECT_TRUE(close(out, want, 0, 1e-6));

  VecF c = a;  // aliasing: out == a
  ops->add(tf(c, {int64_t(n)}), tf(c, {int64_t(n)}), tf(b, {int64_t(n)}));
  EXPECT_TRUE(close(c, want, 0, 1e-6));

  c = a;
  ops->axpy(tf(c, {int64_t(n)}), tf(b, {int64_t(n)}), -0.5f);
  for (size_t i = 0; i < n; ++i) want[i] = double(a[i]) - 0.5 * b[i];
  EXPECT_TRUE(close(c, want, 0, 1e-6));

  c = a;
  ops->scale(tf(c, {int64_t(n)}), 3.0f);
  for (size_t i = 0; i < n; ++i) want[i] = 3.0 * a[i];
  EXPECT_TRUE(close(c, want, 0, 1e-6));

  VecF d(n, 7.0f);
  ops->copy(tf(d, {int64_t(n)}), tf(a, {int64_t(n)}));
  EXPECT_EQ(d, a);
  ops->zero(tf(d, {int64_t(n)}));
  EXPECT_EQ(d, VecF(n, 0.0f));
}

TEST_F(Kernels, SumSquaresIsDoubleAndThreadCountIndependent) {
  const size_t n = 300001;
  VecF a = randn(n, 3, 10.0f);
  double want = 0;
  for (float x : a) want += double(x) * x;
  const double got = ops->sum_squares(tf(a, {int64_t(n)}));
  EXPECT_NEAR(got, want, 1e-12 * want);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const double got1 = ops->sum_squares(tf(a, {int64_t(n)}));
  omp_set_num_threads(3);
  const double got3 = ops->sum_squares(tf(a, {int64_t(n)}));
  omp_set_num_threads(threads);
  EXPECT_EQ(got, got1);
  EXPECT_EQ(got, got3);
}

TEST_F(Kernels, ShapeAndDtypeErrorsNameTheProblem) {
  VecF a(6), b(5);
  try {
    ops->add(tf(a, {6}), tf(a, {6}), tf(b, {5}));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("add: b"), std::string::npos) << e.what();
  }
  std::vector<int32_t> ints(6);
  EXPECT_THROW(ops->scale(ti(ints, {6}), 2.0f), Error);
  EXPECT_THROW(ops->matmul_forward(tf(a, {2, 3}), tf(a, {3, 2}), tf(b, {1, 5}), Tensor{}), Error);
}

// ---- fast exp ---------------------------------------------------------------------------------------------

TEST(FastExp, MatchesLibmWithinTwoUlpAndHandlesEdges) {
  for (float x = -87.0f; x < 88.5f; x += 0.0137f) {
    const double want = std::exp(double(x));
    EXPECT_NEAR(cpu::fast_exp(x), want, 2.5e-7 * want) << x;
  }
  EXPECT_EQ(cpu::fast_exp(-1000.0f), 0.0f);
  EXPECT_EQ(cpu::fast_exp(-INFINITY), 0.0f);
  EXPECT_EQ(cpu::fast_exp(1000.0f), INFINITY);
  EXPECT_TRUE(std::isnan(cpu::fast_exp(kNaN)));
  EXPECT_EQ(cpu::fast_exp(0.0f), 1.0f);
}

// ---- matmul -----------------------------------------------------------------------------------------------

VecD ref_matmul(const VecD& x, const VecD& w, const VecD* b, int N, int C, int OC) {
  VecD out(size_t(N) * OC);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = b ? (*b)[o] : 0.0;
      for (int c = 0; c < C; ++c) s += x[size_t(n) * C + c] * w[size_t(o) * C + c];
      out[size_t(n) * OC + o] = s;
    }
  return out;
}

TEST_F(Kernels, MatmulForwardWithAndWithoutBias) {
  for (auto [N, C, OC] : {std::array{5, 7, 6}, std::array{131, 130, 300}}) {
    VecF x = randn(size_t(N) * C, 10), w = randn(size_t(OC) * C, 11), b = randn(OC, 12);
    VecF out(size_t(N) * OC, kNaN);
    VecD xd = to_d(x), wd = to_d(w), bd = to_d(b);
    ops->matmul_forward(tf(out, {N, OC}), tf(x, {N, C}), tf(w, {OC, C}), tf(b, {OC}));
    EXPECT_TRUE(close(out, ref_matmul(xd, wd, &bd, N, C, OC), 1e-5, 1e-5)) << N << "x" << C << "x" << OC;
    std::fill(out.begin(), out.end(), kNaN);
    ops->matmul_forward(tf(out, {N, OC}), tf(x, {N, C}), tf(w, {OC, C}), Tensor{});
    EXPECT_TRUE(close(out, ref_matmul(xd, wd, nullptr, N, C, OC), 1e-5, 1e-5)) << N << "x" << C << "x" << OC;
  }
}

// A linear joining the residual stream: out = residual + (x @ w^T + b), into a separate output and in place (out is
// the residual), against the double reference; tmp is scratch only.
TEST_F(Kernels, MatmulForwardAddJoinsTheResidual) {
  const int N = 13, C = 9, OC = 11;
  VecF x = randn(size_t(N) * C, 40), w = randn(size_t(OC) * C, 41), b = randn(OC, 42), r = randn(size_t(N) * OC, 43);
  VecD want = ref_matmul(to_d(x), to_d(w), nullptr, N, C, OC), want_b = ref_matmul(to_d(x), to_d(w), nullptr, N, C, OC);
  VecD bd = to_d(b);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      want[size_t(n) * OC + o] += r[size_t(n) * OC + o];
      want_b[size_t(n) * OC + o] += r[size_t(n) * OC + o] + bd[o];
    }
  for (bool in_place : {false, true}) {
    for (bool with_bias : {false, true}) {
      VecF out = in_place ? r : VecF(size_t(N) * OC, kNaN), tmp(size_t(N) * OC, kNaN);
      const VecF r0 = r;
      ops->matmul_forward_add(tf(out, {N, OC}), tf(x, {N, C}), tf(w, {OC, C}), with_bias ? tf(b, {OC}) : Tensor{},
                              in_place ? tf(out, {N, OC}) : tf(r, {N, OC}), tf(tmp, {N, OC}));
      EXPECT_TRUE(close(out, with_bias ? want_b : want, 1e-5, 1e-5)) << in_place << with_bias;
      EXPECT_EQ(r, r0);  // a separate residual is only read
    }
  }
}

// accumulate_dw = false (a step's first write of a gradient, ParamStore::begin_grads): dw, dbias and the norms' dw, db
// are overwritten, and the result is bit for bit accumulating onto zeros, including a batch of no rows (all zeros).
TEST_F(Kernels, WeightGradientsOverwriteAsZeroingFirstWould) {
  const VecF garbage = randn(21 * 336, 60, 1e3f);
  auto run = [&](bool overwrite, const std::function<void(float*, float*)>& op, size_t nw, size_t nb) {
    VecF dw(nw), db(nb);
    if (overwrite) {
      std::copy_n(garbage.begin(), nw, dw.begin());
      std::copy_n(garbage.begin() + nw, nb, db.begin());
    }
    op(dw.data(), db.data());
    dw.insert(dw.end(), db.begin(), db.end());
    return dw;
  };
  for (int N : {0, 7, 150}) {
    SCOPED_TRACE("N=" + std::to_string(N));
    const int C = 336, OC = 20;       // N * C above the CPU kernels' threshold for threads (per-thread partials)
    const size_t R = std::max(N, 1);  // buffers of at least one row: an empty batch still has defined tensors
    VecF x = randn(R * C, 61), w = randn(size_t(OC) * C, 62), dy = randn(R * OC, 63);
    VecF pre = randn(R * C, 64), dx(R * C);
    VecF mean(R), rstd(R), out(R * C), nw = randn(C, 65), nb = randn(C, 66), ndy = randn(R * C, 67);
    ops->layernorm_forward(tf(out, {N, C}), tf(mean, {N}), tf(rstd, {N}), tf(x, {N, C}), tf(nw, {C}), tf(nb, {C}),
                           1e-5f);
    const std::vector<std::pair<std::string, std::function<void(bool, float*, float*)>>> cases = {
        {"matmul_backward",
         [&](bool acc, float* g, float* b) {
           ops->matmul_backward(tf(dx, {N, C}), f32_view(g, {OC, C}), f32_view(b, {OC}), tf(dy, {N, OC}), tf(x, {N, C}),
                                tf(w, {OC, C}), false, acc);
         }},
        {"matmul_backward_gelu",
         [&](bool acc, float* g, float* b) {
           ops->matmul_backward_gelu(tf(dx, {N, C}), f32_view(g, {OC, C}), f32_view(b, {OC}), tf(dy, {N, OC}),
                                     tf(x, {N, C}), tf(w, {OC, C}), tf(pre, {N, C}), acc);
         }},
        {"layernorm_backward",
         [&](bool acc, float* g, float* b) {
           ops->layernorm_backward(tf(dx, {N, C}), f32_view(g, {C}), f32_view(b, {C}), tf(ndy, {N, C}), tf(x, {N, C}),
                                   tf(nw, {C}), tf(mean, {N}), tf(rstd, {N}), acc);
         }},
        {"rmsnorm_backward",
         [&](bool acc, float* g, float*) {
           ops->rmsnorm_backward(tf(dx, {N, C}), f32_view(g, {C}), tf(ndy, {N, C}), tf(x, {N, C}), tf(nw, {C}),
                                 tf(rstd, {N}), acc);
         }},
    };
    for (const auto& [name, op] : cases) {
      const bool norm = name.find("norm") != std::string::npos;
      const size_t n_w = norm ? C : size_t(OC) * C, n_b = norm ? C : OC;
      const VecF want = run(
          false, [&](float* g, float* b) { op(true, g, b); }, n_w, n_b);
      const VecF got = run(
          true, [&](float* g, float* b) { op(false, g, b); }, n_w, n_b);
      EXPECT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        if (name != "rmsnorm_backward" || i < n_w) {
          ASSERT_EQ(got[i], want[i]) << name << " element " << i;
        }
      }
    }
  }
}

TEST_F(Kernels, MatmulBackwardMatchesFiniteDifferences) {
  const int N = 5, C = 7, OC = 6;
  VecF x = randn(N * C, 20), w = randn(OC * C, 21), b = randn(OC, 22), G = randn(N * OC, 23);
  VecD xd = to_d(x), wd = to_d(w), bd = to_d(b);
  const VecD gx = fd_grad([&](const VecD& v) { return dot(ref_matmul(v, wd, &bd, N, C, OC), G); }, xd);
  const VecD gw = fd_grad([&](const VecD& v) { return dot(ref_matmul(xd, v, &bd, N, C, OC), G); }, wd);
  const VecD gb = fd_grad([&](const VecD& v) { return dot(ref_matmul(xd, wd, &v, N, C, OC), G); }, bd);

  // Overwrite dinp (NaN-filled: it must not be read), accumulate dw and dbias onto existing values.
  VecF dx(N * C, kNaN), dw0 = randn(OC * C, 24), db0 = randn(OC, 25), dw = dw0, db = db0;
  ops->matmul_backward(tf(dx, {N, C}), tf(dw, {OC, C}), tf(db, {OC}), tf(G, {N, OC}), tf(x, {N, C}), tf(w, {OC, C}),
                       false);
  EXPECT_TRUE(close(dx, gx, 1e-4, 1e-5));
  EXPECT_TRUE(close(minus(dw, dw0), gw, 1e-4, 1e-5));
  EXPECT_TRUE(close(minus(db, db0), gb, 1e-4, 1e-5));

  // Accumulate dinp; skip dinp and dbias entirely.
  VecF dx0 = randn(N * C, 26);
  dx = dx0;
  ops->matmul_backward(tf(dx, {N, C}), tf(dw, {OC, C}), Tensor{}, tf(G, {N, OC}), tf(x, {N, C}), tf(w, {OC, C}), true);
  EXPECT_TRUE(close(minus(dx, dx0), gx, 1e-4, 1e-5));
  VecD gw2(gw.size());
  for (size_t i = 0; i < gw.size(); ++i) gw2[i] = 2 * gw[i];
  EXPECT_TRUE(close(minus(dw, dw0), gw2, 1e-4, 1e-5));
  ops->matmul_backward(Tensor{}, tf(dw, {OC, C}), Tensor{}, tf(G, {N, OC}), tf(x, {N, C}), tf(w, {OC, C}), false);
}

TEST_F(Kernels, MatmulBackwardLargeAgainstNaiveReference) {
  const int N = 131, C = 130, OC = 300;  // parallel dbias: strips of 256 columns plus a remainder
  VecF x = randn(N * C, 30), w = randn(OC * C, 31), G = randn(N * OC, 32);
  VecF dx(N * C, kNaN), dw(OC * C, 0.0f), db(OC, 0.0f);
  ops->matmul_backward(tf(dx, {N, C}), tf(dw, {OC, C}), tf(db, {OC}), tf(G, {N, OC}), tf(x, {N, C}), tf(w, {OC, C}),
                       false);
  VecD wdx(N * C, 0.0), wdw(OC * C, 0.0), wdb(OC, 0.0);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      const double g = G[n * OC + o];
      wdb[o] += g;
      for (int c = 0; c < C; ++c) {
        wdx[n * C + c] += g * w[o * C + c];
        wdw[o * C + c] += g * x[n * C + c];
      }
    }
  EXPECT_TRUE(close(dx, wdx, 1e-4, 1e-4));
  EXPECT_TRUE(close(dw, wdw, 1e-4, 1e-4));
  EXPECT_TRUE(close(db, wdb, 1e-4, 1e-4));
}

// ---- embedding --------------------------------------------------------------------------------------------

TEST_F(Kernels, EmbeddingForwardBackwardWithAndWithoutPositions) {
  // The second shape is large enough for the parallel path (threads split the channels).
  for (auto [B, T, V, C, maxT] : {std::array{3, 5, 11, 37, 8}, std::array{4, 70, 11, 150, 80}}) {
    std::vector<int32_t> tok(B * T);
    Rng rng(40);
    for (auto& t : tok) t = int32_t(rng.below(4));  // few distinct tokens: rows of dwte collide
    tok[7] = V - 1;
    VecF wte = randn(V * C, 41), wpe = randn(maxT * C, 42), G = randn(B * T * C, 43);
    for (bool with_pos : {true, false}) {
      VecF out(B * T * C, kNaN);
      ops->embedding_forward(tf(out, {B, T, C}), ti(tok, {B, T}), tf(wte, {V, C}),
                             with_pos ? tf(wpe, {maxT, C}) : Tensor{});
      VecD want(out.size());
      for (int b = 0; b < B; ++b)
        for (int t = 0; t < T; ++t)
          for (int c = 0; c < C; ++c)
            want[(b * T + t) * C + c] = double(wte[tok[b * T + t] * C + c]) + (with_pos ? wpe[t * C + c] : 0.0);
      EXPECT_TRUE(close(out, want, 0, 1e-6));

      // dwte and dwpe accumulate onto what is there.
      VecF dwte0 = randn(V * C, 44), dwpe0 = randn(maxT * C, 45), dwte = dwte0, dwpe = dwpe0;
      ops->embedding_backward(tf(dwte, {V, C}), with_pos ? tf(dwpe, {maxT, C}) : Tensor{}, tf(G, {B, T, C}),
                              ti(tok, {B, T}));
      VecD gte(V * C, 0.0), gpe(maxT * C, 0.0);
      for (int b = 0; b < B; ++b)
        for (int t = 0; t < T; ++t)
          for (int c = 0; c < C; ++c) {
            gte[tok[b * T + t] * C + c] += G[(b * T + t) * C + c];
            gpe[t * C + c] += G[(b * T + t) * C + c];
          }
      EXPECT_TRUE(close(minus(dwte, dwte0), gte, 1e-5, 1e-5));
      if (with_pos) {
        EXPECT_TRUE(close(minus(dwpe, dwpe0), gpe, 1e-5, 1e-5));
      } else {
        EXPECT_EQ(dwpe, dwpe0);
      }
    }
  }
}

TEST_F(Kernels, EmbeddingRejectsBadTokensAndLongSequences) {
  const int V = 4, C = 3;
  std::vector<int32_t> tok = {0, 1, 4};
  VecF wte(V * C), wpe(2 * C), out(3 * C);
  EXPECT_THROW(ops->embedding_forward(tf(out, {1, 3, C}), ti(tok, {1, 3}), tf(wte, {V, C}), Tensor{}), Error);
  tok[2] = 2;
  EXPECT_THROW(ops->embedding_forward(tf(out, {1, 3, C}), ti(tok, {1, 3}), tf(wte, {V, C}), tf(wpe, {2, C})), Error);
  ops->embedding_forward(tf(out, {1, 3, C}), ti(tok, {1, 3}), tf(wte, {V, C}), Tensor{});
}

// ---- normalisation ----------------------------------------------------------------------------------------

struct NormRef {
  VecD out, mean, rstd;
};

NormRef ref_layernorm(const VecD& x, const VecD& w, const VecD* b, int N, int C, double eps) {
  NormRef r{VecD(x.size()), VecD(N), VecD(N)};
  for (int n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += x[n * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (x[n * C + c] - m) * (x[n * C + c] - m);
    const double rs = 1 / std::sqrt(v / C + eps);
    for (int c = 0; c < C; ++c) r.out[n * C + c] = (x[n * C + c] - m) * rs * w[c] + (b ? (*b)[c] : 0.0);
    r.mean[n] = m;
    r.rstd[n] = rs;
  }
  return r;
}

NormRef ref_rmsnorm(const VecD& x, const VecD& w, int N, int C, double eps) {
  NormRef r{VecD(x.size()), {}, VecD(N)};
  for (int n = 0; n < N; ++n) {
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += x[n * C + c] * x[n * C + c];
    const double rs = 1 / std::sqrt(ss / C + eps);
    for (int c = 0; c < C; ++c) r.out[n * C + c] = x[n * C + c] * rs * w[c];
    r.rstd[n] = rs;
  }
  return r;
}

TEST_F(Kernels, LayerNormForwardAndBackward) {
  // N * C above the parallel threshold for the second shape (per-thread dw/db partials).
  for (auto [N, C] : {std::array{6, 13}, std::array{150, 333}}) {
    const bool small = N < 10;
    VecF x = randn(N * C, 50, 2.0f), w = randn(C, 51), b = randn(C, 52), G = randn(N * C, 53);
    for (float& v : x) v += 3.0f;  // a row mean far from zero
    VecD xd = to_d(x), wd = to_d(w), bd = to_d(b);
    const float eps = 1e-5f;
    for (bool with_bias : {true, false}) {
      VecF out(N * C, kNaN), mean(N, kNaN), rstd(N, kNaN);
      ops->layernorm_forward(tf(out, {N, C}), tf(mean, {N}), tf(rstd, {N}), tf(x, {N, C}), tf(w, {C}),
                             with_bias ? tf(b, {C}) : Tensor{}, eps);
      const NormRef r = ref_layernorm(xd, wd, with_bias ? &bd : nullptr, N, C, eps);
      EXPECT_TRUE(close(out, r.out, 1e-5, 1e-5));
      EXPECT_TRUE(close(mean, r.mean, 1e-6, 1e-6));
      EXPECT_TRUE(close(rstd, r.rstd, 1e-5, 0));

      VecF dx0 = randn(N * C, 54), dw0 = randn(C, 55), db0 = randn(C, 56), dx = dx0, dw = dw0, db = db0;
      ops->layernorm_backward(tf(dx, {N, C}), tf(dw, {C}), with_bias ? tf(db, {C}) : Tensor{}, tf(G, {N, C}),
                              tf(x, {N, C}), tf(w, {C}), tf(mean, {N}), tf(rstd, {N}));
      const VecD* bp = with_bias ? &bd : nullptr;
      // Full finite differences on the small shape; on the large one a spread of coordinates.
      std::vector<size_t> idx;
      if (!small)
        for (size_t i = 0; i < x.size(); i += 97) idx.push_back(i);
      const VecD gx = fd_grad([&](const VecD& v) { return dot(ref_layernorm(v, wd, bp, N, C, eps).out, G); }, xd, idx);
      const VecD gw = fd_grad([&](const VecD& v) { return dot(ref_layernorm(xd, v, bp, N, C, eps).out, G); }, wd);
      const VecF ddx = minus(dx, dx0);
      EXPECT_TRUE(close(small ? ddx : pick(ddx, idx), gx, 1e-3, 1e-4));
      EXPECT_TRUE(close(minus(dw, dw0), gw, 1e-4, 1e-4));
      if (with_bias) {
        const VecD gb = fd_grad([&](const VecD& v) { return dot(ref_layernorm(xd, wd, &v, N, C, eps).out, G); }, bd);
        EXPECT_TRUE(close(minus(db, db0), gb, 1e-4, 1e-4));
      } else {
        EXPECT_EQ(db, db0);
      }
    }
  }
}

TEST_F(Kernels, LayerNormForwardWithoutSavedStatistics) {
  const int N = 3, C = 8;
  VecF x = randn(N * C, 57), w = randn(C, 58), out(N * C);
  ops->layernorm_forward(tf(out, {N, C}), Tensor{}, Tensor{}, tf(x, {N, C}), tf(w, {C}), Tensor{}, 1e-5f);
  EXPECT_TRUE(close(out, ref_layernorm(to_d(x), to_d(w), nullptr, N, C, 1e-5).out, 1e-5, 1e-5));
}

TEST_F(Kernels, RMSNormForwardAndBackward) {
  for (auto [N, C] : {std::array{6, 13}, std::array{150, 333}}) {
    const bool small = N < 10;
    VecF x = randn(N * C, 60, 2.0f), w = randn(C, 61), G = randn(N * C, 62);
    VecD xd = to_d(x), wd = to_d(w);
    const float eps = 1e-6f;
    VecF out(N * C, kNaN), rstd(N, kNaN);
    ops->rmsnorm_forward(tf(out, {N, C}), tf(rstd, {N}), tf(x, {N, C}), tf(w, {C}), eps);
    const NormRef r = ref_rmsnorm(xd, wd, N, C, eps);
    EXPECT_TRUE(close(out, r.out, 1e-5, 1e-5));
    EXPECT_TRUE(close(rstd, r.rstd, 1e-5, 0));

    VecF dx0 = randn(N * C, 63), dw0 = randn(C, 64), dx = dx0, dw = dw0;
    ops->rmsnorm_backward(tf(dx, {N, C}), tf(dw, {C}), tf(G, {N, C}), tf(x, {N, C}), tf(w, {C}), tf(rstd, {N}));
    std::vector<size_t> idx;
    if (!small)
      for (size_t i = 0; i < x.size(); i += 97) idx.push_back(i);
    const VecD gx = fd_grad([&](const VecD& v) { return dot(ref_rmsnorm(v, wd, N, C, eps).out, G); }, xd, idx);
    const VecD gw = fd_grad([&](const VecD& v) { return dot(ref_rmsnorm(xd, v, N, C, eps).out, G); }, wd);
    const VecF ddx = minus(dx, dx0);
    EXPECT_TRUE(close(small ? ddx : pick(ddx, idx), gx, 1e-3, 1e-4));
    EXPECT_TRUE(close(minus(dw, dw0), gw, 1e-4, 1e-4));
  }
}

// ---- activations ------------------------------------------------------------------------------------------

double ref_gelu(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }

TEST_F(Kernels, GeluTanhForwardAndBackward) {
  const int n = 40001;  // above the parallel threshold
  VecF x = randn(n, 70, 3.0f);
  x[0] = -30.0f, x[1] = 30.0f, x[2] = 0.0f, x[3] = -9.0f, x[4] = 1e-4f;
  VecF out(n, kNaN);
  ops->gelu_forward(tf(out, {n}), tf(x, {n}));
  VecD want(n);
  for (int i = 0; i < n; ++i) want[i] = ref_gelu(x[i]);
  EXPECT_TRUE(close(out, want, 2e-6, 1e-7));

  VecF G = randn(n, 71), dx(n, kNaN);
  ops->gelu_backward(tf(dx, {n}), tf(x, {n}), tf(G, {n}));
  VecD gx(n);
  for (int i = 0; i < n; ++i) gx[i] = G[i] * (ref_gelu(x[i] + 1e-5) - ref_gelu(x[i] - 1e-5)) / 2e-5;
  EXPECT_TRUE(close(dx, gx, 1e-4, 1e-6));
  ops->gelu_backward(tf(G, {n}), tf(x, {n}), tf(G, {n}));  // dinp aliases dout
  EXPECT_EQ(G, dx);
}

TEST_F(Kernels, SwiGLUForwardAndBackward) {
  const int N = 7, F = 9;
  VecF x = randn(N * 2 * F, 80, 2.0f), G = randn(N * F, 81);
  auto ref = [&](const VecD& in) {
    VecD o(N * F);
    for (int n = 0; n < N; ++n)
      for (int j = 0; j < F; ++j) {
        const double g = in[n * 2 * F + j], u = in[n * 2 * F + F + j];
        o[n * F + j] = g / (1 + std::exp(-g)) * u;
      }
    return o;
  };
  VecF out(N * F, kNaN);
  ops->swiglu_forward(tf(out, {N, F}), tf(x, {N, 2 * F}));
  EXPECT_TRUE(close(out, ref(to_d(x)), 1e-5, 1e-6));
  VecF dx(N * 2 * F, kNaN);
  ops->swiglu_backward(tf(dx, {N, 2 * F}), tf(x, {N, 2 * F}), tf(G, {N, F}));
  EXPECT_TRUE(close(dx, fd_grad([&](const VecD& v) { return dot(ref(v), G); }, to_d(x)), 1e-4, 1e-5));
  EXPECT_THROW(ops->swiglu_forward(tf(out, {N, F}), tf(x, {N * 2, F})), Error);  // F odd: no [gate | up] split
}

}  // namespace
}  // namespace mt::test
