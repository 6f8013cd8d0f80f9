// Small single-threaded GEMM for attention tiles, called from inside OpenMP regions.
//
// Why not sgemm: OpenBLAS takes a global lock to hand out its packing buffers on every call; with one call
// per (batch, head, query block) from every thread that lock dominates, and when the cores are shared with
// other processes a preempted lock holder stalls everyone (measured: 10x slower than one thread). Attention
// tiles are small (64 rows, head_dim columns) and need no packing, so a register-blocked kernel on GCC vector
// types does the job without locks or allocation.
#pragma once
#include <cstdint>

namespace mt::cpu {

// C[M, N] = alpha * A B + beta * C, where A(r, k) = a[r * a_rs + k * a_cs] (strides make A^T free),
// B is row-major [K, N] with leading dimension ldb, C row-major with ldc. beta == 0 never reads C.
void tile_gemm(int M, int N, int K, float alpha, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
               int64_t ldb, float beta, float* c, int64_t ldc);

// dst[j, i] = src[i, j] for i < rows, j < cols; dst columns [rows, ldd) of each row are zero-filled.
void transpose(const float* src, int64_t lds, int rows, int cols, float* dst, int64_t ldd);

}  // namespace mt::cpu
