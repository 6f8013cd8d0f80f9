// The GPT on the CUDA backend (bf16 compute, fp32 master weights) against the same GPT on the CPU backend (fp32, the
// oracle): gradients after one step, and 20 training steps whose loss curve must track the CPU's. Needs a GPU;
// skipped without one (ctest label `gpu`).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "megatrain/core/rng.h"
#include "megatrain/model/gpt.h"
#include "megatrain/optim/optimizer.h"

namespace mt {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

ModelConfig small_config(const std::string& variant) {
  ModelConfig c;
  c.vocab_size = 1000;
  c.n_layer = 2;
  c.n_head = 4;
  c.d_model = 256;  // head_dim 64: a size the flash-attention kernel supports
  c.max_seq_len = 128;
  if (variant == "parallel_window") {
    c.block = BlockKind::Parallel;
    c.window = 32;
  } else if (variant == "llama") {
    c.norm = NormKind::RmsNorm, c.mlp = MlpKind::SwiGlu, c.pos = PosKind::Rope, c.n_kv_head = 2, c.bias = false;
    c.tied_embeddings = false;
  } else if (variant == "recompute") {
    c.recompute = {true, false};
  } else if (variant == "rebuild") {  // the norm and GeLU outputs rebuilt in backward (ModelConfig)
    c.recompute_norm = true;
    c.recompute_act = true;
  }
  return c;
}

struct Batch {
  std::vector<int32_t> x, y;
};

Batch make_batch(const ModelConfig& c, int B, int T, uint64_t seed) {
  // A learnable pattern (each token predicts the next of a repeating sequence) so the loss visibly falls.
  Rng r(seed);
  Batch b;
  for (int i = 0; i < B; ++i) {
    const int start = static_cast<int>(r.below(c.vocab_size));
    for (int t = 0; t <= T; ++t) {
      const int32_t tok = static_cast<int32_t>((start + 7 * t) % 97);
      if (t < T) b.x.push_back(tok);
      if (t > 0) b.y.push_back(tok);
    }
  }
  return b;
}

std::vector<float> download(Ops& ops, Tensor t) {
  std::vector<float> h(static_cast<size_t>(t.numel()));
  ops.to_host(h.data(), t);
  return h;
}

double rel_err(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// The parameter: the model variant and the attention that runs on the GPU (our flash kernels or cuDNN's).
class GptGpu : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {
 protected:
  std::unique_ptr<Ops> gpu_ops() const { return make_cuda_ops(-1, CudaOptions{std::get<1>(GetParam())}); }
};

#define SKIP_WITHOUT_GPU_OR_CUDNN()                                                    \
  SKIP_WITHOUT_GPU();                                                                  \
  if (std::get<1>(GetParam()) == "cudnn" && resolve_cuda_attention("auto") != "cudnn") \
  GTEST_SKIP() << "built without cuDNN"

// One forward/backward from identical fp32 weights: the loss within bf16 tolerance, and every parameter gradient
// within 5% relative (L2 over the tensor; bf16 activations carry ~0.4% error per rounding, compounded over layers).
TEST_P(GptGpu, GradientsMatchCpu) {
  SKIP_WITHOUT_GPU_OR_CUDNN();
  const ModelConfig cfg = small_config(std::get<0>(GetParam()));
  auto cpu = make_cpu_ops();
  auto gpu = gpu_ops();
  GPT a(cfg, *cpu), b(cfg, *gpu);
  a.init_weights(11);
  b.init_weights(11);
  const int B = 4, T = 128;
  Batch d = make_batch(cfg, B, T, 5);
  const float la = a.forward(d.x.data(), d.y.data(), B, T, true);
  a.backward();
  const float lb = b.forward(d.x.data(), d.y.data(), B, T, true);
  b.backward();
  EXPECT_NEAR(lb, la, 2e-2 * std::abs(la));
  for (size_t i = 0; i < a.params().size(); ++i) {
    const int k = static_cast<int>(i);
    const std::string& name = a.params().info(k).name;
    auto ga = download(*cpu, a.params().grad(k)), gb = download(*gpu, b.params().grad(k));
    double ref = 0;
    for (float v : ga) ref += double(v) * v;
    if (ref < 1e-20) continue;  // e.g. the attention key bias: mathematically zero gradient
    EXPECT_LT(rel_err(gb, ga), 5e-2) << name;
  }
}

// 20 AdamW steps: the bf16 loss curve tracks the fp32 one within 3% at every step, and both fall.
TEST_P(GptGpu, TwentyStepsTrackCpuLossCurve) {
  SKIP_WITHOUT_GPU_OR_CUDNN();
  const ModelConfig cfg = small_config(std::get<0>(GetParam()));
  auto cpu = make_cpu_ops();
  auto gpu = gpu_ops();
  GPT a(cfg, *cpu), b(cfg, *gpu);
  a.init_weights(3);
  b.init_weights(3);
  OptimConfig oc;
  oc.lr = 1e-3f;
  Optimizer oa(oc, a.params(), *cpu), ob(oc, b.params(), *gpu);
  const int B = 4, T = 128;
  std::vector<float> la, lb;
  for (int s = 1; s <= 20; ++s) {
    Batch d = make_batch(cfg, B, T, 100 + s);
    for (auto [m, o, ops, out] : {std::tuple{&a, &oa, cpu.get(), &la}, std::tuple{&b, &ob, gpu.get(), &lb}}) {
      m->params().zero_grads();
      out->push_back(m->forward(d.x.data(), d.y.data(), B, T, true));
      m->backward();
      const double norm = global_grad_norm(*ops, m->params());
      o->step(m->params(), oc.lr, norm > 1 ? static_cast<float>(1 / norm) : 1.0f, s);
    }
    EXPECT_NEAR(lb.back(), la.back(), 3e-2 * std::abs(la.back())) << "step " << s;
  }
  EXPECT_LT(lb.back(), 0.7 * lb.front());
  EXPECT_LT(la.back(), 0.7 * la.front());
}

INSTANTIATE_TEST_SUITE_P(Variants, GptGpu,
                         ::testing::Combine(::testing::Values("gpt2", "parallel_window", "llama", "recompute",
                                                              "rebuild"),
                                            ::testing::Values("flash", "cudnn")),
                         [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param); });

}  // namespace
}  // namespace mt
