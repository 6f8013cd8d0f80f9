// Straggler-tolerant data parallelism (parallel.straggler_coding, train/coded_forward_backward.h) on real jobs:
// `megatrain launch --nproc 4 -- train` as dp4 under gc, sr-sgc and m-sgc, and as dp2 x tp2 and dp2 x pp2 under gc,
// with a replica made slow by the slowburst fault (each of its micro-batches takes 60x its usual compute time in the
// rounds named). The oracle is the uncoded step on the same global batch: one process reading a round's rows as
// one micro-batch (what the dp tests compare against), and its reordered twin measures the noise floor
// (noise_floor.h): the coded step sums the same micro-batch gradients, each exactly once, in another order (pieces,
// then the replicas' reduction), whichever replicas straggled, so its losses, gradient norms, final parameters and
// moments sit within that floor. No assertion on speed: whether a slow replica is named a straggler depends on the
// machine's load, so a test asserts it only where many slow rounds make one acceptance certain in practice, and
// otherwise asserts the metrics' consistency (every step's rounds, the redundancy paid, waited rounds logged).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "megatrain/ckpt/checkpoint.h"
#include "support/files.h"
#include "support/launch_testutil.h"
#include "support/megatrain.h"
#include "support/metrics.h"
#include "support/parallel_testutil.h"

using namespace ptest;
using namespace std::chrono_literals;

namespace {

constexpr int kDp = 4, kRows = 2;  // replicas, rows per micro-batch per replica

// The shared flags, for the uncoded single process (rows = kDp x kRows) and the coded job (rows = kRows).
std::string flags(const std::string& out, int rows, int accum, const std::string& extra = "") {
  return common_args(out, rows, /*n_layer=*/2,
                     fmt::format(" --train.grad_accum={} --parallel.timeout_s=60", accum) + extra);
}

// The coded job's launcher command line: 4 ranks in `layout` (4 replicas unless it says otherwise), `coding` (the
// parallel.straggler_* flags).
std::string coded(const std::string& out, int accum, const std::string& coding, const std::string& extra = "",
                  const std::string& layout = " --parallel.dp=4") {
  return kMegatrain + " launch --nproc 4 -- train" + flags(out, kRows, accum, layout + coding + extra);
}

// Runs with MEGATRAIN_FAULTS = faults; output to log. Must succeed.
void run_with_faults(const std::string& cmd, const std::string& faults, const std::string& log) {
  const std::string env = faults.empty() ? "" : "MEGATRAIN_FAULTS='" + faults + "' ";
  ASSERT_EQ(std::system((env + cmd + " > " + log + " 2>&1").c_str()), 0) << cmd << "\n" << mt::test::slurp(log);
}

struct Case {
  std::string name, coding, faults;
  int accum = 2;
  int rounds = 2;         // of each step: train.grad_accum + the scheme's delay
  double redundancy = 2;  // the load paid at least (micro-batches computed / the uncoded step's)
  bool waits = false;     // the slow pattern is outside the scheme's model: rounds wait, and say so
  int named = -1;         // a replica that must be named a straggler at least once (-1: not asserted)
  int dp = kDp;           // replicas; the 4 ranks are dp x tp x pp
  std::string layout = " --parallel.dp=4";
  int micro = 1;  // pipeline micro-batches per round (pp)
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class StragglerCoding : public ::testing::TestWithParam<Case> {};

// The coded job against the uncoded step on the same global batch, and its per-step straggler metrics.
TEST_P(StragglerCoding, ADataParallelJobWithASlowReplicaGivesTheUncodedRun) {
  prepare();
  const Case& c = GetParam();
  const Trio t = fresh_trio("mt_straggler", c.name);
  const int rows = c.dp * kRows * c.micro;  // a round's rows: the single process takes them as one micro-batch
  run(kMegatrain + " train" + flags(t.single, rows, c.accum));
  run_twin(rows, flags(t.alt, rows, c.accum));
  const std::string log = t.multi + ".log";
  run_with_faults(coded(t.multi, c.accum, c.coding, "", c.layout), c.faults, log);
  expect_equivalent(t, c.name);

  const auto lines = mt::test::metrics_of(t.multi + "/metrics.jsonl", "train");
  ASSERT_EQ(lines.size(), 5u);
  int waited = 0;
  bool named = false;
  for (const auto& l : lines) {
    ASSERT_TRUE(l.contains("straggler")) << l.dump();
    const auto& s = l["straggler"];
    EXPECT_EQ(s["rounds"], c.rounds) << l.dump();
    EXPECT_GE(s["redundancy"].get<double>(), c.redundancy) << l.dump();
    EXPECT_GE(s["seconds_saved"].get<double>(), 0) << l.dump();
    waited += s["rounds_waited"].get<int>();
    for (const auto& st : s["stragglers"]) named = named || st["replica"] == c.named;
  }
  const std::string text = mt::test::slurp(log);
  if (c.waits) {
    EXPECT_GE(waited, 1) << text;
    EXPECT_NE(text.find("waited for replicas"), std::string::npos) << text;
  }
  if (c.named >= 0) {
    EXPECT_TRUE(named) << "replica " << c.named << " never straggled a round:\n" << text;
  }
  EXPECT_NE(text.find("fault injected: slowburst"), std::string::npos) << text;
}

// Rounds count from 0 within a step; steps 1-2 give every replica the deadline's history (3 rounds at least).
INSTANTIATE_TEST_SUITE_P(
    Schemes, StragglerCoding,
    ::testing::Values(
        // gc s=1: replica 2 slow in five rounds: at least one of them goes on without it.
        Case{"gc", " --parallel.straggler_coding=gc --parallel.straggler_s=1 --parallel.straggler_deadline=8",
             "slowburst:rank=2:factor=60:rounds=3.0,3.1,4.0,4.1,5.0", 2, 2, 2, false, 2},
        // Two slow replicas in one round are beyond gc s=1: the round waits for them, and says so.
        Case{"gc_outside_model",
             " --parallel.straggler_coding=gc --parallel.straggler_s=1 --parallel.straggler_deadline=8",
             "slowburst:rank=1:factor=60:rounds=3.1;slowburst:rank=2:factor=60:rounds=3.1", 2, 2, 2, true, -1},
        // sr-sgc (B=1, W=2, lambda=1: s=1): a job is due one round late, so a step has grad_accum + 1 rounds.
        Case{"sr_sgc",
             " --parallel.straggler_coding=sr-sgc --parallel.straggler_burst=1 --parallel.straggler_window=2 "
             "--parallel.straggler_lambda=1 --parallel.straggler_deadline=8",
             "slowburst:rank=1:factor=60:rounds=3.0,4.1", 2, 3, 1, false, -1},
        // m-sgc (B=1, W=2, lambda=1): jobs of 12 micro-batches (3 per replica), one job per step of
        // grad_accum 3, delay 1; the slow rounds drawn by the bursty generator (p=1: replica 0 starts a burst
        // whenever the model lets it, every other round).
        Case{"m_sgc",
             " --parallel.straggler_coding=m-sgc --parallel.straggler_burst=1 --parallel.straggler_window=2 "
             "--parallel.straggler_lambda=1 --parallel.straggler_deadline=8",
             "slowburst:rank=0:factor=60:b=1:w=2:lambda=1:p=1:seed=1", 3, 2, 1, false, -1},
        // dp2 x tp2, gc s=1: a replica is a tp group; rank 2 (dp1, tp0) is slow, its tp peer waits for it inside
        // the layers' collectives, and the replica leaves a round at a micro-batch boundary.
        Case{"gc_dp2_tp2",
             " --parallel.straggler_coding=gc --parallel.straggler_s=1 --parallel.straggler_deadline=8 "
             "--parallel.tp_chunks=1",
             "slowburst:rank=2:factor=60:rounds=3.0,3.1,4.0,4.1,5.0", 2, 2, 2, false, -1, 2,
             " --parallel.dp=2 --parallel.tp=2"},
        // dp2 x pp2 (1F1B over 2 pipeline micro-batches), gc s=1: a replica is a pipeline; rank 1 (dp1, pp0) is
        // slow, its stage stalls the replica's pipeline, which leaves a round between micro-batches.
        Case{"gc_dp2_pp2",
             " --parallel.straggler_coding=gc --parallel.straggler_s=1 --parallel.straggler_deadline=8 "
             "--parallel.microbatches=2",
             "slowburst:rank=1:factor=60:rounds=3.0,3.1,4.0,4.1,5.0", 2, 2, 2, false, -1, 2,
             " --parallel.dp=2 --parallel.pp=2", 2}),
    CaseName());

// The same fault on an uncoded job (parallel.straggler_coding = none): the slow replica sleeps after its slow rounds
// (train/forward_backward.cpp), its peers wait for it in the gradient reduction as a synchronous step does, and the
// losses stay the uncoded step's (bench/straggler_coding.sh sets the uncoded run beside the coded ones this way).
TEST(StragglerCodingUncoded, TheSlowburstFaultSlowsAnUncodedJobWithoutChangingItsLosses) {
  prepare();
  const Trio t = fresh_trio("mt_straggler", "uncoded");
  const int rows = kDp * kRows;
  run(kMegatrain + " train" + flags(t.single, rows, 2));
  run_twin(rows, flags(t.alt, rows, 2));
  const std::string log = t.multi + ".log";
  run_with_faults(kMegatrain + " launch --nproc 4 -- train" + flags(t.multi, kRows, 2, " --parallel.dp=4"),
                  "slowburst:rank=2:factor=5:rounds=2.0,3.1", log);
  expect_equivalent(t, "uncoded");
  const std::string text = mt::test::slurp(log);
  EXPECT_NE(text.find("fault injected: slowburst:rank=2:factor=5:rounds=2.0,3.1 (rank 2, step 2, round 0"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("(rank 2, step 3, round 1"), std::string::npos) << text;
  for (const auto& l : mt::test::metrics_of(t.multi + "/metrics.jsonl", "train"))
    EXPECT_FALSE(l.contains("straggler")) << l.dump();  // no coding: no straggler report
}

// The three schemes with a deadline no round reaches (every round waits for everyone, so every step keeps the same
// pieces and runs are bit-identical): name, flags, train.grad_accum (m-sgc: a multiple of its job of 3 rounds).
struct Scheme {
  std::string name, coding;
  int accum;
};
void PrintTo(const Scheme& s, std::ostream* os) { *os << s.name; }
const auto kSchemes = ::testing::Values(
    Scheme{"gc", " --parallel.straggler_coding=gc --parallel.straggler_s=1 --parallel.straggler_deadline=1000", 2},
    Scheme{"sr_sgc",
           " --parallel.straggler_coding=sr-sgc --parallel.straggler_burst=1 --parallel.straggler_window=2 "
           "--parallel.straggler_lambda=1 --parallel.straggler_deadline=1000",
           2},
    Scheme{"m_sgc",
           " --parallel.straggler_coding=m-sgc --parallel.straggler_burst=1 --parallel.straggler_window=2 "
           "--parallel.straggler_lambda=1 --parallel.straggler_deadline=1000",
           3});
struct SchemeName {
  std::string operator()(const ::testing::TestParamInfo<Scheme>& i) const { return i.param.name; }
};

class StragglerCodingResume : public ::testing::TestWithParam<Scheme> {};

// A coded run resumed from its step-3 checkpoint logs steps 4 and 5 bit for bit as the uninterrupted run.
TEST_P(StragglerCodingResume, AResumedRunIsBitIdenticalToTheUninterruptedOne) {
  prepare();
  const Scheme& sc = GetParam();
  const std::string full = fresh_dir("mt_straggler_resume_full_" + sc.name);
  run_with_faults(coded(full, sc.accum, sc.coding, " --ckpt.every=3"), "", full + ".log");
  const std::string resumed = fresh_dir("mt_straggler_resume_resumed_" + sc.name);
  run_with_faults(coded(resumed, sc.accum, sc.coding, " --ckpt.resume=" + step3(full)), "", resumed + ".log");
  const std::vector<std::string> want = mt::test::step_losses(full + "/metrics.jsonl");
  const std::vector<std::string> got = mt::test::step_losses(resumed + "/metrics.jsonl");
  ASSERT_EQ(want.size(), 5u);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], want[3]);
  EXPECT_EQ(got[1], want[4]);
}
INSTANTIATE_TEST_SUITE_P(Schemes, StragglerCodingResume, kSchemes, SchemeName());

}  // namespace

namespace {

// A coded job (each scheme, no deadline a round reaches: the same pieces kept every step, so runs are
// bit-identical) under `megatrain launch --max-restarts`: rank 2 killed with SIGKILL once step 5 is logged; the job
// recovers from its step-4 checkpoint and logs the undisturbed coded run's losses bit for bit.
class StragglerCodingLaunch : public ::testing::TestWithParam<Scheme> {};

TEST_P(StragglerCodingLaunch, KillNineOfARankIsRecoveredWithTheLossesOfAnUndisturbedCodedRun) {
  prepare();
  const Scheme& sc = GetParam();
  const std::string clean = fresh_dir("mt_straggler_kill_clean_" + sc.name),
                    out = fresh_dir("mt_straggler_kill_run_" + sc.name);
  const std::string coding = sc.coding + " --train.steps=8 --ckpt.every=2 --ckpt.save_final=false --train.log_every=1";
  run_with_faults(coded(clean, sc.accum, coding), "", clean + ".log");
  const std::vector<std::string> want = mt::test::step_losses(clean + "/metrics.jsonl");
  ASSERT_EQ(want.size(), 8u);

  std::vector<std::string> args = {"launch", "--nproc", "4", "--max-restarts", "3", "--backoff", "0", "--", "train"};
  const std::string job = flags(out, kRows, sc.accum, " --parallel.dp=4" + coding);
  for (size_t b = 1, e; b < job.size(); b = e + 1) {  // the flags, each after a space
    e = job.find(' ', b);
    if (e == std::string::npos) e = job.size();
    if (e > b) args.push_back(job.substr(b, e - b));
  }
  ::setenv("MEGATRAIN_FAULTS", mt::test::slow_from_step6().c_str(), 1);  // attempt 0 only: time to act
  const pid_t launcher = mt::test::start_logged(kMegatrain, args, out + ".log");
  ::unsetenv("MEGATRAIN_FAULTS");
  const double t0 = mt::now_seconds();
  while (mt::test::last_step(out + "/metrics.jsonl") < 5) {
    ASSERT_EQ(::waitpid(launcher, nullptr, WNOHANG), 0) << "the job ended before step 5\n"
                                                        << mt::test::slurp(out + ".log");
    ASSERT_LT(mt::now_seconds() - t0, 300) << "step 5 never came";
    std::this_thread::sleep_for(20ms);
  }
  const pid_t victim = mt::test::rank_pid(launcher, 2);
  ASSERT_GT(victim, 0);
  ::kill(victim, SIGKILL);
  ASSERT_EQ(mt::test::finish_within(launcher, 400), 0) << mt::test::slurp(out + ".log");
  EXPECT_EQ(mt::test::step_losses(out + "/metrics.jsonl"), want) << mt::test::slurp(out + ".log");
}
INSTANTIATE_TEST_SUITE_P(Schemes, StragglerCodingLaunch, kSchemes, SchemeName());

}  // namespace

namespace {

// Turning coding on when resuming an uncoded run: the coded run's data position is the uncoded one's, so an
// uncoded dp4 run's step-3 checkpoint resumed under gc logs steps 4 and 5 of the uninterrupted uncoded step, up to
// the noise floor (expect_resumed_tail).
TEST(StragglerCodingResume, AnUncodedCheckpointResumesUnderCodingOnTheSameData) {
  prepare();
  const std::string full = fresh_dir("mt_straggler_switch_full"), alt = fresh_dir("mt_straggler_switch_alt");
  const std::string uncoded = fresh_dir("mt_straggler_switch_uncoded"), coded_dir = fresh_dir("mt_straggler_switch_gc");
  run(kMegatrain + " train" + flags(full, kDp * kRows, 2));
  run_twin(kDp * kRows, flags(alt, kDp * kRows, 2));
  run_with_faults(coded(uncoded, 2, "", " --ckpt.every=3"), "", uncoded + ".log");
  run_with_faults(coded(coded_dir, 2, " --parallel.straggler_coding=gc --parallel.straggler_s=1",
                        " --ckpt.resume=" + step3(uncoded)),
                  "", coded_dir + ".log");
  expect_resumed_tail(full, alt, {coded_dir}, "uncoded step 3 resumed under gc");
}

}  // namespace
