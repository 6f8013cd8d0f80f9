// No checkpoint ever holds a non-finite value (issue 10, item 3):
//  * first_non_finite finds the first inf/NaN wherever it sits (against a plain loop);
//  * the checkpointer refuses to save a parameter or moment that is inf/NaN, naming the tensor and the step, and
//    writes nothing of that checkpoint (root/latest keeps naming the last good one);
//  * in a parallel run, one rank's non-finite value makes every rank refuse (gathered and sharded saves), with no
//    hang and no manifest committed over a shard another rank refused;
//  * a run whose update overflows the weights stops at that step (the weight check, or the validation loss) with
//    no checkpoint written; a diverging run (optim.lr = 1e6) leaves only finite checkpoints; a non-finite
//    hyperparameter (optim.weight_decay = inf) is refused before anything runs, through the binary too.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/comm_fork_util.h"
#include "megatrain/ckpt/checkpoint.h"
#include "megatrain/ckpt/config_json.h"
#include "megatrain/comm/mesh.h"
#include "megatrain/comm/store.h"
#include "megatrain/data/loader.h"
#include "megatrain/model/gpt.h"
#include "megatrain/optim/optimizer.h"
#include "megatrain/train/checkpointing.h"
#include "megatrain/train/finite.h"
#include "megatrain/train/trainer.h"
#include "support/files.h"
#include "support/megatrain.h"
#include "support/small_job.h"
#include "support/test_util.h"

using namespace mt;
namespace fs = std::filesystem;
using mt::test::error_of;

namespace {

using mt::test::fresh_dir;
using mt::test::kMegatrain;
const std::string& kData = mt::test::kGpt2Brown;

using mt::test::has;

TEST(FiniteScan, FindsTheFirstNonFiniteValueAnywhere) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const int64_t n = 3 * (1 << 14) + 17;  // several scan blocks and a partial one
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 101) * 1e30f - 5e31f;  // large but finite
  EXPECT_EQ(first_non_finite(x.data(), n), -1);
  EXPECT_EQ(first_non_finite(x.data(), 0), -1);
  for (int64_t at : {int64_t{0}, int64_t{1} << 14, (int64_t{1} << 14) - 1, n - 1, int64_t{40000}}) {
    for (float bad : {inf, -inf, nan}) {
      std::vector<float> y = x;
      y[at] = bad;
      if (at + 7 < n) y[at + 7] = nan;  // a later one does not hide the first
      int64_t want = -1;
      for (int64_t i = 0; i < n && want < 0; ++i)
        if (!std::isfinite(y[i])) want = i;
      EXPECT_EQ(first_non_finite(y.data(), n), want) << "at " << at << " value " << bad;
    }
  }
  x[5] = std::numeric_limits<float>::max();
  x[6] = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(first_non_finite(x.data(), n), -1);
}

// A tiny model's run config, checkpoints under root.
RunConfig tiny_config(const std::string& root, std::vector<std::string> extra = {}) {
  std::vector<std::string> ov = {"--model.n_layer=1",     "--model.d_model=16",     "--model.n_head=2",
                                 "--model.vocab_size=64", "--model.max_seq_len=16", "--data.seq_len=8",
                                 "--data.batch_size=2",   "--ckpt.dir=" + root,     "--ckpt.keep_last=10"};
  ov.insert(ov.end(), extra.begin(), extra.end());
  return parse_run_config("", "test", ov);
}

TEST(CheckpointFinite, ANonFiniteParameterOrMomentIsNeverSaved) {
  const std::string root = fresh_dir("mt_finite_single");
  const RunConfig cfg = tiny_config(root);
  auto ops = make_cpu_ops();
  GPT model(cfg.model, *ops);
  model.init_weights(1);
  Optimizer opt(cfg.optim, model.params(), *ops);
  TrainCheckpointer ck(cfg, model, &opt, nullptr, nullptr, -1);
  const LoaderState pos;
  const std::string good = ck.save(1, pos, SaveWhy::Final);
  ASSERT_EQ(*find_latest(root), good);

  const int w = model.params().index("h.0.mlp.c_fc.weight");
  float* p = model.params().param(w).f32();
  const float saved = p[5];
  p[5] = INFINITY;
  std::string msg = error_of([&] { ck.save(2, pos, SaveWhy::Final); });
  EXPECT_TRUE(has(msg, "step 2") && has(msg, "parameter 'h.0.mlp.c_fc.weight'") && has(msg, "element 5: inf") &&
              has(msg, "not written"))
      << msg;
  p[5] = saved;
  opt.v(w).f32()[3] = NAN;  // the moments are checked as well
  msg = error_of([&] { ck.save(3, pos, SaveWhy::Final); });
  EXPECT_TRUE(has(msg, "step 3") && has(msg, "moment v of 'h.0.mlp.c_fc.weight'") && has(msg, "element 3: nan")) << msg;

  // Nothing of steps 2 and 3 exists, not even a staging directory, and latest still names step 1.
  EXPECT_EQ(*find_latest(root), good);
  std::vector<std::string> entries;
  for (auto& e : fs::directory_iterator(root)) entries.push_back(e.path().filename().string());
  std::sort(entries.begin(), entries.end());
  EXPECT_EQ(entries, (std::vector<std::string>{"latest", "step_00000001"}));
}

// Two data-parallel replicas; only rank 1's copy of one parameter is inf. Every rank must refuse (rank 0, which
// writes the gathered checkpoint or commits the sharded one, included), quickly: the groups' 20 s timeout would
// turn a rank waiting for a peer that gave up into a timeout error instead of the expected message.
void one_rank_diverged(bool sharded) {
  SCOPED_TRACE(sharded ? "sharded" : "gathered");
  const std::string root = fresh_dir(sharded ? "mt_finite_dp_sharded" : "mt_finite_dp_gathered");
  mt::test::ScratchDir store_dir;
  const std::string report = comm_test::run_procs(2, [&](int rank) {
    omp_set_num_threads(1);
    const RunConfig cfg = tiny_config(root,
                                      {"--parallel.dp=2", sharded ? "--ckpt.sharded=true" : "--ckpt.sharded=false"});
    auto store = make_file_store(store_dir.path);
    GroupOptions go;
    go.timeout = Millis(20000);
    DeviceMesh mesh(*store, {2, 1, 1}, rank, go);
    auto ops = make_cpu_ops();
    GPT model(cfg.model, *ops);
    model.init_weights(1);
    Optimizer opt(cfg.optim, model.params(), *ops);
    TrainCheckpointer ck(cfg, model, &opt, nullptr, &mesh, -1);
    ck.save(1, LoaderState{}, SaveWhy::Final);  // a good one first
    if (rank == 1) model.params().param("wte.weight").f32()[7] = -INFINITY;
    ck.save(2, LoaderState{}, SaveWhy::Final);
  });
  // Both ranks failed with the refusal, not a timeout or a crash.
  EXPECT_TRUE(has(report, "rank 0: step 2: rank(s) 1 hold non-finite values")) << report;
  EXPECT_TRUE(has(report, "rank 1: step 2: rank 1: parameter 'wte.weight' (element 7: -inf)")) << report;
  EXPECT_FALSE(has(report, "still running") || has(report, "signal") || has(report, "imeout")) << report;
  EXPECT_EQ(*find_latest(root), root + "/step_00000001");
  EXPECT_FALSE(fs::exists(root + "/step_00000002"));
  Checkpoint::load(root);  // the good one is whole
}

TEST(CheckpointFinite, OneRanksNonFiniteValueMakesEveryRankRefuseGathered) { one_rank_diverged(false); }
TEST(CheckpointFinite, OneRanksNonFiniteValueMakesEveryRankRefuseSharded) { one_rank_diverged(true); }

// Every float of every tensor of the checkpoint at dir is finite.
void expect_all_finite(const std::string& dir) {
  Checkpoint c = Checkpoint::load(dir);
  for (const std::string& n : c.tensor_names()) {
    const TensorData& t = c.get(n);
    if (t.dtype != DType::F32) continue;
    EXPECT_EQ(first_non_finite(static_cast<const float*>(t.data), static_cast<int64_t>(t.nbytes / 4)), -1)
        << dir << ": " << n;
  }
}

// The small job on the GPT-2-tokenized Brown shards, two threads, a set peak; lr, warm-up and evaluation as the
// config's defaults.
RunConfig brown_run(const std::string& out, std::vector<std::string> extra) {
  return parse_run_config("", "test",
                          mt::test::SmallJob::gpt2(out)
                              .threads(2)
                              .set("train.peak_tflops", 1)
                              .unset("optim.lr")
                              .unset("optim.warmup_steps")
                              .unset("train.eval_every")
                              .with(extra)
                              .args());
}

// A step whose loss and gradient norm are finite but whose update overflows the weights: a huge (finite, so
// allowed) weight decay times weights of ~10 is inf. Before, the run exited 0 and its final checkpoint held inf
// (and with validation on, printed "val loss -nan" and saved it anyway). Now the run stops at step 1 naming the
// problem, and no checkpoint exists. Checked with and without validation at the step.
TEST(CheckpointFinite, AnUpdateThatOverflowsStopsTheRunBeforeItsCheckpoint) {
  mt::test::prepare_gpt2_brown();
  for (const bool eval : {false, true}) {
    SCOPED_TRACE(eval ? "with validation" : "without validation");
    const std::string out = fresh_dir("mt_finite_overflow");
    const std::string msg = error_of([&] {
      run_training(brown_run(out, {"--optim.lr=1", "--optim.schedule=constant", "--optim.weight_decay=3e38",
                                   "--model.init_std=10", "--train.steps=1", "--train.eval_batches=1",
                                   eval ? "--train.eval_every=1" : "--train.eval_every=0"}));
    });
    if (eval)
      EXPECT_TRUE(has(msg, "step 1: the validation loss is not finite") && has(msg, "diverged")) << msg;
    else
      EXPECT_TRUE(has(msg, "step 1: parameter '") && has(msg, "holds a non-finite value")) << msg;
    EXPECT_FALSE(find_latest(out + "/ckpt").has_value());
    EXPECT_TRUE(list_checkpoints(out + "/ckpt").empty());
  }
}

// The issue's own case, optim.lr = 1e6 with a checkpoint every step: it must stop with a non-finite error, and
// every checkpoint it leaves (latest included) must hold finite values only. (Here the loss or gradient norm goes
// non-finite one step after the weights explode, which the trainer already caught, so this guards the behaviour
// rather than reproducing a failure; the test above reproduces one.)
TEST(CheckpointFinite, ADivergingRunStopsAndLeavesNoNonFiniteCheckpoint) {
  mt::test::prepare_gpt2_brown();
  const std::string out = fresh_dir("mt_finite_lr1e6");
  const std::string msg = error_of([&] {
    run_training(brown_run(out, {"--optim.lr=1e6", "--train.steps=30", "--ckpt.every=1", "--train.eval_batches=1",
                                 "--train.eval_every=1"}));
  });
  EXPECT_TRUE(has(msg, "non-finite") || has(msg, "validation loss is not finite")) << msg;
  for (const CheckpointEntry& c : list_checkpoints(out + "/ckpt")) expect_all_finite(c.dir);
}

// The case through the binary, as a user meets it: refused at config load, naming the key and the range,
// exit non-zero, nothing written.
TEST(CheckpointFinite, AnInfiniteWeightDecayIsRefusedAtConfigLoad) {
  const std::string out = fresh_dir("mt_finite_wd_inf");
  const std::string log = out + ".log";
  const std::string cmd = kMegatrain + " train --data.dir=" + kData + " --train.out_dir=" + out +
                          " --optim.weight_decay=inf --train.steps=1 > " + log + " 2>&1";
  EXPECT_NE(std::system(cmd.c_str()), 0);
  const std::string text = mt::test::slurp(log);
  EXPECT_TRUE(has(text, "optim.weight_decay = inf is out of range: it must be finite and >= 0")) << text;
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
