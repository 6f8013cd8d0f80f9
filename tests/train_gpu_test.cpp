// `megatrain train` on the CUDA backend (train.device = "cuda", bf16) against the same run on the CPU (fp32, the
// oracle): the loss curve tracks the CPU's, and a resumed GPU run continues where the checkpoint left off. Needs a
// GPU; skipped without one (ctest label `gpu`).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "megatrain/kernels/ops.h"
#include "megatrain/train/run_config.h"
#include "megatrain/train/trainer.h"
#include "test_util.h"

using namespace mt;
namespace fs = std::filesystem;

namespace {

const std::string kData = std::string(MT_BINARY_DIR) + "/test-data/brown";

RunConfig small(const std::string& out, const std::string& device, std::vector<std::string> extra = {}) {
  // head_dim 64 (the flash-attention kernel supports 64 and 128).
  std::vector<std::string> ov = {"--data.dir=" + kData, "--train.out_dir=" + out, "--model.n_layer=2",
                                 "--model.d_model=128", "--model.n_head=2", "--model.max_seq_len=128",
                                 "--data.seq_len=128", "--data.batch_size=8", "--optim.lr=3e-3",
                                 "--optim.warmup_steps=2", "--train.eval_every=0", "--sample.tokens=16",
                                 "--train.log_every=1000", "--train.device=" + device};
  ov.insert(ov.end(), extra.begin(), extra.end());
  return parse_run_config("", "test", ov);
}

std::vector<double> losses(const std::string& metrics) {
  std::vector<double> out;
  std::ifstream f(metrics);
  std::string line;
  while (std::getline(f, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["kind"] == "train") out.push_back(j["loss"].get<double>());
  }
  return out;
}

TEST(TrainGpu, TwentyStepsTrackTheCpuRun) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  mt::test::prepare_brown_once(std::string(MT_BINARY_DIR) + "/megatrain", kData);
  const std::string c = ::testing::TempDir() + "/mt_gpu_train_cpu", g = ::testing::TempDir() + "/mt_gpu_train_gpu";
  fs::remove_all(c);
  fs::remove_all(g);
  run_training(small(c, "cpu", {"--train.steps=20", "--ckpt.save_final=false"}));
  run_training(small(g, "cuda", {"--train.steps=20", "--ckpt.save_final=false"}));
  const std::vector<double> lc = losses(c + "/metrics.jsonl"), lg = losses(g + "/metrics.jsonl");
  ASSERT_EQ(lc.size(), 20u);
  ASSERT_EQ(lg.size(), 20u);
  // bf16 activations: ~0.4% per rounding, compounded over 2 layers and 20 steps; 3% of the loss is a loose bound
  // that a wrong gradient or optimizer step would still break within a few steps.
  for (size_t i = 0; i < lc.size(); ++i) EXPECT_NEAR(lg[i], lc[i], 0.03 * lc[i]) << "step " << i + 1;
  EXPECT_LT(lg.back(), lg.front() - 1.0);
}

TEST(TrainGpu, ResumeContinuesTheRun) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  mt::test::prepare_brown_once(std::string(MT_BINARY_DIR) + "/megatrain", kData);
  const std::string a = ::testing::TempDir() + "/mt_gpu_resume_a", b = ::testing::TempDir() + "/mt_gpu_resume_b";
  fs::remove_all(a);
  fs::remove_all(b);
  run_training(small(a, "cuda", {"--train.steps=8", "--ckpt.save_final=false"}));
  run_training(small(b, "cuda", {"--train.steps=8", "--ckpt.every=4", "--ckpt.save_final=false"}));
  fs::remove_all(b + "/metrics.jsonl");
  run_training(small(b, "cuda", {"--train.steps=8", "--ckpt.resume=" + b + "/ckpt/step_00000004"}));
  const std::vector<double> la = losses(a + "/metrics.jsonl"), lb = losses(b + "/metrics.jsonl");
  ASSERT_EQ(la.size(), 8u);
  ASSERT_EQ(lb.size(), 4u);
  // The embedding gradient uses float atomics on the GPU, so runs agree closely but not bit for bit.
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(lb[i], la[4 + i], 1e-3 * la[4 + i]) << "step " << 5 + i;
}

}  // namespace
