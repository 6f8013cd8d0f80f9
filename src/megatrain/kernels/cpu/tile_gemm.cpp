#include "megatrain/kernels/cpu/tile_gemm.h"

#include <algorithm>

namespace mt::cpu {

namespace {

// Register block: R rows x (NV vectors) of C stay in registers for the whole K loop: 24 of the 32 registers
// with AVX-512, 12 of the 16 with AVX2 (same code, narrower vectors).
#ifdef __AVX512F__
constexpr int kLanes = 16, kMR = 6, kNV = 4;
#else
constexpr int kLanes = 8, kMR = 6, kNV = 2;
#endif
using vf = float __attribute__((vector_size(kLanes * sizeof(float))));

inline vf load(const float* p) {
  vf v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, vf v) { __builtin_memcpy(p, &v, sizeof v); }

template <int R, int NV>
void micro(int K, float alpha, const float* a, int64_t a_rs, int64_t a_cs, const float* b, int64_t ldb, float beta,
           float* c, int64_t ldc) {
  vf acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = vf{};
  for (int k = 0; k < K; ++k) {
    vf bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = load(b + k * ldb + kLanes * v);
    for (int r = 0; r < R; ++r) {
      const float av = a[r * a_rs + k * a_cs];
      for (int v = 0; v < NV; ++v) acc[r][v] += av * bv[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) {
      float* cp = c + r * ldc + kLanes * v;
      store(cp, beta == 0.0f ? alpha * acc[r][v] : alpha * acc[r][v] + beta * load(cp));
    }
}

template <int NV>
void rows_dispatch(int rows, int K, float alpha, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
                   int64_t ldb, float beta, float* c, int64_t ldc) {
  switch (rows) {
    case 1: return micro<1, NV>(K, alpha, a, a_rs, a_cs, b, ldb, beta, c, ldc);
    case 2: return micro<2, NV>(K, alpha, a, a_rs, a_cs, b, ldb, beta, c, ldc);
    case 3: return micro<3, NV>(K, alpha, a, a_rs, a_cs, b, ldb, beta, c, ldc);
    case 4: return micro<4, NV>(K, alpha, a, a_rs, a_cs, b, ldb, beta, c, ldc);
    case 5: return micro<5, NV>(K, alpha, a, a_rs, a_cs, b, ldb, beta, c, ldc);
    case 6: return micro<6, NV>(K, alpha, a, a_rs, a_cs, b, ldb, beta, c, ldc);
  }
}

// Columns left over after the vector-wide blocks: plain loops.
void edge_columns(int M, int N0, int N, int K, float alpha, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
                  int64_t ldb, float beta, float* c, int64_t ldc) {
  for (int i = 0; i < M; ++i)
    for (int j = N0; j < N; ++j) {
      float s = 0;
      for (int k = 0; k < K; ++k) s += a[i * a_rs + k * a_cs] * b[k * ldb + j];
      float* cp = c + i * ldc + j;
      *cp = beta == 0.0f ? alpha * s : alpha * s + beta * *cp;
    }
}

}  // namespace

void tile_gemm(int M, int N, int K, float alpha, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
               int64_t ldb, float beta, float* c, int64_t ldc) {
  int j = 0;
  for (; j + kLanes * kNV <= N; j += kLanes * kNV)
    for (int i = 0; i < M; i += kMR)
      rows_dispatch<kNV>(std::min(kMR, M - i), K, alpha, a + i * a_rs, a_rs, a_cs, b + j, ldb, beta, c + i * ldc + j,
                         ldc);
  for (; j + kLanes <= N; j += kLanes)
    for (int i = 0; i < M; i += kMR)
      rows_dispatch<1>(std::min(kMR, M - i), K, alpha, a + i * a_rs, a_rs, a_cs, b + j, ldb, beta, c + i * ldc + j,
                       ldc);
  if (j < N) edge_columns(M, j, N, K, alpha, a, a_rs, a_cs, b, ldb, beta, c, ldc);
}

void transpose(const float* src, int64_t lds, int rows, int cols, float* dst, int64_t ldd) {
  constexpr int kB = 16;  // blocks keep both the rows read and the rows written in L1
  for (int i0 = 0; i0 < rows; i0 += kB)
    for (int j0 = 0; j0 < cols; j0 += kB)
      for (int j = j0; j < std::min(cols, j0 + kB); ++j)
        for (int i = i0; i < std::min(rows, i0 + kB); ++i) dst[j * ldd + i] = src[i * lds + j];
  for (int j = 0; j < cols; ++j) std::fill(dst + j * ldd + rows, dst + (j + 1) * ldd, 0.0f);
}

}  // namespace mt::cpu
