// CPU backend attention (causal, sliding window, GQA) and RoPE against naive double references; backward
// against central finite differences of the reference forward.
#include <limits>

#include "support/kernels_testutil.h"
#include "megatrain/kernels/cpu/tile_gemm.h"
#include "megatrain/kernels/ops.h"

namespace mt::test {
namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

struct AttnRef {
  VecD out, lse;
};

// Straightforward loops: for every (b, h, t) the scores over the keys t may see, a softmax, the weighted sum.
AttnRef ref_attention(const VecD& qkv, const AttnShape& s) {
  const int W = s.qkv_width(), hd = s.head_dim, OC = s.n_head * hd, group = s.n_head / s.n_kv_head;
  AttnRef r{VecD(size_t(s.B) * s.T * OC, 0.0), VecD(size_t(s.B) * s.n_head * s.T)};
  VecD p(s.T);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.n_head; ++h)
      for (int t = 0; t < s.T; ++t) {
        const int kvh = h / group, lo = s.window > 0 ? std::max(0, t - s.window + 1) : 0;
        const double* q = &qkv[(size_t(b) * s.T + t) * W + h * hd];
        double mx = -INFINITY;
        for (int u = lo; u <= t; ++u) {
          const double* k = &qkv[(size_t(b) * s.T + u) * W + (s.n_head + kvh) * hd];
          double dotp = 0;
          for (int c = 0; c < hd; ++c) dotp += q[c] * k[c];
          p[u] = dotp / std::sqrt(double(hd));
          mx = std::max(mx, p[u]);
        }
        double sum = 0;
        for (int u = lo; u <= t; ++u) sum += std::exp(p[u] - mx);
        r.lse[(size_t(b) * s.n_head + h) * s.T + t] = mx + std::log(sum);
        double* o = &r.out[(size_t(b) * s.T + t) * OC + h * hd];
        for (int u = lo; u <= t; ++u) {
          const double* v = &qkv[(size_t(b) * s.T + u) * W + (s.n_head + s.n_kv_head + kvh) * hd];
          for (int c = 0; c < hd; ++c) o[c] += std::exp(p[u] - mx) / sum * v[c];
        }
      }
  return r;
}

class Attention : public ::testing::TestWithParam<AttnShape> {
 protected:
  std::unique_ptr<Ops> ops = make_cpu_ops();
};

TEST_P(Attention, ForwardAndBackwardMatchReference) {
  const AttnShape s = GetParam();
  const int64_t W = s.qkv_width(), OC = int64_t{s.n_head} * s.head_dim, rows = int64_t{s.B} * s.T;
  VecF qkv = randn(rows * W, 100 + s.T + s.window, 1.5f), G = randn(rows * OC, 200 + s.window);
  VecF out(rows * OC, kNaN), lse(int64_t{s.B} * s.n_head * s.T, kNaN);
  ops->attention_forward(tf(out, {s.B, s.T, OC}), tf(lse, {s.B, s.n_head, s.T}), tf(qkv, {s.B, s.T, W}), s);
  const VecD qd = to_d(qkv);
  const AttnRef r = ref_attention(qd, s);
  EXPECT_TRUE(close(out, r.out, 1e-4, 1e-5));
  EXPECT_TRUE(close(lse, r.lse, 1e-5, 1e-5));

  VecF dqkv(rows * W, kNaN);  // overwritten: NaN must not survive anywhere, including the unused parts of rows
  ops->attention_backward(tf(dqkv, {s.B, s.T, W}), tf(G, {s.B, s.T, OC}), tf(qkv, {s.B, s.T, W}),
                          tf(out, {s.B, s.T, OC}), tf(lse, {s.B, s.n_head, s.T}), s);
  auto loss = [&](const VecD& v) { return dot(ref_attention(v, s).out, G); };
  std::vector<size_t> idx;  // all coordinates when small; otherwise a spread over q, k and v of every row
  if (qkv.size() > 1000)
    for (size_t i = 0; i < qkv.size(); i += 37) idx.push_back(i);
  const VecD g = fd_grad(loss, qd, idx, 1e-4);
  EXPECT_TRUE(close(idx.empty() ? dqkv : pick(dqkv, idx), g, 2e-3, 2e-4));
  for (float v : dqkv) ASSERT_FALSE(std::isnan(v));

  // Directional derivative along a random direction touches every coordinate at once.
  const VecF d = randn(qkv.size(), 300);
  VecD xp = qd, xm = qd;
  double along = 0;
  for (size_t i = 0; i < qd.size(); ++i) {
    xp[i] += 1e-5 * d[i];
    xm[i] -= 1e-5 * d[i];
    along += double(dqkv[i]) * d[i];
  }
  const double fd_along = (loss(xp) - loss(xm)) / 2e-5;
  EXPECT_NEAR(along, fd_along, 1e-3 * (1 + std::abs(fd_along)));
}

AttnShape shape(int B, int T, int H, int Hkv, int hd, int window) { return AttnShape{B, T, H, Hkv, hd, window}; }

INSTANTIATE_TEST_SUITE_P(Shapes, Attention,
                         ::testing::Values(shape(2, 7, 4, 2, 4, 0),   // full causal, GQA 2:1
                                           shape(2, 7, 4, 4, 4, 3),   // sliding window W < T, plain multi-head
                                           shape(2, 7, 4, 2, 4, 1),   // W = 1: every token sees only itself
                                           shape(1, 7, 2, 2, 4, 7),   // W = T: same as full causal
                                           shape(1, 7, 2, 1, 4, 12),  // W > T, multi-query
                                           shape(1, 9, 3, 1, 6, 0),   // 3 query heads per kv head
                                           shape(2, 150, 2, 1, 8,
                                                 0),  // several query blocks, T not a multiple of the block
                                           shape(1, 150, 4, 2, 8, 40),    // window inside one block width
                                           shape(1, 150, 2, 2, 8, 100)),  // window spanning blocks
                         [](const auto& info) {
                           const AttnShape& s = info.param;
                           return "B" + std::to_string(s.B) + "T" + std::to_string(s.T) + "H" +
                                  std::to_string(s.n_head) + "KV" + std::to_string(s.n_kv_head) + "D" +
                                  std::to_string(s.head_dim) + "W" + std::to_string(s.window);
                         });

TEST(AttentionErrors, BadShapesAreRejected) {
  auto ops = make_cpu_ops();
  VecF qkv(2 * 4 * 12), out(2 * 4 * 4), lse(2 * 4);
  AttnShape s{1, 2, 3, 2, 1, 0};  // 3 query heads cannot share 2 kv heads
  EXPECT_THROW(ops->attention_forward(tf(out, {8}), tf(lse, {8}), tf(qkv, {96}), s), Error);
  s = AttnShape{1, 2, 2, 1, 4, -1};
  EXPECT_THROW(ops->attention_forward(tf(out, {16}), tf(lse, {4}), tf(qkv, {32}), s), Error);
  s = AttnShape{1, 2, 2, 1, 4, 0};  // qkv should hold 2 * (2 + 2) * 4 = 32 floats
  EXPECT_THROW(ops->attention_forward(tf(out, {16}), tf(lse, {4}), tf(qkv, {30}), s), Error);
}

// A window near 2^31 (issue 10: --model.window=2147483647 died with SIGABRT, a std::length_error thrown inside an
// OpenMP region when the scratch size overflowed int). Any window >= T sees the whole causal context: the result
// must be bit-identical to full causal attention (window 0), forward and backward.
TEST(AttentionWindow, AWindowNearIntMaxIsFullCausalAttention) {
  auto ops = make_cpu_ops();
  const AttnShape full{1, 150, 2, 1, 8, 0};
  const int64_t W = full.qkv_width(), OC = int64_t{full.n_head} * full.head_dim, rows = int64_t{full.B} * full.T;
  const VecF qkv = randn(rows * W, 401, 1.5f), G = randn(rows * OC, 402);
  VecF outs[2], lses[2], grads[2];
  for (int k = 0; k < 2; ++k) {
    AttnShape s = full;
    if (k == 1) s.window = std::numeric_limits<int>::max();
    VecF q = qkv, g = G;
    outs[k].assign(rows * OC, kNaN);
    lses[k].assign(int64_t{s.B} * s.n_head * s.T, kNaN);
    grads[k].assign(rows * W, kNaN);
    ops->attention_forward(tf(outs[k], {s.B, s.T, OC}), tf(lses[k], {s.B, s.n_head, s.T}), tf(q, {s.B, s.T, W}), s);
    ops->attention_backward(tf(grads[k], {s.B, s.T, W}), tf(g, {s.B, s.T, OC}), tf(q, {s.B, s.T, W}),
                            tf(outs[k], {s.B, s.T, OC}), tf(lses[k], {s.B, s.n_head, s.T}), s);
  }
  EXPECT_EQ(outs[1], outs[0]);
  EXPECT_EQ(lses[1], lses[0]);
  EXPECT_EQ(grads[1], grads[0]);
}

// ---- the tile GEMM under attention -----------------------------------------------------------------------

TEST(TileGemm, MatchesNaiveProductForEdgeSizesStridesAndBeta) {
  int cases = 0;
  for (int M : {1, 5, 6, 13})
    for (int N : {1, 15, 16, 17, 64, 80, 130})
      for (int K : {1, 7, 64})
        for (bool trans_a : {false, true})
          for (float beta : {0.0f, 1.0f}) {
            const int lda = trans_a ? M + 3 : K + 2, ldb = N + 5, ldc = N + 1;
            VecF a = randn(size_t(trans_a ? K : M) * lda, 800 + M), b = randn(size_t(K) * ldb, 801 + N);
            VecF c = randn(size_t(M) * ldc, 802 + K);
            if (beta == 0.0f)  // C must not be read: NaN where the product goes (the row padding stays finite)
              for (int i = 0; i < M; ++i) std::fill(c.begin() + i * ldc, c.begin() + i * ldc + N, kNaN);
            VecD want(c.begin(), c.end());
            const int64_t rs = trans_a ? 1 : lda, cs = trans_a ? lda : 1;
            for (int i = 0; i < M; ++i)
              for (int j = 0; j < N; ++j) {
                double sum = 0;
                for (int k = 0; k < K; ++k) sum += double(a[i * rs + k * cs]) * b[k * ldb + j];
                want[i * ldc + j] = 0.5 * sum + (beta == 0.0f ? 0.0 : beta * double(c[i * ldc + j]));
              }
            cpu::tile_gemm(M, N, K, 0.5f, a.data(), rs, cs, b.data(), ldb, beta, c.data(), ldc);
            // (want keeps the row padding as it was: close() also checks it is untouched)
            ASSERT_TRUE(close(c, want, 1e-5, 1e-5))
                << M << "x" << N << "x" << K << " trans " << trans_a << " beta " << beta;
            ++cases;
          }
  EXPECT_EQ(cases, 4 * 7 * 3 * 2 * 2);
}

// ---- RoPE -------------------------------------------------------------------------------------------------

// freq_i as HF's transformers computes it (modeling_rope_utils: the default inverse frequencies, and
// _compute_llama3_parameters for Llama 3.1's scaling: wavelengths below original / high kept, above original / low
// divided by the factor, the band between interpolated), in double.
double hf_inv_freq(const RopeFreqs& f, int i, int hd) {
  const double inv = 1.0 / std::pow(double(f.theta), (2.0 * i) / hd);
  if (f.scaling == 0) return inv;
  const double wavelen = 2 * M_PI / inv, low_wavelen = f.original_len / double(f.low_freq_factor),
               high_wavelen = f.original_len / double(f.high_freq_factor);
  double out = wavelen > low_wavelen ? inv / f.scaling : inv;
  const double smooth = (f.original_len / wavelen - f.low_freq_factor) / (f.high_freq_factor - f.low_freq_factor);
  if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) out = (1 - smooth) * out / f.scaling + smooth * out;
  return out;
}

VecD ref_rope(const VecD& x, const AttnShape& s, const RopeFreqs& f) {
  VecD y = x;
  const int W = s.qkv_width(), half = s.head_dim / 2;
  for (int b = 0; b < s.B; ++b)
    for (int t = 0; t < s.T; ++t)
      for (int h = 0; h < s.n_head + s.n_kv_head; ++h)
        for (int i = 0; i < half; ++i) {
          const size_t j = (size_t(b) * s.T + t) * W + h * s.head_dim + i;
          const double ang = t * hf_inv_freq(f, i, s.head_dim);
          y[j] = x[j] * std::cos(ang) - x[j + half] * std::sin(ang);
          y[j + half] = x[j] * std::sin(ang) + x[j + half] * std::cos(ang);
        }
  return y;
}

TEST(Rope, ForwardMatchesReferenceAndBackwardIsItsTranspose) {
  auto ops = make_cpu_ops();
  // Llama 3.1's scaling with a band that puts head_dim 8's four wavelengths (6.3, 63, 628, 6283) one in each
  // regime: kept (< 1024/8), kept, interpolated, divided (> 1024/1).
  const RopeFreqs llama31{10000.0f, 8.0f, 1.0f, 8.0f, 1024};
  for (const RopeFreqs& f : {RopeFreqs{10000.0f}, RopeFreqs{500.0f}, llama31}) {
    SCOPED_TRACE(fmt::format("theta {} scaling {}", f.theta, f.scaling));
    const AttnShape s{2, 37, 4, 2, 8, 0};
    const int64_t n = int64_t{s.B} * s.T * s.qkv_width();
    const VecF x = randn(n, 400), y = randn(n, 401);
    VecF rx = x;
    ops->rope_forward(tf(rx, {n}), s, f);
    EXPECT_TRUE(close(rx, ref_rope(to_d(x), s, f), 1e-5, 2e-5));
    if (f.scaling > 0) {  // and the scaling changed something: not the unscaled rotation
      VecF plain = x;
      ops->rope_forward(tf(plain, {n}), s, RopeFreqs{f.theta});
      EXPECT_FALSE(close(rx, to_d(plain), 1e-3, 1e-3));
    }
    // v heads untouched, bit for bit
    const int W = s.qkv_width(), v0 = (s.n_head + s.n_kv_head) * s.head_dim;
    for (int64_t r = 0; r < int64_t{s.B} * s.T; ++r)
      for (int c = v0; c < W; ++c) ASSERT_EQ(rx[r * W + c], x[r * W + c]);

    VecF by = y;
    ops->rope_backward(tf(by, {n}), s, f);
    double lhs = 0, rhs = 0;  // <rope(x), y> == <x, rope_bwd(y)>
    for (int64_t i = 0; i < n; ++i) {
      lhs += double(rx[i]) * y[i];
      rhs += double(x[i]) * by[i];
    }
    EXPECT_NEAR(lhs, rhs, 1e-5 * n);
    VecF back = rx;  // a rotation's transpose is its inverse
    ops->rope_backward(tf(back, {n}), s, f);
    EXPECT_TRUE(close(back, to_d(x), 0, 1e-5));
  }
  VecF odd(2 * 3 * 3);
  EXPECT_THROW(ops->rope_forward(tf(odd, {18}), AttnShape{1, 2, 1, 1, 3, 0}, RopeFreqs{}), Error);
  VecF ok(2 * 8 * 4);  // B 1, T 2, heads 1 + 1 (+ v), head_dim 8... a scaling with an empty band is refused
  EXPECT_THROW(ops->rope_forward(tf(ok, {static_cast<int64_t>(ok.size())}), AttnShape{1, 2, 1, 1, 8, 0},
                                 RopeFreqs{10000.0f, 8.0f, 4.0f, 1.0f, 1024}),
               Error);
}

}  // namespace
}  // namespace mt::test
