// End-to-end training on the real default corpus (Brown, GPT-2 BPE) with a very small model:
//  * the loss falls;
//  * resuming from a checkpoint gives bit-identical losses to an uninterrupted run (shuffle and prefetch on);
//  * a checkpoint from a different model config is refused with a message.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "megatrain/ckpt/checkpoint.h"
#include "megatrain/ckpt/safetensors.h"
#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"
#include "megatrain/data/shard.h"
#include "megatrain/tokenizer/tokenizer.h"
#include "megatrain/train/trainer.h"
#include "support/files.h"
#include "support/megatrain.h"
#include "support/metrics.h"
#include "support/small_job.h"
#include "support/test_util.h"

using namespace mt;
namespace fs = std::filesystem;

namespace {

const std::string& kData = mt::test::kGpt2Brown;
using mt::test::kMegatrain;
using mt::test::metrics_of;

void prepare_brown() { mt::test::prepare_gpt2_brown(); }

// The small job on the GPT-2-tokenized Brown shards, two threads.
RunConfig small(const std::string& out, std::vector<std::string> extra = {}) {
  return parse_run_config("", "test", mt::test::SmallJob::gpt2(out).threads(2).with(extra).args());
}

std::vector<std::string> losses(const std::string& metrics) { return mt::test::step_losses(metrics); }

// An empty TempDir()/name, with Brown prepared.
std::string fresh_base(const std::string& name) {
  prepare_brown();
  const std::string base = ::testing::TempDir() + "/" + name;
  fs::remove_all(base);
  fs::create_directories(base);
  return base;
}

// base/data holding copies of the named files of the prepared Brown directory (every file when none is named).
std::string copy_of_brown(const std::string& base, const std::vector<std::string>& files) {
  const std::string data = base + "/data";
  fs::create_directories(data);
  for (auto& e : fs::directory_iterator(kData)) {
    const std::string name = e.path().filename().string();
    if (files.empty() || std::find(files.begin(), files.end(), name) != files.end())
      fs::copy(e.path(), data + "/" + name);
  }
  return data;
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
  // Every train line reports the memory this rank allocated through its backend: planned up front, so the same
  // on every step, and at least the fp32 parameters, gradients and both AdamW moments (16 bytes a parameter).
  const std::vector<double> mem = mt::test::metric_series(out + "/metrics.jsonl", "memory_gb");
  ASSERT_EQ(mem.size(), 80u);
  const ModelConfig m = small(out).model;
  EXPECT_GE(mem.front() * 1e9, 16.0 * static_cast<double>(m.num_params()));
  for (double x : mem) EXPECT_EQ(x, mem.front());
}

// The closing sample decodes with the tokenizer the data was prepared with (data.dir/meta.json), unless
// sample.tokenizer names one; a recorded tokenizer that is gone means no sample, not a crash or the wrong decoding.
TEST(Train, SampleTokenizerComesFromTheDataOrTheConfig) {
  const std::string base = fresh_base("mt_sample_tok");
  const std::string data = copy_of_brown(base, {});
  const std::string recorded = nlohmann::json::parse(std::ifstream(data + "/meta.json"))["tokenizer"];
  ASSERT_TRUE(fs::exists(recorded + "/encoder.json")) << recorded;

  auto run = [&](const std::string& out, std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--data.dir=" + data, "--train.steps=1", "--ckpt.save_final=false", "--sample.tokens=4",
                               "--sample.prompt=The"});
    return run_training(small(base + "/" + out, extra));
  };
  EXPECT_EQ(run("a", {}).sample.rfind("The", 0), 0u);  // the recorded (GPT-2) tokenizer: a sample

  nlohmann::json meta = nlohmann::json::parse(std::ifstream(data + "/meta.json"));
  meta["tokenizer"] = base + "/gone";
  std::ofstream(data + "/meta.json") << meta.dump();
  EXPECT_EQ(run("b", {}).sample, "");  // recorded one missing: no sample
  EXPECT_EQ(run("c", {"--sample.tokenizer=" + recorded}).sample.rfind("The", 0), 0u);  // the configured one wins
  fs::remove_all(base);
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

// A blend of two sources (Brown's train split, and its val split as a second source's train split): a run resumed
// from a checkpoint gives the uninterrupted run's losses bit for bit, the checkpoint records each source's rows,
// and a resume under new weights says so and continues every source where it was.
TEST(Train, ABlendResumesBitIdenticallyAndSaysWhenItsWeightsChange) {
  const std::string base = fresh_base("mt_blend");
  const std::string web = copy_of_brown(base, {}), code = base + "/code";
  fs::create_directories(code);
  fs::copy(kData + "/val_000000.bin", code + "/train_000000.bin");
  {  // a val split of its own, unlike Brown's: a repeating run of ids
    const ShardHeader h = ShardReader(kData + "/val_000000.bin").header();
    ShardWriter w(code, "val", h.vocab_size, h.eot, 1 << 20);
    std::vector<int32_t> doc(2000);
    for (size_t i = 0; i < doc.size(); ++i) doc[i] = static_cast<int32_t>(100 + i % 50);
    w.add_document(doc);
    w.finish();
  }
  const std::string blend = "--data.blend=[{dir=\"" + web + "\",weight=3},{dir=\"" + code + "\",weight=1}]";
  auto run = [&](const std::string& out, std::vector<std::string> extra) {  // small()'s data.dir: replaced
    extra.insert(extra.begin(), blend);
    return run_training(small(base + "/" + out, extra));
  };
  run("a", {"--train.steps=8"});
  {  // each train line says how often each source's data has been seen: rows over its windows of T + 1 tokens
    nlohmann::json last;
    for (nlohmann::json& j : metrics_of(base + "/a/metrics.jsonl", "train")) last = j;
    auto windows = [&](const std::string& shard) { return double((ShardReader(shard).header().num_tokens - 1) / 32); };
    EXPECT_EQ(last["blend_epochs"], (nlohmann::json{24 / windows(web + "/train_000000.bin"),
                                                    8 / windows(code + "/train_000000.bin")}));  // 32 rows, 3:1
  }
  run("b", {"--train.steps=8", "--ckpt.every=4", "--ckpt.save_final=false"});
  const std::string ck = base + "/b/ckpt/step_00000004";
  const nlohmann::json data = nlohmann::json::parse(std::ifstream(ck + "/manifest.json"))["extra"]["data"];
  EXPECT_EQ(data["taken"], (nlohmann::json{12, 4}));  // 16 rows, 3:1
  EXPECT_EQ(data["since"], (nlohmann::json{0, 0}));
  EXPECT_EQ(data["blend"][1]["dir"], code);
  fs::remove_all(base + "/b/metrics.jsonl");
  run("b", {"--train.steps=8", "--ckpt.resume=" + ck});
  const std::vector<std::string> la = losses(base + "/a/metrics.jsonl"), lb = losses(base + "/b/metrics.jsonl");
  ASSERT_EQ(la.size(), 8u);
  ASSERT_EQ(lb.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(la[4 + i], lb[i]) << "step " << 5 + i;

  // New weights: said, and the rows from here on follow them (8 rows at 1:1 from 12 and 4).
  ::testing::internal::CaptureStdout();
  run("c", {"--data.blend=[{dir=\"" + web + "\",weight=1},{dir=\"" + code + "\",weight=1}]", "--train.steps=7",
            "--ckpt.resume=" + ck, "--ckpt.every=6", "--ckpt.save_final=false"});
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("data: the blend changed since checkpoint"), std::string::npos) << out;
  EXPECT_NE(out.find("the new shares hold from here"), std::string::npos) << out;
  const nlohmann::json after =
      nlohmann::json::parse(std::ifstream(base + "/c/ckpt/step_00000006/manifest.json"))["extra"]["data"];
  EXPECT_EQ(after["taken"], (nlohmann::json{16, 8}));
  EXPECT_EQ(after["since"], (nlohmann::json{12, 4}));
  // Another seed: every source's window order changes, which is said (the same weights: no rebase).
  ::testing::internal::CaptureStderr();
  run("e", {"--train.steps=5", "--ckpt.resume=" + ck, "--ckpt.save_final=false", "--data.seed=9"});
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("in another window order (shuffled, seed 1234) than this run's (shuffled, seed 9)"),
            std::string::npos)
      << err;

  // Evaluation: each source's val split on its own ("val_source" lines), and the "val" line their mean by share.
  run("d", {"--train.steps=4", "--train.eval_every=4", "--train.eval_batches=2", "--ckpt.save_final=false"});
  std::vector<nlohmann::json> by_source = metrics_of(base + "/d/metrics.jsonl", "val_source");
  double val = NAN;
  for (nlohmann::json& j : metrics_of(base + "/d/metrics.jsonl", "val")) val = j["val_loss"].get<double>();
  ASSERT_EQ(by_source.size(), 2u);
  EXPECT_EQ(by_source[0]["dir"], web);
  EXPECT_EQ(by_source[1]["dir"], code);
  EXPECT_EQ(by_source[0]["share"].get<double>(), 0.75);
  const double a_loss = by_source[0]["val_loss"].get<double>(), b_loss = by_source[1]["val_loss"].get<double>();
  EXPECT_TRUE(std::isfinite(a_loss) && std::isfinite(b_loss) && a_loss != b_loss);
  EXPECT_EQ(val, 0.75 * a_loss + 0.25 * b_loss);
  fs::remove_all(base);
}

// `megatrain eval` reads the windows the trainer's evaluation reads and averages as it does: on the final checkpoint
// of a run that evaluated at its last step, it gives that run's validation loss (the oracle). The trainer sums each
// batch's loss x targets in float before dividing, so the two agree to float's rounding (2^-24 relative, a few
// times over), not bit for bit.
TEST(Train, TheEvalCommandGivesTheTrainersValidationLoss) {
  const std::string base = fresh_base("mt_eval_cmd");
  const TrainResult r = run_training(small(base + "/run",
                                           {"--train.steps=3", "--train.eval_every=3", "--train.eval_batches=4"}));
  ASSERT_GT(r.last_val_loss, 0);
  const std::string& bin = kMegatrain;
  const std::string out = base + "/eval.json";
  const std::string cmd = fmt::format("{} eval --ckpt {}/run/ckpt --data {} --batches 4 --batch-size 4 --seq-len 32 "
                                      "--threads 2 --json > {} 2>&1",
                                      bin, base, kData, out);
  ASSERT_EQ(std::system(cmd.c_str()), 0) << mt::read_text_file(out);
  const nlohmann::json j = nlohmann::json::parse(mt::read_text_file(out));
  EXPECT_EQ(j["tokens"], 4 * 4 * 32);
  EXPECT_NEAR(j["loss"].get<double>(), r.last_val_loss, 1e-6 * r.last_val_loss);
  // A context longer than the model's, and data of another vocabulary, are refused by name.
  const std::string err = base + "/err.txt";
  EXPECT_NE(std::system(fmt::format("{} eval --ckpt {}/run/ckpt --data {} --seq-len 65 > {} 2>&1", bin, base, kData,
                                    err)
                            .c_str()),
            0);
  EXPECT_NE(mt::read_text_file(err).find("--seq-len 65 exceeds the model's context of 64 tokens"), std::string::npos)
      << mt::read_text_file(err);
  fs::remove_all(base);
}

// `convert --to-hf` writes the model's tokenizer beside it under HF's names: by default the one the checkpoint's data
// was prepared with (its meta.json), byte for byte (GPT-2's encoder.json and vocab.bpe as vocab.json and merges.txt);
// a tokenizer larger than the model's vocabulary is refused before any file is written; `none` writes none.
TEST(Train, AnHfExportCarriesTheTokenizerItsDataWasPreparedWith) {
  const std::string base = fresh_base("mt_export_tok");
  run_training(small(base + "/run", {"--train.steps=1"}));
  const std::string& bin = kMegatrain;
  const std::string log = base + "/log.txt";
  auto convert = [&](const std::string& out, const std::string& extra) {
    return std::system(fmt::format("{} convert --to-hf {}/run/ckpt --out {}/model.safetensors {} > {} 2>&1", bin, base,
                                   out, extra, log)
                           .c_str());
  };
  ASSERT_EQ(convert(base + "/hf", ""), 0) << mt::read_text_file(log);
  const std::string recorded = nlohmann::json::parse(std::ifstream(kData + "/meta.json"))["tokenizer"];
  EXPECT_EQ(mt::read_text_file(base + "/hf/vocab.json"), mt::read_text_file(recorded + "/encoder.json"));
  EXPECT_EQ(mt::read_text_file(base + "/hf/merges.txt"), mt::read_text_file(recorded + "/vocab.bpe"));

  // A tokenizer larger than the model's 50,257 rows: the bytes, 50,100 more tokens and an end of text.
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[mt::bytes_to_gpt2_text(std::string(1, static_cast<char>(b)))] = b;
  for (int i = 0; i < 50100; ++i) vocab[fmt::format("x{}", i)] = 256 + i;
  const nlohmann::json other = {{"added_tokens", {{{"id", 50356}, {"content", "<|endoftext|>"}}}},
                                {"pre_tokenizer", {{"type", "ByteLevel"}, {"use_regex", true}}},
                                {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
  mt::write_file_atomic(base + "/other.json", other.dump());
  EXPECT_NE(convert(base + "/wrong", "--tokenizer " + base + "/other.json"), 0);
  EXPECT_NE(mt::read_text_file(log).find("has 50357 tokens but the model has 50257"), std::string::npos)
      << mt::read_text_file(log);
  EXPECT_FALSE(fs::exists(base + "/wrong")) << "a refused export left files behind";
  ASSERT_EQ(convert(base + "/bare", "--tokenizer none"), 0) << mt::read_text_file(log);
  EXPECT_TRUE(fs::exists(base + "/bare/config.json"));
  EXPECT_FALSE(fs::exists(base + "/bare/vocab.json"));
  fs::remove_all(base);
}

// An attempt ran past its last checkpoint (steps 5..8 after the checkpoint at 4, no final one: as if it died just
// before saving); the restarted run resumes at 4 and runs 5..8 again. metrics.jsonl must then read as one history: steps 1..8 once each, with the
// losses of an undisturbed run (the oracle), so a supervisor's restarts leave no trace in the training record.
TEST(Train, MetricsOfAResumedRunReadAsOneHistory) {
  prepare_brown();
  const std::string a = ::testing::TempDir() + "/mt_hist_a", b = ::testing::TempDir() + "/mt_hist_b";
  fs::remove_all(a);
  fs::remove_all(b);
  run_training(small(a, {"--train.steps=8", "--ckpt.every=0", "--ckpt.save_final=false"}));
  run_training(small(b, {"--train.steps=8", "--ckpt.every=4", "--ckpt.save_final=false"}));
  { std::ofstream(b + "/metrics.jsonl", std::ios::app) << "{\"kind\":\"train\",\"step\":7,\"lo"; }  // torn line
  run_training(small(b, {"--train.steps=8", "--ckpt.every=4", "--ckpt.save_final=false"}));
  std::vector<int> steps;
  // metrics_of parses every line (a line that does not parse throws): the torn one is gone
  for (nlohmann::json& j : metrics_of(b + "/metrics.jsonl", "train")) steps.push_back(j["step"]);
  EXPECT_EQ(steps, (std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(losses(b + "/metrics.jsonl"), losses(a + "/metrics.jsonl"));
}

// A data position is a cursor into one window order. Resumed under another (a changed data.seed, a dataset that
// grew, or a checkpoint from before WindowOrder, which recorded no "order"), the rest of the epoch may repeat and
// skip windows: allowed, never silent. The oracle: the same checkpoint resumed under its own order says nothing.
TEST(Train, ResumeUnderAnotherWindowOrderSaysSo) {
  prepare_brown();
  const std::string a = ::testing::TempDir() + "/mt_resume_order";
  fs::remove_all(a);
  run_training(small(a, {"--train.steps=3", "--ckpt.every=2", "--ckpt.save_final=false"}));
  const std::string ck = a + "/ckpt/step_00000002", mpath = ck + "/manifest.json";
  const nlohmann::json manifest = nlohmann::json::parse(std::ifstream(mpath));
  ASSERT_EQ(manifest["extra"]["data"]["order"], "feistel6");
  ASSERT_GT(manifest["extra"]["data"]["cursor"].get<uint64_t>(), 0u);
  auto resume_stderr = [&](std::vector<std::string> extra) {
    fs::remove_all(a + "/metrics.jsonl");
    extra.insert(extra.end(), {"--train.steps=3", "--ckpt.save_final=false", "--ckpt.resume=" + ck});
    ::testing::internal::CaptureStderr();
    run_training(small(a, extra));
    return ::testing::internal::GetCapturedStderr();
  };
  EXPECT_EQ(resume_stderr({}).find("window order"), std::string::npos);
  const std::string W = std::to_string(manifest["extra"]["data"]["windows"].get<uint64_t>());
  std::string err = resume_stderr({"--data.seed=9"});
  EXPECT_NE(err.find("another window order (shuffled, seed 1234, feistel6, " + W +
                     " windows) than this run's "
                     "(shuffled, seed 9, feistel6, " +
                     W + " windows)"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("the rest of epoch 0 may repeat some windows"), std::string::npos) << err;

  // The dataset grew (a second shard): the same seed permutes more windows, so the saved cursor means other rows.
  const std::string grown = a + "/grown";
  fs::create_directories(grown);
  fs::copy(kData + "/train_000000.bin", grown + "/train_000000.bin");
  fs::copy(kData + "/val_000000.bin", grown + "/train_000001.bin");
  fs::copy(kData + "/val_000000.bin", grown + "/val_000000.bin");
  err = resume_stderr({"--data.dir=" + grown});
  EXPECT_NE(err.find("(shuffled, seed 1234, feistel6, " + W +
                     " windows) than this run's (shuffled, seed 1234, "
                     "feistel6, "),
            std::string::npos)
      << err;

  nlohmann::json old = manifest;
  old["extra"]["data"].erase("order");
  { std::ofstream(mpath) << seal_manifest(old).dump(1); }
  err = resume_stderr({});
  EXPECT_NE(err.find("(shuffled, seed 1234, fisher-yates, " + W + " windows)"), std::string::npos) << err;
  // Keys of the wrong type only describe the order: shown as they are, never a json exception.
  old["extra"]["data"]["order"] = 5;
  old["extra"]["data"]["windows"] = "many";
  { std::ofstream(mpath) << seal_manifest(old).dump(1); }
  err = resume_stderr({});
  EXPECT_NE(err.find("another window order (shuffled, seed 1234, 5) than"), std::string::npos) << err;
}

// Evaluation reads the val split every train.eval_every steps. A split that cannot give one batch (none at all, or
// too few tokens) must stop the run before its first step, as a data error that says what to do, not at the first
// evaluation (before: step 20 here, hours into a real run, as exit code 1). The oracle that the data is otherwise
// fine: the same directory trains with evaluation off.
TEST(Train, AValSplitThatCannotBeReadFailsAtStartNotAtTheFirstEvaluation) {
  const std::string base = fresh_base("mt_val_split");
  const std::string data = copy_of_brown(base, {"train_000000.bin", "meta.json"});
  auto run = [&](const std::string& out, std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--data.dir=" + data, "--train.steps=30", "--ckpt.save_final=false"});
    return run_training(small(base + "/" + out, extra));
  };
  auto expect_fails_at_start = [&](const std::string& out, const std::string& why) {
    try {
      run(out, {"--train.eval_every=20", "--train.eval_batches=2"});
      FAIL() << "trained without a readable val split";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(e.kind, ErrorKind::Data) << msg;
      EXPECT_NE(msg.find("train.eval_every = 20 evaluates on the val split, but it cannot be read"), std::string::npos)
          << msg;
      EXPECT_NE(msg.find(why), std::string::npos) << msg;
      EXPECT_NE(msg.find("--train.eval_every=0"), std::string::npos) << msg;
    }
    EXPECT_TRUE(losses(base + "/" + out + "/metrics.jsonl").empty()) << "steps ran before the failure";
  };
  expect_fails_at_start("none", "no shards of split 'val'");
  {
    ShardWriter w(data, "val", 50257, 50256, 1000);  // 21 tokens: no batch of 4 windows of 33
    w.add_document(std::vector<int32_t>(20, 11));
    w.finish();
  }
  expect_fails_at_start("tiny", "too few for one batch");
  EXPECT_EQ(run("no_eval", {"--train.eval_every=0"}).last_step, 30);
}

// A checkpoint directory that cannot take a file used to surface at the first save, which a run tolerates (a disk
// may fill for a while), so it trained on without checkpoints and failed at its end with exit code 24. Now the main
// rank tries the directories before the first step: a path under a regular file (unusable even for root, which
// CI may be) is a config error naming the key. Without checkpoints to write, ckpt.dir is not touched.
TEST(Train, AnUnusableOutputOrCheckpointDirectoryFailsBeforeTheFirstStep) {
  const std::string base = fresh_base("mt_unusable_dirs");
  const std::string file = base + "/a_file";
  std::ofstream(file) << "not a directory";
  auto expect_config_error = [&](const std::string& out, std::vector<std::string> extra, const std::string& want) {
    extra.push_back("--train.steps=2");
    try {
      run_training(small(out, extra));
      FAIL() << "trained with an unusable directory";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind, ErrorKind::Config) << e.what();
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  expect_config_error(base + "/run", {"--ckpt.dir=" + file + "/ckpt", "--ckpt.every=1"},
                      "ckpt.dir = '" + file + "/ckpt' cannot be used");
  EXPECT_TRUE(losses(base + "/run/metrics.jsonl").empty());
  expect_config_error(file + "/out", {}, "train.out_dir = '" + file + "/out' cannot be used");
  const TrainResult r = run_training(small(base + "/no_ckpt", {"--ckpt.dir=" + file + "/ckpt", "--train.steps=2",
                                                               "--ckpt.every=0", "--ckpt.save_final=false"}));
  EXPECT_EQ(r.last_step, 2);
  // A usable directory keeps only the checkpoints: the probe is gone. With room for 4 checkpoints of 40 MB, the
  // start says nothing about space.
  ::testing::internal::CaptureStderr();
  run_training(small(base + "/ok", {"--train.steps=2", "--ckpt.every=1"}));
  const std::string err = ::testing::internal::GetCapturedStderr();
  if (fs::space(base).available > 200'000'000) {
    EXPECT_EQ(err.find("GB free"), std::string::npos) << err;
  }
  EXPECT_TRUE(fs::exists(base + "/ok/ckpt/step_00000001"));
  EXPECT_FALSE(fs::exists(base + "/ok/ckpt/.megatrain-write-probe"));
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
  // What backward rebuilds is a memory choice, not the model: a run resumes with other recomputation switches.
  TrainResult r = run_training(small(a, {"--train.steps=2", "--model.recompute=all", "--model.recompute_act=true",
                                         "--model.recompute_norm=true"}));
  EXPECT_EQ(r.last_step, 2);
}

TEST(Train, MissingDataDirectoryIsAClearError) {
  try {
    run_training(small(::testing::TempDir() + "/mt_nodata", {"--data.dir=/nonexistent/shards"}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/shards"), std::string::npos) << e.what();
  }
}

// A manifest whose recorded state is out of range or of the wrong type (issue 10, items 2, 7 and 8), re-sealed so
// that its checksum passes and the validation of the values is what answers: resume and `generate` refuse it,
// naming the manifest and the key. Before, window = 2^31-1 crashed generate (SIGABRT in an OpenMP region),
// norm_eps = -1 silently changed its output, and a string step was a bare json type_error.
TEST(Train, ResumeAndGenerateRefuseABadStateInTheManifest) {
  prepare_brown();
  const std::string a = ::testing::TempDir() + "/mt_resume_bad_manifest";
  fs::remove_all(a);
  run_training(small(a, {"--train.steps=1"}));
  const std::string dir = a + "/ckpt/step_00000001", mpath = dir + "/manifest.json";
  const std::string good = mt::test::slurp(mpath);
  struct Case {
    std::string pointer;
    nlohmann::json value;
    std::string expect;
    bool model;  // a model-config key (generate reads it too)
  };
  const std::vector<Case> cases = {
      {"/extra/model/window", 2147483647, "model.window = 2147483647 is out of range", true},
      {"/extra/model/norm_eps", -1, "model.norm_eps = -1 is out of range", true},
      {"/extra/model/vocab_pad_to", 2147483647, "model.vocab_pad_to = 2147483647 is out of range", true},
      {"/extra/model/n_layer", "2", "'n_layer' must be an integer", true},
      {"/extra/step", "4", "extra.step is \"4\", not a step number", false},
      {"/extra/step", -1, "extra.step is -1, not a step number", false},
      {"/extra/data/cursor", -1, "extra.data.cursor is -1, not a non-negative integer", false},
      {"/extra/data/seq_len", "32", "extra.data.seq_len is \"32\", not a non-negative integer", false},
      {"/extra/optim_name", 3, "extra.optim_name is 3, not a string", false},
      {"/extra/data", 5, "extra.data is 5, not an object", false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.pointer + " = " + c.value.dump());
    nlohmann::json m = nlohmann::json::parse(good);
    m[nlohmann::json::json_pointer(c.pointer)] = c.value;
    { std::ofstream(mpath) << seal_manifest(m).dump(1); }
    std::string msg = mt::test::error_of([&] { run_training(small(a, {"--train.steps=2"})); });
    EXPECT_NE(msg.find(dir), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
    if (!c.model) continue;
    const std::string log = a + "/generate.log";
    const std::string cmd = kMegatrain + " generate --ckpt " + dir + " --tokens 2 > " + log + " 2>&1";
    const int rc = std::system(cmd.c_str());
    EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 1) << "generate exited with status " << rc;
    msg = mt::test::slurp(log);
    EXPECT_NE(msg.find(dir + ": manifest.json, extra.model"), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
  }
  { std::ofstream(mpath) << good; }
  EXPECT_NO_THROW(run_training(small(a, {"--train.steps=2"})));
}

}  // namespace

// A MoE model trains end to end in one process (docs/moe.md): the loss falls; every train line of metrics.jsonl
// reports, per MoE layer, the tokens routed to each expert (summing to the step's tokens x top_k) and the drops the
// capacity caused; the sigmoid_bias router's bias, stepped by +-moe_bias_rate after each optimizer step and never by
// the optimizer, is a sum of such steps in the final checkpoint.
TEST(Train, MoeLossFallsAndMetricsCountTokensPerExpert) {
  const std::string out = fresh_base("mt_train_moe");
  const int steps = 40, B = 4, T = 32, k = 2;
  const float rate = 0.0625f;  // a power of two: its multiples are exact in fp32
  const TrainResult r =
      run_training(small(out, {"--train.steps=" + std::to_string(steps), "--train.eval_every=0", "--model.mlp=swiglu",
                               "--model.moe_experts=4", "--model.moe_top_k=2", "--model.moe_d_ff=96",
                               "--model.moe_shared_experts=1", "--model.moe_router=sigmoid_bias",
                               "--model.moe_bias_rate=" + std::to_string(rate), "--model.moe_capacity_factor=1.0",
                               "--model.moe_aux_loss=0.01", "--model.moe_z_loss=0.001",
                               "--data.batch_size=" + std::to_string(B), "--data.seq_len=" + std::to_string(T)}));
  EXPECT_EQ(r.last_step, steps);
  EXPECT_LT(r.last_loss, r.first_loss - 1.5) << "loss did not fall enough";
  const std::vector<nlohmann::json> lines = metrics_of(out + "/metrics.jsonl", "train");
  ASSERT_EQ(lines.size(), static_cast<size_t>(steps));
  int64_t dropped = 0;
  for (const nlohmann::json& j : lines) {
    ASSERT_TRUE(j.contains("moe")) << j.dump();
    ASSERT_EQ(j["moe"].size(), 2u);  // both layers
    for (const nlohmann::json& l : j["moe"]) {
      int64_t sum = 0;
      for (int64_t n : l["tokens_per_expert"].get<std::vector<int64_t>>()) sum += n;
      EXPECT_EQ(sum, int64_t{B} * T * k) << l.dump();
      dropped += l["dropped"].get<int64_t>();
    }
    EXPECT_GT(j["moe_loss"].get<double>(), 0);
  }
  EXPECT_GT(dropped, 0) << "capacity factor 1 with uneven routing should drop some assignments";
  const std::string ckpt = fmt::format("{}/ckpt/step_{:08d}/model.safetensors", out, steps);
  ASSERT_TRUE(fs::exists(ckpt)) << ckpt;
  const SafetensorsFile weights = SafetensorsFile::open(ckpt);
  int moved = 0;
  for (const char* name : {"h.0.moe.router.bias", "h.1.moe.router.bias"}) {
    const TensorData& t = weights.get(name);
    std::vector<float> b(t.numel());
    to_f32(t, b.data());
    for (float v : b) {
      EXPECT_EQ(v / rate, std::round(v / rate)) << name << " = " << v << " is not a sum of +-" << rate << " steps";
      EXPECT_LE(std::abs(v), steps * rate);
      moved += v != 0;
    }
  }
  EXPECT_GT(moved, 0) << "no bias moved";
}
