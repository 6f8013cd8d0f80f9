// train.skip_steps (train/rank_guard.h): a skipped step's batch is read and dropped, nothing is trained at it, and
// the data position moves as if it had trained. Oracles, against undisturbed runs of the same config:
//  * steps before the skip are bit-identical; the skipped step has no train line; the next step differs (the
//    model missed an update);
//  * the loader position in the checkpoint after the skip equals the undisturbed run's at the same step (exactly
//    one step's batches were consumed), also with grad_accum > 1 and two data-parallel ranks;
//  * a run stopped before the skip and resumed with the same skip list equals the uninterrupted skipping run.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "support/comm_fork_util.h"
#include "megatrain/comm/mesh.h"
#include "megatrain/core/stop_request.h"
#include "megatrain/train/trainer.h"
#include "support/files.h"
#include "support/metrics.h"
#include "support/robust_util.h"

using namespace mt;
using namespace robust_test;
namespace fs = std::filesystem;

namespace {

RunConfig config(const std::string& out, std::vector<std::string> extra) {
  std::vector<std::string> ov = small_flags(out);
  ov.insert(ov.end(), {"--train.steps=5", "--ckpt.every=1", "--ckpt.keep_last=10"});
  ov.insert(ov.end(), extra.begin(), extra.end());
  return parse_run_config("", "test", ov);
}

std::string fresh(const std::string& name) {
  const std::string d = mt::test::temp_root() + name;
  fs::remove_all(d);
  return d;
}

// (epoch, cursor) recorded in the checkpoint of `step`.
std::pair<uint64_t, uint64_t> loader_at(const std::string& out, int step) {
  std::ifstream f(out + fmt::format("/ckpt/step_{:08d}/manifest.json", step));
  MT_CHECK(f.good(), "no checkpoint of step {} in {}", step, out);
  const auto j = nlohmann::json::parse(f);
  return {j["extra"]["data"]["epoch"].get<uint64_t>(), j["extra"]["data"]["cursor"].get<uint64_t>()};
}

std::vector<std::string> losses(const std::string& out) { return mt::test::step_losses(out + "/metrics.jsonl"); }

struct StopAt final : TrainObserver {
  int step;
  explicit StopAt(int s) : step(s) {}
  void on_step(const StepReport& r) override {
    if (r.stats.step == step) request_stop();
  }
};

TEST(SkipSteps, TheBatchIsDroppedAndTheDataPositionMovesAsIfTrained) {
  prepare();
  for (const int accum : {1, 2}) {
    SCOPED_TRACE(fmt::format("grad_accum {}", accum));
    const std::string a = fresh("mt_skip_plain"), b = fresh("mt_skip_skipped");
    const std::string acc = fmt::format("--train.grad_accum={}", accum);
    run_training(config(a, {acc}));
    ::testing::internal::CaptureStdout();
    run_training(config(b, {acc, "--train.skip_steps=[3]"}));
    const std::string printed = ::testing::internal::GetCapturedStdout();
    const auto la = losses(a), lb = losses(b);
    ASSERT_EQ(la.size(), 5u);
    ASSERT_EQ(lb.size(), 4u);
    EXPECT_EQ(lb[0], la[0]);
    EXPECT_EQ(lb[1], la[1]);
    EXPECT_EQ(lb[2].substr(0, 2), "4:");  // no line of step 3
    EXPECT_NE(lb[2], la[3]);              // step 4 trains a model that missed step 3's update
    // Exactly one step's batches were consumed at step 3: from step 4 on the position is the undisturbed run's.
    EXPECT_FALSE(fs::exists(b + "/ckpt/step_00000003"));
    for (int s : {2, 4, 5}) EXPECT_EQ(loader_at(b, s), loader_at(a, s)) << "step " << s;
    // Positions 4*2*accum.. of the window order (batch_size 4; steps 1 and 2 read 4*accum rows each).
    const int first = 8 * accum;
    std::string where = fmt::format("epoch 0, positions {}-{}", first, first + 3);
    if (accum == 2) where += fmt::format("; epoch 0, positions {}-{}", first + 4, first + 7);
    EXPECT_TRUE(has(printed, "skipping the batch of step 3 (data rows: " + where + " of the epoch's window order"))
        << printed;
  }
}

TEST(SkipSteps, AResumedRunWithTheSameSkipListEqualsTheUninterruptedOne) {
  prepare();
  const std::string whole = fresh("mt_skip_whole"), parts = fresh("mt_skip_parts");
  run_training(config(whole, {"--train.skip_steps=[3]"}));
  StopAt stop(2);
  TrainResult r = run_training(config(parts, {"--train.skip_steps=[3]"}), {}, {&stop});
  clear_stop_request();
  ASSERT_TRUE(r.stopped);
  ASSERT_EQ(r.last_step, 2);
  TrainResult r2 = run_training(config(parts, {"--train.skip_steps=[3]"}));
  EXPECT_EQ(r2.first_step, 3);
  EXPECT_EQ(losses(parts), losses(whole));
  EXPECT_EQ(loader_at(parts, 5), loader_at(whole, 5));
}

// Two data-parallel ranks (forked, in process): every rank skips at the same step, none waits for another, and
// the position after the skip is the undisturbed run's.
TEST(SkipSteps, EveryDataParallelRankSkipsTogether) {
  prepare();
  const std::string a = fresh("mt_skip_dp_plain"), b = fresh("mt_skip_dp_skipped");
  for (const std::string& out : {a, b}) {
    mt::test::ScratchDir store;
    const std::string report = comm_test::run_procs(
        2,
        [&](int rank) {
          ::setenv("RANK", std::to_string(rank).c_str(), 1);
          ::setenv("WORLD_SIZE", "2", 1);
          ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
          ::setenv("LOCAL_WORLD_SIZE", "2", 1);
          ::setenv("MEGATRAIN_STORE", ("file://" + store.path).c_str(), 1);
          std::vector<std::string> extra = {"--parallel.dp=2", "--data.batch_size=2", "--parallel.timeout_s=60"};
          if (out == b) extra.push_back("--train.skip_steps=[2,4]");
          run_training(config(out, extra));
        },
        300);
    ASSERT_EQ(report, "") << out;
  }
  const auto la = losses(a), lb = losses(b);
  ASSERT_EQ(lb.size(), 3u);
  EXPECT_EQ(lb[0], la[0]);
  EXPECT_EQ(lb[1].substr(0, 2), "3:");
  EXPECT_EQ(lb[2].substr(0, 2), "5:");
  for (int s : {1, 3, 5}) EXPECT_EQ(loader_at(b, s), loader_at(a, s)) << "step " << s;
}

}  // namespace
