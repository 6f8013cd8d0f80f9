// Causal / sliding-window attention with GQA, flash-style memory: no T x T tensor survives a call.
//
// Work is cut into blocks of kBlockQ query rows. A block [q0, q1) can only see keys [k_lo, q1) with
// k_lo = max(0, q0 - W + 1) under a window W, so scores are a kBlockQ x (q1 - k_lo) tile in per-thread scratch:
// sliding-window attention costs O(T * W), never O(T^2). Tiles are multiplied with tile_gemm (see tile_gemm.h
// for why not sgemm); K and V tiles are transposed once into scratch so every product streams rows. Tile
// widths are padded to a multiple of 16 with zero keys, which the mask removes. Backward recomputes the
// probabilities from the saved log-sum-exp.
#include <cmath>

#include "megatrain/kernels/cpu/cpu_ops.h"
#include "megatrain/kernels/cpu/cpu_util.h"
#include "megatrain/kernels/cpu/tile_gemm.h"

namespace mt {

using namespace cpu;

namespace {

constexpr int kBlockQ = 64;

// Geometry of one block of query rows.
struct QBlock {
  int q0, nq;    // query rows [q0, q0 + nq)
  int k_lo, nk;  // keys [k_lo, k_lo + nk) that any row of the block may see
};

QBlock q_block(const AttnShape& s, int qb) {
  QBlock blk;
  blk.q0 = qb * kBlockQ;
  blk.nq = std::min(kBlockQ, s.T - blk.q0);
  blk.k_lo = s.window > 0 ? std::max(0, blk.q0 - s.window + 1) : 0;
  blk.nk = blk.q0 + blk.nq - blk.k_lo;
  return blk;
}

// Keys row t may see, relative to k_lo: [a, e).
inline void row_range(const AttnShape& s, const QBlock& blk, int t, int& a, int& e) {
  a = (s.window > 0 ? std::max(0, t - s.window + 1) : 0) - blk.k_lo;
  e = t + 1 - blk.k_lo;
}

// In int64: kBlockQ + window - 1 overflows int for a window near 2^31.
int max_keys(const AttnShape& s) {
  return s.window > 0 ? static_cast<int>(std::min<int64_t>(s.T, int64_t{kBlockQ} + s.window - 1)) : s.T;
}

int padded(int nk) { return (nk + 15) / 16 * 16; }

}  // namespace

void CpuOps::attention_forward(Tensor out, Tensor lse, Tensor qkv, const AttnShape& s) {
  const char* op = "attention_forward";
  check_attn_shape(op, s);
  float* o = f32_arg(out, op, "out");
  float* L = f32_arg(lse, op, "lse");
  const float* x = f32_arg(qkv, op, "qkv");
  const int64_t W = s.qkv_width(), OC = int64_t{s.n_head} * s.head_dim, hd = s.head_dim;
  check_attention_forward(op, out, lse, qkv, s);
  const int group = s.n_head / s.n_kv_head, nqb = (s.T + kBlockQ - 1) / kBlockQ;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int kpad = padded(max_keys(s));

  RegionErrors errors;
#pragma omp parallel
  {
    float* S = errors.run([&] { return thread_scratch(static_cast<size_t>(kBlockQ + hd) * kpad); });
    float* Kt = S ? S + static_cast<size_t>(kBlockQ) * kpad : nullptr;
#pragma omp for collapse(3) schedule(dynamic)
    for (int b = 0; b < s.B; ++b)
      for (int h = 0; h < s.n_head; ++h)
        for (int qb = 0; qb < nqb; ++qb) {
          if (!S) continue;  // this thread has no scratch: the error is rethrown after the region
          const QBlock blk = q_block(s, qb);
          const int kvh = h / group, nk = blk.nk, ld = padded(nk);
          const float* Q = x + (int64_t{b} * s.T + blk.q0) * W + h * hd;
          const float* K = x + (int64_t{b} * s.T + blk.k_lo) * W + (s.n_head + kvh) * hd;
          const float* V = x + (int64_t{b} * s.T + blk.k_lo) * W + (s.n_head + s.n_kv_head + kvh) * hd;
          transpose(K, W, nk, hd, Kt, ld);
          tile_gemm(blk.nq, ld, hd, scale, Q, W, 1, Kt, ld, 0.0f, S, ld);
          for (int i = 0; i < blk.nq; ++i) {
            const int t = blk.q0 + i;
            int a, e;
            row_range(s, blk, t, a, e);
            float* row = S + static_cast<size_t>(i) * ld;
            float mx = -INFINITY;
            for (int j = a; j < e; ++j) mx = row[j] > mx ? row[j] : mx;
            float sum = 0;
#pragma omp simd reduction(+ : sum)
            for (int j = a; j < e; ++j) {
              row[j] = fast_exp(row[j] - mx);
              sum += row[j];
            }
            const float inv = 1.0f / sum;
            for (int j = 0; j < a; ++j) row[j] = 0;
#pragma omp simd
            for (int j = a; j < e; ++j) row[j] *= inv;
            for (int j = e; j < ld; ++j) row[j] = 0;
            L[(int64_t{b} * s.n_head + h) * s.T + t] = mx + std::log(sum);
          }
          float* O = o + (int64_t{b} * s.T + blk.q0) * OC + h * hd;
          tile_gemm(blk.nq, hd, nk, 1.0f, S, ld, 1, V, W, 0.0f, O, OC);
        }
  }
  errors.rethrow();
}

void CpuOps::attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, const AttnShape& s) {
  const char* op = "attention_backward";
  check_attn_shape(op, s);
  float* dx = f32_arg(dqkv, op, "dqkv");
  const float* dy = f32_arg(dout, op, "dout");
  const float* x = f32_arg(qkv, op, "qkv");
  const float* o = f32_arg(out, op, "out");
  const float* L = f32_arg(lse, op, "lse");
  const int64_t W = s.qkv_width(), OC = int64_t{s.n_head} * s.head_dim, hd = s.head_dim;
  check_numel(dqkv, int64_t{s.B} * s.T * W, op, "dqkv");
  check_numel(qkv, int64_t{s.B} * s.T * W, op, "qkv");
  check_numel(dout, int64_t{s.B} * s.T * OC, op, "dout");
  check_numel(out, int64_t{s.B} * s.T * OC, op, "out");
  check_numel(lse, int64_t{s.B} * s.n_head * s.T, op, "lse");
  MT_CHECK(dx != x, "{}: dqkv must not alias qkv", op);
  const int group = s.n_head / s.n_kv_head, nqb = (s.T + kBlockQ - 1) / kBlockQ;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int kpad = padded(max_keys(s));

  // One task per (batch, kv head): it owns dk and dv of that head and the dq of every query head in its group,
  // so all accumulation stays inside the task (no atomics, fixed order).
  RegionErrors errors;
#pragma omp parallel
  {
    float* P = errors.run([&] { return thread_scratch(static_cast<size_t>(2 * kBlockQ + 2 * hd) * kpad); });
    float* dP = P ? P + static_cast<size_t>(kBlockQ) * kpad : nullptr;
    float* Kt = P ? dP + static_cast<size_t>(kBlockQ) * kpad : nullptr;
    float* Vt = P ? Kt + static_cast<size_t>(hd) * kpad : nullptr;
#pragma omp for collapse(2) schedule(dynamic)
    for (int b = 0; b < s.B; ++b)
      for (int kvh = 0; kvh < s.n_kv_head; ++kvh) {
        if (!P) continue;  // this thread has no scratch: the error is rethrown after the region
        const int64_t base = int64_t{b} * s.T * W;
        float* dK_all = dx + base + (s.n_head + kvh) * hd;
        float* dV_all = dx + base + (s.n_head + s.n_kv_head + kvh) * hd;
        for (int t = 0; t < s.T; ++t) {
          std::fill(dK_all + t * W, dK_all + t * W + hd, 0.0f);
          std::fill(dV_all + t * W, dV_all + t * W + hd, 0.0f);
        }
        for (int qb = 0; qb < nqb; ++qb) {
          const QBlock blk = q_block(s, qb);
          const int nq = blk.nq, nk = blk.nk, ld = padded(nk);
          const int64_t qrow = base + int64_t{blk.q0} * W, krow = base + int64_t{blk.k_lo} * W;
          const float* K = x + krow + (s.n_head + kvh) * hd;
          const float* V = x + krow + (s.n_head + s.n_kv_head + kvh) * hd;
          float* dK = dx + krow + (s.n_head + kvh) * hd;
          float* dV = dx + krow + (s.n_head + s.n_kv_head + kvh) * hd;
          transpose(K, W, nk, hd, Kt, ld);
          transpose(V, W, nk, hd, Vt, ld);
          for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
            const float* Lh = L + (int64_t{b} * s.n_head + h) * s.T;
            const float* Q = x + qrow + h * hd;
            const float* dO = dy + (int64_t{b} * s.T + blk.q0) * OC + h * hd;
            const float* Ob = o + (int64_t{b} * s.T + blk.q0) * OC + h * hd;
            float* dQ = dx + qrow + h * hd;

            tile_gemm(nq, ld, hd, scale, Q, W, 1, Kt, ld, 0.0f, P, ld);
            for (int i = 0; i < nq; ++i) {
              const int t = blk.q0 + i;
              int a, e;
              row_range(s, blk, t, a, e);
              float* row = P + static_cast<size_t>(i) * ld;
              const float l = Lh[t];
              for (int j = 0; j < a; ++j) row[j] = 0;
#pragma omp simd
              for (int j = a; j < e; ++j) row[j] = fast_exp(row[j] - l);
              for (int j = e; j < ld; ++j) row[j] = 0;
            }
            // dV += P^T dO (P read transposed through its strides);  dP = dO V^T
            tile_gemm(nk, hd, nq, 1.0f, P, 1, ld, dO, OC, 1.0f, dV, W);
            tile_gemm(nq, ld, hd, 1.0f, dO, OC, 1, Vt, ld, 0.0f, dP, ld);
            // dS = P * (dP - D), D_i = sum_j P_ij dP_ij = dO_i . O_i. Masked entries have P = 0, so dS = 0 there.
            for (int i = 0; i < nq; ++i) {
              const float* gi = dO + i * OC;
              const float* oi = Ob + i * OC;
              float D = 0;
#pragma omp simd reduction(+ : D)
              for (int c = 0; c < hd; ++c) D += gi[c] * oi[c];
              float* p = P + static_cast<size_t>(i) * ld;
              const float* dp = dP + static_cast<size_t>(i) * ld;
#pragma omp simd
              for (int j = 0; j < ld; ++j) p[j] = p[j] * (dp[j] - D);
            }
            // dQ = scale * dS K (each query row of head h belongs to exactly one block: overwrite);
            // dK += scale * dS^T Q
            tile_gemm(nq, hd, nk, scale, P, ld, 1, K, W, 0.0f, dQ, W);
            tile_gemm(nk, hd, nq, scale, P, 1, ld, Q, W, 1.0f, dK, W);
          }
        }
      }
  }
  errors.rethrow();
}

}  // namespace mt
