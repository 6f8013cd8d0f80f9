// Fused softmax + cross-entropy over a (padded) vocabulary, never materialising probabilities.
#include <cmath>

#include "megatrain/kernels/cpu/cpu_ops.h"
#include "megatrain/kernels/cpu/cpu_util.h"

namespace mt {

using namespace cpu;

namespace {

// Log-sum-exp of row[0, V) in one read of memory: the row is walked in L1-sized chunks, each chunk's max is
// taken, the running sum rescaled when the max grows, then the chunk's exps added while it is still in cache.
float row_logsumexp(const float* row, int64_t V) {
  constexpr int64_t kChunk = 512;
  float m = -INFINITY, sum = 0;
  for (int64_t c0 = 0; c0 < V; c0 += kChunk) {
    const int64_t c1 = std::min(V, c0 + kChunk);
    float cm = -INFINITY;
#pragma omp simd reduction(max : cm)
    for (int64_t j = c0; j < c1; ++j) cm = row[j] > cm ? row[j] : cm;
    if (cm > m) {
      sum *= fast_exp(m - cm);
      m = cm;
    }
    float cs = 0;
#pragma omp simd reduction(+ : cs)
    for (int64_t j = c0; j < c1; ++j) cs += fast_exp(row[j] - m);
    sum += cs;
  }
  return m + std::log(sum);
}

}  // namespace

void CpuOps::cross_entropy(Tensor losses, Tensor logits, Tensor targets, int V, float dloss, bool write_grad) {
  const char* op = "cross_entropy";
  float* loss = f32_arg(losses, op, "losses");
  float* z = f32_arg(logits, op, "logits");
  const int32_t* tgt = i32_arg(targets, op, "targets");
  const auto [N, Vp] = cross_entropy_dims(op, losses, logits, targets, V);
  for (int64_t n = 0; n < N; ++n)
    MT_CHECK(tgt[n] < V, "{}: target {} at row {} is outside the vocabulary [0, {})", op, tgt[n], n, V);

#pragma omp parallel for if (N * Vp > kParallelMin) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* row = z + n * Vp;
    const int32_t t = tgt[n];
    if (t < 0) {  // ignored position (padding, prompt): no loss, no gradient
      loss[n] = 0;
      if (write_grad) std::fill(row, row + Vp, 0.0f);
      continue;
    }
    const float lse = row_logsumexp(row, V);
    loss[n] = lse - row[t];
    if (write_grad) {
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) row[j] = fast_exp(row[j] - lse) * dloss;
      row[t] -= dloss;
      std::fill(row + V, row + Vp, 0.0f);
    }
  }
}

}  // namespace mt
