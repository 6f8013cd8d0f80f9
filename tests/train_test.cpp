// End-to-end training on the real default corpus (Brown, GPT-2 BPE) with a very small model:
//  * the loss falls;
//  * resuming from a checkpoint gives bit-identical losses to an uninterrupted run (shuffle and prefetch on);
//  * a checkpoint from a different model config is refused with a message.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "megatrain/core/error.h"
#include "megatrain/train/trainer.h"
#include "test_util.h"

using namespace mt;
namespace fs = std::filesystem;

namespace {

const std::string kData = std::string(MT_BINARY_DIR) + "/test-data/brown";

void prepare_brown() { mt::test::prepare_brown_once(std::string(MT_BINARY_DIR) + "/megatrain", kData); }

RunConfig small(const std::string& out, std::vector<std::string> extra = {}) {
  std::vector<std::string> ov = {"--data.dir=" + kData, "--train.out_dir=" + out, "--model.n_layer=2",
                                 "--model.d_model=64", "--model.n_head=2", "--model.max_seq_len=64",
                                 "--data.seq_len=32", "--data.batch_size=4", "--optim.lr=3e-3",
                                 "--optim.warmup_steps=2", "--train.eval_every=0", "--sample.tokens=0",
                                 "--train.log_every=1000", "--train.threads=2"};
  ov.insert(ov.end(), extra.begin(), extra.end());
  return parse_run_config("", "test", ov);
}

std::vector<std::string> losses(const std::string& metrics) {
  std::vector<std::string> out;
  std::ifstream f(metrics);
  std::string line;
  while (std::getline(f, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["kind"] == "train") out.push_back(std::to_string(j["step"].get<int>()) + ":" + j["loss_exact"].get<std::string>());
  }
  return out;
}

TEST(Train, LossFallsOnTheDefaultCorpus) {
  prepare_brown();
  std::string out = ::testing::TempDir() + "/mt_train_falls";
  fs::remove_all(out);
  TrainResult r = run_training(small(out, {"--train.steps=80", "--ckpt.save_final=false", "--train.eval_every=80",
                                           "--train.eval_batches=4"}));
  EXPECT_EQ(r.last_step, 80);
  EXPECT_GT(r.first_loss, 10.0);  // ~ln(50257) at init
  // Unigram statistics alone take a model from ~10.8 to ~7.5 nats on Brown; require most of that.
  EXPECT_LT(r.last_loss, r.first_loss - 2.5) << "loss did not fall enough";
  EXPECT_LT(r.last_val_loss, 8.3);
}

TEST(Train, ResumeIsBitIdentical) {
  prepare_brown();
  std::string a = ::testing::TempDir() + "/mt_resume_a", b = ::testing::TempDir() + "/mt_resume_b";
  fs::remove_all(a);
  fs::remove_all(b);
  // Uninterrupted: 8 steps. Interrupted: 4 steps with a checkpoint, then a new process-like run resumes to 8.
  run_training(small(a, {"--train.steps=8"}));
  run_training(small(b, {"--train.steps=8", "--ckpt.every=4", "--ckpt.save_final=false"}));
  // Pretend the run died after step 4: drop everything after the step-4 checkpoint and resume.
  fs::remove_all(b + "/metrics.jsonl");
  run_training(small(b, {"--train.steps=8", "--ckpt.resume=" + b + "/ckpt/step_00000004"}));
  std::vector<std::string> la = losses(a + "/metrics.jsonl"), lb = losses(b + "/metrics.jsonl");
  ASSERT_EQ(la.size(), 8u);
  ASSERT_EQ(lb.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(la[4 + i], lb[i]);
}

TEST(Train, ResumeRefusesADifferentModel) {
  prepare_brown();
  std::string a = ::testing::TempDir() + "/mt_resume_mismatch";
  fs::remove_all(a);
  run_training(small(a, {"--train.steps=1"}));
  try {
    run_training(small(a, {"--train.steps=2", "--model.d_model=32"}));
    FAIL() << "resumed a checkpoint of another model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("different model config"), std::string::npos) << e.what();
  }
}

TEST(Train, MissingDataDirectoryIsAClearError) {
  try {
    run_training(small(::testing::TempDir() + "/mt_nodata", {"--data.dir=/nonexistent/shards"}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/shards"), std::string::npos) << e.what();
  }
}

}  // namespace
