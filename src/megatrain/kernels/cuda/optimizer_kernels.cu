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

__device__ __forceinline__ bool dev_aligned(const void* p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

// The same for many tensors: grid.y walks the segments, grid.x strides within one (blocks past a small segment's end
// exit at once, which is cheaper than a launch per tensor). With w16, the updated weight also goes to the bf16
// compute copy from the register that holds it (the separate refresh pass read the fp32 weights back).
// Four elements a thread per step, as 16-byte loads and stores (8 bytes for the bf16 copy), where the segment's
// start is aligned for them (the rest, and unaligned segments, one element at a time): the 4-byte version moved
// its 30 bytes an element at 88% of copy bandwidth on the H100 (15.2 ms for the 1.3B model). The arithmetic is
// adamw_element's on registers, so the results are bit-identical either way.
__global__ void adamw_multi_kernel(float* p, const float* g, float* m, float* v, const AdamSeg* segs, AdamConsts k,
                                   uint16_t* w16) {
  const AdamSeg s = segs[blockIdx.y];
  k.wd = s.wd;
  float* ps = p + s.offset;
  const float* gs = g + s.offset;
  float* mv = m + s.offset;
  float* vv = v + s.offset;
  uint16_t* ws = w16 ? w16 + s.offset : nullptr;
  int64_t done = 0;
  if (dev_aligned(ps, 16) && dev_aligned(gs, 16) && dev_aligned(mv, 16) && dev_aligned(vv, 16) &&
      (!ws || dev_aligned(ws, 8))) {  // the same for every thread of the block: no divergence
    const int64_t n4 = s.numel / 4;
    for (int64_t q = global_thread(); q < n4; q += grid_threads()) {
      const float4 P = reinterpret_cast<const float4*>(ps)[q], G = reinterpret_cast<const float4*>(gs)[q];
      const float4 M = reinterpret_cast<const float4*>(mv)[q], V = reinterpret_cast<const float4*>(vv)[q];
      float pl[4] = {P.x, P.y, P.z, P.w}, gl[4] = {G.x, G.y, G.z, G.w};
      float ml[4] = {M.x, M.y, M.z, M.w}, vl[4] = {V.x, V.y, V.z, V.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) adamw_element(pl, gl, ml, vl, j, k);
      reinterpret_cast<float4*>(ps)[q] = make_float4(pl[0], pl[1], pl[2], pl[3]);
      reinterpret_cast<float4*>(mv)[q] = make_float4(ml[0], ml[1], ml[2], ml[3]);
      reinterpret_cast<float4*>(vv)[q] = make_float4(vl[0], vl[1], vl[2], vl[3]);
      if (ws) {  // element j in bits 16 * j (little-endian), as four uint16_t stores would put them
        uint2 b;
        b.x = uint32_t{f32_to_bf16_bits(pl[0])} | (uint32_t{f32_to_bf16_bits(pl[1])} << 16);
        b.y = uint32_t{f32_to_bf16_bits(pl[2])} | (uint32_t{f32_to_bf16_bits(pl[3])} << 16);
        reinterpret_cast<uint2*>(ws)[q] = b;
      }
    }
    done = n4 * 4;
  }
  for (int64_t i = done + global_thread(); i < s.numel; i += grid_threads()) {
    adamw_element(ps, gs, mv, vv, i, k);
    if (ws) ws[i] = f32_to_bf16_bits(ps[i]);
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
  for (int64_t i = global_thread(); i < s.numel; i += grid_threads())
    lamb_apply_element(p, m, v, s.offset + i, k, step);
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
  // At most 1024 blocks per segment (each thread then loops): enough to fill the GPU with the large matrices. A
  // thread takes four elements a step where it can.
  const unsigned gx = std::min(grid_for((max_numel + 3) / 4, kThreads), 1024u);
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
