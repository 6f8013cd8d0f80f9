// GeLU (tanh approximation) and SwiGLU.
#include "megatrain/kernels/cpu/cpu_ops.h"
#include "megatrain/kernels/cpu/cpu_util.h"

namespace mt {

using namespace cpu;

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

}  // namespace

// gelu(x) = 0.5 x (1 + tanh(u)) = x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3). The sigmoid form is exact
// algebra but needs only one exp and keeps full relative accuracy where 1 + tanh(u) would cancel (x << 0).
void CpuOps::gelu_forward(Tensor out, Tensor inp) {
  const char* op = "gelu_forward";
  float* o = f32_arg(out, op, "out");
  const float* x = f32_arg(inp, op, "inp");
  const int64_t n = gelu_numel(op, out, inp);
#pragma omp parallel for simd if (n > kParallelMin) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float xi = x[i];
    const float u = kSqrt2OverPi * (xi + kGeluCubic * xi * xi * xi);
    o[i] = xi * fast_sigmoid(2.0f * u);
  }
}

// d gelu / dx = s + 2 x s (1 - s) u',  s = sigmoid(2u),  u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
void CpuOps::gelu_backward(Tensor dinp, Tensor inp, Tensor dout) {
  const char* op = "gelu_backward";
  float* dx = f32_arg(dinp, op, "dinp");
  const float* x = f32_arg(inp, op, "inp");
  const float* dy = f32_arg(dout, op, "dout");
  const int64_t n = gelu_backward_numel(op, dinp, inp, dout);
#pragma omp parallel for simd if (n > kParallelMin) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float xi = x[i];
    const float u = kSqrt2OverPi * (xi + kGeluCubic * xi * xi * xi);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * xi * xi);
    const float sg = fast_sigmoid(2.0f * u);
    dx[i] = dy[i] * (sg + 2.0f * xi * sg * (1.0f - sg) * du);
  }
}

void CpuOps::swiglu_forward(Tensor out, Tensor inp) {
  const char* op = "swiglu_forward";
  float* o = f32_arg(out, op, "out");
  const float* x = f32_arg(inp, op, "inp");
  const auto [N, F] = swiglu_dims(op, out, inp);
#pragma omp parallel for if (N * F > kParallelMin) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* gate = x + n * 2 * F;
    const float* up = gate + F;
    float* orow = o + n * F;
#pragma omp simd
    for (int64_t j = 0; j < F; ++j) orow[j] = gate[j] * fast_sigmoid(gate[j]) * up[j];
  }
}

// out = silu(g) u:  d u = dout silu(g);  d g = dout u sigmoid(g) (1 + g (1 - sigmoid(g)))
void CpuOps::swiglu_backward(Tensor dinp, Tensor inp, Tensor dout) {
  const char* op = "swiglu_backward";
  float* dx = f32_arg(dinp, op, "dinp");
  const float* x = f32_arg(inp, op, "inp");
  const float* dy = f32_arg(dout, op, "dout");
  const auto [N, F] = swiglu_backward_dims(op, dinp, inp, dout);
#pragma omp parallel for if (N * F > kParallelMin) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* gate = x + n * 2 * F;
    const float* up = gate + F;
    const float* g = dy + n * F;
    float* dgate = dx + n * 2 * F;
    float* dup = dgate + F;
#pragma omp simd
    for (int64_t j = 0; j < F; ++j) {
      const float a = gate[j], b = up[j], sg = fast_sigmoid(a);
      dgate[j] = g[j] * b * sg * (1.0f + a * (1.0f - sg));
      dup[j] = g[j] * a * sg;
    }
  }
}

}  // namespace mt
