// The CPU MoE ops (cpu/moe.h). Plain loops in fp32 with double where a sum spans the experts or the tokens (the
// router's normalisations, the losses): they are O(N * E), small beside the expert GEMMs, and exactness there keeps
// the routing decisions stable between runs. The GEMMs go through Ops (the CPU backend's BLAS path).
#include "megatrain/kernels/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "megatrain/core/error.h"

namespace mt {

namespace {

// The router's probabilities of one token's row of logits (softmax, or elementwise sigmoid).
void row_probs(float* p, const float* l, int E, MoeRouter router) {
  if (router == MoeRouter::SigmoidBias) {
    for (int e = 0; e < E; ++e) p[e] = static_cast<float>(1.0 / (1.0 + std::exp(-double(l[e]))));
    return;
  }
  double m = l[0], s = 0;
  for (int e = 1; e < E; ++e) m = std::max(m, double(l[e]));
  for (int e = 0; e < E; ++e) s += std::exp(l[e] - m);
  for (int e = 0; e < E; ++e) p[e] = static_cast<float>(std::exp(l[e] - m) / s);
}

// The k best experts of one token by score (descending; ties to the lower index: a stable order).
void top_k(int* out, const float* score, const float* bias, int E, int k, std::vector<int>& idx) {
  idx.resize(E);
  std::iota(idx.begin(), idx.end(), 0);
  auto key = [&](int e) { return double(score[e]) + (bias ? double(bias[e]) : 0.0); };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) {
    const double ka = key(a), kb = key(b);
    return ka > kb || (ka == kb && a < b);
  });
  std::copy(idx.begin(), idx.begin() + k, out);
}

// Permuted order: kept assignments expert by expert, token order within an expert (a counting sort).
void build_order(MoeRouting& r) {
  const int64_t N = r.N;
  const int E = r.E, k = r.k;
  std::vector<int64_t> kept(E, 0);
  r.row.assign(N * k, -1);
  r.dropped = 0;
  // First pass: which assignments fit the capacity, in token order (then slot order).
  std::vector<uint8_t> keep(N * k, 0);
  for (int64_t a = 0; a < N * k; ++a) {
    const int e = r.expert[a];
    if (r.capacity > 0 && kept[e] >= r.capacity) {
      ++r.dropped;
      continue;
    }
    keep[a] = 1;
    ++kept[e];
  }
  r.offsets.assign(E + 1, 0);
  for (int e = 0; e < E; ++e) r.offsets[e + 1] = r.offsets[e] + kept[e];
  r.token.assign(r.offsets[E], 0);
  r.slot.assign(r.offsets[E], 0);
  std::vector<int64_t> next(r.offsets.begin(), r.offsets.end() - 1);
  for (int64_t a = 0; a < N * k; ++a) {
    if (!keep[a]) continue;
    const int64_t row = next[r.expert[a]]++;
    r.row[a] = static_cast<int>(row);
    r.token[row] = static_cast<int>(a / k);
    r.slot[row] = static_cast<int>(a % k);
  }
}

}  // namespace

void moe_route(MoeRouting& r, const float* logits, int64_t N, int E, int k, MoeRouter router, const float* bias,
               float capacity_factor) {
  MT_CHECK(E >= 1 && k >= 1 && k <= E, "moe_route: top-k {} of {} experts", k, E);
  MT_CHECK(N * k <= INT32_MAX, "moe_route: {} tokens x top-k {} exceed the permuted rows' int range", N, k);
  r.N = N, r.E = E, r.k = k, r.router = router;
  r.probs.resize(N * E);
  r.expert.resize(N * k);
  r.gate.resize(N * k);
  r.routed.assign(E, 0);
  std::vector<int> idx;
  const float* b = router == MoeRouter::SigmoidBias ? bias : nullptr;
  for (int64_t t = 0; t < N; ++t) {
    float* p = &r.probs[t * E];
    row_probs(p, logits + t * E, E, router);
    int* ex = &r.expert[t * k];
    top_k(ex, p, b, E, k, idx);
    double s = 0;
    for (int j = 0; j < k; ++j) s += p[ex[j]];
    for (int j = 0; j < k; ++j) {
      r.gate[t * k + j] = static_cast<float>(p[ex[j]] / s);
      ++r.routed[ex[j]];
    }
  }
  r.capacity = capacity_factor > 0 ? static_cast<int64_t>(std::ceil(double(capacity_factor) * N * k / E)) : 0;
  build_order(r);
  r.batch_N = N, r.batch_routed = r.routed, r.batch_dropped = r.dropped;
}

namespace {

// P_e's per-token probabilities q[E] of the aux loss: softmax, p itself; sigmoid_bias, s / sum(s). Returns sum(s).
double aux_probs(double* q, const float* p, int E, MoeRouter router) {
  double s = 1;
  if (router == MoeRouter::SigmoidBias) {
    s = 0;
    for (int e = 0; e < E; ++e) s += p[e];
  }
  for (int e = 0; e < E; ++e) q[e] = p[e] / s;
  return s;
}

double logsumexp(const float* l, int E) {
  double m = l[0], s = 0;
  for (int e = 1; e < E; ++e) m = std::max(m, double(l[e]));
  for (int e = 0; e < E; ++e) s += std::exp(l[e] - m);
  return m + std::log(s);
}

}  // namespace

void moe_prob_sums(const MoeRouting& r, double* P) {
  const int E = r.E;
  std::vector<double> q(E);
  std::fill(P, P + E, 0.0);
  for (int64_t t = 0; t < r.N; ++t) {
    aux_probs(q.data(), &r.probs[t * E], E, r.router);
    for (int e = 0; e < E; ++e) P[e] += q[e];
  }
}

double moe_aux_from_sums(const MoeRouting& r, const double* P_sums) {
  const double N = double(r.batch_N);
  double loss = 0;
  for (int e = 0; e < r.E; ++e) loss += double(r.batch_routed[e]) / (N * r.k) * (P_sums[e] / N);
  return r.E * loss;
}

double moe_aux_loss(const MoeRouting& r) {
  std::vector<double> P(r.E);
  moe_prob_sums(r, P.data());
  return moe_aux_from_sums(r, P.data());
}

double moe_z_loss(const float* logits, int64_t N, int E) {
  double s = 0;
  for (int64_t t = 0; t < N; ++t) {
    const double z = logsumexp(logits + t * E, E);
    s += z * z;
  }
  return N > 0 ? s / double(N) : 0.0;
}

void moe_router_backward(float* dlogits, const float* dgate, const float* logits, const MoeRouting& r, float aux_coef,
                         float z_coef) {
  const int E = r.E, k = r.k;
  const double N = double(r.batch_N);  // the micro-batch's tokens (all of them: the means are over it)
  // d aux / d q_{t,e} = E * f_e / N (f_e a constant), the same for every token.
  std::vector<double> daux(E);
  for (int e = 0; e < E; ++e) daux[e] = aux_coef * double(E) * (double(r.batch_routed[e]) / (N * k)) / N;
  std::vector<double> dp(E), q(E);
  for (int64_t t = 0; t < r.N; ++t) {
    const float* p = &r.probs[t * E];
    const float* l = logits + t * E;
    const int* ex = &r.expert[t * k];
    const float* g = &r.gate[t * k];
    std::fill(dp.begin(), dp.end(), 0.0);
    // Gates: g_j = p_{e_j} / S, S = sum_m p_{e_m}  =>  dp_{e_j} = (dg_j - sum_m dg_m g_m) / S.
    double S = 0, dot = 0;
    for (int j = 0; j < k; ++j) S += p[ex[j]], dot += double(dgate[t * k + j]) * g[j];
    for (int j = 0; j < k; ++j) dp[ex[j]] += (dgate[t * k + j] - dot) / S;
    // Aux: q = p (softmax) or s / sum(s) (sigmoid): dp_e += (dq_e - sum dq q) / sum(s) in the latter.
    if (aux_coef != 0) {
      const double ss = aux_probs(q.data(), p, E, r.router);
      double dq_q = 0;
      for (int e = 0; e < E; ++e) dq_q += daux[e] * q[e];
      for (int e = 0; e < E; ++e) dp[e] += r.router == MoeRouter::SigmoidBias ? (daux[e] - dq_q) / ss : daux[e];
    }
    float* dl = dlogits + t * E;
    if (r.router == MoeRouter::Softmax) {  // softmax backward: dl = p * (dp - sum(p dp))
      double pdp = 0;
      for (int e = 0; e < E; ++e) pdp += p[e] * dp[e];
      for (int e = 0; e < E; ++e) dl[e] = static_cast<float>(p[e] * (dp[e] - pdp));
    } else {  // sigmoid backward: dl = dp * s (1 - s)
      for (int e = 0; e < E; ++e) dl[e] = static_cast<float>(dp[e] * p[e] * (1.0 - p[e]));
    }
    // z-loss: d/dl (lse^2 / N) = 2 lse softmax(l) / N.
    if (z_coef != 0) {
      const double lse = logsumexp(l, E);
      for (int e = 0; e < E; ++e) dl[e] += static_cast<float>(z_coef * 2.0 * lse * std::exp(l[e] - lse) / N);
    }
  }
}

void moe_permute(Tensor xp, Tensor x, const MoeRouting& r) {
  const int64_t C = x.size(-1), A = r.rows();
  MT_CHECK(xp.numel() >= A * C, "moe_permute: {} rows of {} do not fit {}", A, C, xp.shape_str());
  const float* src = x.f32();
  float* dst = xp.f32();
#pragma omp parallel for
  for (int64_t i = 0; i < A; ++i) std::copy_n(src + r.token[i] * C, C, dst + i * C);
}

void moe_permute_backward(Tensor dx, Tensor dxp, const MoeRouting& r) {
  const int64_t C = dx.size(-1), k = r.k;
  const float* src = dxp.f32();
  float* dst = dx.f32();
  // Per token, its slots in order: each row of dx has one writer (no race) and a fixed summation order.
#pragma omp parallel for
  for (int64_t t = 0; t < r.N; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int row = r.row[t * k + j];
      if (row < 0) continue;
      for (int64_t c = 0; c < C; ++c) dst[t * C + c] += src[row * C + c];
    }
}

void moe_combine(Tensor y, Tensor yp, const MoeRouting& r) {
  const int64_t C = y.size(-1), k = r.k;
  const float* src = yp.f32();
  float* dst = y.f32();
#pragma omp parallel for
  for (int64_t t = 0; t < r.N; ++t) {
    float* out = dst + t * C;
    std::fill_n(out, C, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const int row = r.row[t * k + j];
      if (row < 0) continue;
      const float g = r.gate[t * k + j];
      for (int64_t c = 0; c < C; ++c) out[c] += g * src[row * C + c];
    }
  }
}

void moe_combine_backward(Tensor dyp, float* dgate, Tensor dy, Tensor yp, const MoeRouting& r) {
  const int64_t C = dy.size(-1), k = r.k;
  const float* g = dy.f32();
  const float* y = yp.f32();
  float* d = dyp.f32();
#pragma omp parallel for
  for (int64_t t = 0; t < r.N; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int row = r.row[t * k + j];
      if (row < 0) {
        dgate[t * k + j] = 0;
        continue;
      }
      const float gate = r.gate[t * k + j];
      double dot = 0;
      for (int64_t c = 0; c < C; ++c) {
        d[row * C + c] = gate * g[t * C + c];
        dot += double(g[t * C + c]) * y[row * C + c];
      }
      dgate[t * k + j] = static_cast<float>(dot);
    }
}

namespace {

Tensor expert_weight(Tensor w, int e) {
  const int64_t O = w.size(1), I = w.size(2);
  return Tensor(w.f32() + e * O * I, {O, I});
}

}  // namespace

void moe_grouped_forward(Ops& ops, Tensor out, Tensor in, Tensor w, const std::vector<int64_t>& offsets) {
  MT_CHECK(w.ndim == 3 && int64_t(offsets.size()) == w.size(0) + 1, "moe_grouped_forward: w {} for {} experts",
           w.shape_str(), offsets.size() - 1);
  for (int e = 0; e + 1 < int(offsets.size()); ++e) {
    const int64_t a = offsets[e], b = offsets[e + 1];
    if (a == b) continue;
    ops.matmul_forward(out.slice0(a, b), in.slice0(a, b), expert_weight(w, e), Tensor{});
  }
}

void moe_grouped_backward(Ops& ops, Tensor din, Tensor dw, Tensor dout, Tensor in, Tensor w,
                          const std::vector<int64_t>& offsets, bool accumulate_dw) {
  for (int e = 0; e + 1 < int(offsets.size()); ++e) {
    const int64_t a = offsets[e], b = offsets[e + 1];
    if (a == b) {
      if (!accumulate_dw) ops.zero(expert_weight(dw, e));
      continue;
    }
    ops.matmul_backward(din.defined() ? din.slice0(a, b) : Tensor{}, expert_weight(dw, e), Tensor{}, dout.slice0(a, b),
                        in.slice0(a, b), expert_weight(w, e), false, accumulate_dw);
  }
}

}  // namespace mt
