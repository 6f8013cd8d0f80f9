// CPU backend: fused softmax cross-entropy (padded vocabulary, ignored targets) against a double reference and
// finite differences; AdamW and LAMB over three steps against their formulas evaluated in double.
#include <omp.h>

#include <limits>
#include <tuple>
#include <vector>

#include "support/kernels_testutil.h"
#include "megatrain/core/bf16.h"
#include "megatrain/kernels/ops.h"

namespace mt::test {
namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

// losses[n] = logsumexp(z[n, :V]) - z[n, target] (0 for target < 0)
VecD ref_ce(const VecD& z, const std::vector<int32_t>& tgt, int N, int V, int Vp) {
  VecD loss(N, 0.0);
  for (int n = 0; n < N; ++n) {
    if (tgt[n] < 0) continue;
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j < V; ++j) mx = std::max(mx, z[size_t(n) * Vp + j]);
    for (int j = 0; j < V; ++j) sum += std::exp(z[size_t(n) * Vp + j] - mx);
    loss[n] = mx + std::log(sum) - z[size_t(n) * Vp + tgt[n]];
  }
  return loss;
}

TEST(CrossEntropy, PaddedVocabAndIgnoredTargets) {
  auto ops = make_cpu_ops();
  const int N = 6, V = 11, Vp = 16;
  VecF z = randn(N * Vp, 500, 3.0f);
  for (int n = 0; n < N; ++n)
    for (int j = V; j < Vp; ++j) z[n * Vp + j] = 1e4f;  // padded columns: huge, and must still be ignored
  std::vector<int32_t> tgt = {3, -1, 0, 10, 7, -1};
  const float dloss = 0.25f;
  const VecD zd = to_d(z);
  const VecD want = ref_ce(zd, tgt, N, V, Vp);

  VecF loss(N, kNaN), zc = z;
  ops->cross_entropy(tf(loss, {N}), tf(zc, {N, Vp}), ti(tgt, {N}), V, dloss, false);
  EXPECT_TRUE(close(loss, want, 1e-5, 1e-5));
  EXPECT_EQ(zc, z);  // no gradient requested: logits untouched

  std::fill(loss.begin(), loss.end(), kNaN);
  ops->cross_entropy(tf(loss, {N}), tf(zc, {N, Vp}), ti(tgt, {N}), V, dloss, true);
  EXPECT_TRUE(close(loss, want, 1e-5, 1e-5));
  // d(dloss * sum_n loss_n) / dz by finite differences: covers softmax - onehot, padded and ignored columns.
  const VecD g = fd_grad(
      [&](const VecD& v) {
        double s = 0;
        for (double l : ref_ce(v, tgt, N, V, Vp)) s += dloss * l;
        return s;
      },
      zd);
  EXPECT_TRUE(close(zc, g, 1e-4, 1e-6));
  for (int n = 0; n < N; ++n)
    for (int j = 0; j < Vp; ++j) {
      if (j >= V || tgt[n] < 0) {
        ASSERT_EQ(zc[n * Vp + j], 0.0f) << n << "," << j;
      }
    }
}

TEST(CrossEntropy, GPT2VocabOnlinePassAcrossChunks) {
  auto ops = make_cpu_ops();
  const int N = 3, V = 50257, Vp = 50304;
  VecF z = randn(size_t(N) * Vp, 510, 4.0f);
  z[1 * Vp + 40000] = 60.0f;  // a late maximum: the running sum must be rescaled
  z[2 * Vp + 5] = -200.0f;    // a logit whose exp underflows
  std::vector<int32_t> tgt = {50256, 40000, 5};
  const VecD want = ref_ce(to_d(z), tgt, N, V, Vp);
  VecF loss(N), zc = z;
  ops->cross_entropy(tf(loss, {N}), tf(zc, {N, Vp}), ti(tgt, {N}), V, 1.0f, true);
  EXPECT_TRUE(close(loss, want, 1e-5, 1e-4));
  for (int n = 0; n < N; ++n) {  // each gradient row sums to zero (softmax sums to one) and is 0 on padding
    double s = 0;
    for (int j = 0; j < V; ++j) s += zc[size_t(n) * Vp + j];
    EXPECT_NEAR(s, 0.0, 1e-5);
    for (int j = V; j < Vp; ++j) ASSERT_EQ(zc[size_t(n) * Vp + j], 0.0f);
  }
}

TEST(CrossEntropy, BadArgumentsAreRejected) {
  auto ops = make_cpu_ops();
  VecF z(2 * 8), loss(2);
  std::vector<int32_t> tgt = {1, 6};
  EXPECT_THROW(ops->cross_entropy(tf(loss, {2}), tf(z, {2, 8}), ti(tgt, {2}), 6, 1.0f, true), Error);   // 6 >= V
  EXPECT_THROW(ops->cross_entropy(tf(loss, {2}), tf(z, {2, 8}), ti(tgt, {2}), 9, 1.0f, true), Error);   // V > Vp
  EXPECT_THROW(ops->cross_entropy(tf(loss, {2}), tf(z, {2, 8}), tf(loss, {2}), 8, 1.0f, true), Error);  // F32 targets
}

// ---- optimizers -------------------------------------------------------------------------------------------

struct OptState {
  VecD p, m, v;
};

// One Adam moment update from the formulas, in double; returns u = mhat / (sqrt(vhat) + eps) + wd * p.
VecD ref_adam_moments(OptState& st, const VecF& g, const AdamHParams& h) {
  VecD u(st.p.size());
  const double bc1 = 1 - std::pow(double(h.beta1), h.step), bc2 = 1 - std::pow(double(h.beta2), h.step);
  for (size_t i = 0; i < u.size(); ++i) {
    const double gi = double(g[i]) * h.grad_scale;
    st.m[i] = h.beta1 * st.m[i] + (1 - double(h.beta1)) * gi;
    st.v[i] = h.beta2 * st.v[i] + (1 - double(h.beta2)) * gi * gi;
    u[i] = st.m[i] / bc1 / (std::sqrt(st.v[i] / bc2) + h.eps) + double(h.weight_decay) * st.p[i];
  }
  return u;
}

AdamHParams hparams(int step) {
  AdamHParams h;
  h.lr = 1e-2f, h.beta1 = 0.9f, h.beta2 = 0.95f, h.eps = 1e-8f, h.weight_decay = 0.1f;
  h.step = step, h.grad_scale = 0.5f;
  return h;
}

TEST(Optimizer, AdamWThreeStepsMatchFormula) {
  auto ops = make_cpu_ops();
  const int n = 70001;  // parallel path, odd tail
  VecF p = randn(n, 600), m(n, 0.0f), v(n, 0.0f);
  OptState st{to_d(p), VecD(n, 0.0), VecD(n, 0.0)};
  for (int step = 1; step <= 3; ++step) {
    const VecF g = randn(n, 610 + step, 0.1f);
    const AdamHParams h = hparams(step);
    ops->adamw_update(tf(p, {n}), tf(const_cast<VecF&>(g), {n}), tf(m, {n}), tf(v, {n}), h);
    const VecD u = ref_adam_moments(st, g, h);
    for (int i = 0; i < n; ++i) st.p[i] -= h.lr * u[i];
  }
  EXPECT_TRUE(close(m, st.m, 1e-5, 1e-8));
  EXPECT_TRUE(close(v, st.v, 1e-5, 1e-10));
  EXPECT_TRUE(close(p, st.p, 1e-5, 1e-6));
}

// The multi-tensor AdamW over a flat buffer against each segment updated on its own, in separate vectors, by
// adamw_update with the segment's weight decay (bit for bit); the gaps between segments stay untouched, and a
// segment past the end is refused.


// Bit-identity of the flat buffers' segments with the oracle's per-segment vectors.
void expect_segments_equal(const std::vector<AdamSegment>& segs, const VecF& p, const VecF& m, const VecF& v,
                           const std::vector<VecF>& ps, const std::vector<VecF>& ms, const std::vector<VecF>& vs) {
  for (size_t k = 0; k < segs.size(); ++k)
    for (int64_t i = 0; i < segs[k].numel; ++i) {
      const int64_t j = segs[k].offset + i;
      ASSERT_EQ(p[j], ps[k][i]) << "segment " << k << " element " << i;
      ASSERT_EQ(m[j], ms[k][i]) << "segment " << k << " element " << i;
      ASSERT_EQ(v[j], vs[k][i]) << "segment " << k << " element " << i;
    }
}

// The oracle's state for multi-tensor optimizer tests: each segment's parameters (from p0) and zero moments in
// vectors of their own, so the per-tensor ops run on separate memory.
std::tuple<std::vector<VecF>, std::vector<VecF>, std::vector<VecF>>
per_segment_state(const VecF& p0, const std::vector<AdamSegment>& segs) {
  std::vector<VecF> ps, ms, vs;
  for (const AdamSegment& s : segs) {
    ps.emplace_back(p0.begin() + s.offset, p0.begin() + s.offset + s.numel);
    ms.emplace_back(s.numel, 0.0f);
    vs.emplace_back(s.numel, 0.0f);
  }
  return {ps, ms, vs};
}

TEST(Optimizer, AdamWMultiTensorIsPerSegmentAdamW) {
  auto ops = make_cpu_ops();
  const std::vector<AdamSegment> segs = {
      {0, 13, 0.1f}, {16, 1, 0.0f}, {32, 0, 0.1f}, {32, 5000, 0.1f}, {5040, 7, 0.0f}};
  const int64_t n = 5056;
  const VecF p0 = randn(n, 700);
  VecF p = p0, m(n, 0.0f), v(n, 0.0f);
  auto [ps, ms, vs] = per_segment_state(p0, segs);  // the oracle: one vector per segment
  AdamHParams h = hparams(1);
  h.weight_decay = 0.5f;  // replaced by each segment's
  for (int step = 1; step <= 2; ++step) {
    h.step = step;
    VecF g = randn(n, 710 + step, 0.1f);
    ops->adamw_update_multi(tf(p, {n}), tf(g, {n}), tf(m, {n}), tf(v, {n}), segs, h);
    for (size_t k = 0; k < segs.size(); ++k) {
      const int64_t len = segs[k].numel;
      if (len == 0) continue;  // nothing to update (and an empty vector has no memory to view)
      VecF gs(g.begin() + segs[k].offset, g.begin() + segs[k].offset + len);
      AdamHParams hs = h;
      hs.weight_decay = segs[k].weight_decay;
      ops->adamw_update(tf(ps[k], {len}), tf(gs, {len}), tf(ms[k], {len}), tf(vs[k], {len}), hs);
    }
  }
  expect_segments_equal(segs, p, m, v, ps, ms, vs);
  EXPECT_EQ(p[13], p0[13]);  // gaps
  EXPECT_EQ(p[5050], p0[5050]);
  VecF g = randn(n, 720, 0.1f);
  try {
    ops->adamw_update_multi(tf(p, {n}), tf(g, {n}), tf(m, {n}), tf(v, {n}), {AdamSegment{n - 3, 7, 0.0f}}, h);
    FAIL() << "a segment past the end was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside a flat tensor"), std::string::npos) << e.what();
  }
}

// The fused refresh of the compute copy: with weight_out (bf16), every segment of it holds the updated weights
// rounded as convert() rounds (the host's float_to_bf16, bit for bit), and the gaps between segments keep what they
// held; the fp32 update is the same bits as without it.
TEST(Optimizer, AdamWMultiTensorWritesTheComputeCopyOfEachSegment) {
  auto ops = make_cpu_ops();
  const std::vector<AdamSegment> segs = {{0, 13, 0.1f}, {16, 1, 0.0f}, {32, 0, 0.1f}, {32, 500, 0.1f}, {540, 7, 0.0f}};
  const int64_t n = 560;
  const VecF p0 = randn(n, 730);
  VecF p = p0, m(n, 0.0f), v(n, 0.0f), q = p0, mq(n, 0.0f), vq(n, 0.0f);
  constexpr uint16_t kSentinel = 0x7fc1;  // a NaN pattern convert() never writes for these finite weights
  std::vector<uint16_t> w(n, kSentinel);
  AdamHParams h = hparams(1);
  for (int step = 1; step <= 2; ++step) {
    h.step = step;
    VecF g = randn(n, 740 + step, 0.1f);
    ops->adamw_update_multi(tf(p, {n}), tf(g, {n}), tf(m, {n}), tf(v, {n}), segs, h,
                            Tensor(w.data(), {n}, DType::BF16));
    ops->adamw_update_multi(tf(q, {n}), tf(g, {n}), tf(mq, {n}), tf(vq, {n}), segs, h);
  }
  std::vector<bool> in_segment(n, false);
  for (const AdamSegment& sg : segs)
    for (int64_t i = sg.offset; i < sg.offset + sg.numel; ++i) in_segment[i] = true;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(p[i], q[i]) << "element " << i;
    if (in_segment[i])
      ASSERT_EQ(w[i], float_to_bf16(p[i])) << "element " << i;
    else
      ASSERT_EQ(w[i], kSentinel) << "gap element " << i;
  }
}

// The multi-tensor LAMB (both passes, norms between them in a tensor) against the per-tensor sequence on each
// segment in its own vectors: lamb_moments, sum_squares of the param, the trust ratio in float from the two norms
// rounded to float, lamb_apply (bit for bit, norms included). Segments of odd sizes, with and without decay, an
// empty one, and one whose params and grads are zero (trust 1); the gaps stay untouched; bad norms and segments are refused.
TEST(Optimizer, LambMultiTensorIsPerSegmentLamb) {
  auto ops = make_cpu_ops();
  const std::vector<AdamSegment> segs = {{0, 13, 0.1f},    {16, 1, 0.0f},   {32, 0, 0.1f},
                                         {32, 5000, 0.1f}, {5040, 7, 0.0f}, {5047, 37, 0.1f}};
  const int64_t n = 5090;
  VecF p0 = randn(n, 800);
  std::fill(p0.begin() + 5047, p0.begin() + 5047 + 37, 0.0f);  // ||w|| = 0: trust 1
  VecF p = p0, m(n, 0.0f), v(n, 0.0f), norms(2 * segs.size(), kNaN);
  auto [ps, ms, vs] = per_segment_state(p0, segs);  // the oracle: one vector per segment
  AdamHParams h = hparams(1);
  h.weight_decay = 0.5f;  // replaced by each segment's
  h.grad_scale = 0.5f;
  const Tensor nt = tf(norms, {static_cast<int64_t>(norms.size())});
  int trust_one = 0;
  for (int step = 1; step <= 3; ++step) {
    h.step = step;
    VecF g = randn(n, 810 + step, 0.1f);
    std::fill(g.begin() + 5047, g.begin() + 5047 + 37, 0.0f);  // and ||u|| = 0: the zero segment stays zero
    ops->lamb_moments_multi(tf(p, {n}), tf(g, {n}), tf(m, {n}), tf(v, {n}), segs, h, nt);
    const VecF got_norms = norms;
    ops->lamb_apply_multi(tf(p, {n}), tf(m, {n}), tf(v, {n}), segs, h, nt);
    EXPECT_EQ(norms, got_norms) << "lamb_apply_multi changed the norms";
    for (size_t k = 0; k < segs.size(); ++k) {
      const int64_t len = segs[k].numel;
      if (len == 0) {  // nothing to update; both norms are 0
        EXPECT_EQ(got_norms[2 * k], 0.0f);
        EXPECT_EQ(got_norms[2 * k + 1], 0.0f);
        continue;
      }
      VecF gs(g.begin() + segs[k].offset, g.begin() + segs[k].offset + len);
      AdamHParams hs = h;
      hs.weight_decay = segs[k].weight_decay;
      const float u2 = static_cast<float>(ops->lamb_moments(tf(ps[k], {len}), tf(gs, {len}), tf(ms[k], {len}),
                                                            tf(vs[k], {len}), hs));
      const float w2 = static_cast<float>(ops->sum_squares(tf(ps[k], {len})));
      ASSERT_EQ(got_norms[2 * k], w2) << "||w||^2 of segment " << k << " at step " << step;
      ASSERT_EQ(got_norms[2 * k + 1], u2) << "||u||^2 of segment " << k << " at step " << step;
      const float trust = (w2 > 0 && u2 > 0) ? std::sqrt(w2 / u2) : 1.0f;
      trust_one += trust == 1.0f;
      ops->lamb_apply(tf(ps[k], {len}), tf(ms[k], {len}), tf(vs[k], {len}), hs, trust);
    }
  }
  EXPECT_EQ(trust_one, 3) << "the zero segment (and only it) must take trust 1 at each step";
  expect_segments_equal(segs, p, m, v, ps, ms, vs);
  EXPECT_NE(p[100], p0[100]);  // updated
  EXPECT_EQ(p[13], p0[13]);    // gaps
  EXPECT_EQ(p[5084], p0[5084]);
  VecF g = randn(n, 820, 0.1f);
  auto error = [&](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string e = error([&] {
    ops->lamb_moments_multi(tf(p, {n}), tf(g, {n}), tf(m, {n}), tf(v, {n}), segs, h, tf(norms, {4}));
  });
  EXPECT_NE(e.find("lamb_moments_multi: norms (2 per segment)"), std::string::npos) << e;
  e = error([&] {
    ops->lamb_apply_multi(tf(p, {n}), tf(m, {n}), tf(v, {n}), {AdamSegment{n - 3, 7, 0.0f}}, h, tf(norms, {2}));
  });
  EXPECT_NE(e.find("lamb_apply_multi: segment [5087, 5094) is outside the flat buffers of 5090"), std::string::npos)
      << e;
}

TEST(Optimizer, LambThreeStepsMatchFormula) {
  auto ops = make_cpu_ops();
  const int n = 150001;  // several blocks of the deterministic sum
  VecF p = randn(n, 700), m(n, 0.0f), v(n, 0.0f);
  OptState st{to_d(p), VecD(n, 0.0), VecD(n, 0.0)};
  for (int step = 1; step <= 3; ++step) {
    const VecF g = randn(n, 710 + step, 0.1f);
    const AdamHParams h = hparams(step);
    const VecF p0 = p, m0 = m, v0 = v;
    const double uu = ops->lamb_moments(tf(p, {n}), tf(const_cast<VecF&>(g), {n}), tf(m, {n}), tf(v, {n}), h);
    const VecD u = ref_adam_moments(st, g, h);
    double want_uu = 0, pp = 0;
    for (int i = 0; i < n; ++i) want_uu += u[i] * u[i], pp += st.p[i] * st.p[i];
    EXPECT_NEAR(uu, want_uu, 1e-5 * want_uu);

    // The same pass with another thread count gives the same bits.
    VecF p1 = p0, m1 = m0, v1 = v0;
    const int threads = omp_get_max_threads();
    omp_set_num_threads(threads == 1 ? 2 : 1);
    const double uu1 = ops->lamb_moments(tf(p1, {n}), tf(const_cast<VecF&>(g), {n}), tf(m1, {n}), tf(v1, {n}), h);
    omp_set_num_threads(threads);
    EXPECT_EQ(uu, uu1);

    const float trust = float(std::sqrt(pp) / std::sqrt(want_uu));  // the layer-wise trust ratio ||p|| / ||u||
    ops->lamb_apply(tf(p, {n}), tf(m, {n}), tf(v, {n}), h, trust);
    for (int i = 0; i < n; ++i) st.p[i] -= double(h.lr) * trust * u[i];
  }
  EXPECT_TRUE(close(m, st.m, 1e-5, 1e-8));
  EXPECT_TRUE(close(v, st.v, 1e-5, 1e-10));
  EXPECT_TRUE(close(p, st.p, 1e-5, 1e-6));
}

TEST(Optimizer, BadHyperparametersAreRejected) {
  auto ops = make_cpu_ops();
  VecF p(4), g(4), m(4), v(4), v3(3);
  AdamHParams h = hparams(0);
  EXPECT_THROW(ops->adamw_update(tf(p, {4}), tf(g, {4}), tf(m, {4}), tf(v, {4}), h), Error);  // step 0
  h = hparams(1);
  EXPECT_THROW(ops->adamw_update(tf(p, {4}), tf(g, {4}), tf(m, {4}), tf(v3, {3}), h), Error);
}

}  // namespace
}  // namespace mt::test
