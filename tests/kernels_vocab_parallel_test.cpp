// Vocab-parallel cross-entropy and the "no row" embedding tokens against naive double references: the logits
// are split column-wise over simulated ranks, the three local steps run per rank with the all-reduces done by
// hand, and the result must equal the softmax cross-entropy of the whole row (loss and dlogits).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "support/kernels_testutil.h"
#include "megatrain/kernels/ops.h"

using namespace mt;
using namespace mt::test;

namespace {

struct VocabParallel : ::testing::Test {
  std::unique_ptr<Ops> ops = make_cpu_ops();
};

// Runs the vocab-parallel CE over `ranks` column shards of logits [N, Vp_tp] (V real columns) and returns the
// per-row losses; dlogits (when write_grad) are written back into `logits` (re-assembled).
VecF run_sharded(Ops& ops, VecF& logits, std::vector<int32_t>& targets, int64_t N, int64_t Vtot, int V, int ranks,
                 float dloss, bool write_grad) {
  const int64_t Vl = Vtot / ranks;
  std::vector<VecF> shard(ranks, VecF(N * Vl)), stats(ranks, VecF(3 * N));
  for (int r = 0; r < ranks; ++r)
    for (int64_t n = 0; n < N; ++n) std::copy_n(logits.begin() + n * Vtot + r * Vl, Vl, shard[r].begin() + n * Vl);
  auto n_real = [&](int r) { return static_cast<int>(std::clamp<int64_t>(V - r * Vl, 0, Vl)); };
  for (int r = 0; r < ranks; ++r) ops.vp_ce_max(tf(stats[r], {3, N}), tf(shard[r], {N, Vl}), n_real(r));
  for (int64_t n = 0; n < N; ++n) {  // allreduce Max
    float m = -std::numeric_limits<float>::infinity();
    for (int r = 0; r < ranks; ++r) m = std::max(m, stats[r][n]);
    for (int r = 0; r < ranks; ++r) stats[r][n] = m;
  }
  for (int r = 0; r < ranks; ++r)
    ops.vp_ce_sums(tf(stats[r], {3, N}), tf(shard[r], {N, Vl}), ti(targets, {N}), r * Vl, n_real(r), V);
  for (int64_t i = N; i < 3 * N; ++i) {  // allreduce Sum
    float s = 0;
    for (int r = 0; r < ranks; ++r) s += stats[r][i];
    for (int r = 0; r < ranks; ++r) stats[r][i] = s;
  }
  std::vector<VecF> loss(ranks, VecF(N));
  for (int r = 0; r < ranks; ++r)
    ops.vp_ce_finish(tf(loss[r], {N}), tf(shard[r], {N, Vl}), tf(stats[r], {3, N}), ti(targets, {N}), r * Vl, n_real(r),
                     dloss, write_grad);
  for (int r = 1; r < ranks; ++r) EXPECT_EQ(loss[r], loss[0]) << "every rank computes the same losses";
  for (int r = 0; r < ranks; ++r)
    for (int64_t n = 0; n < N; ++n) std::copy_n(shard[r].begin() + n * Vl, Vl, logits.begin() + n * Vtot + r * Vl);
  return loss[0];
}

TEST_F(VocabParallel, CrossEntropyMatchesNaiveSoftmaxForAnyRankCount) {
  const int64_t N = 7;
  const int V = 45;  // real vocabulary; padded columns hold garbage that must be ignored
  const float dloss = 0.3f;
  for (int ranks : {1, 2, 3, 4}) {
    const int64_t Vtot = (V + 4 * ranks - 1) / (4 * ranks) * (4 * ranks);
    VecF logits = randn(N * Vtot, 11 + ranks, 3.0f);
    std::vector<int32_t> targets = {0, 44, 13, -1, 22, 30, 1};
    VecD want_loss(N), want_grad(N * Vtot, 0.0);
    for (int64_t n = 0; n < N; ++n) {
      if (targets[n] < 0) continue;
      double m = -1e300, s = 0;
      for (int j = 0; j < V; ++j) m = std::max(m, double(logits[n * Vtot + j]));
      for (int j = 0; j < V; ++j) s += std::exp(logits[n * Vtot + j] - m);
      want_loss[n] = m + std::log(s) - logits[n * Vtot + targets[n]];
      for (int j = 0; j < V; ++j) want_grad[n * Vtot + j] = std::exp(logits[n * Vtot + j] - m) / s * dloss;
      want_grad[n * Vtot + targets[n]] -= dloss;
    }
    VecF got = run_sharded(*ops, logits, targets, N, Vtot, V, ranks, dloss, true);
    EXPECT_TRUE(close(got, want_loss, 1e-5, 1e-5)) << ranks << " ranks";
    EXPECT_TRUE(close(logits, want_grad, 1e-5, 1e-7)) << ranks << " ranks";
  }
}

TEST_F(VocabParallel, EqualsTheSingleDeviceCrossEntropy) {
  const int64_t N = 5, Vtot = 64;
  const int V = 61;
  VecF a = randn(N * Vtot, 5), b = a;
  std::vector<int32_t> targets = {3, 60, -1, 0, 31};
  VecF want(N);
  ops->cross_entropy(tf(want, {N}), tf(a, {N, Vtot}), ti(targets, {N}), V, 0.5f, true);
  VecF got = run_sharded(*ops, b, targets, N, Vtot, V, 2, 0.5f, true);
  EXPECT_TRUE(close(got, to_d(want), 1e-6, 1e-6));
  EXPECT_TRUE(close(b, to_d(a), 1e-6, 1e-8));
}

TEST_F(VocabParallel, TargetOutsideTheVocabularyIsAnError) {
  const int64_t N = 2, Vl = 8;
  VecF logits = randn(N * Vl, 3), stats(3 * N);
  std::vector<int32_t> targets = {1, 16};
  ops->vp_ce_max(tf(stats, {3, N}), tf(logits, {N, Vl}), 8);
  EXPECT_THROW(ops->vp_ce_sums(tf(stats, {3, N}), tf(logits, {N, Vl}), ti(targets, {N}), 8, 8, 16), Error);
  EXPECT_THROW(ops->vp_ce_max(tf(stats, {3, N}), tf(logits, {N, Vl}), 9), Error);
}

TEST_F(VocabParallel, EmbeddingNegativeTokensGiveNoRow) {
  // Two vocabulary shards of a [6, C] table: each looks up its own tokens (others -1); the sum of the shards'
  // outputs equals the full lookup, and each shard's gradient rows are the full gradient's.
  const int B = 2, T = 3, C = 4, V = 6, Vl = 3;
  VecF wte = randn(V * C, 1), wpe = randn(T * C, 2), g = randn(B * T * C, 3);
  std::vector<int32_t> tok = {0, 5, 2, 3, 3, 1};
  VecF full(B * T * C), dfull(V * C, 0.0f), sum(B * T * C, 0.0f), dsh(V * C, 0.0f);
  ops->embedding_forward(tf(full, {B, T, C}), ti(tok, {B, T}), tf(wte, {V, C}), tf(wpe, {T, C}));
  ops->embedding_backward(tf(dfull, {V, C}), Tensor{}, tf(g, {B, T, C}), ti(tok, {B, T}));
  for (int r = 0; r < 2; ++r) {
    std::vector<int32_t> lt(tok.size());
    for (size_t i = 0; i < tok.size(); ++i) lt[i] = tok[i] / Vl == r ? tok[i] - r * Vl : -1;
    VecF out(B * T * C);
    ops->embedding_forward(tf(out, {B, T, C}), ti(lt, {B, T}), f32_view(wte.data() + r * Vl * C, {Vl, C}),
                           r == 0 ? tf(wpe, {T, C}) : Tensor{});
    for (size_t i = 0; i < out.size(); ++i) sum[i] += out[i];
    ops->embedding_backward(f32_view(dsh.data() + r * Vl * C, {Vl, C}), Tensor{}, tf(g, {B, T, C}), ti(lt, {B, T}));
  }
  EXPECT_TRUE(close(sum, to_d(full), 1e-6, 1e-6));
  EXPECT_EQ(dsh, dfull);
}

TEST_F(VocabParallel, MatmulBackwardInputGradientAlone) {
  // dinp = dout @ w without dw (and without inp), as the row-chunked GEMMs of tensor parallelism call it.
  const int N = 3, C = 4, OC = 5;
  VecF w = randn(OC * C, 1), dy = randn(N * OC, 2), dx(N * C);
  VecD want(N * C, 0.0);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c)
      for (int o = 0; o < OC; ++o) want[n * C + c] += double(dy[n * OC + o]) * w[o * C + c];
  ops->matmul_backward(tf(dx, {N, C}), Tensor{}, Tensor{}, tf(dy, {N, OC}), Tensor{}, tf(w, {OC, C}), false);
  EXPECT_TRUE(close(dx, want, 1e-5, 1e-6));
}

}  // namespace
