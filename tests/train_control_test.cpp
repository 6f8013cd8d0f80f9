// How a run talks to whatever supervises it (train/observer.h, core/error.h, core/stop_request.h,
// train/config_agreement.h):
//  * observers see every event of a run, in order, with the values the run returns;
//  * a stop request finishes the step, writes a checkpoint, and the resumed run continues bit-identically to an
//    undisturbed one (the oracle); through the binary, SIGTERM gives the Stopped exit code, also under `launch`
//    where every rank must stop at the same step;
//  * each kind of failure exits with its own code;
//  * ranks started with different configs fail at start-up, naming the keys and ranks;
//  * a CPU rank's MFU denominator is its share of its node's CPUs, so with more ranks than CPUs no logged MFU
//    exceeds 100%, and the first line says how the peak was found;
//  * an OpenBLAS fallback core is replaced by the best candidate that passes its self-test (`megatrain train` run
//    directly re-executes itself, `launch` sets it for its ranks) and the first line says so; the user's
//    OPENBLAS_CORETYPE is kept.
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "megatrain/core/error.h"
#include "megatrain/core/stop_request.h"
#include "megatrain/kernels/cpu/blas_probe.h"
#include "megatrain/train/config_agreement.h"
#include "megatrain/train/peak.h"
#include "megatrain/train/trainer.h"
#include "support/files.h"
#include "support/megatrain.h"
#include "support/metrics.h"
#include "support/small_job.h"
#include "support/test_util.h"

using namespace mt;
namespace fs = std::filesystem;

namespace {

using mt::test::kMegatrain;
using mt::test::slurp;

void prepare_brown() { mt::test::prepare_gpt2_brown(); }

// The small job on the GPT-2-tokenized Brown shards, with a set peak (no matmul benchmark at start-up).
std::vector<std::string> small_flags(const std::string& out) {
  return mt::test::SmallJob::gpt2(out).set("train.peak_tflops", 1).args();
}

RunConfig small(const std::string& out, std::vector<std::string> extra = {}) {
  std::vector<std::string> ov = small_flags(out);
  ov.insert(ov.end(), extra.begin(), extra.end());
  return parse_run_config("", "test", ov);
}

std::string joined(const std::vector<std::string>& v) { return mt::test::SmallJob::joined(v); }

// "step:loss_exact" of every train line.
std::vector<std::string> losses(const std::string& metrics) { return mt::test::step_losses(metrics); }

using mt::test::shell_exit_code;

// Runs a shell command, returns its exit code.
int run(const std::string& cmd) { return shell_exit_code(std::system(cmd.c_str())); }

struct Recorder final : TrainObserver {
  std::vector<std::string> events;
  int stop_at = -1;  // request a stop in on_step of this step
  std::vector<StepReport> steps;
  void on_run_start(const RunStart& r) override { events.push_back("start " + std::to_string(r.start_step)); }
  void on_step(const StepReport& r) override {
    events.push_back("step " + std::to_string(r.stats.step));
    steps.push_back(r);
    if (r.stats.step == stop_at) request_stop();
  }
  std::vector<double> evals;
  void on_eval(int step, double v) override {
    events.push_back(fmt::format("eval {}", step));
    evals.push_back(v);
  }
  void on_checkpoint(int step, const std::string& dir, const std::string& why) override {
    events.push_back(fmt::format("checkpoint {} {} {}", step, why, fs::path(dir).filename().string()));
  }
  void on_error(int step, ErrorKind k, const std::string&) override {
    events.push_back(fmt::format("error {} {}", step, kind_name(k)));
  }
};

TEST(TrainObservers, SeeEveryEventInOrderWithTheRunsValues) {
  prepare_brown();
  const std::string out = ::testing::TempDir() + "/mt_observers";
  fs::remove_all(out);
  Recorder rec;
  // Synchronous saves: an asynchronous one is committed (and reported) whenever its background write ends, which
  // falls anywhere after its step (tests/ckpt_fast_test.cpp checks the order of its own events).
  TrainResult r = run_training(small(out, {"--train.steps=4", "--train.eval_every=2", "--train.eval_batches=2",
                                           "--ckpt.every=3", "--ckpt.async=false"}),
                               {}, {&rec});
  const std::vector<std::string> want = {"start 0", "step 1", "step 2",
                                         "eval 2",  "step 3", "checkpoint 3 periodic step_00000003",
                                         "step 4",  "eval 4", "checkpoint 4 final step_00000004"};
  EXPECT_EQ(rec.events, want);
  ASSERT_EQ(rec.evals.size(), 2u);
  EXPECT_TRUE(std::isfinite(rec.evals[0]));
  EXPECT_EQ(rec.evals[1], r.last_val_loss);
  ASSERT_EQ(rec.steps.size(), 4u);
  EXPECT_EQ(rec.steps.back().stats.loss, r.last_loss);
  for (const StepReport& s : rec.steps) {  // one process: no plane has traffic
    EXPECT_EQ(s.dp.busy_seconds + s.tp.busy_seconds + s.pp.busy_seconds, 0.0);
    EXPECT_GT(s.stats.step_seconds, 0.0);
  }
  // The metrics log is an observer too: it has the same steps and the checkpoints.
  EXPECT_EQ(losses(out + "/metrics.jsonl").size(), 4u);
  EXPECT_NE(slurp(out + "/metrics.jsonl").find("\"kind\":\"checkpoint\""), std::string::npos);
}

TEST(TrainObservers, SeeTheErrorThatEndsARunWithItsKind) {
  prepare_brown();
  const std::string out = ::testing::TempDir() + "/mt_observers_diverge";
  fs::remove_all(out);
  Recorder rec;
  // lr 1e6 with Adam moves every weight by ~1e6 per step: the logits overflow within a few steps.
  try {
    run_training(small(out, {"--train.steps=50", "--optim.lr=1e6", "--optim.warmup_steps=0", "--optim.grad_clip=0"}),
                 {}, {&rec});
    FAIL() << "a run at lr 1e6 did not diverge";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind, ErrorKind::NonFinite) << e.what();
    ASSERT_FALSE(rec.events.empty());
    EXPECT_EQ(rec.events.back().rfind("error ", 0), 0u) << rec.events.back();
    EXPECT_NE(rec.events.back().find("non-finite"), std::string::npos) << rec.events.back();
  }
  EXPECT_NE(slurp(out + "/metrics.jsonl").find("\"error_kind\":\"non-finite\""), std::string::npos);
}

TEST(TrainStop, FinishesTheStepCheckpointsAndResumesBitIdentically) {
  prepare_brown();
  const std::string a = ::testing::TempDir() + "/mt_stop_a", b = ::testing::TempDir() + "/mt_stop_b";
  fs::remove_all(a);
  fs::remove_all(b);
  run_training(small(a, {"--train.steps=7"}));  // the undisturbed run
  Recorder rec;
  rec.stop_at = 3;
  TrainResult r = run_training(small(b, {"--train.steps=7"}), {}, {&rec});
  clear_stop_request();
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.last_step, 3);
  EXPECT_EQ(rec.events.back(), "checkpoint 3 stop step_00000003");
  TrainResult r2 = run_training(small(b, {"--train.steps=7"}));  // ckpt.resume = auto
  EXPECT_FALSE(r2.stopped);
  EXPECT_EQ(r2.first_step, 4);
  EXPECT_EQ(losses(a + "/metrics.jsonl"), losses(b + "/metrics.jsonl"));
}

// Starts argv in its own process group; returns its pid.
pid_t spawn_sh(const std::string& cmd) {
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

// Waits (up to 120 s, a hang guard) until the metrics file has a train line of step >= n.
bool wait_for_step(const std::string& metrics, int n) {
  for (int i = 0; i < 1200; ++i) {
    for (const std::string& l : losses(metrics))
      if (std::stoi(l.substr(0, l.find(':'))) >= n) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

int wait_pid(pid_t pid) {
  int st = 0;
  ::waitpid(pid, &st, 0);
  return shell_exit_code(st);
}

// Whether process pid ignores signal sig (the SigIgn mask of /proc/<pid>/status: bit sig-1).
bool ignores_signal(pid_t pid, int sig) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("SigIgn:", 0) == 0) return (std::stoull(line.substr(7), nullptr, 16) >> (sig - 1)) & 1;
  return false;
}

TEST(TrainStop, SigtermGivesTheStoppedExitCodeAndAResumableCheckpoint) {
  prepare_brown();
  const std::string out = ::testing::TempDir() + "/mt_stop_sigterm";
  fs::remove_all(out);
  // exec: the signal goes to megatrain itself, not to the shell.
  pid_t pid = spawn_sh("exec " + kMegatrain + " train" + joined(small_flags(out)) + " --train.steps=100000 > " + out +
                       ".log 2>&1");
  ASSERT_TRUE(wait_for_step(out + "/metrics.jsonl", 2)) << slurp(out + ".log");
  // A rank ignores SIGPIPE: a write to a peer that died then fails as a lost peer (exit code 22, snapshots
  // persisted for the restart) instead of killing the rank with no word (Gloo writes with writev: no MSG_NOSIGNAL).
  EXPECT_TRUE(ignores_signal(pid, SIGPIPE));
  ::kill(pid, SIGTERM);
  EXPECT_EQ(wait_pid(pid), exit_code(ErrorKind::Stopped)) << slurp(out + ".log");
  const std::string log = slurp(out + ".log");
  EXPECT_NE(log.find("stop requested"), std::string::npos) << log;
  // The stop checkpoint is complete: a run resumes from it.
  const std::vector<std::string> before = losses(out + "/metrics.jsonl");
  ASSERT_FALSE(before.empty());
  const int last = std::stoi(before.back().substr(0, before.back().find(':')));
  EXPECT_TRUE(fs::exists(out + fmt::format("/ckpt/step_{:08d}", last))) << log;
  EXPECT_EQ(run(kMegatrain + " train" + joined(small_flags(out)) + fmt::format(" --train.steps={}", last + 1) + " > " +
                out + ".resume.log 2>&1"),
            0)
      << slurp(out + ".resume.log");
  EXPECT_NE(slurp(out + ".resume.log").find(fmt::format("at step {}", last)), std::string::npos);
}

TEST(TrainStop, UnderLaunchEveryRankStopsAtTheSameStep) {
  prepare_brown();
  const std::string out = ::testing::TempDir() + "/mt_stop_launch";
  fs::remove_all(out);
  pid_t pid = spawn_sh("exec " + kMegatrain + " launch --nproc 2 --grace 60 -- train" + joined(small_flags(out)) +
                       " --parallel.dp=2 --data.batch_size=2 --train.steps=100000 > " + out + ".log 2>&1");
  ASSERT_TRUE(wait_for_step(out + "/metrics.jsonl", 2)) << slurp(out + ".log");
  ::kill(pid, SIGTERM);  // the launcher forwards it to both ranks, which see it at different points of a step
  wait_pid(pid);
  const std::string log = slurp(out + ".log");
  // Both ranks stopped cleanly (no rank was killed after the grace period, none timed out waiting for the other).
  EXPECT_EQ(log.find("killing it"), std::string::npos) << log;
  EXPECT_EQ(log.find("timed out"), std::string::npos) << log;
  EXPECT_NE(log.find("stop requested"), std::string::npos) << log;
  const std::vector<std::string> l = losses(out + "/metrics.jsonl");
  ASSERT_FALSE(l.empty());
  const int last = std::stoi(l.back().substr(0, l.back().find(':')));
  EXPECT_TRUE(fs::exists(out + fmt::format("/ckpt/step_{:08d}/manifest.json", last))) << log;
}

TEST(ExitCodes, EachKindOfFailureHasItsOwnCode) {
  prepare_brown();
  const std::string out = ::testing::TempDir() + "/mt_exit_codes";
  fs::remove_all(out);
  const std::string train = kMegatrain + " train" + joined(small_flags(out));
  EXPECT_EQ(run(train + " --model.n_layre=2 > /dev/null 2>&1"), exit_code(ErrorKind::Config));
  EXPECT_EQ(run(train + " --data.dir=/nonexistent/shards > /dev/null 2>&1"), exit_code(ErrorKind::Data));
  EXPECT_EQ(run(train + " --ckpt.resume=/nonexistent/ckpt/step_00000001 > /dev/null 2>&1"),
            exit_code(ErrorKind::Checkpoint));
  EXPECT_EQ(run(train + " --train.steps=50 --optim.lr=1e6 --optim.warmup_steps=0 --optim.grad_clip=0 > " + out +
                ".log 2>&1"),
            exit_code(ErrorKind::NonFinite))
      << slurp(out + ".log");
  EXPECT_NE(slurp(out + ".log").find("non-finite"), std::string::npos);
  // The codes split into "restarting cannot help" and "a restart may help".
  EXPECT_FALSE(restart_may_help(ErrorKind::Config));
  EXPECT_FALSE(restart_may_help(ErrorKind::Checkpoint));
  EXPECT_TRUE(restart_may_help(ErrorKind::PeerLost));
  EXPECT_TRUE(restart_may_help(ErrorKind::CommTimeout));
}

TEST(ConfigAgreement, DifferencesNameEveryKeyBothValuesAndTheRank) {
  const ConfigEntries ref = {{"model.n_layer", "2"}, {"optim.lr", "0.001"}, {"data.seq_len", "32"}};
  EXPECT_EQ(config_differences(ref, ref, 3), "");
  const ConfigEntries mine = {{"model.n_layer", "3"}, {"optim.lr", "0.001"}, {"data.seq_len", "64"}, {"x.y", "1"}};
  EXPECT_EQ(config_differences(ref, mine, 3),
            "data.seq_len (rank 0: 32, rank 3: 64); model.n_layer (rank 0: 2, rank 3: 3); x.y (rank 0: <absent>, "
            "rank 3: 1)");
}

TEST(ConfigAgreement, TheEffectiveConfigCoversDefaultsAndOverrides) {
  RunConfig a = parse_run_config("", "a", {"--optim.lr=0.001"}), b = parse_run_config("[optim]\nlr = 1e-3\n", "b");
  EXPECT_EQ(a.effective, b.effective);  // the same values, however they were written
  RunConfig c = parse_run_config("", "c", {"--optim.lr=0.001", "--data.seq_len=64"});
  EXPECT_EQ(config_differences(a.effective, c.effective, 1), "data.seq_len (rank 0: 128, rank 1: 64)");
  EXPECT_GT(a.effective.size(), 60u);  // every key of every section, defaults included
}

TEST(ConfigAgreement, RanksWithDifferentConfigsFailAtStartNamingKeysAndRanks) {
  prepare_brown();
  const std::string out = ::testing::TempDir() + "/mt_config_disagree";
  fs::remove_all(out);
  // Rank 1 gets another n_layer and another lr: before this check, n_layer aborted inside Gloo and lr trained on.
  const std::string cmd = kMegatrain + " launch --nproc 2 --exec -- sh -c '" + kMegatrain + " train" +
                          joined(small_flags(out)) +
                          " --parallel.dp=2 --data.batch_size=2 --train.steps=2 --model.n_layer=$((RANK+2))"
                          " --optim.lr=$((RANK+1))e-3' > " +
                          out + ".log 2>&1";
  EXPECT_EQ(run(cmd), exit_code(ErrorKind::Config)) << slurp(out + ".log");
  const std::string log = slurp(out + ".log");
  EXPECT_NE(log.find("different configs"), std::string::npos) << log;
  EXPECT_NE(log.find("model.n_layer (rank 0: 2, rank 1: 3)"), std::string::npos) << log;
  EXPECT_NE(log.find("optim.lr (rank 0: 0.001, rank 1: 0.002)"), std::string::npos) << log;
  EXPECT_EQ(log.find("EnforceNotMet"), std::string::npos) << log;
}

TEST(Peak, DatasheetPeaksByDeviceName) {
  EXPECT_DOUBLE_EQ(datasheet_peak_flops("NVIDIA H100 80GB HBM3"), 989.4e12);
  EXPECT_DOUBLE_EQ(datasheet_peak_flops("NVIDIA H100 PCIe"), 756.0e12);
  EXPECT_DOUBLE_EQ(datasheet_peak_flops("NVIDIA H100 NVL"), 835.5e12);
  EXPECT_DOUBLE_EQ(datasheet_peak_flops("NVIDIA H200"), 989.4e12);
  EXPECT_DOUBLE_EQ(datasheet_peak_flops("NVIDIA A100-SXM4-80GB"), 312.0e12);
  EXPECT_EQ(datasheet_peak_flops("NVIDIA GeForce RTX 4090"), 0.0);  // unknown: the user must configure it
}

}  // namespace

TEST(Peak, ARankGetsItsShareOfTheNodesCpusAndNeverMoreThanItsThreads) {
  EXPECT_DOUBLE_EQ(cpu_peak_per_rank(100e9, {1, 4, 2}), 50e9);    // `make train` on 2 cores: half a CPU a rank
  EXPECT_DOUBLE_EQ(cpu_peak_per_rank(100e9, {2, 4, 16}), 200e9);  // CPUs to spare: the rank's 2 threads
  EXPECT_DOUBLE_EQ(cpu_peak_per_rank(100e9, {4, 2, 6}), 300e9);   // 3 CPUs a rank, fewer than its 4 threads
  EXPECT_DOUBLE_EQ(cpu_peak_per_rank(90e9, {1, 3, 1}), 30e9);
  // The node's ranks together never exceed its CPUs at the measured rate, nor a rank its threads.
  for (int t = 1; t <= 4; ++t)
    for (int l = 1; l <= 8; ++l)
      for (int c = 1; c <= 8; ++c) {
        const double p = cpu_peak_per_rank(1.0, {t, l, c});
        EXPECT_LE(l * p, c * (1 + 1e-12)) << t << " " << l << " " << c;
        EXPECT_LE(p, t);
        EXPECT_GT(p, 0);
      }
  EXPECT_THROW(cpu_peak_per_rank(1e9, {0, 1, 1}), Error);
  EXPECT_THROW(cpu_peak_per_rank(1e9, {1, 1, 0}), Error);
}

// A real job with more ranks than CPUs: `launch --nproc 2` pinned to one CPU (taskset), the peak measured.
TEST(Peak, WithMoreRanksThanCpusNoLoggedMfuExceeds100Percent) {
  if (run("command -v taskset > /dev/null") != 0) GTEST_SKIP() << "no taskset";
  cpu_set_t set;
  ASSERT_EQ(::sched_getaffinity(0, sizeof set, &set), 0);
  int cpu = 0;
  while (!CPU_ISSET(cpu, &set)) ++cpu;
  prepare_brown();
  const std::string out = ::testing::TempDir() + "/mt_peak_shared";
  fs::remove_all(out);
  const std::string job = mt::test::SmallJob::gpt2(out).steps(6).log_every(1).batch(2).line();
  ASSERT_EQ(run(fmt::format("taskset -c {} {} launch --nproc 2 -- train{} --parallel.dp=2 > {}.log 2>&1", cpu,
                            kMegatrain, job, out)),
            0)
      << slurp(out + ".log");
  const std::vector<nlohmann::json> train = mt::test::metrics_of(out + "/metrics.jsonl", "train");
  ASSERT_EQ(train.size(), 6u) << slurp(out + ".log");
  for (const nlohmann::json& j : train) EXPECT_LE(j["mfu"].get<double>(), 1.0) << j.dump();
  const std::string log = slurp(out + ".log");
  EXPECT_NE(log.find("this node's 1 CPU shared by 2 ranks of 1 thread"), std::string::npos) << log;
  const nlohmann::json start = mt::test::metrics_of(out + "/metrics.jsonl", "run").at(0);
  EXPECT_NE(start["peak_source"].get<std::string>().find("1 CPU shared by 2 ranks"), std::string::npos) << start;
}

namespace {

// The first line a run printed on stdout.
std::string first_line(const std::string& file) {
  std::ifstream f(file);
  std::string line;
  std::getline(f, line);
  return line;
}

// The first candidate core for this CPU whose self-test passes, each run as the binary's own hidden subcommand.
std::string first_passing_candidate() {
  for (const std::string& c : blas_core_candidates(cpu_features()))
    if (run("OPENBLAS_CORETYPE=" + c + " " + kMegatrain + " __blas-selftest > /dev/null 2>&1") == 0) return c;
  return "";
}

}  // namespace

TEST(BlasCore, TrainReexecutesItselfWithTheBestPassingCoreWhenOpenBlasFellBack) {
  const std::string want = first_passing_candidate();
  if (want.empty()) GTEST_SKIP() << "no core better than a fallback runs on this CPU";
  prepare_brown();
  const std::string out = ::testing::TempDir() + "/mt_blas_reexec";
  fs::remove_all(out);
  // The test hook makes OpenBLAS's report read "Prescott", as on a processor it does not know.
  ASSERT_EQ(run("env -u OPENBLAS_CORETYPE -u MEGATRAIN_BLAS_CORE MEGATRAIN_TEST_BLAS_CORENAME=Prescott " + kMegatrain +
                " train" + joined(small_flags(out)) + " --train.steps=1 > " + out + ".log 2> " + out + ".err"),
            0)
      << slurp(out + ".log") << slurp(out + ".err");
  // The core named is openblas_get_corename() of the process that trained: the re-executed one ran it.
  const std::string line = first_line(out + ".log");
  EXPECT_EQ(line.rfind("model: ", 0), 0u) << line;
  EXPECT_NE(line.find("| BLAS core " + want + " (OpenBLAS fell back to Prescott on a CPU with "), std::string::npos)
      << line;
  EXPECT_NE(line.find(want + " passed the self-test"), std::string::npos) << line;
  const nlohmann::json start = mt::test::metrics_of(out + "/metrics.jsonl", "run").at(0);
  EXPECT_EQ(start["blas_core"].get<std::string>().rfind("BLAS core " + want + " (", 0), 0u) << start;
}

TEST(BlasCore, TheUsersCoretypeIsKeptEvenAFallbackOne) {
  prepare_brown();
  const std::string out = ::testing::TempDir() + "/mt_blas_user";
  fs::remove_all(out);
  ASSERT_EQ(run("env -u MEGATRAIN_BLAS_CORE OPENBLAS_CORETYPE=Prescott MEGATRAIN_TEST_BLAS_CORENAME=Prescott " +
                kMegatrain + " train" + joined(small_flags(out)) + " --train.steps=1 > " + out + ".log 2>&1"),
            0)
      << slurp(out + ".log");
  const std::string line = first_line(out + ".log");
  EXPECT_NE(line.find("| BLAS core Prescott (OPENBLAS_CORETYPE=Prescott set by the user)"), std::string::npos) << line;
}

TEST(BlasCore, LaunchGivesItsRanksTheBestPassingCoreWhenOpenBlasFellBack) {
  const std::string want = first_passing_candidate();
  if (want.empty()) GTEST_SKIP() << "no core better than a fallback runs on this CPU";
  prepare_brown();
  const std::string out = ::testing::TempDir() + "/mt_blas_launch";
  fs::remove_all(out);
  ASSERT_EQ(run("env -u OPENBLAS_CORETYPE -u MEGATRAIN_BLAS_CORE MEGATRAIN_TEST_BLAS_CORENAME=Prescott " + kMegatrain +
                " launch --nproc 2 -- train" + joined(small_flags(out)) +
                " --parallel.dp=2 --data.batch_size=2 --train.steps=1 > " + out + ".log 2>&1"),
            0)
      << slurp(out + ".log");
  const std::string log = slurp(out + ".log");
  EXPECT_NE(log.find("launch: ranks run OpenBLAS core " + want + ": OpenBLAS fell back to Prescott"), std::string::npos)
      << log;
  EXPECT_NE(log.find("| BLAS core " + want + " (OpenBLAS fell back to Prescott"), std::string::npos) << log;
}
