// `megatrain train` on the CUDA backend (train.device = "cuda", bf16) against the same run on the CPU (fp32, the
// oracle): the loss curve tracks the CPU's, and a resumed GPU run continues where the checkpoint left off. Needs a
// GPU; skipped without one (ctest label `gpu`).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#ifdef MT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "megatrain/kernels/ops.h"
#include "megatrain/train/run_config.h"
#include "megatrain/train/trainer.h"
#include "support/files.h"
#include "support/launch_testutil.h"
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

// The job every layout runs: 4 layers (pp2 x 2 virtual stages is one layer each), 10 steps with a global batch of 8
// rows, evaluations, samples and checkpoints on; `batch` is data.batch_size.
std::string layout_job(const std::string& out, int batch) {
  return gpu_job(out, "cuda")
      .model(4, 128, 2, 128)
      .batch(batch)
      .set("train.eval_every", 5)
      .set("train.eval_batches", 2)
      .set("sample.tokens", 8)
      .steps(10)
      .set("ckpt.every", 5)
      .set("ckpt.resume", "none")
      .line();
}

void run_logged(const std::string& cmd, const std::string& log) {
  ASSERT_EQ(std::system((cmd + " > " + log + " 2>&1").c_str()), 0) << cmd << "\n" << mt::test::slurp(log);
}

std::vector<double> as_doubles(const std::vector<std::string>& v) {
  std::vector<double> d;
  for (const auto& s : v) d.push_back(std::stod(s.substr(s.find(':') + 1)));  // "step:loss_exact"
  return d;
}

// The oracle of every layout: one rank on one GPU, the same global batch, run once per build (cached_losses).
std::vector<double> one_gpu_losses() {
  const std::string bin = mt::test::kMegatrain, one = ::testing::TempDir() + "/mt_gpu_multi_one";
  const std::string cmd = bin + " train" + layout_job(one, 8);
  return as_doubles(mt::test::cached_losses("gpu-one-rank", {cmd}, [&] {
    fs::remove_all(one);
    run_logged(cmd, one + ".log");
    return mt::test::step_losses(one + "/metrics.jsonl");
  }));
}

struct Layout {
  const char* name;
  int nproc;
  int batch;  // data.batch_size, the rows of one micro-batch: 8 / (dp x micro-batches)
  const char* flags;
};
std::ostream& operator<<(std::ostream& os, const Layout& l) { return os << l.name; }

const std::vector<Layout> kLayouts = {
    {"dp2", 2, 4, " --parallel.dp=2"},
    {"tp2", 2, 8, " --parallel.tp=2"},  // parallel.overlap (default on): the chunked all-gather/reduce-scatter GEMMs
    {"pp2", 2, 4, " --parallel.pp=2 --parallel.microbatches=2"},
    {"pp2_interleaved", 2, 2, " --parallel.pp=2 --parallel.virtual_stages=2 --parallel.microbatches=4"},
    {"dp2_tp2", 4, 4, " --parallel.dp=2 --parallel.tp=2"},
    {"dp2_pp2_tp2", 8, 2, " --parallel.dp=2 --parallel.pp=2 --parallel.tp=2 --parallel.microbatches=2"},
};

// A layout under `megatrain launch` against one GPU with the same global batch; `plane` is added to every launched
// run (the device plane: NCCL with a GPU per rank, or staged through host memory with the ranks sharing GPUs). bf16
// on both sides, so the 3% bound the one-GPU run meets against the CPU (TwentyStepsTrackTheCpuRun). Then the
// layout's sharded checkpoint (written through the host copies) resumes under another layout, one GPU, and
// continues the layout's own curve.
void layout_tracks_one_gpu(const Layout& l, const std::string& plane) {
  const std::string& bin = mt::test::kMegatrain;
  mt::test::prepare_gpt2_brown();
  const std::vector<double> l1 = one_gpu_losses();
  ASSERT_EQ(l1.size(), 10u);
  const std::string out = ::testing::TempDir() + "/mt_gpu_multi_" + l.name +
                          (plane.find("staged") != std::string::npos ? "_staged" : "_nccl");
  fs::remove_all(out);
  run_logged(bin + " launch --nproc " + std::to_string(l.nproc) + " -- train" + layout_job(out, l.batch) + l.flags +
                 plane,
             out + ".log");
  const std::vector<double> lm = losses(out + "/metrics.jsonl");
  ASSERT_EQ(lm.size(), 10u) << l.name;
  for (size_t i = 0; i < l1.size(); ++i) EXPECT_NEAR(lm[i], l1[i], 0.03 * l1[i]) << l.name << " step " << i + 1;
  const std::string again = out + "_resumed";
  fs::remove_all(again);
  run_logged(bin + " train" + layout_job(again, 8) + " --ckpt.resume=" + out + "/ckpt/step_00000005", again + ".log");
  const std::vector<double> lr = losses(again + "/metrics.jsonl");
  ASSERT_EQ(lr.size(), 5u) << l.name;
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(lr[i], lm[5 + i], 0.03 * lm[5 + i]) << l.name << " resumed step " << 6 + i;
}

class GpuLayouts : public ::testing::TestWithParam<Layout> {};

// Several GPUs: one rank per GPU, the tensors over NCCL. Needs as many GPUs as ranks; skipped otherwise (NCCL
// refuses two ranks on one GPU).
TEST_P(GpuLayouts, OneRankPerGpuTracksOneGpu) {
  if (gpu_count() < GetParam().nproc)
    GTEST_SKIP() << "needs " << GetParam().nproc << " GPUs (" << gpu_count() << " visible)";
  layout_tracks_one_gpu(GetParam(), " --parallel.device_plane=nccl");
}

// Several ranks on one GPU (comm/staged_group.h): the device plane staged through host memory over Gloo, which NCCL
// cannot do; up to dp2 x pp2 x tp2, eight ranks on one GPU.
TEST_P(GpuLayouts, RanksSharingOneGpuTrackOneGpu) {
  if (gpu_count() < 1) GTEST_SKIP() << "needs a GPU";
  layout_tracks_one_gpu(GetParam(), " --parallel.device_plane=staged");
}

INSTANTIATE_TEST_SUITE_P(TrainGpu, GpuLayouts, ::testing::ValuesIn(kLayouts),
                         [](const ::testing::TestParamInfo<Layout>& i) { return std::string(i.param.name); });

// A rank of a staged dp2 job SIGKILLs itself at step 7 (MEGATRAIN_FAULTS crash); `megatrain launch --max-restarts`
// restarts the job from the step-5 checkpoint by itself (ckpt.resume = auto, the newest one), and the recovered curve tracks the undisturbed one within
// the layouts' bf16 bound (bit for bit only under train.deterministic: the atomics of the embedding gradient).
TEST(TrainGpu, AKilledRankSharingTheGpuIsRecoveredByTheLauncher) {
  if (gpu_count() < 1) GTEST_SKIP() << "needs a GPU";
  mt::test::prepare_gpt2_brown();
  const std::vector<double> l1 = one_gpu_losses();
  const std::string out = ::testing::TempDir() + "/mt_gpu_kill9", events = out + ".events.jsonl";
  fs::remove_all(out);
  fs::remove(events);
  run_logged("MEGATRAIN_FAULTS=crash:rank=1:step=7 " + mt::test::kMegatrain +
                 " launch --nproc 2 --max-restarts 2 --backoff 0 --events " + events + " -- train" +
                 layout_job(out, 4) + " --parallel.dp=2 --parallel.device_plane=staged --ckpt.resume=auto",
             out + ".log");
  // The restart resumes from step 5 and rewrites the steps after it: one whole curve of 10 steps.
  const std::vector<double> lm = losses(out + "/metrics.jsonl");
  ASSERT_EQ(lm.size(), 10u) << mt::test::slurp(out + ".log");
  for (size_t i = 0; i < 10; ++i) EXPECT_NEAR(lm[i], l1[i], 0.03 * l1[i]) << "step " << i + 1;
  const std::string ev = mt::test::slurp(events);
  EXPECT_NE(ev.find("\"restarting\""), std::string::npos) << ev;
  EXPECT_NE(ev.find("\"resumed\""), std::string::npos) << ev;
}

// `megatrain diagnose` on a GPU machine checks every GPU (launch/gpu_checks.h): on a healthy one every check ran and
// passes: the GEMM rate, the device and host copies, the GEMM with a known result bit for bit, and NVML's memory
// errors and clock events.
TEST(TrainGpu, DiagnoseChecksEachGpuAndAHealthyOnePasses) {
  if (gpu_count() < 1) GTEST_SKIP() << "needs a GPU";
  const std::string out = ::testing::TempDir() + "/mt_gpu_diagnose.json";
  ASSERT_EQ(std::system((mt::test::kMegatrain + " diagnose --json --local-ranks 2 > " + out).c_str()), 0)
      << mt::test::slurp(out);
  const nlohmann::json report = nlohmann::json::parse(mt::test::slurp(out));
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& c : report["checks"]) by_name[c["name"]] = c;
  for (int g = 0; g < gpu_count(); ++g)
    for (const std::string what : {"gemm", "hbm_bandwidth", "host_bandwidth", "self_test", "memory_errors", "clocks"}) {
      const nlohmann::json& c = by_name[fmt::format("gpu{}_{}", g, what)];
      EXPECT_TRUE(c.value("ran", false)) << c.dump();
      EXPECT_TRUE(c.value("pass", false)) << c.dump();
    }
  EXPECT_TRUE(report["pass"].get<bool>()) << report.dump();
}

// A real degradation, not an injected one: while this process runs bf16 GEMMs on GPU 0 without pause, the GPU
// time-slices between the two processes' contexts and `megatrain diagnose` measures about half the rate, under the
// check's 60% of the datasheet peak (a healthy H100/H200 measures ~78%). The failed check names the GPU and the
// rate it measured.
TEST(TrainGpu, DiagnoseFailsTheGemmCheckOfAGpuAnotherProcessIsUsing) {
  if (gpu_count() < 1) GTEST_SKIP() << "needs a GPU";
  std::atomic<bool> stop{false};
  std::atomic<long> gemms{0};
  std::thread burner([&] {
    auto ops = make_cuda_ops(0);
    constexpr int64_t n = 8192;
    Buffer a = ops->alloc(size_t(n * n) * 2), c = ops->alloc(size_t(n * n) * 2);  // their values do not matter
    Tensor ta = a.view({n, n}, DType::BF16), tc = c.view({n, n}, DType::BF16);
    while (!stop) {
      ops->matmul_forward(tc, ta, ta, Tensor{});
      ops->synchronize();
      ++gemms;
    }
  });
  while (gemms < 3) std::this_thread::sleep_for(std::chrono::milliseconds(10));  // the burner is computing
  const std::string out = ::testing::TempDir() + "/mt_gpu_diagnose_contended.json";
  const int rc = std::system((mt::test::kMegatrain + " diagnose --json > " + out).c_str());
  stop = true;
  burner.join();
  const nlohmann::json report = nlohmann::json::parse(mt::test::slurp(out));
  EXPECT_NE(rc, 0) << report.dump();
  EXPECT_FALSE(report["pass"].get<bool>());
  nlohmann::json gemm;
  for (const auto& c : report["checks"])
    if (c["name"] == "gpu0_gemm") gemm = c;
  ASSERT_FALSE(gemm.is_null()) << report.dump();
  EXPECT_FALSE(gemm.value("pass", true)) << gemm.dump();
  const std::string detail = gemm.value("detail", "");
  EXPECT_NE(detail.find("GPU 0"), std::string::npos) << detail;
  EXPECT_NE(detail.find("TFLOP/s"), std::string::npos) << detail;
  EXPECT_LT(gemm.value("value", 1e9), 0.6 * 989) << gemm.dump();
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
