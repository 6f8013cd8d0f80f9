// Fault injection (train/faults.h) and the rank-side checks around it:
//  * MEGATRAIN_FAULTS parsing: every kind with its keys; malformed items are Config errors naming the item and what
//    is allowed; the attempt rule; fault_badnode;
//  * the loss-spike rules and the new train.* keys;
//  * each kind fires at the right rank and step in a 2-rank job of the built binary (ranks started by hand, so
//    each one's own exit status is seen): crash dies by SIGKILL at the step; nan fails every rank with the
//    NonFinite code and leaves no checkpoint of the step; hang blocks the rank (heartbeats going on, its op
//    posted) while the other times out in the named collective; slow stretches the rank's compute time.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "support/comm_fork_util.h"
#include "megatrain/ckpt/checkpoint.h"
#include "megatrain/core/error.h"
#include "megatrain/train/faults.h"
#include "megatrain/train/loss_spike.h"
#include "megatrain/train/run_config.h"
#include "support/files.h"
#include "support/metrics.h"
#include "support/robust_util.h"

using namespace mt;
using namespace robust_test;
namespace fs = std::filesystem;
using mt::test::error_of;

namespace {

// The message and kind of the Error f() throws.
template <typename F>
std::pair<std::string, ErrorKind> error_and_kind(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return {e.what(), e.kind};
  }
  return {"<no error>", ErrorKind::Internal};
}

TEST(FaultSpec, ParsesEveryKind) {
  const auto f = parse_faults(" crash:rank=1:step=7 ; hang:rank=2:step=5:attempt=1;nan:rank=0:step=9;"
                              "slow:rank=3:factor=1.5;slow:rank=2:factor=2:step=4;badnode:node=1;;");
  ASSERT_EQ(f.size(), 6u);
  EXPECT_EQ(f[0].kind, FaultKind::Crash);
  EXPECT_EQ(f[0].item, "crash:rank=1:step=7");
  EXPECT_EQ(f[0].rank, 1);
  EXPECT_EQ(f[0].step, 7);
  EXPECT_EQ(f[0].attempt, -1);
  EXPECT_EQ(f[1].kind, FaultKind::Hang);
  EXPECT_EQ(f[1].rank, 2);
  EXPECT_EQ(f[1].step, 5);
  EXPECT_EQ(f[1].attempt, 1);
  EXPECT_EQ(f[2].kind, FaultKind::Nan);
  EXPECT_EQ(f[2].step, 9);
  EXPECT_EQ(f[3].kind, FaultKind::Slow);
  EXPECT_EQ(f[3].factor, 1.5);
  EXPECT_EQ(f[3].step, 1);  // slow: from the first step unless told
  EXPECT_EQ(f[4].step, 4);
  EXPECT_EQ(f[5].kind, FaultKind::BadNode);
  EXPECT_EQ(f[5].node, 1);
  EXPECT_TRUE(parse_faults("").empty());
  EXPECT_TRUE(parse_faults(" ; ").empty());
}

TEST(FaultSpec, FiresInTheFirstAttemptOrTheNamedOne) {
  const auto f = parse_faults("crash:rank=0:step=1;crash:rank=0:step=1:attempt=2");
  EXPECT_TRUE(f[0].fires_in(0));
  EXPECT_FALSE(f[0].fires_in(1));
  EXPECT_FALSE(f[1].fires_in(0));
  EXPECT_FALSE(f[1].fires_in(1));
  EXPECT_TRUE(f[1].fires_in(2));
}

TEST(FaultSpec, MalformedItemsAreConfigErrorsNamingTheItemAndWhatIsAllowed) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"crsh:rank=1:step=7",
       {"item 'crsh:rank=1:step=7'", "unknown fault kind 'crsh'", "crash, hang, nan, slow, badnode"}},
      {"crash:rank=1:stp=7", {"item 'crash:rank=1:stp=7'", "unknown key 'stp'", "rank=R:step=S[:attempt=A]"}},
      {"crash:rank=1", {"missing key 'step'", "crash takes rank=R:step=S[:attempt=A]"}},
      {"hang:step=3", {"missing key 'rank'"}},
      {"crash:rank=1:step=0", {"step='0' must be an integer >= 1"}},
      {"crash:rank=-1:step=2", {"rank='-1' must be an integer >= 0"}},
      {"nan:rank=x:step=2", {"rank='x' must be an integer >= 0"}},
      {"nan:rank=1:step=2:step=3", {"key 'step' given twice"}},
      {"slow:rank=1:factor=0.5", {"factor='0.5' must be a number in [1, 1000]"}},
      {"slow:rank=1", {"missing key 'factor'", "rank=R:factor=F[:step=S][:attempt=A]"}},
      {"badnode:rank=1", {"unknown key 'rank'", "badnode takes node=N[:attempt=A]"}},
      {"crash:rank=1:step", {"'step' is not key=value"}},
      {"crash:rank=1:step=2;oops", {"item 'oops'", "unknown fault kind"}},
  };
  for (const auto& [text, parts] : cases) {
    const auto [msg, kind] = error_and_kind([&] { parse_faults(text); });
    EXPECT_EQ(kind, ErrorKind::Config) << text << ": " << msg;
    EXPECT_TRUE(has(msg, "MEGATRAIN_FAULTS")) << msg;
    for (const std::string& p : parts) EXPECT_TRUE(has(msg, p)) << text << ": " << msg << " lacks " << p;
  }
}

TEST(FaultSpec, BadNodeReadsTheEnvironment) {
  ::setenv("MEGATRAIN_FAULTS", "badnode:node=1;crash:rank=0:step=3", 1);
  ::unsetenv("MEGATRAIN_ATTEMPT");
  EXPECT_TRUE(fault_badnode(1));
  EXPECT_FALSE(fault_badnode(0));
  ::setenv("MEGATRAIN_ATTEMPT", "1", 1);
  EXPECT_FALSE(fault_badnode(1));  // the first attempt only
  ::setenv("MEGATRAIN_FAULTS", "badnode:node=1:attempt=1", 1);
  EXPECT_TRUE(fault_badnode(1));
  ::setenv("MEGATRAIN_ATTEMPT", "one", 1);
  EXPECT_TRUE(has(error_and_kind([] { fault_badnode(1); }).first, "MEGATRAIN_ATTEMPT='one'"));
  ::unsetenv("MEGATRAIN_ATTEMPT");
  ::unsetenv("MEGATRAIN_FAULTS");
  EXPECT_FALSE(fault_badnode(1));
}

TEST(FaultSpec, ARankOutsideTheWorldIsRefused) {
  FaultInjector inj(parse_faults("crash:rank=4:step=2"), 0, 0);
  inj.check_world(5);
  const auto [msg, kind] = error_and_kind([&] { inj.check_world(4); });
  EXPECT_EQ(kind, ErrorKind::Config);
  EXPECT_TRUE(has(msg, "'crash:rank=4:step=2': rank 4 is outside the world of 4 ranks")) << msg;
}

TEST(LossSpike, SigmaAndRatioRules) {
  LossSpikeDetector d(SpikeRule{20, 6, 2});
  // Not before 10 losses are known, however large.
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(d.observe(i == 5 ? 100.0 : 3.0 + 0.01 * (i % 3)));
  // The window (3.00, 3.01, 3.02, ... and one 100) has a large std: 9 is no sigma spike, but above 2 x median 3.01.
  auto s = d.observe(9.0);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->rule, "factor");
  EXPECT_DOUBLE_EQ(s->threshold, 2 * s->median);
  // A quiet window: 3.1 is within noise? No: std ~0.008, mean ~3.01: 3.1 is a sigma spike, 3.02 is not.
  LossSpikeDetector q(SpikeRule{20, 6, 2});
  for (int i = 0; i < 20; ++i) q.observe(3.0 + 0.01 * (i % 3));
  EXPECT_FALSE(q.observe(3.02));
  s = q.observe(3.1);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->rule, "sigma");
  EXPECT_NEAR(s->mean, 3.01, 0.002);
  EXPECT_EQ(s->samples, 20);
  // A falling loss (early training) is never a spike; window 0 turns it off.
  LossSpikeDetector f(SpikeRule{});
  for (int i = 0; i < 200; ++i) EXPECT_FALSE(f.observe(10.0 * std::exp(-0.02 * i)));
  LossSpikeDetector off(SpikeRule{0, 6, 2});
  for (int i = 0; i < 30; ++i) EXPECT_FALSE(off.observe(i == 29 ? 1e9 : 1.0));
}

TEST(RobustConfig, SkipStepsAndSpikeKeys) {
  const RunConfig c = parse_run_config("[train]\nskip_steps = [3, 9]\nspike_factor = 3.0\n", "t");
  EXPECT_EQ(c.train.skip_steps, (std::vector<int>{3, 9}));
  EXPECT_EQ(c.train.spike_factor, 3.0);
  EXPECT_NE(std::find(c.effective.begin(), c.effective.end(),
                      std::pair<std::string, std::string>{"train.skip_steps", "[3,9]"}),
            c.effective.end());
  EXPECT_TRUE(parse_run_config("", "t").train.skip_steps.empty());
  EXPECT_TRUE(has(error_of([] { parse_run_config("", "t", {"--train.skip_steps=3"}); }),
                  "train.skip_steps must be a list of integers"));
  EXPECT_TRUE(has(error_of([] { parse_run_config("", "t", {"--train.skip_steps=[0]"}); }),
                  "train.skip_steps holds 0: each must be in [1,"));
  EXPECT_TRUE(has(error_of([] { parse_run_config("", "t", {"--train.skip_steps=[1.5]"}); }),
                  "train.skip_steps must hold integers only"));
  EXPECT_TRUE(has(error_of([] { parse_run_config("", "t", {"--train.spike_factor=0.5"}); }),
                  "train.spike_factor = 0.5 must be > 1"));
  EXPECT_TRUE(has(error_of([] { parse_run_config("", "t", {"--train.spike_window=-1"}); }),
                  "train.spike_window = -1 must be >= 0"));
  EXPECT_TRUE(has(error_of([] { parse_run_config("", "t", {"--train.spike_sigmas=0"}); }),
                  "train.spike_sigmas = 0 must be finite and > 0"));
}

// ---- each kind, fired in a 2-rank data-parallel job of the binary ---------------------------------------------

struct Job {
  std::string out;
  mt::test::ScratchDir store;
  Rank r0, r1;
};

std::unique_ptr<Job> start_job(const std::string& name, const std::string& faults, std::vector<std::string> extra,
                               const std::vector<std::string>& env = {}) {
  prepare();
  auto j = std::make_unique<Job>();
  j->out = mt::test::temp_root() + name;
  fs::remove_all(j->out);
  fs::create_directories(j->out);
  std::vector<std::string> args = small_flags(j->out + "/run");
  args.insert(args.end(), {"--parallel.dp=2", "--data.batch_size=2"});
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<std::string> e = {"MEGATRAIN_FAULTS=" + faults};
  e.insert(e.end(), env.begin(), env.end());
  j->r0 = start_rank(0, 2, j->store.path, args, j->out + "/log0", e);
  j->r1 = start_rank(1, 2, j->store.path, args, j->out + "/log1", e);
  return j;
}

std::string logs(const Job& j) { return "rank 0:\n" + slurp(j.out + "/log0") + "rank 1:\n" + slurp(j.out + "/log1"); }

TEST(FaultInjection, CrashKillsTheRankBySigkillAtTheStep) {
  auto j = start_job("mt_fault_crash", "crash:rank=1:step=3", {"--train.steps=6", "--parallel.timeout_s=30"});
  ASSERT_TRUE(j->r1.wait_exit(120)) << logs(*j);
  EXPECT_EQ(j->r1.signal(), SIGKILL) << logs(*j);
  EXPECT_TRUE(has(slurp(j->out + "/log1"), "fault injected: crash:rank=1:step=3 (rank 1, step 3, attempt 0)"))
      << logs(*j);
  // Its heartbeats: the event first, and steps 1 and 2 only.
  const auto ev = j->r1.events("fault_injected");
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0]["fault"], "crash:rank=1:step=3");
  EXPECT_EQ(ev[0]["step"], 3);
  EXPECT_EQ(ev[0]["attempt"], 0);
  EXPECT_EQ(last_step(j->r1), 2);
  // The other rank loses its peer and fails (peer lost, or a timeout), without the fault line.
  ASSERT_TRUE(j->r0.wait_exit(120)) << logs(*j);
  EXPECT_TRUE(j->r0.exit_code() == exit_code(ErrorKind::PeerLost) ||
              j->r0.exit_code() == exit_code(ErrorKind::CommTimeout))
      << logs(*j);
  EXPECT_FALSE(has(slurp(j->out + "/log0"), "fault injected"));
  EXPECT_TRUE(j->r0.events("fault_injected").empty());
}

TEST(FaultInjection, AFaultFiresOnlyInItsAttempt) {
  // The same crash in attempt 1: nothing fires and the job completes; one meant for attempt 1 fires there.
  auto j = start_job("mt_fault_attempt", "crash:rank=1:step=2;crash:rank=0:step=4:attempt=2", {"--train.steps=3"},
                     {"MEGATRAIN_ATTEMPT=1"});
  ASSERT_TRUE(j->r0.wait_exit(120) && j->r1.wait_exit(120)) << logs(*j);
  EXPECT_EQ(j->r0.exit_code(), 0) << logs(*j);
  EXPECT_EQ(j->r1.exit_code(), 0) << logs(*j);
  EXPECT_FALSE(has(logs(*j), "fault injected"));
  auto k = start_job("mt_fault_attempt2", "crash:rank=0:step=2:attempt=2", {"--train.steps=3"},
                     {"MEGATRAIN_ATTEMPT=2"});
  ASSERT_TRUE(k->r0.wait_exit(120)) << logs(*k);
  EXPECT_EQ(k->r0.signal(), SIGKILL) << logs(*k);
  EXPECT_TRUE(has(slurp(k->out + "/log0"), "(rank 0, step 2, attempt 2)")) << logs(*k);
  k->r1.kill_now();
}

TEST(FaultInjection, NanFailsEveryRankBeforeTheOptimizerStepAndNoCheckpointOfThatStep) {
  auto j = start_job("mt_fault_nan", "nan:rank=1:step=3", {"--train.steps=6", "--ckpt.every=1"});
  ASSERT_TRUE(j->r0.wait_exit(120) && j->r1.wait_exit(120)) << logs(*j);
  // Both ranks, also rank 0 whose own weights are finite, stop at step 3 with the NonFinite code.
  EXPECT_EQ(j->r0.exit_code(), exit_code(ErrorKind::NonFinite)) << logs(*j);
  EXPECT_EQ(j->r1.exit_code(), exit_code(ErrorKind::NonFinite)) << logs(*j);
  EXPECT_TRUE(has(slurp(j->out + "/log1"), "fault injected: nan:rank=1:step=3 (rank 1, step 3, attempt 0)"));
  EXPECT_FALSE(has(slurp(j->out + "/log0"), "fault injected"));
  for (Rank* r : {&j->r0, &j->r1}) {
    EXPECT_TRUE(has(slurp(r->log), "step 3: non-finite loss")) << slurp(r->log);
    const auto ev = r->events("non_finite");
    ASSERT_EQ(ev.size(), 1u) << r->rank;
    EXPECT_EQ(ev[0]["step"], 3);
    EXPECT_TRUE(ev[0]["grad_norm"].is_null()) << ev[0].dump();  // the global norm is NaN on every rank
    const auto err = r->events("error");
    ASSERT_EQ(err.size(), 1u);
    EXPECT_EQ(err[0]["code"], exit_code(ErrorKind::NonFinite));
  }
  // Checkpoints of steps 1 and 2; none of step 3 or later, and latest names step 2.
  const std::string ck = j->out + "/run/ckpt";
  EXPECT_TRUE(fs::exists(ck + "/step_00000002/manifest.json")) << logs(*j);
  EXPECT_FALSE(fs::exists(ck + "/step_00000003"));
  EXPECT_EQ(*find_latest(ck), ck + "/step_00000002");
  EXPECT_EQ(mt::test::step_losses(j->out + "/run/metrics.jsonl").size(), 2u);
}

TEST(FaultInjection, HangBlocksTheRankInACollectiveWhileTheOtherTimesOutInIt) {
  auto j = start_job("mt_fault_hang", "hang:rank=1:step=3", {"--train.steps=100", "--parallel.timeout_s=5"});
  // Rank 0 times out in the collective rank 1 never entered.
  ASSERT_TRUE(j->r0.wait_exit(120)) << logs(*j);
  EXPECT_EQ(j->r0.exit_code(), exit_code(ErrorKind::CommTimeout)) << logs(*j);
  // Rank 1 is still there, blocked, and still heartbeating after rank 0 is gone.
  ASSERT_TRUE(j->r1.alive()) << logs(*j);
  const size_t before = j->r1.hb().size();
  ASSERT_TRUE(poll_until(
      {&j->r1}, [&] { return j->r1.hb().size() >= before + 5; }, 30))
      << logs(*j);
  EXPECT_TRUE(j->r1.alive());
  const std::string log1 = slurp(j->out + "/log1");
  EXPECT_TRUE(has(log1, "fault injected: hang:rank=1:step=3 (rank 1, step 3, attempt 0): blocking in ")) << log1;
  const auto ev = j->r1.events("fault_injected");
  ASSERT_EQ(ev.size(), 1u);
  const std::string group = ev[0]["group"], op = ev[0]["op"];
  const int seq = ev[0]["seq"];
  // The hung rank shows that op posted (never started); the other showed it started, and its error names it.
  const nlohmann::json last1 = j->r1.hb().back();
  EXPECT_EQ(last1["step"], 2) << last1.dump();
  bool posted = false;
  for (const auto& c : last1["colls"])
    posted = posted || (c["group"] == group && c["op"] == op && c["seq"] == seq && c["state"] == "posted");
  EXPECT_TRUE(posted) << last1.dump();
  bool started = false;
  for (const auto& l : j->r0.hb())
    for (const auto& c : l["colls"])
      started = started || (c["group"] == group && c["op"] == op && c["seq"] == seq && c["state"] == "started");
  EXPECT_TRUE(started) << ev[0].dump();
  const std::string log0 = slurp(j->out + "/log0");
  EXPECT_TRUE(has(log0, "group " + group + ": " + op) && has(log0, fmt::format("#{} failed", seq))) << log0;
  j->r1.kill_now();
}

TEST(FaultInjection, SlowStretchesTheRanksComputeTime) {
  auto j = start_job("mt_fault_slow", "slow:rank=1:factor=3", {"--train.steps=10"});
  ASSERT_TRUE(j->r0.wait_exit(180) && j->r1.wait_exit(180)) << logs(*j);
  ASSERT_EQ(j->r0.exit_code(), 0) << logs(*j);
  ASSERT_EQ(j->r1.exit_code(), 0) << logs(*j);
  EXPECT_TRUE(has(slurp(j->out + "/log1"), "fault injected: slow:rank=1:factor=3 (rank 1, step 1, attempt 0)"));
  // Compute times of steps 3..10 (step 1 has no earlier step to stretch; step 2 pays the start-up), as medians.
  auto median_compute = [](const Rank& r) {
    std::vector<double> v;
    for (const auto& l : r.hb("step"))
      if (l["step"].get<int>() >= 3) v.push_back(l["compute_time"].get<double>());
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  const double c0 = median_compute(j->r0), c1 = median_compute(j->r1);
  ASSERT_GT(c0, 0);
  // ~3x; asserted at 1.5x. This compares two ranks' times on the same machine in the same steps, never a time with
  // a constant, so the machine's speed cancels: both ranks compute the same work (the same model, a batch of the
  // same size), and the slow rank sleeps twice its own previous step's compute on top of it. It fails only if rank
  // 0's median compute over 8 steps were inflated twice as much as rank 1's by other load, while both share the
  // same cores under the same scheduler.
  EXPECT_GT(c1 / c0, 1.5) << "compute time rank 0 " << c0 << " s, rank 1 " << c1 << " s";
}

}  // namespace
