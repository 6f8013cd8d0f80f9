// AdamW and LAMB over flat fp32 parameter, gradient and moment buffers, per tensor or for every tensor of the model
// at once (blockIdx.y picks the tensor). Multi-tensor LAMB is two passes whose per-tensor norms stay on the device:
// moments + block partial sums, a per-tensor reduction of the partials, then the trust-scaled update. The element
// functions are shared by the per-tensor and multi-tensor kernels; the arithmetic is the CPU reference's, term for
// term.
#include <algorithm>

#include "megatrain/kernels/cuda/device_util.cuh"

namespace mt::cuda {

namespace {

constexpr int kThreads = 256;

// The Adam direction u = mhat / (sqrt(vhat) + eps) + wd * p.
__device__ __forceinline__ float adam_dir(float m, float v, float p, const AdamConsts& k) {
  return m * k.inv_bc1 / (sqrtf(v * k.inv_bc2) + k.eps) + k.wd * p;
}

// The moments of one element (AdamW and LAMB pass 1) from its gradient; returns the Adam direction u at p[i].
__device__ __forceinline__ float adam_moments(const float* p, const float* g, float* m, float* v, int64_t i,
                                              const AdamConsts& k) {
  const float gi = g[i] * k.gs;
  const float mi = k.b1 * m[i] + k.one_minus_b1 * gi;
  const float vi = k.b2 * v[i] + k.one_minus_b2 * gi * gi;
  m[i] = mi;
  v[i] = vi;
  return adam_dir(mi, vi, p[i], k);
}

// One element of AdamW: the moments, then the step along the Adam direction.
__device__ __forceinline__ void adamw_element(float* p, const float* g, float* m, float* v, int64_t i,
                                              const AdamConsts& k) {
  p[i] -= k.lr * adam_moments(p, g, m, v, i, k);
}

// One element of LAMB pass 2: the step (lr * trust) along the Adam direction recomputed from m, v.
__device__ __forceinline__ void lamb_apply_element(float* p, const float* m, const float* v, int64_t i,
                                                   const AdamConsts& k, float step) {
  p[i] -= step * adam_dir(m[i], v[i], p[i], k);
}

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n, AdamConsts k) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) adamw_element(p, g, m, v, i, k);
}

// The same for many tensors: grid.y walks the segments, grid.x strides within one (blocks past a small segment's end
// exit at once, which is cheaper than a launch per tensor). With w16, the updated weight also goes to the bf16
// compute copy from the register that holds it (the separate refresh pass read the fp32 weights back).
__global__ void adamw_multi_kernel(float* p, const float* g, float* m, float* v, const AdamSeg* segs, AdamConsts k,
                                   uint16_t* w16) {
  const AdamSeg s = segs[blockIdx.y];
  k.wd = s.wd;
  for (int64_t i = global_thread(); i < s.numel; i += grid_threads()) {
    adamw_element(p, g, m, v, s.offset + i, k);
    if (w16) w16[s.offset + i] = f32_to_bf16_bits(p[s.offset + i]);
  }
}

// Moments as in AdamW; block g writes the sum of u^2 over its share (double per thread) to partials[g].
__global__ void lamb_moments_kernel(const float* p, const float* g, float* m, float* v, int64_t n, AdamConsts k,
                                    double* partials) {
  double acc = 0;
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    const double u = adam_moments(p, g, m, v, i, k);
    acc += u * u;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void lamb_apply_kernel(float* p, const float* m, const float* v, int64_t n, AdamConsts k, float step) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) lamb_apply_element(p, m, v, i, k, step);
}

// Blocks of segment j that hold elements under a grid-stride loop of gridDim.x blocks of `threads`: the others
// have nothing to add.
__device__ __forceinline__ int64_t busy_blocks(int64_t numel, int threads, int blocks) {
  const int64_t b = (numel + threads - 1) / threads;
  return b < blocks ? b : blocks;
}

// Multi-tensor pass 1: grid (gx, segments). Block (x, j) updates its share of segment j and writes its sums of p^2
// and u^2 (double per thread) to partials[2 * (j * gx + x)] and [... + 1]; blocks past a segment's end exit at once
// (they would add zeros) and write nothing.
__global__ void lamb_moments_multi_kernel(const float* p, const float* g, float* m, float* v, const AdamSeg* segs,
                                          AdamConsts k, double* partials) {
  const AdamSeg s = segs[blockIdx.y];
  if (blockIdx.x >= busy_blocks(s.numel, blockDim.x, gridDim.x)) return;  // the whole block: no sync skipped
  k.wd = s.wd;
  double w2 = 0, u2 = 0;
  for (int64_t i = global_thread(); i < s.numel; i += grid_threads()) {
    const int64_t e = s.offset + i;
    const double w = p[e];
    const double u = adam_moments(p, g, m, v, e, k);
    w2 += w * w;
    u2 += u * u;
  }
  w2 = block_sum(w2);
  u2 = block_sum(u2);
  if (threadIdx.x == 0) {
    double* out = partials + 2 * (static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x);
    out[0] = w2;
    out[1] = u2;
  }
}

// Multi-tensor reduction: block j adds segment j's busy block partials (each thread a fixed strided subset, then
// the block tree), so the result depends on the sizes only, never on scheduling.
__global__ void lamb_norms_kernel(const double* partials, const AdamSeg* segs, int gx, int threads, float* norms) {
  const int64_t busy = busy_blocks(segs[blockIdx.x].numel, threads, gx);
  const double* part = partials + 2 * static_cast<int64_t>(blockIdx.x) * gx;
  double w2 = 0, u2 = 0;
  for (int64_t b = threadIdx.x; b < busy; b += blockDim.x) {
    w2 += part[2 * b];
    u2 += part[2 * b + 1];
  }
  w2 = block_sum(w2);
  u2 = block_sum(u2);
  if (threadIdx.x == 0) {
    norms[2 * blockIdx.x] = static_cast<float>(w2);
    norms[2 * blockIdx.x + 1] = static_cast<float>(u2);
  }
}

// Multi-tensor pass 2: grid (gx, segments); every block of segment j derives its trust ratio from norms[2j..2j+1]
// (lamb_trust in ops.h: float, correctly rounded / and sqrt as on the host).
__global__ void lamb_apply_multi_kernel(float* p, const float* m, const float* v, const AdamSeg* segs, AdamConsts k,
                                        const float* norms) {
  const AdamSeg s = segs[blockIdx.y];
  k.wd = s.wd;
  const float w2 = norms[2 * blockIdx.y], u2 = norms[2 * blockIdx.y + 1];
  const float trust = (w2 > 0 && u2 > 0) ? sqrtf(w2 / u2) : 1.0f;
  const float step = k.lr * trust;
  for (int64_t i = global_thread(); i < s.numel; i += grid_threads()) lamb_apply_element(p, m, v, s.offset + i, k, step);
}

// Blocks per segment of lamb_moments_multi: ~8 elements per thread of the largest segment, at most kMaxPartials.
int lamb_multi_gx(int64_t max_numel) {
  const int64_t want = (max_numel + kThreads * 8 - 1) / (kThreads * 8);
  return static_cast<int>(want < 1 ? 1 : (want < kMaxPartials ? want : kMaxPartials));
}

}  // namespace

void adamw_update(cudaStream_t s, float* p, const float* g, float* m, float* v, int64_t n, const AdamConsts& k) {
  if (n <= 0) return;
  adamw_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(p, g, m, v, n, k);
  check_launch("adamw_kernel");
}

void adamw_update_multi(cudaStream_t s, float* p, const float* g, float* m, float* v, const AdamSeg* segs, int n_segs,
                        int64_t max_numel, const AdamConsts& k, uint16_t* w16) {
  if (n_segs <= 0 || max_numel <= 0) return;
  // At most 1024 blocks per segment (each thread then loops): enough to fill the GPU with the large matrices.
  const unsigned gx = std::min(grid_for(max_numel, kThreads), 1024u);
  adamw_multi_kernel<<<dim3(gx, static_cast<unsigned>(n_segs)), kThreads, 0, s>>>(p, g, m, v, segs, k, w16);
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

size_t lamb_multi_partials(int n_segs, int64_t max_numel) {
  if (n_segs <= 0 || max_numel <= 0) return 0;
  return 2 * static_cast<size_t>(n_segs) * static_cast<size_t>(lamb_multi_gx(max_numel));
}

void lamb_moments_multi(cudaStream_t s, const float* p, const float* g, float* m, float* v, const AdamSeg* segs,
                        int n_segs, int64_t max_numel, const AdamConsts& k, double* partials, float* norms) {
  if (n_segs <= 0) return;
  const int gx = lamb_multi_gx(max_numel);
  if (max_numel > 0) {
    lamb_moments_multi_kernel<<<dim3(gx, static_cast<unsigned>(n_segs)), kThreads, 0, s>>>(p, g, m, v, segs, k,
                                                                                         partials);
    check_launch("lamb_moments_multi_kernel");
  }
  // Run even when every segment is empty: it writes their zero norms.
  lamb_norms_kernel<<<n_segs, kThreads, 0, s>>>(partials, segs, gx, kThreads, norms);
  check_launch("lamb_norms_kernel");
}

void lamb_apply_multi(cudaStream_t s, float* p, const float* m, const float* v, const AdamSeg* segs, int n_segs,
                      int64_t max_numel, const AdamConsts& k, const float* norms) {
  if (n_segs <= 0 || max_numel <= 0) return;
  const unsigned gx = std::min(grid_for(max_numel, kThreads), 1024u);
  lamb_apply_multi_kernel<<<dim3(gx, static_cast<unsigned>(n_segs)), kThreads, 0, s>>>(p, m, v, segs, k, norms);
  check_launch("lamb_apply_multi_kernel");
}

}  // namespace mt::cuda
