// GeLU (tanh approximation) and SwiGLU, forward and backward, on bf16 with fp32 math. Memory-bound: each thread
// moves 16-byte packs (8 bf16) when the pointers and widths allow, else single elements.
#include "megatrain/kernels/cuda/device_util.cuh"

namespace mt::cuda {

namespace {

constexpr int kThreads = 256;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

// gelu(x) = 0.5 x (1 + tanh(u)) = x * sigmoid(2u), u = sqrt(2/pi)(x + 0.044715 x^3): the sigmoid form (as the CPU
// backend) needs one exp and keeps its relative accuracy for x << 0.
__device__ __forceinline__ float gelu(float x) {
  const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  return x / (1.0f + expf(-2.0f * u));
}

// d gelu/dx = s + 2 x s (1 - s) u',  s = sigmoid(2u),  u' = sqrt(2/pi)(1 + 3 * 0.044715 x^2)
__device__ __forceinline__ float gelu_grad(float x) {
  const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
  const float sg = 1.0f / (1.0f + expf(-2.0f * u));
  return sg + 2.0f * x * sg * (1.0f - sg) * du;
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// out = gelu(inp), or with dout: out = dout * gelu'(inp) (out may alias dout: same thread, same element).
template <int K, bool kBackward>
__global__ void gelu_kernel(bf16* out, const bf16* inp, const bf16* dout, int64_t n) {
  const int64_t npack = n / K;
  for (int64_t p = global_thread(); p < npack; p += grid_threads()) {
    const Pack<K, bf16> x = load_pack<K>(inp + p * K);
    Pack<K, bf16> g{};
    if constexpr (kBackward) g = load_pack<K>(dout + p * K);
    Pack<K, bf16> o;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const float xf = to_f(x.v[k]);
      o.v[k] = from_f<bf16>(kBackward ? to_f(g.v[k]) * gelu_grad(xf) : gelu(xf));
    }
    store_pack<K>(out + p * K, o);
  }
  const int64_t i = npack * K + global_thread();  // the n % K tail
  if (i < n) {
    const float xf = to_f(inp[i]);
    out[i] = from_f<bf16>(kBackward ? to_f(dout[i]) * gelu_grad(xf) : gelu(xf));
  }
}

// Row n of inp is [gate (F) | up (F)]. Forward: out[n, j] = silu(gate) * up. Backward writes dinp[n] = [dgate | dup]:
// d up = dout silu(g);  d gate = dout up sigmoid(g)(1 + g(1 - sigmoid(g))).
// A pack of K covers columns [j, j + K) of one row (F % K == 0 when K > 1, so it never straddles two rows).
template <int K, bool kBackward>
__global__ void swiglu_kernel(bf16* out, const bf16* inp, const bf16* dout, int64_t N, int64_t F) {
  const int64_t npack = N * F / K;
  for (int64_t p = global_thread(); p < npack; p += grid_threads()) {
    const int64_t e = p * K, n = e / F, j = e % F;
    const bf16* gate = inp + n * 2 * F + j;
    const bf16* up = gate + F;
    const Pack<K, bf16> ga = load_pack<K>(gate), u = load_pack<K>(up);
    if constexpr (!kBackward) {
      Pack<K, bf16> o;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const float a = to_f(ga.v[k]);
        o.v[k] = from_f<bf16>(a * sigmoid(a) * to_f(u.v[k]));
      }
      store_pack<K>(out + e, o);
    } else {
      const Pack<K, bf16> g = load_pack<K>(dout + e);
      Pack<K, bf16> dg, du;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const float a = to_f(ga.v[k]), b = to_f(u.v[k]), d = to_f(g.v[k]), sg = sigmoid(a);
        dg.v[k] = from_f<bf16>(d * b * sg * (1.0f + a * (1.0f - sg)));
        du.v[k] = from_f<bf16>(d * a * sg);
      }
      bf16* dgate = out + n * 2 * F + j;
      store_pack<K>(dgate, dg);
      store_pack<K>(dgate + F, du);
    }
  }
}

}  // namespace

void gelu_forward(cudaStream_t s, bf16* out, const bf16* inp, int64_t n) {
  if (n <= 0) return;
  if (aligned16(out) && aligned16(inp))
    gelu_kernel<8, false><<<grid_for((n + 7) / 8, kThreads), kThreads, 0, s>>>(out, inp, nullptr, n);
  else
    gelu_kernel<1, false><<<grid_for(n, kThreads), kThreads, 0, s>>>(out, inp, nullptr, n);
  check_launch("gelu_forward_kernel");
}

void gelu_backward(cudaStream_t s, bf16* dinp, const bf16* inp, const bf16* dout, int64_t n) {
  if (n <= 0) return;
  if (aligned16(dinp) && aligned16(inp) && aligned16(dout))
    gelu_kernel<8, true><<<grid_for((n + 7) / 8, kThreads), kThreads, 0, s>>>(dinp, inp, dout, n);
  else
    gelu_kernel<1, true><<<grid_for(n, kThreads), kThreads, 0, s>>>(dinp, inp, dout, n);
  check_launch("gelu_backward_kernel");
}

void swiglu_forward(cudaStream_t s, bf16* out, const bf16* inp, int64_t N, int64_t F) {
  if (N * F <= 0) return;
  if (F % 8 == 0 && aligned16(out) && aligned16(inp))
    swiglu_kernel<8, false><<<grid_for(N * F / 8, kThreads), kThreads, 0, s>>>(out, inp, nullptr, N, F);
  else
    swiglu_kernel<1, false><<<grid_for(N * F, kThreads), kThreads, 0, s>>>(out, inp, nullptr, N, F);
  check_launch("swiglu_forward_kernel");
}

void swiglu_backward(cudaStream_t s, bf16* dinp, const bf16* inp, const bf16* dout, int64_t N, int64_t F) {
  if (N * F <= 0) return;
  if (F % 8 == 0 && aligned16(dinp) && aligned16(inp) && aligned16(dout))
    swiglu_kernel<8, true><<<grid_for(N * F / 8, kThreads), kThreads, 0, s>>>(dinp, inp, dout, N, F);
  else
    swiglu_kernel<1, true><<<grid_for(N * F, kThreads), kThreads, 0, s>>>(dinp, inp, dout, N, F);
  check_launch("swiglu_backward_kernel");
}

}  // namespace mt::cuda
