// Times the CUDA backend's GEMMs and memory-bound kernels at GPT-2 124M (C = 768) and 1.3B-class (C = 2048)
// shapes with N = B*T = 8192 rows, each next to a peer measured in the same run:
//   * GEMMs with a fused epilogue (matmul_forward with BIAS, matmul_gelu_forward with GELU_AUX_BIAS) against the
//     same cuBLASLt GEMM without epilogue followed by separate bias (and GeLU) kernels; reported in TFLOP/s;
//   * the weight gradients of matmul_backward (dw and dbias) with the bias sums in the GEMM's BGRADB epilogue
//     against the column-sum kernels, and against the GEMM without dbias; in ms;
//   * the MoE grouped GEMM (moe_grouped_matmul_forward and _backward) over E experts' row blocks of a random
//     routing, on the default lanes and on one stream, against one dense GEMM of the same total rows (the ceiling:
//     the same FLOPs in one launch); in TFLOP/s;
//   * layernorm_forward, layernorm_backward, add_layernorm_forward and cross_entropy in GB/s of compulsory traffic (each tensor read or
//     written once) against a device-to-device cudaMemcpy of 512 MiB (read + write).
// Each number is the median over repetitions of CUDA-event times on the op stream. Prints JSON.
//   bench_cuda_ops [--quick]     (--quick: fewer shapes and repetitions; for smoke runs)
#include <iostream>
#include <nlohmann/json.hpp>

#ifdef MT_HAVE_CUDA
#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "megatrain/core/bf16.h"
#include "megatrain/core/rng.h"
#include "megatrain/kernels/cuda/cuda_ops.h"
#include "megatrain/kernels/cuda/launch.h"

using namespace mt;
using nlohmann::json;

namespace {

// Median milliseconds of fn on stream s over reps runs (after one warm-up), from events around each run.
double median_ms(cudaStream_t s, const std::function<void()>& fn, int reps) {
  fn();
  cuda::check(cudaStreamSynchronize(s), "bench: cudaStreamSynchronize");
  cudaEvent_t a, b;
  cuda::check(cudaEventCreate(&a), "bench: cudaEventCreate");
  cuda::check(cudaEventCreate(&b), "bench: cudaEventCreate");
  std::vector<float> ms;
  for (int r = 0; r < reps; ++r) {
    cuda::check(cudaEventRecord(a, s), "bench: cudaEventRecord");
    fn();
    cuda::check(cudaEventRecord(b, s), "bench: cudaEventRecord");
    cuda::check(cudaEventSynchronize(b), "bench: cudaEventSynchronize");
    float t = 0;
    cuda::check(cudaEventElapsedTime(&t, a, b), "bench: cudaEventElapsedTime");
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Device memory that lives for the whole run, filled with uniform values in [-scale, scale] (bf16) or zeros.
struct DevTensors {
  CudaOps& ops;
  std::vector<Buffer> bufs;
  Tensor bf16(std::initializer_list<int64_t> shape, float scale, uint64_t seed) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    Buffer b = ops.alloc(static_cast<size_t>(n) * 2);
    Tensor t = b.view(shape, DType::BF16);
    if (scale > 0) {
      std::vector<uint16_t> h(static_cast<size_t>(n));
      Rng rng(seed);
      for (auto& x : h) x = float_to_bf16(scale * (rng.uniform() * 2 - 1));
      ops.to_device(t, h.data());
    }
    bufs.push_back(std::move(b));
    return t;
  }
  Tensor f32(std::initializer_list<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    Buffer b = ops.alloc(static_cast<size_t>(n) * 4);
    Tensor t = b.view(shape, DType::F32);
    bufs.push_back(std::move(b));
    return t;
  }
  Tensor i32(std::initializer_list<int64_t> shape, int32_t below, uint64_t seed) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    Buffer b = ops.alloc(static_cast<size_t>(n) * 4);
    Tensor t = b.view(shape, DType::I32);
    std::vector<int32_t> h(static_cast<size_t>(n));
    Rng rng(seed);
    for (auto& x : h) x = static_cast<int32_t>(rng.below(static_cast<uint64_t>(below)));
    ops.to_device(t, h.data());
    bufs.push_back(std::move(b));
    return t;
  }
};

struct GemmCase {
  const char* name;
  int64_t N, C, OC;
  bool gelu;  // the MLP up-projection: matmul_gelu_forward
};

// Expert offsets [E + 1] of A assignments dealt to E experts uniformly at random (the imbalance of a real router's
// early steps; a trained router is more even).
std::vector<int64_t> random_offsets(int64_t A, int64_t E, uint64_t seed) {
  std::vector<int64_t> off(static_cast<size_t>(E + 1), 0);
  Rng rng(seed);
  for (int64_t a = 0; a < A; ++a) ++off[static_cast<size_t>(rng.below(static_cast<uint64_t>(E))) + 1];
  for (int64_t e = 0; e < E; ++e) off[e + 1] += off[e];
  return off;
}

// The grouped GEMM at DeepSeekMoE 16B's expert widths (C 2048, expert width 1408) for N = 8192 tokens: its 64
// experts of top-6, and 8 experts of top-2 and top-1; forward and backward (din and dw), on the lanes and on one
// stream, with one dense GEMM of the same rows as the peer.
json bench_grouped(CudaOps& ops, bool quick, int reps) {
  struct Case {
    int64_t N, k, E, C, F;
  };
  std::vector<Case> cases = {{8192, 6, 64, 2048, 1408}, {8192, 2, 8, 2048, 1408}, {8192, 1, 8, 2048, 1408}};
  if (quick) cases = {{2048, 2, 8, 1024, 704}};
  const cudaStream_t s = ops.stream();
  json res = json::array();
  for (const Case& c : cases) {
    const int64_t A = c.N * c.k;
    const std::vector<int64_t> off = random_offsets(A, c.E, 42);
    DevTensors d{ops, {}};
    Tensor x = d.bf16({A, c.C}, 1.0f, 1), w = d.bf16({c.E, c.F, c.C}, 0.02f, 2), y = d.bf16({A, c.F}, 0, 0);
    Tensor dy = d.bf16({A, c.F}, 1.0f, 3), dx = d.bf16({A, c.C}, 0, 0), dw = d.f32({c.E, c.F, c.C});
    Tensor w0 = w.slice0(0, 1).view({c.F, c.C}), dw0 = dw.slice0(0, 1).view({c.F, c.C});
    auto fwd = [&] { ops.moe_grouped_matmul_forward(y, x, w, off); };
    auto bwd = [&] { ops.moe_grouped_matmul_backward(dx, dw, dy, x, w, off, false); };
    const int lanes = ops.expert_lanes();
    const double fwd_ms = median_ms(s, fwd, reps), bwd_ms = median_ms(s, bwd, reps);
    ops.set_expert_lanes(1);
    const double fwd1_ms = median_ms(s, fwd, reps), bwd1_ms = median_ms(s, bwd, reps);
    ops.set_expert_lanes(lanes);
    const double dense_fwd_ms = median_ms(
        s, [&] { ops.matmul_forward(y, x, w0, Tensor{}); }, reps);
    const double dense_bwd_ms = median_ms(
        s, [&] { ops.matmul_backward(dx, dw0, Tensor{}, dy, x, w0, false, false); }, reps);
    int64_t largest = 0;
    for (int64_t e = 0; e < c.E; ++e) largest = std::max(largest, off[e + 1] - off[e]);
    const double flops = 2.0 * A * c.C * c.F;  // the forward; the backward is twice it
    auto tf = [&](double f, double ms) { return f / (ms * 1e-3) / 1e12; };
    res.push_back({{"tokens", c.N},
                   {"top_k", c.k},
                   {"experts", c.E},
                   {"C", c.C},
                   {"F", c.F},
                   {"rows", A},
                   {"largest_expert_rows", largest},
                   {"lanes", lanes},
                   {"forward_tflops", tf(flops, fwd_ms)},
                   {"forward_one_stream_tflops", tf(flops, fwd1_ms)},
                   {"forward_dense_tflops", tf(flops, dense_fwd_ms)},
                   {"backward_tflops", tf(2 * flops, bwd_ms)},
                   {"backward_one_stream_tflops", tf(2 * flops, bwd1_ms)},
                   {"backward_dense_tflops", tf(2 * flops, dense_bwd_ms)}});
  }
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  if (!cuda_available()) {
    std::cout << json{{"skipped", "no CUDA device"}}.dump() << "\n";
    return 0;
  }
  try {
    CudaOps ops;
    const cudaStream_t s = ops.stream();
    const int reps = quick ? 5 : 30;
    cudaDeviceProp prop{};
    cuda::check(cudaGetDeviceProperties(&prop, ops.device_id()), "bench: cudaGetDeviceProperties");
    json out;
    out["device"] = prop.name;
    out["reps"] = reps;

    // ---- memcpy peer ----
    DevTensors mem{ops, {}};
    const int64_t copy_elems = int64_t{256} << 20;  // 256 Mi bf16 = 512 MiB
    Tensor csrc = mem.bf16({copy_elems}, 0, 0), cdst = mem.bf16({copy_elems}, 0, 0);
    const double copy_ms = median_ms(
        s, [&] { ops.copy(cdst, csrc); }, reps);
    const double memcpy_gbps = 2.0 * copy_elems * 2 / (copy_ms * 1e-3) / 1e9;
    out["memcpy_gbps"] = memcpy_gbps;
    mem.bufs.clear();

    // ---- GEMMs ----
    std::vector<GemmCase> cases = {
        {"gpt2-124m qkv", 8192, 768, 2304, false},       {"gpt2-124m attn proj", 8192, 768, 768, false},
        {"gpt2-124m fc (gelu)", 8192, 768, 3072, true},  {"gpt2-124m fc proj", 8192, 3072, 768, false},
        {"gpt2-124m lm head", 8192, 768, 50304, false},  {"gpt2-1.3b qkv", 8192, 2048, 6144, false},
        {"gpt2-1.3b fc (gelu)", 8192, 2048, 8192, true}, {"gpt2-1.3b fc proj", 8192, 8192, 2048, false},
    };
    if (quick) cases.resize(3);
    json gemms = json::array();
    for (const GemmCase& g : cases) {
      DevTensors d{ops, {}};
      Tensor x = d.bf16({g.N, g.C}, 1.0f, 1), w = d.bf16({g.OC, g.C}, 0.02f, 2), b = d.bf16({g.OC}, 0.02f, 3);
      Tensor o = d.bf16({g.N, g.OC}, 0, 0);
      Tensor pre = g.gelu ? d.bf16({g.N, g.OC}, 0, 0) : Tensor{};
      auto* ob = static_cast<cuda::bf16*>(o.ptr);
      auto* pb = static_cast<cuda::bf16*>(pre.ptr);
      const auto* bb = static_cast<const cuda::bf16*>(b.ptr);
      double fused_ms, unfused_ms;
      if (g.gelu) {
        fused_ms = median_ms(
            s, [&] { ops.matmul_gelu_forward(o, pre, x, w, b); }, reps);
        unfused_ms = median_ms(
            s,
            [&] {
              ops.matmul_forward(pre, x, w, Tensor{});
              cuda::add_bias_rows(s, pb, bb, g.N, g.OC);
              cuda::gelu_forward(s, ob, pb, g.N * g.OC);
            },
            reps);
      } else {
        fused_ms = median_ms(
            s, [&] { ops.matmul_forward(o, x, w, b); }, reps);
        unfused_ms = median_ms(
            s,
            [&] {
              ops.matmul_forward(o, x, w, Tensor{});
              cuda::add_bias_rows(s, ob, bb, g.N, g.OC);
            },
            reps);
      }
      const double flops = 2.0 * g.N * g.C * g.OC;
      gemms.push_back({{"name", g.name},
                       {"N", g.N},
                       {"C", g.C},
                       {"OC", g.OC},
                       {"fused_tflops", flops / (fused_ms * 1e-3) / 1e12},
                       {"unfused_tflops", flops / (unfused_ms * 1e-3) / 1e12},
                       {"fused_speedup", unfused_ms / fused_ms}});
    }
    out["gemm"] = gemms;

    // ---- weight gradients: dw and dbias of matmul_backward, the bias sums in the GEMM's BGRADB epilogue against
    // the column-sum kernels after the GEMM, with the GEMM alone (no dbias) as the floor both approach. ----
    json wgrads = json::array();
    for (const GemmCase& g : cases) {
      if (g.OC > 8192) continue;  // the lm head has no bias
      DevTensors d{ops, {}};
      Tensor x = d.bf16({g.N, g.C}, 1.0f, 1), w = d.bf16({g.OC, g.C}, 0.02f, 2), dy = d.bf16({g.N, g.OC}, 1.0f, 3);
      Tensor dw = d.f32({g.OC, g.C}), db = d.f32({g.OC});
      const int64_t before = ops.fused_bias_grads();
      ops.set_fuse_bias_grads(true);
      const double fused_ms = median_ms(
          s, [&] { ops.matmul_backward(Tensor{}, dw, db, dy, x, w, false, false); }, reps);
      const bool ran_fused = ops.fused_bias_grads() > before;
      ops.set_fuse_bias_grads(false);
      const double kernels_ms = median_ms(
          s, [&] { ops.matmul_backward(Tensor{}, dw, db, dy, x, w, false, false); }, reps);
      ops.set_fuse_bias_grads(true);
      const double dw_ms = median_ms(
          s, [&] { ops.matmul_backward(Tensor{}, dw, Tensor{}, dy, x, w, false, false); }, reps);
      wgrads.push_back({{"name", g.name},
                        {"N", g.N},
                        {"C", g.C},
                        {"OC", g.OC},
                        {"bgradb_accepted", ran_fused},
                        {"fused_ms", fused_ms},
                        {"column_sum_kernels_ms", kernels_ms},
                        {"dw_only_ms", dw_ms},
                        {"fused_speedup", kernels_ms / fused_ms}});
    }
    out["weight_grads"] = wgrads;

    out["moe_grouped_gemm"] = bench_grouped(ops, quick, reps);

    // ---- memory-bound kernels ----
    json mb = json::array();
    const int64_t N = 8192;
    for (int64_t C : {int64_t{768}, int64_t{2048}}) {
      DevTensors d{ops, {}};
      Tensor x = d.bf16({N, C}, 1.0f, 4), r = d.bf16({N, C}, 1.0f, 5), w = d.bf16({C}, 1.0f, 6),
             b = d.bf16({C}, 0.1f, 7), o = d.bf16({N, C}, 0, 0);
      Tensor mean = d.f32({N}), rstd = d.f32({N});
      const double ln_ms = median_ms(
          s, [&] { ops.layernorm_forward(o, mean, rstd, x, w, b, 1e-5f); }, reps);
      const double ln_bytes = 2.0 * N * C * 2 + 8.0 * N;  // read x, write out, write mean + rstd
      // res = x + r (res aliases x: the benchmark keeps adding, values stay finite for 30 reps of unit noise)
      const double add_ms = median_ms(
          s, [&] { ops.add_layernorm_forward(x, o, mean, rstd, x, r, w, b, 1e-5f, false); }, reps);
      const double add_bytes = 4.0 * N * C * 2 + 8.0 * N;  // read a, b; write res, out
      // The backward: dinp += (read and written), dout and x read, dw/db through the partial rows (G * 2C floats,
      // not counted).
      Tensor dout = d.bf16({N, C}, 1.0f, 10), dinp = d.bf16({N, C}, 0, 0), dw = d.f32({C}), db = d.f32({C});
      const double lnb_ms = median_ms(
          s, [&] { ops.layernorm_backward(dinp, dw, db, dout, x, w, mean, rstd, false); }, reps);
      const double lnb_bytes = 4.0 * N * C * 2 + 8.0 * N;
      mb.push_back({{"op", "layernorm_backward"},
                    {"N", N},
                    {"C", C},
                    {"gbps", lnb_bytes / (lnb_ms * 1e-3) / 1e9},
                    {"fraction_of_memcpy", lnb_bytes / (lnb_ms * 1e-3) / 1e9 / memcpy_gbps}});
      mb.push_back({{"op", "layernorm_forward"},
                    {"N", N},
                    {"C", C},
                    {"gbps", ln_bytes / (ln_ms * 1e-3) / 1e9},
                    {"fraction_of_memcpy", ln_bytes / (ln_ms * 1e-3) / 1e9 / memcpy_gbps}});
      mb.push_back({{"op", "add_layernorm_forward"},
                    {"N", N},
                    {"C", C},
                    {"gbps", add_bytes / (add_ms * 1e-3) / 1e9},
                    {"fraction_of_memcpy", add_bytes / (add_ms * 1e-3) / 1e9 / memcpy_gbps}});
    }
    {
      const int64_t Vp = 50304, Nce = quick ? 1024 : 8192;
      const int V = 50257;
      DevTensors d{ops, {}};
      Tensor logits = d.bf16({Nce, Vp}, 4.0f, 8), tgt = d.i32({Nce}, V, 9), losses = d.f32({Nce});
      // After the first run the logits hold gradients; the work per run is the same.
      const double ce_ms = median_ms(
          s, [&] { ops.cross_entropy(losses, logits, tgt, V, 1.0f / Nce, true); }, reps);
      const double ce_bytes = 2.0 * Nce * Vp * 2;  // logits read once, dlogits written once
      mb.push_back({{"op", "cross_entropy (write_grad)"},
                    {"N", Nce},
                    {"Vp", Vp},
                    {"gbps", ce_bytes / (ce_ms * 1e-3) / 1e9},
                    {"fraction_of_memcpy", ce_bytes / (ce_ms * 1e-3) / 1e9 / memcpy_gbps}});
    }
    out["memory_bound"] = mb;
    std::cout << out.dump(2) << "\n";
  } catch (const std::exception& e) {
    std::cout << json{{"error", e.what()}}.dump() << "\n";
    return 1;
  }
  return 0;
}

#else  // built without CUDA

int main() {
  std::cout << nlohmann::json{{"skipped", "no CUDA"}}.dump() << "\n";
  return 0;
}

#endif
