// Flash attention throughput (kernels/cuda/flash_attention.*): forward, backward and both, causal against a sliding
// window of T/4, on GPT-2-small-like (B=8, T=1024, H=12, hd=64) and larger-head (B=4, T=2048, H=16, hd=128) shapes.
// TFLOP/s counts the work actually needed: 4 hd flops per visible (query, key) pair forward (QK^T and PV), 10 hd
// backward (QK^T recomputed, dP, dV, dK, dQ). A window skips most pairs, so its time must drop with them (the
// "window_speedup" field: causal time / window time). Prints one JSON object; {"skipped": ...} without a GPU.
#include <cstdio>

#include <nlohmann/json.hpp>

#ifdef MT_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "megatrain/core/bf16.h"
#include "megatrain/kernels/cuda/flash_attention.h"

namespace {

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

struct DeviceMem {
  void* p = nullptr;
  explicit DeviceMem(size_t bytes) { cuda_ok(cudaMalloc(&p, bytes), "cudaMalloc"); }
  ~DeviceMem() { cudaFree(p); }
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

void fill_random(void* dst, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<uint16_t> h(n);
  for (auto& x : h) x = mt::float_to_bf16(dist(rng));
  cuda_ok(cudaMemcpy(dst, h.data(), n * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
}

// Visible (query, key) pairs of one (batch, head).
double visible_pairs(int T, int W) {
  double n = 0;
  for (int t = 0; t < T; ++t) n += W > 0 ? std::min(t + 1, W) : t + 1;
  return n;
}

// Median milliseconds of f() over `iters` runs, each timed by its own event pair on the default stream.
template <typename F>
double median_ms(F&& f, int iters) {
  cudaEvent_t a, b;
  cuda_ok(cudaEventCreate(&a), "cudaEventCreate");
  cuda_ok(cudaEventCreate(&b), "cudaEventCreate");
  for (int i = 0; i < 3; ++i) f();  // warm-up
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i) {
    cuda_ok(cudaEventRecord(a, nullptr), "cudaEventRecord");
    f();
    cuda_ok(cudaEventRecord(b, nullptr), "cudaEventRecord");
    cuda_ok(cudaEventSynchronize(b), "cudaEventSynchronize");
    cuda_ok(cudaEventElapsedTime(&ms[i], a, b), "cudaEventElapsedTime");
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[iters / 2];
}

nlohmann::json bench_shape(int B, int T, int H, int hd, int W) {
  mt::AttnShape s;
  s.B = B;
  s.T = T;
  s.n_head = H;
  s.n_kv_head = H;
  s.head_dim = hd;
  s.window = W;
  const size_t n_qkv = size_t(B) * T * s.qkv_width(), n_out = size_t(B) * T * H * hd, n_lse = size_t(B) * H * T;
  DeviceMem qkv(n_qkv * 2), out(n_out * 2), dout(n_out * 2), lse(n_lse * 4), dqkv(n_qkv * 2),
      ws(mt::flash_attention_workspace_bytes(s));
  fill_random(qkv.p, n_qkv, 1);
  fill_random(dout.p, n_out, 2);
  auto fwd = [&] {
    mt::flash_attention_forward(nullptr, s, qkv.as<__nv_bfloat16>(), out.as<__nv_bfloat16>(), lse.as<float>());
  };
  auto bwd = [&] {
    mt::flash_attention_backward(nullptr, s, qkv.as<__nv_bfloat16>(), out.as<__nv_bfloat16>(),
                                 dout.as<__nv_bfloat16>(), lse.as<float>(), dqkv.as<__nv_bfloat16>(), ws.as<float>());
  };
  const int iters = 20;
  const double fwd_ms = median_ms(fwd, iters);
  const double bwd_ms = median_ms(bwd, iters);
  const double both_ms = median_ms([&] { fwd(); bwd(); }, iters);
  const double pairs = visible_pairs(T, W) * B * H;
  const double fwd_flops = 4.0 * pairs * hd, bwd_flops = 10.0 * pairs * hd;
  return {{"B", B},
          {"T", T},
          {"H", H},
          {"hd", hd},
          {"window", W},
          {"fwd_ms", fwd_ms},
          {"bwd_ms", bwd_ms},
          {"fwd_bwd_ms", both_ms},
          {"fwd_tflops", fwd_flops / fwd_ms * 1e-9},
          {"bwd_tflops", bwd_flops / bwd_ms * 1e-9},
          {"fwd_bwd_tflops", (fwd_flops + bwd_flops) / both_ms * 1e-9}};
}

}  // namespace

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("%s\n", nlohmann::json{{"skipped", "no CUDA device"}}.dump().c_str());
    return 0;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  nlohmann::json runs = nlohmann::json::array();
  struct Shape {
    int B, T, H, hd;
  };
  for (const Shape& sh : {Shape{8, 1024, 12, 64}, Shape{4, 2048, 16, 128}}) {
    nlohmann::json causal = bench_shape(sh.B, sh.T, sh.H, sh.hd, 0);
    nlohmann::json window = bench_shape(sh.B, sh.T, sh.H, sh.hd, sh.T / 4);
    runs.push_back({{"causal", causal},
                    {"window", window},
                    {"window_speedup", causal["fwd_bwd_ms"].get<double>() / window["fwd_bwd_ms"].get<double>()}});
  }
  std::printf("%s\n", nlohmann::json{{"bench", "flash_attention"}, {"device", prop.name}, {"runs", runs}}.dump(2).c_str());
  return 0;
}

#else  // built without CUDA

int main() {
  std::printf("%s\n", nlohmann::json{{"skipped", "built without CUDA"}}.dump().c_str());
  return 0;
}

#endif
