// Training-step throughput of megatrain on one GPU (bf16 compute, fp32 master weights, AdamW), the megatrain side of
// bench/gpu_compare.sh (the PyTorch side is bench/torch_gpt.py with the same model, shapes and FLOP formula).
// Prints one JSON line: model, B, T, tokens/s (median over the timed steps), step ms, MFU against a stated peak
// (989 TFLOP/s: H100 SXM dense bf16; the same figure is used for H200), and the GPU memory the run took. For the MoE
// preset the FLOPs are the active parameters' (ModelConfig::flops_per_token: the router and the top-k experts).
// Usage: bench_gpu_train [--model gpt2-124m|gpt2-350m|gpt-1.3b|moe-1b] [--batch B] [--seq T] [--steps N] [--warmup N]
//                        [--block sequential|parallel] [--window W] [--recompute] [--recompute-act]
//                        [--recompute-norm] [--peak-tflops P]   (--recompute-act / --recompute-norm:
//                        ModelConfig::recompute_act / recompute_norm, the GeLU / norm outputs rebuilt in backward)
//                        [--attention auto|flash|cudnn]   (auto, the default: cuDNN's fused attention where built
//                        with cuDNN, else flash; flash: our kernels; cudnn: cuDNN's). The JSON names the one that ran.
//                        [--gemm-tuning N]   (time N of cuBLASLt's candidate algorithms per GEMM shape on its first
//                        call and keep the fastest; the JSON's gemm_tuned lists what each shape chose and the time
//                        it saved, gemm_tuning_saved_ms_per_step their sum over one step's calls)
//                        [--deterministic]   (CudaOptions::deterministic, train.deterministic: steps that repeat bit
//                        for bit; run with and without to measure what it costs)
//                        [--plan-memory]   (no GPU needed: what the run would allocate through the backend, from the
//                        same allocation code on the host, with bf16 activations; see plan_memory below)
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <cstdlib>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "megatrain/core/clock.h"
#include "megatrain/core/rng.h"
#include "megatrain/kernels/cpu/cpu_ops.h"
#include "megatrain/model/gpt.h"
#include "megatrain/optim/optimizer.h"

#ifdef MT_HAVE_CUDA
#include <cuda_runtime.h>

#include "megatrain/kernels/cuda/cuda_ops.h"
#endif

using namespace mt;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The presets of bench/torch_gpt.py (GPT-2 layout: learned positions, LayerNorm, GeLU, biases, tied embeddings).
bool preset(const std::string& name, ModelConfig& c, int& T) {
  if (name == "gpt2-124m") {
    c.n_layer = 12, c.d_model = 768, c.n_head = 12, T = 1024;
  } else if (name == "gpt2-350m") {
    c.n_layer = 24, c.d_model = 1024, c.n_head = 16, T = 1024;
  } else if (name == "gpt-1.3b") {
    c.n_layer = 24, c.d_model = 2048, c.n_head = 16, T = 2048;
  } else if (name == "moe-1b") {
    // megatrain's own (not a torch_gpt.py preset): a Mixtral-style MoE of 1.23B parameters, 0.26B of them active
    // per token. Per layer: attention 4 * 1024^2 = 4.19M; 16 SwiGLU experts of 3 * 1408 * 1024 = 4.33M each
    // (69.2M) and the router's 16 * 1024; 16 layers = 1.175B; the tied embedding 50257 * 1024 = 51.5M (plus norms).
    // Active: attention + 2 experts (8.65M) per layer = 206M, and the LM head's 51.5M.
    c.n_layer = 16, c.d_model = 1024, c.n_head = 16, T = 2048;
    c.norm = NormKind::RmsNorm, c.mlp = MlpKind::SwiGlu, c.pos = PosKind::Rope, c.bias = false;
    c.moe_experts = 16, c.moe_top_k = 2, c.moe_d_ff = 1408, c.moe_every = 1, c.moe_first_dense = 0;
    c.moe_aux_loss = 0.01f;
  } else {
    return false;
  }
  return true;
}

// The CUDA backend's allocation plan without a GPU: the model and the optimizer allocate everything up front through
// Ops::alloc (the figure bench runs report as allocated_gb), so building them over a backend with the CUDA dtypes
// (bf16 activations and compute copy, fp32 master weights, gradients and moments) gives the same bytes. Nothing is
// computed: alloc reserves lazily zeroed address space (untouched pages take no memory, so a 1.3B plan fits on a
// small host) and the ops that fill buffers at construction are no-ops. The CUDA backend's own workspaces (cuBLASLt,
// attention, reduction scratch) are outside Ops::alloc, in the measured figure and here alike.
class PlanOps final : public CpuOps {
 public:
  DType compute_dtype() const override { return DType::BF16; }
  Buffer alloc(size_t bytes) override {
    void* p = mmap(nullptr, bytes > 0 ? bytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) fail("plan-memory: cannot reserve {} bytes of address space", bytes);
    reserved_ += bytes;
    return Buffer(p, bytes, Device::CPU, nullptr);  // never released: the process ends after the plan
  }
  size_t allocated_bytes() const override { return reserved_; }
  void zero(Tensor) override {}  // the reserved pages are zero already
  void copy(Tensor, Tensor) override {}
  void convert(Tensor, Tensor) override {}

 private:
  size_t reserved_ = 0;
};

nlohmann::json plan_memory(const ModelConfig& cfg, int B, int T) {
  PlanOps ops;
  GPT model(cfg, ops);
  const size_t model_bytes = ops.allocated_bytes();  // master weights, gradients, the bf16 compute copy
  OptimConfig oc;
  Optimizer opt(oc, model.params(), ops);
  const size_t optim_bytes = ops.allocated_bytes() - model_bytes;
  model.reserve_activation_slots(0, 1, B, T);  // what the first forward plans: activations and scratch
  const size_t act_bytes = ops.allocated_bytes() - model_bytes - optim_bytes;
  return {{"planned_bytes", ops.allocated_bytes()},
          {"planned_gb", double(ops.allocated_bytes()) / 1e9},
          {"params_grads_compute_copy_gb", double(model_bytes) / 1e9},
          {"optimizer_gb", double(optim_bytes) / 1e9},
          {"activations_and_scratch_gb", double(act_bytes) / 1e9}};
}

#ifdef MT_HAVE_CUDA
size_t gpu_used_bytes() {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return 0;
  return total_b - free_b;
}
std::string gpu_name() {
  cudaDeviceProp p{};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess) return "unknown";
  return p.name;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  std::string model_name = "gpt2-124m", block = "sequential", attention = "auto";
  int B = 8, T = 0, steps = 20, warmup = 3, window = 0, gemm_tuning = 0;
  bool recompute = false, recompute_act = false, recompute_norm = false, plan = false, deterministic = false;
  double peak_tflops = 989.0;
  CLI::App app{"bench_gpu_train: megatrain's training-step throughput on one GPU; prints one JSON line"};
  app.add_option("--model", model_name, "preset (bench/torch_gpt.py's)")
      ->check(CLI::IsMember({"gpt2-124m", "gpt2-350m", "gpt-1.3b", "moe-1b"}))
      ->capture_default_str();
  app.add_option("--batch", B, "sequences per step")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--seq", T, "tokens per sequence (0: the preset's)")->check(CLI::NonNegativeNumber);
  app.add_option("--steps", steps, "timed steps")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--block", block, "transformer block")
      ->check(CLI::IsMember({"sequential", "parallel"}))
      ->capture_default_str();
  app.add_option("--window", window, "sliding-window width (0: full causal)")->check(CLI::NonNegativeNumber);
  app.add_flag("--recompute", recompute, "recompute every layer in backward");
  app.add_flag("--recompute-act", recompute_act, "rebuild the GeLU output in backward");
  app.add_flag("--recompute-norm", recompute_norm, "rebuild the norms' outputs in backward");
  app.add_flag("--plan-memory", plan, "print what a run would allocate, without a GPU");
  app.add_option("--peak-tflops", peak_tflops, "the GPU's dense bf16 peak, for MFU")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--attention", attention, "auto: cuDNN where built with it, else flash")
      ->check(CLI::IsMember({"auto", "flash", "cudnn"}))
      ->capture_default_str();
  app.add_option("--gemm-tuning", gemm_tuning, "candidate GEMM algorithms to time per shape (0: the heuristic's)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  app.add_flag("--deterministic", deterministic, "bit-for-bit repeatable steps (train.deterministic)");
  CLI11_PARSE(app, argc, argv);
  ModelConfig cfg;
  int preset_T = 0;
  preset(model_name, cfg, preset_T);  // the name was checked by CLI11
  if (T == 0) T = preset_T;
  cfg.max_seq_len = T;
  parse_kind("--block", block, cfg.block);
  cfg.window = window;
  if (recompute) cfg.recompute.assign(cfg.n_layer, true);
  cfg.recompute_act = recompute_act;
  cfg.recompute_norm = recompute_norm;
  nlohmann::json out = {{"benchmark", "train_step_gpu"},
                        {"framework", "megatrain"},
                        {"model", model_name},
                        {"B", B},
                        {"T", T},
                        {"block", block},
                        {"window", window},
                        {"recompute", recompute},
                        {"recompute_act", recompute_act},
                        {"recompute_norm", recompute_norm},
                        {"attention", resolve_cuda_attention(attention)},
                        {"gemm_tuning", gemm_tuning},
                        {"deterministic", deterministic}};
  if (plan) {
    try {
      out["benchmark"] = "memory_plan";
      out.update(plan_memory(cfg, B, T));
    } catch (const std::exception& e) {
      out["error"] = e.what();
      std::printf("%s\n", out.dump().c_str());
      return 1;
    }
    out.erase("attention");  // not a run: nothing is resolved
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  if (!cuda_available()) {
    out["skipped"] = "no CUDA device (or megatrain built without CUDA)";
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
#ifdef MT_HAVE_CUDA
  try {
    CudaOptions copt;
    copt.attention = attention;
    copt.gemm_tuning = gemm_tuning;
    copt.deterministic = deterministic;
    auto ops = make_cuda_ops(-1, copt);
    ops->synchronize();
    const size_t used_before = gpu_used_bytes();
    GPT model(cfg, *ops);
    model.init_weights(1);
    OptimConfig oc;
    Optimizer opt(oc, model.params(), *ops);

    Rng rng(3);
    std::vector<int32_t> x(size_t(B) * T), y(size_t(B) * T);
    for (auto& v : x) v = static_cast<int32_t>(rng.below(cfg.vocab_size));
    for (auto& v : y) v = static_cast<int32_t>(rng.below(cfg.vocab_size));
    std::vector<double> times;
    float loss = 0;
    for (int s = 0; s < warmup + steps; ++s) {
      ops->synchronize();
      const double t0 = now_seconds();
      model.params().begin_grads();
      loss = model.forward(x.data(), y.data(), B, T, true);
      model.backward();
      const double norm = global_grad_norm(*ops, model.params());
      opt.step(model.params(), 6e-4f, norm > 1 ? static_cast<float>(1 / norm) : 1.0f, s + 1);
      ops->synchronize();
      if (s >= warmup) times.push_back(now_seconds() - t0);
    }
    // One more step with every op timed by CUDA events (no syncs inside): where the time goes, by op name.
    ops->set_op_timing(true);
    model.params().begin_grads();
    model.forward(x.data(), y.data(), B, T, true);
    model.backward();
    opt.step(model.params(), 6e-4f, 1.0f, warmup + steps + 1);
    ops->synchronize();
    std::map<std::string, double> op_ms;
    double op_total = 0;
    for (const OpTiming& o : ops->take_op_timings()) {
      op_ms[o.name] += o.ms;
      op_total += o.ms;
    }
    ops->set_op_timing(false);
    const double t = median(times);
    const double tokens_per_s = double(B) * T / t;
    const double flops = cfg.flops_per_token(T) * tokens_per_s;
    out["gpu"] = gpu_name();
    out["params"] = cfg.num_params();
    if (cfg.moe()) out["active_flops_per_token"] = cfg.flops_per_token(T);  // MFU's numerator: active parameters
    out["tokens_per_s"] = tokens_per_s;
    out["step_ms"] = 1e3 * t;
    out["model_tflops"] = flops / 1e12;
    out["peak_tflops"] = peak_tflops;
    out["mfu"] = flops / (peak_tflops * 1e12);
    out["gpu_memory_gb"] = double(gpu_used_bytes() - used_before) / 1e9;  // device memory the run took
    out["allocated_gb"] = double(ops->allocated_bytes()) / 1e9;           // comparable to torch's peak allocated
    out["op_ms_one_step"] = op_ms;
    out["op_ms_total"] = op_total;
    out["final_loss"] = loss;
    if (gemm_tuning > 0) {
      // What tuning chose per distinct GEMM, and the time it saved over the heuristic's choice in one step: each
      // problem's saving times its calls per step (every step runs the same GEMMs).
      const double runs = warmup + steps + 1;
      double saved = 0;
      nlohmann::json tuned = nlohmann::json::array();
      for (const GemmTuned& g : static_cast<CudaOps&>(*ops).gemm_tuning_report()) {
        const double per_step = static_cast<double>(g.calls) / runs;
        nlohmann::json j = {{"problem", g.problem},
                            {"op", g.op},
                            {"candidates", g.candidates},
                            {"calls_per_step", per_step},
                            {"tuned", g.tuned}};
        if (g.tuned) {
          j.update({{"chosen", g.chosen}, {"heuristic_ms", g.heuristic_ms}, {"best_ms", g.best_ms}});
          saved += (g.heuristic_ms - g.best_ms) * per_step;
        } else {
          j["why_not"] = g.why_not;
        }
        tuned.push_back(j);
      }
      out["gemm_tuned"] = tuned;
      out["gemm_tuning_saved_ms_per_step"] = saved;
    }
  } catch (const std::exception& e) {
    out["error"] = e.what();
    std::printf("%s\n", out.dump().c_str());
    return 1;
  }
#endif
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
