// `megatrain train` on the CUDA backend (train.device = "cuda", bf16) against the same run on the CPU (fp32, the
// oracle): the loss curve tracks the CPU's, and a resumed GPU run continues where the checkpoint left off. Needs a
// GPU; skipped without one (ctest label `gpu`).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#ifdef MT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "megatrain/kernels/ops.h"
#include "megatrain/train/run_config.h"
#include "megatrain/train/trainer.h"
#include "support/files.h"
#include "support/megatrain.h"
#include "support/metrics.h"
#include "support/small_job.h"
#include "support/test_util.h"

using namespace mt;
namespace fs = std::filesystem;

namespace {

// The small job on the GPT-2-tokenized Brown shards, wider for the GPU: head_dim 64 (the flash-attention kernel
// supports 64 and 128), 8 rows of 128 tokens, a 16-token sample; the config's thread count.
mt::test::SmallJob gpu_job(const std::string& out, const std::string& device) {
  return std::move(mt::test::SmallJob::gpt2(out)
                       .model(2, 128, 2, 128)
                       .set("data.seq_len", 128)
                       .batch(8)
                       .set("sample.tokens", 16)
                       .unset("train.threads")
                       .set("train.device", device));
}

RunConfig small(const std::string& out, const std::string& device, std::vector<std::string> extra = {}) {
  return parse_run_config("", "test", gpu_job(out, device).with(extra).args());
}

std::vector<double> losses(const std::string& metrics) { return mt::test::metric_series(metrics, "loss"); }

TEST(TrainGpu, TwentyStepsTrackTheCpuRun) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  mt::test::prepare_gpt2_brown();
  const std::string c = ::testing::TempDir() + "/mt_gpu_train_cpu", g = ::testing::TempDir() + "/mt_gpu_train_gpu";
  fs::remove_all(c);
  fs::remove_all(g);
  run_training(small(c, "cpu", {"--train.steps=20", "--ckpt.save_final=false"}));
  const std::vector<double> lc = losses(c + "/metrics.jsonl");
  ASSERT_EQ(lc.size(), 20u);
  // The default attention (cuDNN's where the build has it) and our flash kernels, each against the same CPU run.
  for (const std::string attention : {"auto", "flash"}) {
    SCOPED_TRACE("train.attention = " + attention);
    fs::remove_all(g);
    run_training(small(g, "cuda", {"--train.steps=20", "--ckpt.save_final=false", "--train.attention=" + attention}));
    const std::vector<double> lg = losses(g + "/metrics.jsonl");
    ASSERT_EQ(lg.size(), 20u);
    // bf16 activations: ~0.4% per rounding, compounded over 2 layers and 20 steps; 3% of the loss is a loose bound
    // that a wrong gradient or optimizer step would still break within a few steps.
    for (size_t i = 0; i < lc.size(); ++i) EXPECT_NEAR(lg[i], lc[i], 0.03 * lc[i]) << "step " << i + 1;
    EXPECT_LT(lg.back(), lg.front() - 1.0);
  }
}

TEST(TrainGpu, ResumeContinuesTheRun) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  mt::test::prepare_gpt2_brown();
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

// The timeline on a GPU (train.trace_steps): each op's device time from CUDA events, on the "device" track. Two
// traced steps of the same shapes enqueue the same ops, so the device track is one step's op sequence twice
// (oracle: the step's own repetition); ops of one stream never overlap; the window's first op cannot start before
// the window's first step did on the host.
TEST(TrainGpu, TheTimelineCarriesEveryOpsDeviceTime) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  mt::test::prepare_gpt2_brown();
  const std::string out = ::testing::TempDir() + "/mt_gpu_trace";
  fs::remove_all(out);
  run_training(small(out, "cuda",
                     {"--train.steps=3", "--ckpt.save_final=false", "--train.trace_steps=[2,3]", "--sample.tokens=0"}));
  std::ifstream f(out + "/trace.json");
  ASSERT_TRUE(f.good());
  const nlohmann::json j = nlohmann::json::parse(f);
  std::map<int, std::string> tracks;
  for (const auto& e : j["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name") tracks[e["tid"].get<int>()] = e["args"]["name"];
  std::vector<std::string> ops;
  double prev_end = -1, first_step = 1e300, first_op = 1e300;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] != "X") continue;
    if (e["cat"] == "step") first_step = std::min(first_step, e["ts"].get<double>());
    if (tracks[e["tid"].get<int>()] != "device") continue;
    const double ts = e["ts"].get<double>(), dur = e["dur"].get<double>();
    EXPECT_GE(ts, prev_end - 1.0) << e["name"] << " overlaps the op before it";  // 1 us: the events' resolution
    prev_end = ts + dur;
    first_op = std::min(first_op, ts);
    ops.push_back(e["name"]);
  }
  ASSERT_FALSE(ops.empty());
  ASSERT_EQ(ops.size() % 2, 0u);
  const std::vector<std::string> step2(ops.begin(), ops.begin() + ops.size() / 2),
      step3(ops.begin() + ops.size() / 2, ops.end());
  EXPECT_EQ(step2, step3);
  EXPECT_EQ(std::count(ops.begin(), ops.end(), std::string("cross_entropy")), 2);
  EXPECT_GE(first_op, first_step);
}

// Several GPUs: `megatrain launch` with one rank per GPU, the tensors over NCCL and the norms and losses over Gloo,
// against one GPU with the same global batch (bf16 on both sides, so the same 3% bound as against the CPU). Needs
// as many GPUs as ranks; skipped otherwise (NCCL refuses two ranks on one GPU).
int gpu_count() {
#ifdef MT_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
#else
  return 0;
#endif
}

// The layouts under `megatrain launch` against one GPU with the same global batch; `plane` is added to every launched
// run (the device plane: NCCL with a GPU per rank, or staged through host memory with the ranks sharing GPUs).
void layouts_track_one_gpu(const std::string& plane, bool with_dp2_tp2) {
  const std::string& bin = mt::test::kMegatrain;
  mt::test::prepare_gpt2_brown();
  auto args = [&](const std::string& out, int batch) {
    return gpu_job(out, "cuda")
        .batch(batch)
        .set("train.eval_every", 5)
        .set("train.eval_batches", 2)
        .set("sample.tokens", 8)
        .steps(10)
        .set("ckpt.every", 5)
        .set("ckpt.resume", "none")
        .line();
  };
  auto run = [](const std::string& cmd) {
    ASSERT_EQ(std::system((cmd + " > " + ::testing::TempDir() + "/mt_gpu_multi.log 2>&1").c_str()), 0)
        << cmd << "\n(output in " << ::testing::TempDir() << "/mt_gpu_multi.log)";
  };
  const std::string one = ::testing::TempDir() + "/mt_gpu_multi_one";
  fs::remove_all(one);
  run(bin + " train" + args(one, 8));
  const std::vector<double> l1 = losses(one + "/metrics.jsonl");
  ASSERT_EQ(l1.size(), 10u);
  struct Layout {
    const char* name;
    int batch;
    const char* flags;
  };
  std::vector<Layout> layouts = {Layout{"dp2", 4, " --parallel.dp=2"}, Layout{"tp2", 8, " --parallel.tp=2"},
                                 Layout{"pp2", 4, " --parallel.pp=2 --parallel.microbatches=2"}};
  if (with_dp2_tp2) layouts.push_back(Layout{"dp2tp2", 4, " --parallel.dp=2 --parallel.tp=2"});
  for (const Layout& l : layouts) {
    const std::string out = ::testing::TempDir() + "/mt_gpu_multi_" + l.name;
    fs::remove_all(out);
    const int nproc = std::string(l.name) == "dp2tp2" ? 4 : 2;
    run(bin + " launch --nproc " + std::to_string(nproc) + " -- train" + args(out, l.batch) + l.flags + plane);
    const std::vector<double> lm = losses(out + "/metrics.jsonl");
    ASSERT_EQ(lm.size(), 10u) << l.name;
    for (size_t i = 0; i < l1.size(); ++i) EXPECT_NEAR(lm[i], l1[i], 0.03 * l1[i]) << l.name << " step " << i + 1;
    // The sharded checkpoint went through the host copies: it must resume on one GPU.
    const std::string again = out + "_resumed";
    fs::remove_all(again);
    run(bin + " train" + args(again, 8) + " --ckpt.resume=" + out + "/ckpt/step_00000005");
    const std::vector<double> lr = losses(again + "/metrics.jsonl");
    ASSERT_EQ(lr.size(), 5u) << l.name;
    for (int i = 0; i < 5; ++i) EXPECT_NEAR(lr[i], lm[5 + i], 0.03 * lm[5 + i]) << l.name << " resumed step " << 6 + i;
  }
}

TEST(TrainGpu, MultiGpuLayoutsTrackOneGpu) {
  if (gpu_count() < 2) GTEST_SKIP() << "needs 2 GPUs (" << gpu_count() << " visible)";
  layouts_track_one_gpu(" --parallel.device_plane=nccl", false);
}

// Several ranks on one GPU (comm/staged_group.h): the device plane staged through host memory over Gloo, which NCCL
// cannot do; the same layouts and bound, and dp2 x tp2 on four ranks.
TEST(TrainGpu, LayoutsSharingOneGpuTrackOneGpu) {
  if (gpu_count() < 1) GTEST_SKIP() << "needs a GPU";
  layouts_track_one_gpu(" --parallel.device_plane=staged", true);
}

// `megatrain diagnose` on a GPU machine checks every GPU (launch/gpu_checks.h): on a healthy one every check passes,
// the GEMM rate and the copy were measured, and the GEMM with a known result gave it bit for bit.
TEST(TrainGpu, DiagnoseChecksEachGpuAndAHealthyOnePasses) {
  if (gpu_count() < 1) GTEST_SKIP() << "needs a GPU";
  const std::string out = ::testing::TempDir() + "/mt_gpu_diagnose.json";
  ASSERT_EQ(std::system((mt::test::kMegatrain + " diagnose --json --local-ranks 2 > " + out).c_str()), 0)
      << mt::test::slurp(out);
  const nlohmann::json report = nlohmann::json::parse(mt::test::slurp(out));
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& c : report["checks"]) by_name[c["name"]] = c;
  for (int g = 0; g < gpu_count(); ++g)
    for (const std::string what : {"gemm", "hbm_bandwidth", "self_test"}) {
      const nlohmann::json& c = by_name[fmt::format("gpu{}_{}", g, what)];
      EXPECT_TRUE(c.value("ran", false)) << c.dump();
      EXPECT_TRUE(c.value("pass", false)) << c.dump();
    }
  EXPECT_TRUE(report["pass"].get<bool>()) << report.dump();
}

// train.deterministic: two GPU runs of the same job give bit-identical per-step losses ("loss_exact", the loss's
// exact bits), with the default attention (cuDNN's deterministic engines, or our flash kernel where cuDNN has none)
// and with our flash kernels. Oracle: the run itself, repeated. Without the setting the embedding gradient's and
// flash attention dq's float atomics make the last bits vary.
TEST(TrainGpu, TwoDeterministicRunsGiveIdenticalLosses) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  mt::test::prepare_gpt2_brown();
  const std::string a = ::testing::TempDir() + "/mt_gpu_det_a", b = ::testing::TempDir() + "/mt_gpu_det_b";
  for (const std::string attention : {"auto", "flash"}) {
    SCOPED_TRACE("train.attention = " + attention);
    const std::vector<std::string> extra = {"--train.steps=20", "--ckpt.save_final=false", "--train.deterministic=true",
                                            "--train.attention=" + attention};
    for (const std::string& out : {a, b}) {
      fs::remove_all(out);
      run_training(small(out, "cuda", extra));
    }
    const std::vector<std::string> la = mt::test::step_losses(a + "/metrics.jsonl"),
                                   lb = mt::test::step_losses(b + "/metrics.jsonl");
    ASSERT_EQ(la.size(), 20u);
    EXPECT_EQ(la, lb);
  }
}

// A deterministic run under `megatrain launch` whose rank SIGKILLs itself at step 7 (MEGATRAIN_FAULTS) is restarted
// from the step-5 checkpoint and ends with per-step losses bit for bit those of the same job undisturbed: recovery
// from a checkpoint loses nothing when every step repeats exactly.
TEST(TrainGpu, AKillNineRecoveryOfADeterministicRunEqualsAnUndisturbedOne) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  mt::test::prepare_gpt2_brown();
  const fs::path dir = mt::test::case_dir("mt-gpu-det-kill-");
  // Both runs through the launcher, the same way, so that only the crash and the recovery differ.
  const auto launch = [&](const std::string& name, const std::string& faults) {
    mt::test::SmallJob job = gpu_job((dir / name).string(), "cuda");
    job.with({"--train.steps=12", "--ckpt.every=5", "--ckpt.save_final=false", "--train.deterministic=true"});
    if (!faults.empty()) ::setenv("MEGATRAIN_FAULTS", faults.c_str(), 1);
    const std::string cmd = mt::test::kMegatrain + " launch --nproc 1 --max-restarts 2 --backoff 0 --events " +
                            (dir / (name + "_events.jsonl")).string() + " -- train" + job.line() + " > " +
                            (dir / (name + ".log")).string() + " 2>&1";
    const int rc = mt::test::shell_exit_code(std::system(cmd.c_str()));
    ::unsetenv("MEGATRAIN_FAULTS");
    return rc;
  };
  ASSERT_EQ(launch("undisturbed", ""), 0) << mt::test::slurp(dir / "undisturbed.log");
  ASSERT_EQ(launch("run", "crash:rank=0:step=7"), 0) << mt::test::slurp(dir / "run.log");
  int injected = 0;
  for (const auto& e : mt::test::events_of(dir / "run_events.jsonl")) injected += e["event"] == "injected";
  EXPECT_EQ(injected, 1) << "the crash was not injected: " << mt::test::slurp(dir / "run_events.jsonl");
  const std::vector<std::string> want = mt::test::step_losses(dir / "undisturbed" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 12u);
  EXPECT_EQ(mt::test::step_losses(dir / "run" / "metrics.jsonl"), want);
  if (!HasFailure()) fs::remove_all(dir);
}

}  // namespace
