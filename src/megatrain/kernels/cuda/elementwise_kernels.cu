// Memory-bound elementwise kernels (convert, add, axpy, scale) and the reductions that end on the host or in a
// parameter gradient (sum of squares, column sums). All are grid-stride loops over 16-byte packs when every pointer
// is 16-byte aligned, with a scalar tail; K = 1 instantiations handle unaligned views (slices of odd widths).
#include "megatrain/core/bits_hash.h"
#include "megatrain/kernels/cuda/device_util.cuh"

namespace mt::cuda {

namespace {

constexpr int kThreads = 256;

// ---- conversions ------------------------------------------------------------------------------------------------

__global__ void f32_to_bf16_kernel(uint16_t* dst, const float* src, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) dst[i] = f32_to_bf16_bits(src[i]);
}

__global__ void bf16_to_f32_kernel(float* dst, const uint16_t* src, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads())
    dst[i] = __uint_as_float(static_cast<uint32_t>(src[i]) << 16);
}

// ---- out = f(a, b) elementwise --------------------------------------------------------------------------------

struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct AxpyOp {
  float alpha;
  __device__ float operator()(float d, float s) const { return d + alpha * s; }
};
struct ScaleOp {
  float alpha;
  __device__ float operator()(float x, float) const { return x * alpha; }
};

// out[i] = f(a[i], b[i]); b may be null (f ignores its second argument then). out may alias a or b: each element is
// read and written by the same thread.
template <int K, class T, class F>
__global__ void map2_kernel(T* out, const T* a, const T* b, int64_t n, F f) {
  const int64_t npack = n / K;
  for (int64_t p = global_thread(); p < npack; p += grid_threads()) {
    const Pack<K, T> x = load_pack<K>(a + p * K);
    Pack<K, T> y{};
    if (b) y = load_pack<K>(b + p * K);
    Pack<K, T> o;
#pragma unroll
    for (int k = 0; k < K; ++k) o.v[k] = from_f<T>(f(to_f(x.v[k]), b ? to_f(y.v[k]) : 0.0f));
    store_pack<K>(out + p * K, o);
  }
  // The n % K < K leftover elements: one each for the first threads of the grid.
  const int64_t i = npack * K + global_thread();
  if (i < n) out[i] = from_f<T>(f(to_f(a[i]), b ? to_f(b[i]) : 0.0f));
}

template <class T, class F>
void map2(cudaStream_t s, T* out, const T* a, const T* b, int64_t n, F f, const char* name) {
  if (n <= 0) return;
  constexpr int K = kPack<T>;
  if (aligned16(out) && aligned16(a) && (b == nullptr || aligned16(b))) {
    map2_kernel<K><<<grid_for((n + K - 1) / K, kThreads), kThreads, 0, s>>>(out, a, b, n, f);
  } else {
    map2_kernel<1><<<grid_for(n, kThreads), kThreads, 0, s>>>(out, a, b, n, f);
  }
  check_launch(name);
}

template <class F>
void map2_any(cudaStream_t s, bool is_bf16, void* out, const void* a, const void* b, int64_t n, F f, const char* name) {
  if (is_bf16)
    map2(s, static_cast<bf16*>(out), static_cast<const bf16*>(a), static_cast<const bf16*>(b), n, f, name);
  else
    map2(s, static_cast<float*>(out), static_cast<const float*>(a), static_cast<const float*>(b), n, f, name);
}

// ---- reductions -------------------------------------------------------------------------------------------------

// Each block writes the sum of x^2 over its grid-stride share, accumulated in double per thread (the sum feeds
// gradient clipping over up to billions of elements; fp64 adds cost nothing in a memory-bound loop).
template <class T>
__global__ void sum_squares_kernel(const T* x, int64_t n, double* partials) {
  double acc = 0;
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    const double v = to_f(x[i]);
    acc += v * v;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// Pass 1 of the column sums: block (tile, g) sums rows [g * rows_per_block, ...) of its columns into partial[g, c].
// Vector path (C % 8 == 0, x 16-byte aligned): a thread owns 8 consecutive columns, reads them with one 16-byte load
// per row and keeps 8 running sums; the row loop is unrolled by 4 so each thread has 4 loads in flight. The first
// version (one bf16 column per thread, one dependent load per row) was latency-bound: 11.5 ms of a 1.3B model's
// step on an H100 for ~7 GB of reads (bench/results/ncu_kernels-gpt-1.3b-nvidia-h100-80gb-hbm3.json).
constexpr int kColThreads = 128;  // columns per tile: 8 * kColThreads

__global__ void column_partials_vec_kernel(float* partial, const bf16* x, int64_t N, int64_t C,
                                           int64_t rows_per_block) {
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * kColThreads + threadIdx.x) * 8;
  if (c >= C) return;
  const int64_t r0 = blockIdx.y * rows_per_block;
  const int64_t r1 = r0 + rows_per_block < N ? r0 + rows_per_block : N;
  float acc[8] = {};
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    Pack<8, bf16> v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = load_pack<8>(x + (r + u) * C + c);
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[k] += __bfloat162float(v[u].v[k]);
  }
  for (; r < r1; ++r) {
    const Pack<8, bf16> v = load_pack<8>(x + r * C + c);
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[k] += __bfloat162float(v.v[k]);
  }
  float* out = partial + blockIdx.y * C + c;
#pragma unroll
  for (int k = 0; k < 8; ++k) out[k] = acc[k];
}

// Scalar path (any C, any alignment): threads walk columns (coalesced) and loop over the rows.
__global__ void column_partials_kernel(float* partial, const bf16* x, int64_t N, int64_t C, int64_t rows_per_block) {
  const int64_t r0 = blockIdx.x * rows_per_block;
  const int64_t r1 = r0 + rows_per_block < N ? r0 + rows_per_block : N;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = 0;
    for (int64_t r = r0; r < r1; ++r) acc += __bfloat162float(x[r * C + c]);
    partial[blockIdx.x * C + c] = acc;
  }
}

// Pass 2, shared with the norms' dw/db (add_partial_rows): column j of the [G, W] partial rows is added to
// out0[j] (j < split) or out1[j - split]. A block takes 32 columns; its kRowLanes thread rows each sum every
// kRowLanes-th partial row, and the block adds those kRowLanes sums in a fixed order: the same bits on every run,
// with G / kRowLanes loads per thread instead of G (one thread per column, the first version, left 2-3 blocks'
// worth of threads each walking up to 1024 rows: 5.4 ms of the 1.3B step for 8 MB of partials).
constexpr int kRowLanes = 16;

__global__ void partial_rows_reduce_kernel(float* out0, float* out1, int64_t split, const float* partial, int64_t W,
                                           int64_t G, bool accumulate) {
  __shared__ float part[kRowLanes][33];  // +1: no bank conflicts on the column-wise reads below
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float acc = 0;
  if (j < W)
    for (int64_t g = threadIdx.y; g < G; g += kRowLanes) acc += partial[g * W + j];
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || j >= W) return;
  float sum = 0;
#pragma unroll
  for (int y = 0; y < kRowLanes; ++y) sum += part[y][threadIdx.x];
  float* out = j < split ? out0 + j : out1 ? out1 + (j - split) : nullptr;
  if (out) *out = accumulate ? *out + sum : sum;
}

__global__ void add_bias_rows_kernel(bf16* out, const bf16* bias, int64_t N, int64_t OC) {
  for (int64_t e = global_thread(); e < N * OC; e += grid_threads())
    out[e] = from_f<bf16>(to_f(out[e]) + to_f(bias[e % OC]));
}

}  // namespace

void add_bias_rows(cudaStream_t s, bf16* out, const bf16* bias, int64_t N, int64_t OC) {
  if (N * OC <= 0) return;
  add_bias_rows_kernel<<<grid_for(N * OC, kThreads), kThreads, 0, s>>>(out, bias, N, OC);
  check_launch("add_bias_rows_kernel");
}

void convert_f32_to_bf16(cudaStream_t s, bf16* dst, const float* src, int64_t n) {
  if (n <= 0) return;
  f32_to_bf16_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(reinterpret_cast<uint16_t*>(dst), src, n);
  check_launch("convert_f32_to_bf16");
}

void convert_bf16_to_f32(cudaStream_t s, float* dst, const bf16* src, int64_t n) {
  if (n <= 0) return;
  bf16_to_f32_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(dst, reinterpret_cast<const uint16_t*>(src), n);
  check_launch("convert_bf16_to_f32");
}

void add(cudaStream_t s, bool is_bf16, void* out, const void* a, const void* b, int64_t n) {
  map2_any(s, is_bf16, out, a, b, n, AddOp{}, "add_kernel");
}

void axpy(cudaStream_t s, bool is_bf16, void* dst, const void* src, float alpha, int64_t n) {
  map2_any(s, is_bf16, dst, dst, src, n, AxpyOp{alpha}, "axpy_kernel");
}

void scale(cudaStream_t s, bool is_bf16, void* x, float alpha, int64_t n) {
  map2_any(s, is_bf16, x, x, nullptr, n, ScaleOp{alpha}, "scale_kernel");
}

// core/bits_hash.h's terms summed modulo 2^64: exact in any order, so the block tree and the host's final sum give
// the CPU loop's bits.
__global__ void bits_hash_kernel(const uint32_t* w, int64_t n, unsigned long long* partials) {
  unsigned long long acc = 0;
  for (int64_t i = global_thread(); i < n; i += grid_threads()) acc += bits_hash_term(w[i], static_cast<uint64_t>(i));
  acc = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

int bits_hash_partials(cudaStream_t s, const uint32_t* w, int64_t n, unsigned long long* partials) {
  if (n <= 0) return 0;
  const int64_t want = (n + kThreads * 8 - 1) / (kThreads * 8);
  const int G = static_cast<int>(want < kMaxPartials ? want : kMaxPartials);
  bits_hash_kernel<<<G, kThreads, 0, s>>>(w, n, partials);
  check_launch("bits_hash_kernel");
  return G;
}

int sum_squares_partials(cudaStream_t s, bool is_bf16, const void* x, int64_t n, double* partials) {
  if (n <= 0) return 0;
  // The block count depends on n only, so the partials (and their host-side sum) are reproducible.
  const int64_t want = (n + kThreads * 8 - 1) / (kThreads * 8);  // ~8 elements per thread at least
  const int G = static_cast<int>(want < kMaxPartials ? want : kMaxPartials);
  if (is_bf16)
    sum_squares_kernel<<<G, kThreads, 0, s>>>(static_cast<const bf16*>(x), n, partials);
  else
    sum_squares_kernel<<<G, kThreads, 0, s>>>(static_cast<const float*>(x), n, partials);
  check_launch("sum_squares_kernel");
  return G;
}

void add_partial_rows(cudaStream_t s, float* out0, float* out1, int64_t split, const float* partial, int64_t W,
                      int64_t G, bool accumulate) {
  if (W <= 0 || G <= 0) return;
  const dim3 block(32, kRowLanes);
  partial_rows_reduce_kernel<<<static_cast<unsigned>((W + 31) / 32), block, 0, s>>>(out0, out1, split, partial, W, G,
                                                                                    accumulate);
  check_launch("partial_rows_reduce_kernel");
}

void column_sums_accumulate(cudaStream_t s, float* out, const bf16* x, int64_t N, int64_t C, float* scratch,
                            size_t scratch_floats, bool accumulate) {
  if (N <= 0 || C <= 0) return;
  // Enough row blocks to fill the GPU (~32 rows each), bounded by the scratch and by 1024 partial rows.
  int64_t G = (N + 31) / 32;
  const int64_t fit = static_cast<int64_t>(scratch_floats) / C;
  if (G > fit) G = fit;
  if (G > 1024) G = 1024;
  if (G < 1) G = 1;  // C larger than the scratch: the caller checked C <= scratch_floats
  const int64_t rows_per_block = (N + G - 1) / G;
  G = (N + rows_per_block - 1) / rows_per_block;  // no empty blocks
  if (C % 8 == 0 && aligned16(x)) {
    const dim3 grid(static_cast<unsigned>((C / 8 + kColThreads - 1) / kColThreads), static_cast<unsigned>(G));
    column_partials_vec_kernel<<<grid, kColThreads, 0, s>>>(scratch, x, N, C, rows_per_block);
  } else {
    column_partials_kernel<<<static_cast<unsigned>(G), kThreads, 0, s>>>(scratch, x, N, C, rows_per_block);
  }
  check_launch("column_partials_kernel");
  add_partial_rows(s, out, nullptr, C, scratch, C, G, accumulate);
}

}  // namespace mt::cuda
