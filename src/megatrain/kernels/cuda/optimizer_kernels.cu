// AdamW and LAMB over flat fp32 parameter, gradient and moment buffers: AdamW for every tensor of the model in one
// launch (blockIdx.y picks the tensor), LAMB one grid-stride launch per tensor (its trust ratio needs each tensor's
// norms first). The arithmetic is the CPU reference's, term for term.
#include <algorithm>

#include "megatrain/kernels/cuda/device_util.cuh"

namespace mt::cuda {

namespace {

constexpr int kThreads = 256;

// The Adam direction u = mhat / (sqrt(vhat) + eps) + wd * p.
__device__ __forceinline__ float adam_dir(float m, float v, float p, const AdamConsts& k) {
  return m * k.inv_bc1 / (sqrtf(v * k.inv_bc2) + k.eps) + k.wd * p;
}

// One element of AdamW: the moments, then the step along the Adam direction.
__device__ __forceinline__ void adamw_element(float* p, const float* g, float* m, float* v, int64_t i,
                                              const AdamConsts& k) {
  const float gi = g[i] * k.gs;
  const float mi = k.b1 * m[i] + k.one_minus_b1 * gi;
  const float vi = k.b2 * v[i] + k.one_minus_b2 * gi * gi;
  m[i] = mi;
  v[i] = vi;
  p[i] -= k.lr * adam_dir(mi, vi, p[i], k);
}

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n, AdamConsts k) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) adamw_element(p, g, m, v, i, k);
}

// The same for many tensors: grid.y walks the segments, grid.x strides within one (blocks past a small segment's end
// exit at once, which is cheaper than a launch per tensor).
__global__ void adamw_multi_kernel(float* p, const float* g, float* m, float* v, const AdamSeg* segs, AdamConsts k) {
  const AdamSeg s = segs[blockIdx.y];
  k.wd = s.wd;
  for (int64_t i = global_thread(); i < s.numel; i += grid_threads()) adamw_element(p, g, m, v, s.offset + i, k);
}

// Moments as in AdamW; block g writes the sum of u^2 over its share (double per thread) to partials[g].
__global__ void lamb_moments_kernel(const float* p, const float* g, float* m, float* v, int64_t n, AdamConsts k,
                                    double* partials) {
  double acc = 0;
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    const float gi = g[i] * k.gs;
    const float mi = k.b1 * m[i] + k.one_minus_b1 * gi;
    const float vi = k.b2 * v[i] + k.one_minus_b2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const double u = adam_dir(mi, vi, p[i], k);
    acc += u * u;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void lamb_apply_kernel(float* p, const float* m, const float* v, int64_t n, AdamConsts k, float step) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) p[i] -= step * adam_dir(m[i], v[i], p[i], k);
}

}  // namespace

void adamw_update(cudaStream_t s, float* p, const float* g, float* m, float* v, int64_t n, const AdamConsts& k) {
  if (n <= 0) return;
  adamw_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(p, g, m, v, n, k);
  check_launch("adamw_kernel");
}

void adamw_update_multi(cudaStream_t s, float* p, const float* g, float* m, float* v, const AdamSeg* segs, int n_segs,
                        int64_t max_numel, const AdamConsts& k) {
  if (n_segs <= 0 || max_numel <= 0) return;
  // At most 1024 blocks per segment (each thread then loops): enough to fill the GPU with the large matrices.
  const unsigned gx = std::min(grid_for(max_numel, kThreads), 1024u);
  adamw_multi_kernel<<<dim3(gx, static_cast<unsigned>(n_segs)), kThreads, 0, s>>>(p, g, m, v, segs, k);
  check_launch("adamw_multi_kernel");
}

int lamb_moments(cudaStream_t s, const float* p, const float* g, float* m, float* v, int64_t n, const AdamConsts& k,
                 double* partials) {
  if (n <= 0) return 0;
  // The block count depends on n only (reproducible sums); at least ~8 elements per thread.
  const int64_t want = (n + kThreads * 8 - 1) / (kThreads * 8);
  const int G = static_cast<int>(want < kMaxPartials ? want : kMaxPartials);
  lamb_moments_kernel<<<G, kThreads, 0, s>>>(p, g, m, v, n, k, partials);
  check_launch("lamb_moments_kernel");
  return G;
}

void lamb_apply(cudaStream_t s, float* p, const float* m, const float* v, int64_t n, const AdamConsts& k, float step) {
  if (n <= 0) return;
  lamb_apply_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(p, m, v, n, k, step);
  check_launch("lamb_apply_kernel");
}

}  // namespace mt::cuda
