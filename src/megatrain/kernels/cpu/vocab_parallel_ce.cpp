// Vocab-parallel softmax cross-entropy: the three local steps between which the caller all-reduces the row
// statistics over the tensor-parallel ranks (see ops.h).
#include <cmath>

#include "megatrain/kernels/cpu/cpu_ops.h"
#include "megatrain/kernels/cpu/cpu_util.h"

namespace mt {

using namespace cpu;

void CpuOps::vp_ce_max(Tensor stats, Tensor logits, int n_real) {
  const char* op = "vp_ce_max";
  float* st = f32_arg(stats, op, "stats");
  const float* z = f32_arg(logits, op, "logits");
  const auto [N, Vl] = vp_ce_dims(op, stats, logits, n_real);
#pragma omp parallel for if (N * Vl > kParallelMin) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* row = z + n * Vl;
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < n_real; ++j) m = row[j] > m ? row[j] : m;
    st[n] = m;
  }
}

void CpuOps::vp_ce_sums(Tensor stats, Tensor logits, Tensor targets, int64_t v0, int n_real, int V) {
  const char* op = "vp_ce_sums";
  float* st = f32_arg(stats, op, "stats");
  const float* z = f32_arg(logits, op, "logits");
  const int32_t* tgt = i32_arg(targets, op, "targets");
  const auto [N, Vl] = vp_ce_dims(op, stats, logits, n_real);
  check_numel(targets, N, op, "targets");
  for (int64_t n = 0; n < N; ++n)
    MT_CHECK(tgt[n] < V, "{}: target {} at row {} is outside the vocabulary [0, {})", op, tgt[n], n, V);
  float* sum = st + N;
  float* tl = st + 2 * N;
#pragma omp parallel for if (N * Vl > kParallelMin) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* row = z + n * Vl;
    const float m = st[n];
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n_real; ++j) s += fast_exp(row[j] - m);
    sum[n] = s;
    const int64_t t = static_cast<int64_t>(tgt[n]) - v0;
    tl[n] = tgt[n] >= 0 && t >= 0 && t < n_real ? row[t] : 0.0f;
  }
}

void CpuOps::vp_ce_finish(Tensor losses, Tensor logits, Tensor stats, Tensor targets, int64_t v0, int n_real,
                          float dloss, bool write_grad) {
  const char* op = "vp_ce_finish";
  float* loss = f32_arg(losses, op, "losses");
  float* z = f32_arg(logits, op, "logits");
  const float* st = f32_arg(stats, op, "stats");
  const int32_t* tgt = i32_arg(targets, op, "targets");
  const auto [N, Vl] = vp_ce_dims(op, stats, logits, n_real);
  check_numel(targets, N, op, "targets");
  check_numel(losses, N, op, "losses");
#pragma omp parallel for if (N * Vl > kParallelMin) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* row = z + n * Vl;
    if (tgt[n] < 0) {
      loss[n] = 0;
      if (write_grad) std::fill(row, row + Vl, 0.0f);
      continue;
    }
    const float lse = st[n] + std::log(st[N + n]);
    loss[n] = lse - st[2 * N + n];
    if (write_grad) {
#pragma omp simd
      for (int64_t j = 0; j < n_real; ++j) row[j] = fast_exp(row[j] - lse) * dloss;
      std::fill(row + n_real, row + Vl, 0.0f);
      const int64_t t = static_cast<int64_t>(tgt[n]) - v0;
      if (t >= 0 && t < n_real) row[t] -= dloss;
    }
  }
}

}  // namespace mt
