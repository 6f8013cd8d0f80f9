// `megatrain train` of configs/moe-tiny.toml (a mixture-of-experts GPT, docs/moe.md) on the CUDA backend
// (train.device = "cuda", bf16) against the same run on the CPU (fp32, the oracle): the loss curve of 20 steps tracks
// the CPU's. Needs a GPU; skipped without one (ctest label `gpu`).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "megatrain/kernels/ops.h"
#include "megatrain/train/run_config.h"
#include "megatrain/train/trainer.h"
#include "support/megatrain.h"
#include "support/metrics.h"

using namespace mt;
namespace fs = std::filesystem;

namespace {

// The shipped config on the GPT-2-tokenized Brown shards the tests prepare, 20 steps, no checkpoint or sample.
RunConfig moe_tiny(const std::string& out, const std::string& device) {
  return load_run_config(MT_SOURCE_DIR "/configs/moe-tiny.toml",
                         {"data.dir=" + mt::test::kGpt2Brown, "train.out_dir=" + out, "train.steps=20",
                          "train.device=" + device, "train.eval_every=0", "ckpt.every=0", "ckpt.save_final=false",
                          "sample.tokens=0"});
}

TEST(TrainMoeGpu, TwentyStepsOfMoeTinyTrackTheCpuRun) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  mt::test::prepare_gpt2_brown();
  const std::string c = ::testing::TempDir() + "/mt_moe_gpu_cpu", g = ::testing::TempDir() + "/mt_moe_gpu_gpu";
  fs::remove_all(c);
  fs::remove_all(g);
  run_training(moe_tiny(c, "cpu"));
  run_training(moe_tiny(g, "cuda"));
  const std::vector<double> lc = mt::test::metric_series(c + "/metrics.jsonl", "loss");
  const std::vector<double> lg = mt::test::metric_series(g + "/metrics.jsonl", "loss");
  ASSERT_EQ(lc.size(), 20u);
  ASSERT_EQ(lg.size(), 20u);
  // train_gpu_test's bound: bf16 activations carry ~0.4% per rounding, compounded over the layers and 20 steps; 3%
  // of the loss is loose, and a wrong gradient, routing or bias step would still break it within a few steps. (A
  // token whose top-k choice sits within the logits' bf16 rounding of a tie may route differently on the GPU: a
  // handful of tokens per step, inside the same bound.)
  for (size_t i = 0; i < lc.size(); ++i) EXPECT_NEAR(lg[i], lc[i], 0.03 * lc[i]) << "step " << i + 1;
  EXPECT_LT(lg.back(), lg.front() - 1.0);
}

}  // namespace
