// Silent data corruption on real supervised jobs (train/sdc_check.h): a bit of one weight of one rank is flipped
// (MEGATRAIN_FAULTS bitflip) in a running `megatrain launch --max-restarts ... -- train` job. The replicas' check
// must find it before the step's checkpoint is written, the event log must name the corrupt rank, the step and the
// tensor, and the job must finish by itself with the per-step losses of an undisturbed run (the oracle): the
// restart resumes from the newest checkpoint the replicas agreed on, before the flip.
// The flip lands after step 6's update, a checkpoint step (ckpt.every = 2), so the check of that checkpoint finds it
// whatever train.sdc_check_every is; under ZeRO-2 the next step's all-gather of the parameters would overwrite (or
// spread) a flip that no check saw (docs/robust-training.md says what the check cannot see).
// A transient fault (MEGATRAIN_FAULTS sdcgrad) corrupts one gradient element of one rank before the data-parallel
// reduction, which spreads it to every replica: the replicas' check cannot see it, the rerun of the step whose
// gradient norm spiked must (train/sdc_rerun.h), before the update, so the restart from the checkpoint before it
// trains the undisturbed run's losses.
#include "support/files.h"
#include "support/launch_testutil.h"
#include "support/megatrain.h"
#include "support/metrics.h"
#include "support/test_util.h"

using namespace mt;
using namespace mt::test;
namespace fs = std::filesystem;

namespace {

class LaunchSdc : public ::testing::Test {
 protected:
  void SetUp() override {
    mt::test::prepare_launch_data();
    dir_ = mt::test::case_dir("mt-sdc-");
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // The job: the fault matrix's small one (launch_testutil.h dp2_tp2_job: 10 steps, a checkpoint every 2), or
  // the transient-fault cases' (transient_job).
  using JobOf = std::function<SmallJob(const std::string& out)>;
  // 15 steps, a checkpoint every 5: the spike detectors' warm-up is 10 steps (train/loss_spike.h), so a fault in
  // step 12 can be seen, and the restart resumes from step 10's checkpoint.
  static SmallJob transient_job(const std::string& out) {
    return std::move(dp2_tp2_job(out).steps(15).set("ckpt.every", 5));
  }

  // `nproc` ranks of the job in the layout `layout`.
  std::vector<std::string> job(const std::string& out, int nproc, const std::vector<std::string>& layout,
                               const std::vector<std::string>& launch_opts, const JobOf& of = dp2_tp2_job) {
    std::vector<std::string> a = {"launch", "--nproc", std::to_string(nproc)};
    a.insert(a.end(), launch_opts.begin(), launch_opts.end());
    a.push_back("--");
    a.push_back("train");
    for (const std::string& f : of(out).with(layout).args()) a.push_back(f);
    return a;
  }

  // The losses of the undisturbed job, once per build and layout (launch_testutil.h cached_losses). The transient
  // cases' oracle trains without the spikes' rerun (train.sdc_rerun_on_spike = false): nothing of what they test.
  std::vector<std::string> undisturbed(int nproc, const std::vector<std::string>& layout, const JobOf& of = dp2_tp2_job,
                                       size_t steps = 10) {
    const std::vector<std::string> args = job((dir_ / "undisturbed").string(), nproc, layout, {}, of);
    std::vector<std::string> losses = cached_losses("sdc-undisturbed", args, [&] {
      const std::string log = (dir_ / "undisturbed.log").string();
      EXPECT_EQ(finish_within(start_logged(kMegatrain, args, log), 400), 0) << slurp(log);
      return step_losses((dir_ / "undisturbed" / "metrics.jsonl").string());
    });
    EXPECT_EQ(losses.size(), steps);
    return losses;
  }
  std::vector<std::string> undisturbed_transient(int nproc, std::vector<std::string> layout) {
    layout.push_back("--train.sdc_rerun_on_spike=false");
    return undisturbed(nproc, layout, transient_job, 15);
  }

  // The job under supervision with MEGATRAIN_FAULTS = faults; returns the launcher's exit code.
  int supervised(int nproc, const std::vector<std::string>& layout, const std::string& faults,
                 const JobOf& of = dp2_tp2_job) {
    ::setenv("MEGATRAIN_FAULTS", faults.c_str(), 1);
    const pid_t launcher = start_logged(kMegatrain,
                                        job(out(), nproc, layout,
                                            {"--max-restarts", "3", "--backoff", "0", "--events", events()}, of),
                                        (dir_ / "run.log").string());
    ::unsetenv("MEGATRAIN_FAULTS");
    return finish_within(launcher, 400);
  }
  std::string out() const { return (dir_ / "run").string(); }
  std::string events() const { return (dir_ / "events.jsonl").string(); }
  std::string log() const { return slurp(dir_ / "run.log"); }
  nlohmann::json first(const std::string& name) const {
    for (auto& e : events_of(events()))
      if (e["event"] == name) return e;
    return nlohmann::json();
  }
  // The events `event` of reason `reason`, in order (default: the faults of reason sdc).
  std::vector<nlohmann::json> sdc_faults(const std::string& event = "fault", const std::string& reason = "sdc") const {
    std::vector<nlohmann::json> v;
    for (auto& e : events_of(events()))
      if (e["event"] == event && e.value("reason", "") == reason) v.push_back(e);
    return v;
  }
  // The steps of the checkpoints in the run's ckpt dir.
  std::set<int> checkpoint_steps() const {
    std::set<int> steps;
    for (auto& e : fs::directory_iterator(fs::path(out()) / "ckpt"))
      if (e.path().filename().string().rfind("step_", 0) == 0)
        steps.insert(std::stoi(e.path().filename().string().substr(5)));
    return steps;
  }

  // A transient fault of rank `rank` in step 12 (sdcgrad) in `layout`: found by the rerun of the spiking step,
  // `rank` alone named with `tensor`, the job restarts from step 10's checkpoint and trains the undisturbed losses.
  void transient_fault_is_found(int nproc, const std::vector<std::string>& layout, int rank,
                                const std::string& tensor) {
    const auto want = undisturbed_transient(nproc, layout);
    ASSERT_EQ(supervised(nproc, layout, fmt::format("sdcgrad:rank={}:step=12", rank), transient_job), 0) << log();
    EXPECT_EQ(step_losses(out() + "/metrics.jsonl"), want);
    EXPECT_EQ(first("injected")["rank"], rank);
    const std::vector<nlohmann::json> sdc = sdc_faults();
    ASSERT_EQ(sdc.size(), 1u) << slurp(events());
    EXPECT_EQ(sdc[0]["rank"], rank);
    EXPECT_EQ(sdc[0]["attempt"], 0);
    EXPECT_EQ(sdc[0]["detail"]["step"], 12);
    EXPECT_EQ(sdc[0]["detail"]["transient"], true);
    EXPECT_EQ(sdc[0]["detail"]["node"], 0);
    EXPECT_EQ(sdc[0]["detail"]["tensor"], tensor);
    EXPECT_EQ(sdc[0]["detail"]["trigger"], "grad_norm");
    EXPECT_NE(sdc[0]["detail"]["first"], sdc[0]["detail"]["rerun"]);
    EXPECT_TRUE(sdc_faults("fault", "sdc_culprit").empty()) << slurp(events());
    EXPECT_TRUE(sdc_faults("warning", "sdc_rerun").empty()) << slurp(events());  // the clean attempt: no spike
    // The error every rank fails with is the Sdc kind's (exit 25), before step 12's update: no checkpoint of
    // attempt 0 holds it (the next one was step 15's, never reached), the restart loads step 10's.
    EXPECT_NE(log().find("exit code 25"), std::string::npos) << log();
    EXPECT_EQ(first("restarting")["attempt"], 0);
    EXPECT_EQ(first("resumed")["from"], 10);
    EXPECT_EQ(first("done")["attempt"], 1);
    EXPECT_EQ(first("evicted"), nlohmann::json());          // a transient fault is no reason to leave the node
    EXPECT_EQ(checkpoint_steps(), (std::set<int>{5, 10}));  // save_final false; 15 is the last step
  }

  fs::path dir_;
};

// dp = 3: the majority names the one corrupt replica.
TEST_F(LaunchSdc, ABitflipOnOneOfThreeReplicasIsNamedByMajorityAndTheJobRecoversTheUndisturbedLosses) {
  const std::vector<std::string> layout = {"--parallel.dp=3", "--parallel.tp=1"};
  const auto want = undisturbed(3, layout);
  ASSERT_EQ(supervised(3, layout, "bitflip:rank=1:step=6"), 0) << log();
  EXPECT_EQ(step_losses(out() + "/metrics.jsonl"), want);
  EXPECT_EQ(first("injected")["rank"], 1);
  const std::vector<nlohmann::json> sdc = sdc_faults();
  ASSERT_EQ(sdc.size(), 1u) << slurp(events());
  EXPECT_EQ(sdc[0]["rank"], 1);
  EXPECT_EQ(sdc[0]["detail"]["step"], 6);
  EXPECT_EQ(sdc[0]["detail"]["tensor"], "h.0.ln_1.weight");
  EXPECT_EQ(sdc[0]["detail"]["suspects"], nlohmann::json::array({1}));
  EXPECT_EQ(sdc[0]["detail"]["no_majority"], false);
  EXPECT_EQ(first("restarting")["attempt"], 0);
  EXPECT_EQ(first("resumed")["from"], 4);  // the checkpoint of step 6 was never written: its check failed
  EXPECT_EQ(first("done")["attempt"], 1);
  // Each checkpoint records the parameter hash its replicas agreed on at its own step (the restarted attempt wrote
  // step 6's and 8's; keep_last 3 leaves 4, 6, 8).
  for (int s : {4, 6, 8}) {
    const fs::path manifest = fs::path(out()) / "ckpt" / fmt::format("step_{:08d}", s) / "manifest.json";
    const nlohmann::json sdc = nlohmann::json::parse(slurp(manifest))["extra"]["sdc"];
    EXPECT_EQ(sdc["step"], s) << manifest;
    EXPECT_EQ(sdc["hash"].get<std::string>().size(), 16u) << manifest;
    EXPECT_EQ(sdc["dp"], 3) << manifest;
  }
}

// The check only reads the parameters: checking after every step, or never, trains bit for bit the same.
TEST_F(LaunchSdc, CheckingEveryStepOrNeverChangesNoLoss) {
  const std::vector<std::string> layout = {};  // dp2 x tp2
  const auto want = undisturbed(4, layout);
  for (const char* every : {"0", "1"}) {
    const std::string run = (dir_ / (std::string("every") + every)).string();
    std::vector<std::string> extra = {std::string("--train.sdc_check_every=") + every};
    const std::string log = run + ".log";
    std::vector<std::string> args = job(run, 4, extra, {});
    ASSERT_EQ(finish_within(start_logged(kMegatrain, args, log), 400), 0) << slurp(log);
    EXPECT_EQ(step_losses(run + "/metrics.jsonl"), want) << "train.sdc_check_every=" << every;
  }
}

// dp = 2 (x tp = 2): no majority, so both replicas of the corrupt rank's dp group are named (the other dp group,
// the other tp coordinate, agrees and names nobody); the restarted attempt's rerun of the step names the one that
// did not reproduce its result.
TEST_F(LaunchSdc, ABitflipUnderDp2NamesThePairThenTheRerunNamesTheCulpritAndTheJobRecoversTheUndisturbedLosses) {
  const std::vector<std::string> layout = {};  // dp2_tp2_job's own dp2 x tp2
  const auto want = undisturbed(4, layout);
  ASSERT_EQ(supervised(4, layout, "bitflip:rank=2:step=6"), 0) << log();
  EXPECT_EQ(step_losses(out() + "/metrics.jsonl"), want);
  const std::vector<nlohmann::json> sdc = sdc_faults();
  ASSERT_EQ(sdc.size(), 2u) << slurp(events());
  std::set<int> named;
  for (const auto& e : sdc) {
    named.insert(e["rank"].get<int>());
    EXPECT_EQ(e["detail"]["step"], 6);
    EXPECT_EQ(e["detail"]["suspects"], nlohmann::json::array({0, 2}));
    EXPECT_EQ(e["detail"]["no_majority"], true);
  }
  EXPECT_EQ(named, (std::set<int>{0, 2}));  // rank 2's dp group: (dp0, tp0) and (dp1, tp0)
  // The restarted attempt reruns step 6: rank 0 reproduces its hash, rank 2 (flipped in attempt 0 only) does not.
  std::vector<nlohmann::json> culprits;
  for (auto& e : events_of(events()))
    if (e["event"] == "fault" && e.value("reason", "") == "sdc_culprit") culprits.push_back(e);
  ASSERT_EQ(culprits.size(), 1u) << slurp(events());
  EXPECT_EQ(culprits[0]["rank"], 2);
  EXPECT_EQ(culprits[0]["attempt"], 1);
  EXPECT_EQ(culprits[0]["detail"]["step"], 6);
  EXPECT_EQ(culprits[0]["detail"]["reproduced_by"], nlohmann::json::array({0}));
  EXPECT_FALSE(fs::exists(fs::path(out()) / "ckpt" / "sdc" / "step_6-pp0-tp0.json"));  // settled: removed
  EXPECT_EQ(first("resumed")["from"], 4);
  EXPECT_EQ(first("done")["attempt"], 1);
}

// dp = 2: the corrupted gradient reaches both replicas through the reduce-scatter, so their parameters would agree;
// the gradient norm spikes, the rerun of step 12 reproduces on rank 0 and not on rank 1, which is named.
TEST_F(LaunchSdc, ATransientGradientFaultUnderDp2IsFoundByTheRerunOfTheSpikingStepAndTheJobRecoversTheLosses) {
  transient_fault_is_found(2, {"--parallel.dp=2", "--parallel.tp=1"}, 1, "h.0.ln_1.weight");
}

// dp = 2 x tp = 2: rank 1 is (dp 0, tp 1); the corrupted element is in the first block tensor that is sharded over
// tp (a replicated one's gradient is summed over tp in place: left out of the comparison, train/sdc_rerun.h).
TEST_F(LaunchSdc, ATransientGradientFaultUnderDp2Tp2NamesTheOneRankThatErred) {
  transient_fault_is_found(4, {}, 1, "h.0.attn.c_attn.weight");
}

// Straggler coding (gc on dp = 4; a deadline no round reaches, so every run of a step keeps the same pieces): the
// rerun of the spiking step replays the agreed straggler bitmaps on the kept batches, reproduces bit for bit on every
// rank but rank 2, which is named. (Rank 2, not 1: with no straggler each block's piece is taken from its lowest
// replica, 0 and 2, so replicas 1 and 3 contribute zeros, and a fault scaling one of their zeros changes nothing.)
TEST_F(LaunchSdc, ATransientGradientFaultUnderStragglerCodingIsFoundByTheRerunOfTheSpikingStep) {
  transient_fault_is_found(4,
                           {"--parallel.dp=4", "--parallel.tp=1", "--parallel.straggler_coding=gc",
                            "--parallel.straggler_s=1", "--parallel.straggler_deadline=1000", "--train.grad_accum=2"},
                           2, "h.0.ln_1.weight");
}

// dp = 2 x pp = 2: rank 1 holds the first stage (its first block) of the second replica; the rerun replays the
// pipeline's schedule on the kept batches.
TEST_F(LaunchSdc, ATransientGradientFaultUnderDp2Pp2IsFoundInItsStage) {
  transient_fault_is_found(4, {"--parallel.dp=2", "--parallel.tp=1", "--parallel.pp=2"}, 1, "h.0.ln_1.weight");
}

// A spike without a fault: a spike rule so tight that the gradient norm or the loss spikes at many steps; each
// rerun reproduces on every rank, and the run trains the losses of a run without reruns, bit for bit.
TEST_F(LaunchSdc, ASpikeWhoseRerunReproducesIsNoFaultAndChangesNoLoss) {
  const std::vector<std::string> layout = {"--parallel.dp=2", "--parallel.tp=1"};
  const auto want = undisturbed_transient(2, layout);
  std::vector<std::string> tight = layout;
  tight.insert(tight.end(), {"--train.spike_window=2", "--train.spike_sigmas=1e-6"});
  ASSERT_EQ(supervised(2, tight, "", transient_job), 0) << log();
  EXPECT_EQ(step_losses(out() + "/metrics.jsonl"), want);
  const std::vector<nlohmann::json> reruns = sdc_faults("warning", "sdc_rerun");
  EXPECT_GE(reruns.size(), 3u) << slurp(events());
  std::set<int> steps;
  for (const auto& e : reruns) {
    EXPECT_EQ(e["detail"]["reproduced"], true);
    steps.insert(e["detail"]["step"].get<int>());
  }
  EXPECT_EQ(steps.size(), reruns.size());  // one rerun per spiking step
  EXPECT_TRUE(sdc_faults().empty()) << slurp(events());
  EXPECT_EQ(first("restarting"), nlohmann::json());
  EXPECT_EQ(first("done")["attempt"], 0);
}

}  // namespace
