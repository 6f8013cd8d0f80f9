// Token (+ learned position) embedding.
#include <cstring>

#include "megatrain/kernels/cpu/cpu_ops.h"
#include "megatrain/kernels/cpu/cpu_util.h"

namespace mt {

using namespace cpu;

namespace {

void check_tokens(const char* op, const int32_t* tok, int64_t n, int64_t rows) {
  for (int64_t i = 0; i < n; ++i)
    MT_CHECK(tok[i] < rows, "{}: token {} at position {} is outside the embedding table [0, {})", op, tok[i], i, rows);
}

}  // namespace

void CpuOps::embedding_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe) {
  const char* op = "embedding_forward";
  float* o = f32_arg(out, op, "out");
  const int32_t* tok = i32_arg(tokens, op, "tokens");
  const float* te = f32_arg(wte, op, "wte");
  const float* pe = f32_opt(wpe, op, "wpe");
  const auto [N, T, C, V] = embedding_dims(op, out, tokens, wte, wpe);
  check_tokens(op, tok, N, V);
#pragma omp parallel for if (N * C > kParallelMin) schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    float* row = o + i * C;
    if (tok[i] < 0) {  // not my vocabulary shard
      if (pe)
        std::memcpy(row, pe + (i % T) * C, static_cast<size_t>(C) * sizeof(float));
      else
        std::memset(row, 0, static_cast<size_t>(C) * sizeof(float));
      continue;
    }
    const float* e = te + static_cast<int64_t>(tok[i]) * C;
    if (pe) {
      const float* p = pe + (i % T) * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) row[c] = e[c] + p[c];
    } else {
      std::memcpy(row, e, static_cast<size_t>(C) * sizeof(float));
    }
  }
}

void CpuOps::embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens) {
  const char* op = "embedding_backward";
  float* dte = f32_arg(dwte, op, "dwte");
  float* dpe = f32_opt(dwpe, op, "dwpe");
  const float* dy = f32_arg(dout, op, "dout");
  const int32_t* tok = i32_arg(tokens, op, "tokens");
  const auto [N, T, C, V] = embedding_backward_dims(op, dwte, dwpe, dout, tokens);
  check_tokens(op, tok, N, V);
  // A token may repeat, so rows of dwte collide: threads split the channels instead of the tokens, which
  // needs no atomics and keeps the add order fixed.
  const int nt = N * C > kParallelMin ? omp_get_max_threads() : 1;
  const int64_t strip = std::max<int64_t>(16, ((C + nt - 1) / nt + 15) / 16 * 16);
  const int64_t strips = (C + strip - 1) / strip;
#pragma omp parallel for if (nt > 1) schedule(static)
  for (int64_t s = 0; s < strips; ++s) {
    const int64_t c0 = s * strip, c1 = std::min(C, c0 + strip);
    for (int64_t i = 0; i < N; ++i) {
      const float* g = dy + i * C;
      if (tok[i] >= 0) {
        float* e = dte + static_cast<int64_t>(tok[i]) * C;
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) e[c] += g[c];
      }
      if (dpe) {
        float* p = dpe + (i % T) * C;
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) p[c] += g[c];
      }
    }
  }
}

}  // namespace mt
