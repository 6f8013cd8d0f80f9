// The supervisor's decisions, in process, against known answers: whom a hang blames (from synthetic flight
// recorder states whose answer is known by construction), when a failure is restarted, and how heartbeats are read.
#include <fmt/format.h>
#include <map>
#include <gtest/gtest.h>

#include "megatrain/launch/diagnose.h"
#include "megatrain/launch/gpu_checks.h"
#include "megatrain/launch/hang_blame.h"
#include "megatrain/launch/job_protocol.h"
#include "megatrain/launch/job_watch.h"
#include "megatrain/launch/node_lease.h"
#include "megatrain/launch/node_plan.h"
#include "megatrain/launch/rank_status.h"
#include "megatrain/launch/restart_policy.h"
#include "megatrain/launch/sdc_strikes.h"
#include "megatrain/launch/stack_dump.h"
#include "megatrain/launch/useful_time.h"

using namespace mt::launch;

namespace {

RankStatus rank(int r, std::string coord, std::vector<CollectiveState> colls, double last_heard = 100) {
  RankStatus s;
  s.rank = r;
  s.coord = std::move(coord);
  s.heard = true;
  s.last_heard = last_heard;
  s.step = 5;
  s.phase = "forward_backward";
  s.colls = std::move(colls);
  return s;
}

TEST(HangBlame, TheRankThatNeverEnteredTheCollectiveIsNamedWithItsGroupAndSequence) {
  // dp group [1,3]: rank 1 waits in all_gather #41; rank 3 finished #40 and never posted #41.
  std::vector<RankStatus> rs = {rank(1, "dp0,pp0,tp1", {{"dp[1,3]", "all_gather", 41, "started"}}),
                                rank(3, "dp1,pp0,tp1", {{"dp[1,3]", "all_gather", 40, "done"}})};
  Blame b = blame_hang(rs, 101, 10);
  EXPECT_EQ(b.ranks, std::vector<int>{3});
  EXPECT_EQ(b.line, "rank 3 (dp1,pp0,tp1) never entered all_gather #41 of group dp[1,3]; rank 1 waits in it");
}

TEST(HangBlame, VictimsWaitingElsewhereAreFollowedToTheRoot) {
  // Rank 2 is stuck outside any collective (its tp #7 is done). Rank 3 waits for it in tp #8, so rank 3 lags in
  // dp #12, where rank 1 waits for it. The root is rank 2, not rank 3.
  std::vector<RankStatus> rs = {
      rank(1, "dp0,pp0,tp1", {{"dp[1,3]", "allreduce", 12, "started"}, {"tp[0-1]", "allreduce", 8, "done"}}),
      rank(0, "dp0,pp0,tp0", {{"tp[0-1]", "allreduce", 8, "done"}, {"dp[0,2]", "allreduce", 12, "started"}}),
      rank(2, "dp1,pp0,tp0", {{"tp[2-3]", "allreduce", 7, "done"}, {"dp[0,2]", "allreduce", 11, "done"}}),
      rank(3, "dp1,pp0,tp1", {{"tp[2-3]", "allreduce", 8, "started"}, {"dp[1,3]", "allreduce", 11, "done"}})};
  Blame b = blame_hang(rs, 101, 10);
  ASSERT_EQ(b.ranks, std::vector<int>{2}) << b.line;
  EXPECT_NE(b.line.find("rank 2 (dp1,pp0,tp0) never entered allreduce #8 of group tp[2-3]; rank 3 waits in it"),
            std::string::npos)
      << b.line;
}

// Rank 3 posted tp #7 but never started it; rank 2 runs tp #7, so neither enters dp #30, where ranks 0 and 1 wait:
// rank 2 is a victim, rank 3 the root (the driver met this with tp inside a node and dp across nodes).
TEST(HangBlame, ARankWaitingOnAPeerThatOnlyPostedIsAVictimNotTheRoot) {
  std::vector<RankStatus> rs = {
      rank(0, "dp0,pp0,tp0", {{"dp[0,2]", "reduce_scatter", 30, "started"}, {"tp[0-1]", "allreduce", 7, "done"}}),
      rank(1, "dp0,pp0,tp1", {{"dp[1,3]", "reduce_scatter", 30, "started"}, {"tp[0-1]", "allreduce", 7, "done"}}),
      rank(2, "dp1,pp0,tp0", {{"dp[0,2]", "reduce_scatter", 29, "done"}, {"tp[2-3]", "allreduce", 7, "started"}}),
      rank(3, "dp1,pp0,tp1", {{"dp[1,3]", "reduce_scatter", 29, "done"}, {"tp[2-3]", "allreduce", 7, "posted"}})};
  Blame b = blame_hang(rs, 100, 10);
  EXPECT_EQ(b.ranks, std::vector<int>({3})) << b.line;
  EXPECT_NE(b.line.find("rank 3 (dp1,pp0,tp1) never entered reduce_scatter #30 of group dp[1,3]"), std::string::npos)
      << b.line;
}

TEST(HangBlame, ASilentRankIsBlamedBeforeAnyCollectiveEvidence) {
  std::vector<RankStatus> rs = {rank(0, "dp0,pp0,tp0", {{"dp[0-1]", "allreduce", 3, "started"}}, 100),
                                rank(1, "dp1,pp0,tp0", {{"dp[0-1]", "allreduce", 3, "started"}}, 80)};
  Blame b = blame_hang(rs, 100, 10);
  EXPECT_EQ(b.ranks, std::vector<int>{1});
  EXPECT_NE(b.line.find("rank 1 (dp1,pp0,tp0) stopped responding: no heartbeat for 20 s"), std::string::npos) << b.line;
  EXPECT_NE(b.line.find("in allreduce #3 of group dp[0-1]"), std::string::npos) << b.line;
}

TEST(HangBlame, PostedButNeverStartedIsBlamedWhenEveryoneIsAtTheSameCollective) {
  std::vector<RankStatus> rs = {rank(0, "", {{"dp[0-2]", "allreduce", 9, "started"}}),
                                rank(1, "", {{"dp[0-2]", "allreduce", 9, "posted"}}),
                                rank(2, "", {{"dp[0-2]", "allreduce", 9, "started"}})};
  Blame b = blame_hang(rs, 101, 10);
  EXPECT_EQ(b.ranks, std::vector<int>{1});
  EXPECT_EQ(b.line, "rank 1 posted allreduce #9 of group dp[0-2] but never started it; ranks 0,2 wait in it");
}

TEST(HangBlame, NoEvidenceNamesNoOneButSaysWhatEachRankDoes) {
  std::vector<RankStatus> rs = {rank(0, "", {{"dp[0-1]", "allreduce", 9, "done"}}),
                                rank(1, "", {{"dp[0-1]", "allreduce", 9, "done"}})};
  Blame b = blame_hang(rs, 101, 10);
  EXPECT_TRUE(b.ranks.empty());
  EXPECT_NE(b.line.find("no rank could be blamed"), std::string::npos) << b.line;
  EXPECT_NE(b.line.find("rank 1: step 5 forward_backward"), std::string::npos) << b.line;
}

TEST(RestartPolicy, ConfigDataAndCheckpointErrorsAreNeverRestarted) {
  RestartPolicy p;
  p.max_restarts = 5;
  for (int code : {2, 10, 11, 12}) {
    RestartDecision d = decide_restart(p, code, 0, 0);
    EXPECT_FALSE(d.restart) << code;
    EXPECT_EQ(d.exit_code, code);
  }
  for (int code : {1, 20, 21, 22, 23, 24, 137, 139}) EXPECT_TRUE(decide_restart(p, code, 0, 0).restart) << code;
}

TEST(RestartPolicy, RestartsAreBoundedBackedOffAndGiveUpWithoutProgress) {
  RestartPolicy p;
  p.max_restarts = 3;
  p.backoff_s = 2;
  p.backoff_max_s = 5;
  p.no_progress_limit = 3;
  EXPECT_DOUBLE_EQ(decide_restart(p, 22, 0, 0).delay_s, 2);  // progress before this failure: the base delay
  EXPECT_DOUBLE_EQ(decide_restart(p, 22, 1, 2).delay_s, 4);  // doubling while no progress is made
  RestartDecision spent = decide_restart(p, 22, 3, 0);
  EXPECT_FALSE(spent.restart);
  EXPECT_EQ(spent.exit_code, mt::kRestartsSpentExit);
  RestartDecision stuck = decide_restart(p, 20, 2, 3);
  EXPECT_FALSE(stuck.restart);
  EXPECT_EQ(stuck.exit_code, mt::kNoProgressExit);
  p.max_restarts = 0;  // restarts off: the failure's own code, as a plain launch always returned
  EXPECT_EQ(decide_restart(p, 22, 0, 0).exit_code, 22);
  p.max_restarts = 3;
  p.backoff_max_s = 3;
  EXPECT_DOUBLE_EQ(decide_restart(p, 22, 1, 2).delay_s, 3);  // capped
}

TEST(RankStatus, HeartbeatsUpdateTheStatusAndGarbageChangesNothing) {
  RankStatus s;
  s.rank = 2;
  EXPECT_FALSE(s.apply(nlohmann::json::parse(R"({"type":"event","event":"nonfinite","step":3})"), 1));
  EXPECT_FALSE(s.heard);
  EXPECT_FALSE(s.apply(nlohmann::json::parse("[1,2]"), 1));
  EXPECT_TRUE(
      s.apply(nlohmann::json::parse(
                  R"({"type":"hb","rank":2,"coord":[1,0,1],"step":7,"phase":"optimizer","step_time":0.5,)"
                  R"("compute_time":0.4,"colls":[{"group":"dp[0,2]","op":"allreduce","seq":12,"state":"done"}]})"),
              42));
  EXPECT_TRUE(s.heard);
  EXPECT_EQ(s.last_heard, 42);
  EXPECT_EQ(s.step, 7);
  EXPECT_EQ(s.coord, "dp1,pp0,tp1");
  EXPECT_EQ(s.phase, "optimizer");
  ASSERT_EQ(s.colls.size(), 1u);
  EXPECT_EQ(s.colls[0].seq, 12);
  EXPECT_FALSE(s.colls[0].in_flight());
  // A background heartbeat repeating an older step never moves the step back; a wrongly typed field is skipped.
  EXPECT_TRUE(s.apply(nlohmann::json::parse(R"({"type":"hb","step":6,"coord":"x","phase":"eval"})"), 43));
  EXPECT_EQ(s.step, 7);
  EXPECT_EQ(s.coord, "dp1,pp0,tp1");
}

TEST(Diagnose, AValueUnderTheToleratedFractionOfTheExpectedOneFails) {
  CheckResult c;
  c.name = "gemm";
  c.unit = "GFLOP/s";
  c.pass = true;
  c.value = 60;
  c.expected = 100;
  judge(c, 0.5);
  EXPECT_TRUE(c.pass) << c.detail;
  c.value = 40;
  judge(c, 0.5);
  EXPECT_FALSE(c.pass);
  EXPECT_NE(c.detail.find("40 GFLOP/s against 100 expected (40%, the floor is 50%)"), std::string::npos) << c.detail;
  CheckResult wrong = c;  // a wrong result fails whatever its speed
  wrong.pass = false;
  wrong.value = 1000;
  judge(wrong, 0.5);
  EXPECT_FALSE(wrong.pass);
  CheckResult none = c;  // nothing to compare with: the measurement passes, and says so
  none.pass = true;
  none.expected = 0;
  judge(none, 0.5);
  EXPECT_TRUE(none.pass);
  EXPECT_NE(none.detail.find("no expectation"), std::string::npos);
}

// ---- the job driver's decisions -----------------------------------------------------------------------------------

// Made-up measurements of a node's GPUs, judged by hand against the thresholds of gpu_checks.h.
GpuHealth healthy_h200(int i) {
  GpuHealth g;
  g.index = i;
  g.name = "NVIDIA H200";
  g.gemm_tflops = 720, g.datasheet_tflops = 989.4;
  g.hbm_gbps = 4100, g.datasheet_hbm_gbps = datasheet_hbm_gbps(g.name);
  g.h2d_gbps = 50, g.d2h_gbps = 52;
  g.self_test_ran = g.self_test_exact = true;
  g.temperature_c = 40, g.slowdown_temperature_c = 90;
  g.nvml_read = true;
  return g;
}

std::map<std::string, CheckResult> by_name(const std::vector<CheckResult>& cs) {
  std::map<std::string, CheckResult> m;
  for (const auto& c : cs) m[c.name] = c;
  return m;
}

TEST(GpuChecks, EightHealthyGpusPassAndEachCheckIsNamedByItsGpu) {
  std::vector<GpuHealth> gpus;
  for (int i = 0; i < 8; ++i) gpus.push_back(healthy_h200(i));
  const auto checks = judge_gpus(gpus);
  ASSERT_EQ(checks.size(), 8u * 6u);
  for (const auto& c : checks) EXPECT_TRUE(c.pass) << c.name << ": " << c.detail;
  const auto m = by_name(checks);
  for (const char* n : {"gpu7_gemm", "gpu7_hbm_bandwidth", "gpu7_host_bandwidth", "gpu7_self_test",
                        "gpu7_memory_errors", "gpu7_clocks"})
    EXPECT_EQ(m.count(n), 1u) << n;
  EXPECT_EQ(datasheet_hbm_gbps("NVIDIA H100 80GB HBM3"), 3350);
  EXPECT_EQ(datasheet_hbm_gbps("Tesla V100"), 0);
}

// A GPU slower than 85% of the node's median fails even above its datasheet floor (a straggler the job waits for);
// one under 60% of its datasheet fails even alone.
TEST(GpuChecks, ASlowGpuFailsAgainstItsPeersAndAloneAgainstItsDatasheet) {
  std::vector<GpuHealth> gpus;
  for (int i = 0; i < 4; ++i) gpus.push_back(healthy_h200(i));
  gpus[2].gemm_tflops = 600;  // 83% of the others' 720, 61% of the datasheet
  auto m = by_name(judge_gpus(gpus));
  EXPECT_FALSE(m["gpu2_gemm"].pass);
  EXPECT_NE(m["gpu2_gemm"].detail.find("83% of the node's median GPU (720 TFLOP/s"), std::string::npos)
      << m["gpu2_gemm"].detail;
  EXPECT_TRUE(m["gpu1_gemm"].pass);
  GpuHealth alone = healthy_h200(0);
  alone.gemm_tflops = 580;  // 59% of 989.4
  m = by_name(judge_gpus({alone}));
  EXPECT_FALSE(m["gpu0_gemm"].pass);
  EXPECT_NE(m["gpu0_gemm"].detail.find("under 594 TFLOP/s (60% of its datasheet's 989)"), std::string::npos)
      << m["gpu0_gemm"].detail;
  alone.gemm_tflops = 600;
  EXPECT_TRUE(by_name(judge_gpus({alone}))["gpu0_gemm"].pass);
  alone.h2d_gbps = 7;  // a link trained down
  EXPECT_FALSE(by_name(judge_gpus({alone}))["gpu0_host_bandwidth"].pass);
}

TEST(GpuChecks, MemoryErrorsAWrongSelfTestAndAHardwareSlowdownFailTheirGpu) {
  std::vector<GpuHealth> gpus = {healthy_h200(0), healthy_h200(1), healthy_h200(2)};
  gpus[0].row_remap_pending = true;
  gpus[1].self_test_exact = false;
  gpus[2].clock_events = {"sw_power_cap", "hw_thermal_slowdown"};
  auto m = by_name(judge_gpus(gpus));
  EXPECT_FALSE(m["gpu0_memory_errors"].pass);
  EXPECT_NE(m["gpu0_memory_errors"].detail.find("a row remap pending"), std::string::npos);
  EXPECT_TRUE(m["gpu1_memory_errors"].pass);
  EXPECT_FALSE(m["gpu1_self_test"].pass);
  EXPECT_NE(m["gpu1_self_test"].detail.find("WRONG RESULT"), std::string::npos);
  EXPECT_FALSE(m["gpu2_clocks"].pass);
  EXPECT_NE(m["gpu2_clocks"].detail.find("slowed down: hw_thermal_slowdown"), std::string::npos)
      << m["gpu2_clocks"].detail;
  EXPECT_NE(m["gpu2_clocks"].detail.find("(also: sw_power_cap)"), std::string::npos);
  gpus[2].clock_events = {"sw_power_cap"};  // a software cap alone is said, not failed
  gpus[2].temperature_c = 91;               // but past the slowdown threshold is a failure
  m = by_name(judge_gpus(gpus));
  EXPECT_FALSE(m["gpu2_clocks"].pass);
  EXPECT_NE(m["gpu2_clocks"].detail.find("91 C, at or above its slowdown threshold 90 C"), std::string::npos);
}

// What was not measured is no evidence either way: it passes and says so.
TEST(GpuChecks, WhatWasNotMeasuredPassesAndSaysSo) {
  GpuHealth g;
  g.index = 3;
  g.name = "NVIDIA H200";
  auto m = by_name(judge_gpus({g}));
  EXPECT_TRUE(m["gpu3_gemm"].pass);
  EXPECT_FALSE(m["gpu3_gemm"].ran);
  EXPECT_NE(m["gpu3_gemm"].detail.find("not measured"), std::string::npos);
  EXPECT_TRUE(m["gpu3_self_test"].pass);
  EXPECT_FALSE(m["gpu3_self_test"].ran);
  for (const char* n : {"gpu3_memory_errors", "gpu3_clocks"}) {  // NVML not read: no claim of health either
    EXPECT_FALSE(m[n].ran) << n;
    EXPECT_NE(m[n].detail.find("not measured (NVML was not read)"), std::string::npos) << m[n].detail;
  }
}

// The node's GPUs together: an exact all-reduce over NVLink passes; one that fell back to PCIe speed, or a wrong sum,
// fails naming why; a part with no NVLink figure is judged on exactness; one that could not run says why and passes.
TEST(GpuChecks, TheNodeAllReduceFailsBelowItsNvlinkFloorOrWhenInexact) {
  auto check = [](double busbw, bool exact, const char* name = "NVIDIA H200") {
    return judge_gpu_allreduce({8, true, busbw, exact, ""}, name);
  };
  CheckResult ok = check(420, true);
  EXPECT_EQ(ok.name, "gpus_allreduce");
  EXPECT_TRUE(ok.pass) << ok.detail;
  EXPECT_NE(ok.detail.find("8 GPUs (NVIDIA H200): all-reduce bus bandwidth 420 GB/s, exact"), std::string::npos)
      << ok.detail;
  CheckResult pcie = check(48, true);  // an NVLink down: the traffic goes over PCIe
  EXPECT_FALSE(pcie.pass);
  EXPECT_NE(pcie.detail.find("under 180 GB/s (40% of its NVLink's 450 GB/s a direction)"), std::string::npos)
      << pcie.detail;
  CheckResult wrong = check(420, false);
  EXPECT_FALSE(wrong.pass);
  EXPECT_NE(wrong.detail.find("WRONG RESULT"), std::string::npos);
  CheckResult a100 = check(100, true, "NVIDIA A100-SXM4-80GB");  // 300 GB/s a direction: floor 120
  EXPECT_FALSE(a100.pass) << a100.detail;
  CheckResult pcie_part = check(20, true, "NVIDIA H100 PCIe");  // no NVLink figure: exactness only
  EXPECT_TRUE(pcie_part.pass) << pcie_part.detail;
  EXPECT_NE(pcie_part.detail.find("judged on exactness only"), std::string::npos);
  CheckResult none = judge_gpu_allreduce({2, false, 0, false, "ncclCommInitAll: unhandled system error"},
                                         "NVIDIA H200");
  EXPECT_TRUE(none.pass);
  EXPECT_FALSE(none.ran);
  EXPECT_NE(none.detail.find("not measured (ncclCommInitAll: unhandled system error)"), std::string::npos);
}

// A node named once for a silent data corruption restarts where it is (it may have been transient); named again in a
// later attempt it is persistent and evicted, naming both attempts. Two namings in one attempt are one.
TEST(SdcStrikes, ANodeNamedInTwoAttemptsIsEvictedAndOnceIsNot) {
  SdcStrikes s;
  EXPECT_TRUE(s.named(0, {1}).empty());
  EXPECT_TRUE(s.named(0, {1}).empty());  // the same attempt again: still the first sight
  EXPECT_TRUE(s.named(1, {2}).empty());  // another node's first
  const auto evict = s.named(2, {1, 3});
  ASSERT_EQ(evict.size(), 1u);
  EXPECT_NE(evict.at(1).find("in attempt 0 and again in attempt 2: persistent"), std::string::npos) << evict.at(1);
  EXPECT_TRUE(s.named(3, {}).empty());
}

TEST(SdcStrikes, OnlyANewCulpritIsNamedNotThePairWithoutMajorityNorTheRerunThatSettlesIt) {
  EXPECT_TRUE(names_sdc_culprit("sdc", false));           // the odd one of a majority, or a rerun's transient
  EXPECT_FALSE(names_sdc_culprit("sdc", true));           // one of a pair: the rerun decides
  EXPECT_FALSE(names_sdc_culprit("sdc_culprit", false));  // settles an earlier attempt's pair: not a new fault
  EXPECT_FALSE(names_sdc_culprit("non_finite", false));
}

TEST(RestartTracker, AStepNonFiniteInTwoAttemptsInARowIsSkippedAndProgressResetsTheRun) {
  RestartPolicy p;
  p.max_restarts = 10;
  p.no_progress_limit = 2;
  RestartTracker t(p);
  std::string note;
  EXPECT_TRUE(t.after_attempt(20, 5, 5, &note).restart);  // NaN at step 5: roll back
  EXPECT_TRUE(note.empty());
  EXPECT_TRUE(t.after_attempt(20, 5, 5, &note).restart);  // again at 5, no progress (1 of 2)
  EXPECT_EQ(t.skip_steps(), std::set<int>({5}));
  EXPECT_NE(note.find("step 5 was non-finite twice"), std::string::npos);
  EXPECT_TRUE(t.after_attempt(22, 8, -1).restart);  // progress past 5: the run of no-progress resets
  EXPECT_TRUE(t.after_attempt(22, 8, -1).restart);  // 1 without progress
  RestartDecision d = t.after_attempt(22, 8, -1);   // 2 without progress: give up
  EXPECT_FALSE(d.restart);
  EXPECT_EQ(d.exit_code, mt::kNoProgressExit);
  EXPECT_EQ(t.best_step(), 8);
  EXPECT_EQ(t.restarts(), 4);
}

TEST(NodePlan, ALostNodesSlotGoesToTheLowestUsableSpareAndTheLayoutStays) {
  NodePlanInput in;
  in.prev = {0, 1, 2};
  in.usable = {true, false, true, false, true, true};  // 1 lost; spare 3 failed diagnose; 4 and 5 are fine
  in.nproc = 8;
  in.tp = 8, in.pp = 1, in.dp = 3;
  NodePlan p = plan_next_nodes(in);
  EXPECT_EQ(p.nodes, std::vector<int>({0, 4, 2}));
  EXPECT_EQ(p.dp, 0);
  EXPECT_EQ(p.why, "node 4 replaces node 1 in slot 1; the layout is unchanged");
  in.usable = {true, true, true};
  EXPECT_EQ(plan_next_nodes(in).nodes, std::vector<int>({0, 1, 2}));
  EXPECT_EQ(plan_next_nodes(in).why, "the same nodes");
}

TEST(NodePlan, WithoutASpareTheJobShrinksToWholeReplicasAndKeepsTheGlobalBatch) {
  NodePlanInput in;
  in.prev = {0, 1, 2, 3};
  in.usable = {true, true, false, true};
  in.nproc = 4;
  in.tp = 4, in.pp = 2, in.dp = 2, in.grad_accum = 1;  // a replica is 8 ranks = 2 nodes: 3 survivors keep 2
  NodePlan p = plan_next_nodes(in);
  EXPECT_EQ(p.nodes, std::vector<int>({0, 1}));
  EXPECT_EQ(p.dp, 1);
  EXPECT_EQ(p.grad_accum, 2);
  EXPECT_EQ(p.why, "node(s) 2 out and no spare left; shrinking to 2 nodes: dp 2 -> 1 (tp 4, pp 2), world 16 -> 8, "
                   "grad_accum 1 -> 2 (the global batch stays)");
  in.tp = 4, in.pp = 1, in.dp = 4, in.grad_accum = 3;  // a replica per node: 12 micro-batches over 3 replicas
  p = plan_next_nodes(in);
  EXPECT_EQ(p.nodes, std::vector<int>({0, 1, 3}));
  EXPECT_EQ(p.dp, 3);
  EXPECT_EQ(p.grad_accum, 4);
  in.grad_accum = 1;  // 4 micro-batches do not split over 3 replicas: 2 nodes, accumulating 2
  p = plan_next_nodes(in);
  EXPECT_EQ(p.nodes, std::vector<int>({0, 1}));
  EXPECT_EQ(p.dp, 2);
  EXPECT_EQ(p.grad_accum, 2);
  in.shrink = false;
  EXPECT_TRUE(plan_next_nodes(in).nodes.empty());
  EXPECT_NE(plan_next_nodes(in).why.find("--no-shrink"), std::string::npos);
  in.shrink = true;
  in.tp = 0;  // no rank ever reported the layout
  EXPECT_TRUE(plan_next_nodes(in).nodes.empty());
  EXPECT_NE(plan_next_nodes(in).why.find("layout is unknown"), std::string::npos);
  in.prev = {0, 1};
  in.usable = {true, false};
  in.tp = 8, in.pp = 1, in.dp = 1;  // one replica spans both nodes: nothing fits on one
  EXPECT_TRUE(plan_next_nodes(in).nodes.empty());
  EXPECT_NE(plan_next_nodes(in).why.find("holds whole tp 8 x pp 1 replicas"), std::string::npos);
}

// The driver sees ranks through their agents' published statuses: the round trip keeps what the hang rules need,
// and puts the age of the last heartbeat on the reader's clock.
// Each step line is kept as a record (a tick line is not): the last RankStatus::kRecentSeconds of them, at most
// kMaxRecent.
TEST(RankStatus, StepLinesOfTheLastSecondsAreKeptAsRecords) {
  RankStatus s;
  auto line = [](const char* at, int step, double loss) {
    return nlohmann::json{{"type", "hb"}, {"at", at}, {"step", step}, {"loss", loss}, {"step_time", 0.01 * step}};
  };
  for (int step = 1; step <= 3; ++step) s.apply(line("step", step, 5.0 - step), 10.0 + step);
  s.apply(line("tick", 3, 2.0), 13.5);
  ASSERT_EQ(s.recent.size(), 3u);
  EXPECT_EQ(s.recent[0].step, 1);
  EXPECT_EQ(s.recent[2].step, 3);
  EXPECT_EQ(s.recent[2].loss, 2.0);
  EXPECT_DOUBLE_EQ(s.recent[2].step_time, 0.03);
  EXPECT_EQ(s.recent[2].heard, 13.0);
  s.apply(line("step", 4, 1.0), 12.0 + RankStatus::kRecentSeconds + 0.5);  // steps 1 and 2 fall out of the window
  ASSERT_EQ(s.recent.size(), 2u);
  EXPECT_EQ(s.recent.front().step, 3);
  for (int step = 5; step < 5 + int(RankStatus::kMaxRecent) + 10; ++step) s.apply(line("step", step, 1.0), 18.0);
  EXPECT_EQ(s.recent.size(), RankStatus::kMaxRecent);
  EXPECT_EQ(s.recent.back().step, 4 + int(RankStatus::kMaxRecent) + 10);
}

TEST(JobProtocol, RankStatusesSurviveTheStoreAndKeepTheirAge) {
  RankStatus s = rank(3, "dp1,pp0,tp1", {{"dp[1,3]", "all_gather", 41, "posted"}}, 100);
  s.heard = true;
  s.step = 7;
  s.phase = "forward_backward";
  s.compute_time = 0.25;
  s.dp = 2, s.pp = 1, s.tp = 2, s.grad_accum = 3;
  // Step records: one too old to be published (heard 98.5 at 104 is beyond kRecentSeconds), two that are, one
  // without a loss (a pipeline stage before the last).
  s.recent = {{5, 1.5, 0.2, 98.5, {}}, {6, std::nullopt, 0.3, 100, {}}, {7, 1.25, 0.4, 103, {}}};
  bool running = false;
  RankStatus t = proto::status_from_json(proto::status_to_json(s, true, 104), 1000, &running);
  EXPECT_TRUE(running);
  EXPECT_EQ(t.rank, 3);
  EXPECT_EQ(t.coord, "dp1,pp0,tp1");
  EXPECT_EQ(t.step, 7);
  EXPECT_DOUBLE_EQ(t.last_heard, 996);
  EXPECT_EQ(t.compute_time, 0.25);
  EXPECT_FALSE(t.step_time.has_value());
  EXPECT_EQ(t.tp, 2);
  EXPECT_EQ(t.grad_accum, 3);
  ASSERT_EQ(t.colls.size(), 1u);
  EXPECT_EQ(t.colls[0].seq, 41);
  EXPECT_EQ(t.colls[0].state, "posted");
  ASSERT_EQ(t.recent.size(), 2u);
  EXPECT_EQ(t.recent[0].step, 6);
  EXPECT_FALSE(t.recent[0].loss.has_value());
  EXPECT_DOUBLE_EQ(t.recent[0].heard, 996);  // its age (4 s) on the reader's clock
  EXPECT_EQ(t.recent[1].loss, 1.25);
  EXPECT_EQ(t.recent[1].step_time, 0.4);
  proto::AttemptPlan p;
  p.attempt = 2, p.nodes = {0, 2}, p.nproc = 4, p.extra_args = {"--parallel.dp=1"};
  proto::AttemptPlan q = proto::AttemptPlan::from_json(p.to_json());
  EXPECT_EQ(q.nodes, p.nodes);
  EXPECT_EQ(q.world(), 8);
  EXPECT_EQ(q.slot_of(2), 1);
  EXPECT_EQ(q.slot_of(1), -1);
  EXPECT_EQ(q.extra_args, p.extra_args);
}

// The straggler's tp peer waits for it, and on a loaded host part of that wait is counted as compute: the peer can
// cross the factor too, but it is never the slowest rank, and only the slowest is flagged.
TEST(JobWatch, OnlyTheSlowestRankIsFlaggedAsAStraggler) {
  WatchOptions o;
  o.straggler_steps = 2;
  JobWatch w(o);
  w.reset({0, 1, 2, 3}, 0, 0);
  const double compute[] = {1.0, 1.0, 3.0, 2.0};  // rank 3 waits on rank 2, half of it unmeasured
  std::vector<std::string> flagged;
  for (int step = 1; step <= 5; ++step)
    for (int r = 0; r < 4; ++r) {
      RankStatus s = rank(r, fmt::format("dp{},pp0,tp{}", r / 2, r % 2), {}, step);
      s.heard = true;
      s.step = step;
      s.phase = "forward_backward";
      s.step_time = 3.0;
      s.compute_time = compute[r];
      WatchUpdate u = w.apply_status(size_t(r), s, step);
      if (!u.straggler.empty()) flagged.push_back(u.straggler);
    }
  ASSERT_EQ(flagged.size(), 1u);
  EXPECT_NE(flagged[0].find("rank 2 (dp1,pp0,tp0) is a straggler"), std::string::npos) << flagged[0];
}

// The driver hears each rank every half second, in any order, and a status carries every step since the last in
// its records: each step is judged once all ranks have reported it, against the peers' compute at that very step.
// The oracle: the same steps fed one heartbeat at a time flag the same rank at the same step.
TEST(JobWatch, StepsBetweenTwoStatusesAreJudgedOneByOneAgainstThePeersSameStep) {
  WatchOptions o;
  o.straggler_steps = 3;
  // Rank 1 is slow at steps 2-4 and 6-9 only; rank 0 catches up with it at step 5, which breaks the run.
  auto compute = [](int r, int step) { return r == 1 && step != 5 ? 2.0 : 1.0; };
  auto status = [&](int r, int upto) {
    RankStatus s = rank(r, r == 0 ? "dp0,pp0,tp0" : "dp1,pp0,tp0", {}, upto);
    s.step = upto, s.start_step = 1, s.step_time = 2.0, s.compute_time = compute(r, upto);
    for (int k = 2; k <= upto; ++k) s.recent.push_back({k, std::nullopt, 2.0, double(upto), compute(r, k)});
    return s;
  };
  auto flag_step = [&](const std::vector<std::pair<int, int>>& feed) {  // (rank, step up to) in the order heard
    JobWatch w(o);
    w.reset({0, 1}, 0, 0);
    w.apply_status(0, status(0, 1), 1);
    w.apply_status(1, status(1, 1), 1);
    for (auto [r, upto] : feed) {
      WatchUpdate u = w.apply_status(size_t(r), status(r, upto), upto);
      if (!u.straggler.empty()) {
        EXPECT_EQ(u.straggler_rank, 1) << u.straggler;
        return upto;
      }
    }
    return -1;
  };
  std::vector<std::pair<int, int>> each_step;
  for (int k = 2; k <= 9; ++k) each_step.push_back({k % 2, k}), each_step.push_back({1 - k % 2, k});
  EXPECT_EQ(flag_step(each_step), 4);
  // Rank 1 heard at steps 4 and 9, rank 0 at 3, 5, 8, 9: step 4 is judged when rank 0's status of step 5 comes.
  EXPECT_EQ(flag_step({{1, 4}, {0, 3}, {0, 5}, {1, 9}, {0, 8}, {0, 9}}), 5);
  // Every step in one status each: judged at the second.
  EXPECT_EQ(flag_step({{1, 9}, {0, 9}}), 9);
}

// Over the factor but by less than 5% of the step (milliseconds of compute in a long step, where one preemption is
// as large) is no straggler; the same ratio in a step that is mostly compute is.
TEST(JobWatch, ARankOverTheFactorByLessThanAShareOfTheStepIsNoStraggler) {
  for (double step_time : {1.0, 0.1}) {
    JobWatch w(WatchOptions{});
    w.reset({0, 1}, 0, 0);
    bool flagged = false;
    for (int step = 1; step <= 6; ++step)
      for (int r = 0; r < 2; ++r) {
        RankStatus s = rank(r, r == 0 ? "dp0,pp0,tp0" : "dp1,pp0,tp0", {}, step);
        s.step = step, s.step_time = step_time, s.compute_time = r == 1 ? 0.04 : 0.02;  // 2x, 20 ms more
        flagged |= !w.apply_status(size_t(r), s, step).straggler.empty();
      }
    EXPECT_EQ(flagged, step_time < 0.4) << "step time " << step_time;  // 20 ms is 5% of a 0.4 s step
  }
}

// The driver polls statuses, so the first status it hears of a rank may be steps past the rank's start (a short
// restarted attempt can be done by the second poll): that is progress, and the attempt has resumed. A first status
// at the start step is only where the rank starts.
TEST(JobWatch, AFirstStatusPastTheStartStepIsProgress) {
  JobWatch w(WatchOptions{});
  w.reset({0, 1}, 0, /*best_before=*/11);
  RankStatus at_start = rank(0, "dp0,pp0,tp0", {}, 1);
  at_start.heard = true, at_start.start_step = 5, at_start.step = 5;
  EXPECT_FALSE(w.apply_status(0, at_start, 1).first_step);
  RankStatus past = rank(1, "dp1,pp0,tp0", {}, 1);
  past.heard = true, past.start_step = 5, past.step = 20;
  const WatchUpdate u = w.apply_status(1, past, 1);
  EXPECT_TRUE(u.first_step);
  EXPECT_TRUE(u.stepped);
  EXPECT_EQ(w.best_step(), 20);
}

// Fed statuses (as the driver is), the watch finds a hang only past the floor and blames the rank that never
// entered; a straggler is flagged after straggler_steps and marked for eviction after straggler_evict_steps.
TEST(JobWatch, StatusesFeedTheSameHangAndStragglerRules) {
  WatchOptions o;
  o.hang_floor_s = 30;
  o.startup_timeout_s = 60;
  o.straggler_steps = 2;
  o.straggler_evict_steps = 4;
  JobWatch w(o);
  w.reset({0, 1}, 0, 0);
  auto status = [](int r, int step, double compute, std::vector<CollectiveState> colls, double heard) {
    RankStatus s = rank(r, r == 0 ? "dp0,pp0,tp0" : "dp1,pp0,tp0", std::move(colls), heard);
    s.heard = true;
    s.step = step;
    s.phase = "forward_backward";
    s.step_time = compute;
    s.compute_time = compute;
    return s;
  };
  std::vector<std::string> flagged;
  int evict_at = -1;
  for (int step = 1; step <= 5; ++step) {
    for (int r = 0; r < 2; ++r) {
      WatchUpdate u = w.apply_status(size_t(r), status(r, step, r == 1 ? 1.5 : 1.0, {}, step), step);
      if (!u.straggler.empty()) flagged.push_back(u.straggler);
      if (u.evict_straggler) evict_at = step;
    }
  }
  ASSERT_EQ(flagged.size(), 1u);
  EXPECT_NE(flagged[0].find("rank 1 (dp1,pp0,tp0) is a straggler"), std::string::npos) << flagged[0];
  EXPECT_EQ(evict_at, 5);  // (a rank's first status is where it starts, not a step: slow steps 2..5)
  // Rank 1 never enters all_gather #9, which rank 0 waits in; both keep heartbeating.
  w.apply_status(0, status(0, 6, 1.0, {{"dp[0-1]", "all_gather", 9, "started"}}, 6), 6);
  w.apply_status(1, status(1, 6, 1.0, {{"dp[0-1]", "all_gather", 8, "done"}}, 6), 6);
  auto republish = [&](double now) {  // agents publish the same statuses again, with fresh heartbeats
    w.apply_status(0, status(0, 6, 1.0, {{"dp[0-1]", "all_gather", 9, "started"}}, now), now);
    w.apply_status(1, status(1, 6, 1.0, {{"dp[0-1]", "all_gather", 8, "done"}}, now), now);
  };
  republish(20);
  EXPECT_FALSE(w.check_hang(20, {true, true}).has_value());  // 14 s without progress, under the 30 s floor
  republish(37);
  auto h = w.check_hang(37, {true, true});
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->blame.ranks, std::vector<int>({1}));
  EXPECT_NE(h->why.find("no progress"), std::string::npos) << h->why;
}

// The lease ends strictly before the driver can declare the node lost: the driver waits the whole timeout from
// when it saw the last bump, which is no earlier than when the bump was sent; the lease is 3/4 of it from then.
TEST(NodeLease, LapsesAQuarterOfTheTimeoutBeforeTheDriverCouldDeclareTheNodeLost) {
  NodeLease l(8.0);
  EXPECT_DOUBLE_EQ(l.length(), 6.0);
  EXPECT_DOUBLE_EQ(l.renew_interval(), 1.0);
  EXPECT_FALSE(l.lapsed(1e9));  // not armed: the node has not reached the store yet
  l.renewed(100.0);
  EXPECT_FALSE(l.lapsed(106.0));  // exactly at its length it still holds
  EXPECT_TRUE(l.lapsed(106.001));
  l.renewed(105.0);  // a bump sent at 105 was acknowledged (say at 107: the ack time does not count)
  EXPECT_DOUBLE_EQ(l.age(107.0), 2.0);
  EXPECT_FALSE(l.lapsed(111.0));
  EXPECT_TRUE(l.lapsed(111.5));
  l.renewed(103.0);  // a late ack of an older bump never moves the lease back
  EXPECT_DOUBLE_EQ(l.age(107.0), 2.0);
}

// Once lapsed, a lease stays lapsed: a bump that gets through after it (the host thawed, the network came back) may
// come after the driver declared the node lost.
TEST(NodeLease, ALapsedLeaseIsNeverRenewed) {
  NodeLease l(8.0);
  l.renewed(100.0);
  l.renewed(106.0);  // sent while the lease held (by its last instant): renews
  EXPECT_FALSE(l.lapsed(112.0));
  l.renewed(112.5);  // sent after it lapsed at 112
  EXPECT_TRUE(l.lapsed(112.5));
  EXPECT_TRUE(l.lapsed(200.0));
  EXPECT_DOUBLE_EQ(l.age(112.5), 6.5);
}

// At every --node-timeout (>= 1 s) three renewals fit in the lease, so one slow round trip does not lapse it.
TEST(NodeLease, RenewsOftenEnoughAtShortTimeouts) {
  for (double t : {1.0, 2.0, 4.0, 8.0, 60.0}) {
    NodeLease l(t);
    EXPECT_LE(l.renew_interval() * 3, l.length()) << "timeout " << t;
    EXPECT_LE(l.renew_interval(), 1.0);
    EXPECT_LT(l.length(), t);
  }
}

}  // namespace

namespace {

// Effective training time: a step run again replaces its first run and drops what came after; the sum is taken in
// step order, as summing metrics.jsonl's final lines gives it.
TEST(UsefulTime, ARecomputedStepCountsOnceAndTheLostStepsAfterItNotAtAll) {
  UsefulTime u;
  for (int s = 1; s <= 5; ++s) u.step(s, 0.1 * s);  // attempt 0: steps 1-5, then a crash
  u.step(4, 0.75);                                  // attempt 1 resumed from step 3's checkpoint
  EXPECT_EQ(u.steps(), 4) << "step 5 of attempt 0 was lost with it";
  EXPECT_EQ(u.seconds(), ((0.1 + 0.2) + 0.30000000000000004) + 0.75);  // summed from step 1, as the file's lines
  u.step(5, 0.5);
  u.step(6, 0.25);
  EXPECT_EQ(u.steps(), 6);
  EXPECT_EQ(u.seconds(), ((((0.1 + 0.2) + 0.30000000000000004) + 0.75) + 0.5) + 0.25);
  const nlohmann::json j = effective_training_json(u, 4.25);
  EXPECT_EQ(j["useful_s"], u.seconds());
  EXPECT_EQ(j["wall_s"], 4.25);
  EXPECT_DOUBLE_EQ(j["effective_training"].get<double>(), u.seconds() / 4.25);
  EXPECT_EQ(effective_training_line(u, 4.25), "effective training time 49.4%: the 6 steps kept took 2.1 s of the "
                                              "job's 4.2 s");
}

// The supervisors feed it from rank 0's step lines only, across attempts (reset() keeps it).
TEST(JobWatch, UsefulTimeTakesRankZerosStepsAcrossAttempts) {
  JobWatch w(WatchOptions{});
  auto step_line = [](int step, double t) {
    return nlohmann::json{{"type", "hb"}, {"at", "step"}, {"step", step}, {"step_time", t}, {"start_step", 0}};
  };
  w.reset({0, 1}, 0.0, 0);
  for (int s = 1; s <= 3; ++s) {
    w.apply_heartbeat(0, step_line(s, 1.0), 1.0 * s);
    w.apply_heartbeat(1, step_line(s, 100.0), 1.0 * s);  // rank 1's times are not counted
  }
  w.apply_heartbeat(0, step_line(3, 1.0), 3.5);  // the same line again (a tick would carry it too): counted once
  EXPECT_EQ(w.useful().steps(), 3);
  EXPECT_EQ(w.useful().seconds(), 3.0);
  w.reset({0, 1}, 10.0, 3);  // attempt 1 resumed from step 2
  w.apply_heartbeat(0, step_line(3, 2.0), 11.0);
  EXPECT_EQ(w.useful().seconds(), 4.0) << "steps 1 and 2 of attempt 0, step 3 of attempt 1";
  // Under the driver, a status carries several records at once.
  RankStatus s;
  s.rank = 0;
  s.heard = true;
  s.step = 5;
  s.start_step = 2;
  s.recent = {{3, 2.0, 2.0, 11.0, {}}, {4, std::nullopt, 0.5, 11.5, {}}, {5, std::nullopt, 0.25, 11.6, {}}};
  w.apply_status(0, s, 12.0);
  EXPECT_EQ(w.useful().steps(), 5);
  EXPECT_EQ(w.useful().seconds(), 4.75);
}

}  // namespace

namespace {

// gdb's "thread apply all bt", shortened: the main thread's three innermost megatrain frames, then each other
// thread's innermost one, once; names cut at their argument lists ("(anonymous namespace)" is not one).
TEST(StackDump, NamesEachThreadsInnermostMegatrainFunction) {
  const std::string gdb =
      "[New LWP 22178]\n"
      "__futex_abstimed_wait_common64 (private=0) at ./nptl/futex-internal.c:57\n"
      "\n"
      "Thread 3 (Thread 0x7ff40d7fa000 (LWP 22191) \"exe\"):\n"
      "#0  __futex_abstimed_wait_common64 (private=0) at ./nptl/futex-internal.c:57\n"
      "#5  0x000055db3062fd30 in mt::(anonymous namespace)::GlooGroup::run_worker() ()\n"
      "#6  0x00007ff4254d44a3 in ?? () from /lib/x86_64-linux-gnu/libstdc++.so.6\n"
      "\n"
      "Thread 2 (Thread 0x7ff40dffb000 (LWP 22188) \"exe\"):\n"
      "#0  0x00007ff4256ebfa5 in clock_nanosleep () from /lib/x86_64-linux-gnu/libc.so.6\n"
      "#2  0x000055db30561234 in mt::FaultInjector::FaultInjector(mt::RunConfig const&)::{lambda(std::__cxx11::"
      "basic_string<char> const&, mt::FlightEntry const&)#1}::operator()(std::string const&, mt::FlightEntry const&) "
      "const ()\n"
      "#3  0x000055db30561299 in mt::FlightRecorder::enter(std::string const&, mt::FlightEntry const&) ()\n"
      "\n"
      "Thread 4 (Thread 0x7ff40e7fc000 (LWP 22189) \"exe\"):\n"
      "#5  0x000055db3062fd30 in mt::(anonymous namespace)::GlooGroup::run_worker() ()\n"
      "\n"
      "Thread 1 (Thread 0x7ff425a3d000 (LWP 22177) \"exe\"):\n"
      "#6  0x000055db30625f5e in mt::(anonymous namespace)::OpWork::wait() ()\n"
      "#7  mt::DataParallel::wait (this=0x1, w=...) at src/megatrain/parallel/data_parallel.cpp:210\n"
      "#8  0x000055db305f9460 in mt::DataParallel::finish_gradients() ()\n"
      "#9  0x000055db3053988b in mt::run_training(mt::RunConfig const&) ()\n"
      "#12 0x000055db3042bc64 in main ()\n"
      "[Inferior 1 (process 22177) detached]\n";
  EXPECT_EQ(innermost_project_frames(gdb),
            (std::vector<std::string>{
                "main: mt::(anonymous namespace)::OpWork::wait < mt::DataParallel::wait < "
                "mt::DataParallel::finish_gradients",
                "mt::(anonymous namespace)::GlooGroup::run_worker",
                "mt::FaultInjector::FaultInjector"}));  // a lambda is named by the function it is defined in
  EXPECT_TRUE(innermost_project_frames("ptrace: Operation not permitted.\n").empty());
}

// gdb on a process it may not attach to (pid 1 is not this test's child; as root it may be, so a pid that does not
// exist): no stacks, and an error that says why rather than an empty success.
TEST(StackDump, AProcessThatCannotBeAttachedGivesAnError) {
  const StackDump d = dump_stacks(999999999, 30);
  EXPECT_FALSE(d.error.empty());
  EXPECT_TRUE(d.frames.empty());
}

}  // namespace
