// The supervisor's decisions, in process, against known answers: whom a hang blames (from synthetic flight
// recorder states whose answer is known by construction), when a failure is restarted, and how heartbeats are read.
#include <gtest/gtest.h>

#include "megatrain/launch/diagnose.h"
#include "megatrain/launch/hang_blame.h"
#include "megatrain/launch/rank_status.h"
#include "megatrain/launch/restart_policy.h"

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

TEST(HangBlame, ASilentRankIsBlamedBeforeAnyCollectiveEvidence) {
  std::vector<RankStatus> rs = {rank(0, "dp0,pp0,tp0", {{"dp[0-1]", "allreduce", 3, "started"}}, 100),
                                rank(1, "dp1,pp0,tp0", {{"dp[0-1]", "allreduce", 3, "started"}}, 80)};
  Blame b = blame_hang(rs, 100, 10);
  EXPECT_EQ(b.ranks, std::vector<int>{1});
  EXPECT_NE(b.line.find("rank 1 (dp1,pp0,tp0) stopped responding: no heartbeat for 20 s"), std::string::npos)
      << b.line;
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
  EXPECT_EQ(spent.exit_code, kRestartsSpentExit);
  RestartDecision stuck = decide_restart(p, 20, 2, 3);
  EXPECT_FALSE(stuck.restart);
  EXPECT_EQ(stuck.exit_code, kNoProgressExit);
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
  EXPECT_TRUE(s.apply(nlohmann::json::parse(
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

}  // namespace
