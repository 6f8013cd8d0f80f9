// The timeline and its trace files (obs/) against known answers: what is recorded when, what a rank file holds,
// how merging moves each rank onto rank 0's clock, and what the checks conclude from hand-made traces.
#include <gtest/gtest.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <thread>

#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"
#include "megatrain/obs/chrome_trace.h"
#include "megatrain/obs/timeline.h"
#include "megatrain/obs/trace_check.h"
#include "support/files.h"
#include "support/test_util.h"

using namespace mt;
using namespace mt::obs;

namespace {

std::string fresh(const std::string& name) {
  const std::string d = mt::test::temp_root() + "/obs_trace_test/" + name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

using mt::test::error_of;

Span comm(const std::string& op, const std::string& group, int64_t seq, double t0, double t1, int peer = -1) {
  Span s{op, "comm", group, t0, t1, {{"group", group}, {"seq", seq}}};
  if (peer >= 0) s.args["peer"] = peer;
  return s;
}

RankTrace info(int rank, int world, double offset = 0, double error = 0) {
  RankTrace r;
  r.rank = rank;
  r.world = world;
  r.label = "rank " + std::to_string(rank);
  r.clock_offset_s = offset;
  r.clock_error_s = error;
  return r;
}

TEST(Timeline, RecordsOnlyWhileOnAndCountsWhatItDrops) {
  Timeline& t = timeline();
  t.take();
  bool described = false;
  {
    ScopedSpan off("phase", [&] {
      described = true;
      return SpanInfo{"before", nullptr};
    });
  }
  EXPECT_FALSE(described) << "a span's description is built only while the timeline is on";
  t.set_on(true);
  {
    ScopedSpan outer("step", "step 1");
    ScopedSpan inner("phase", [] { return SpanInfo{"inner", {{"mb", 3}}}; });
  }
  t.set_on(false);
  { ScopedSpan off("phase", "after"); }
  std::vector<Span> spans = t.take();
  ASSERT_EQ(spans.size(), 2u);
  // Destruction order: the inner span ends (and is recorded) first, and lies within the outer one.
  EXPECT_EQ(spans[0].name, "inner");
  EXPECT_EQ(spans[0].args["mb"], 3);
  EXPECT_EQ(spans[1].name, "step 1");
  EXPECT_EQ(spans[1].track, "main");
  EXPECT_LE(spans[1].t0, spans[0].t0);
  EXPECT_GE(spans[1].t1, spans[0].t1);

  t.set_limit(3);
  t.set_on(true);
  for (int i = 0; i < 5; ++i) t.add(Span{"s", "phase", "main", 0, 1, nullptr});
  t.set_on(false);
  EXPECT_EQ(t.dropped(), 2u);
  EXPECT_EQ(t.take().size(), 3u);
  t.set_limit(Timeline::kDefaultLimit);
}

TEST(Timeline, ClockIsTheSystemClockInUnixSeconds) {
  // No skew is injected in this process (no clock_skew fault in MEGATRAIN_FAULTS), so the trace clock is the wall clock.
  ASSERT_EQ(injected_clock_skew(), 0);
  // Bracketed by clock_gettime(CLOCK_REALTIME) itself, read as integer nanoseconds: before <= t <= after up to the
  // double's rounding of ~1.8e9 s (a spacing of 2.4e-7 s). Not by time(): glibc answers it from the coarse clock,
  // which lags the fine one by up to a tick, so just past a second boundary time() still gives the second before
  // and a correct t failed t < after + 1 (seen once in a clean-clone run).
  auto realtime = [] {
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  };
  const double before = realtime();
  const double t = trace_clock();
  const double after = realtime();
  EXPECT_GE(t, before - 1e-6);
  EXPECT_LE(t, after + 1e-6);
}

TEST(ChromeTrace, RankFileIsAChromeTraceWithTracksAsThreads) {
  const std::vector<Span> spans = {{"step 1", "step", "main", 100.0, 100.5, {{"step", 1}}},
                                   comm("allreduce", "dp[0,1]", 7, 100.1, 100.2)};
  const nlohmann::json j = chrome_trace(info(1, 2, 0.25, 1e-4), spans);
  EXPECT_EQ(j["megatrain"]["rank"], 1);
  EXPECT_DOUBLE_EQ(j["megatrain"]["clock_offset_s"].get<double>(), 0.25);
  std::map<int, std::string> threads;
  std::vector<nlohmann::json> xs;
  for (const auto& e : j["traceEvents"]) {
    EXPECT_EQ(e["pid"], 1);
    if (e["ph"] == "M" && e["name"] == "thread_name") threads[e["tid"]] = e["args"]["name"];
    if (e["ph"] == "X") xs.push_back(e);
  }
  EXPECT_EQ(threads[0], "main");
  ASSERT_EQ(xs.size(), 2u);
  EXPECT_DOUBLE_EQ(xs[0]["ts"].get<double>(), 100.0e6);  // microseconds of the rank's own clock
  EXPECT_NEAR(xs[0]["dur"].get<double>(), 0.5e6, 1e-3);
  EXPECT_EQ(threads[xs[1]["tid"].get<int>()], "dp[0,1]");
}

TEST(ChromeTrace, MergePutsEveryRankOnRankZerosClock) {
  const std::string d = fresh("merge");
  // The same instant is 1000.0 on rank 0's clock and 1003.0 on rank 1's: rank 1's offset is -3.
  write_rank_trace(d + "/rank0.json", info(0, 3), {{"a", "phase", "main", 1000.0, 1000.5, nullptr}});
  write_rank_trace(d + "/rank1.json", info(1, 3, -3.0, 2e-5), {{"b", "phase", "main", 1003.25, 1003.5, nullptr}});
  const MergedTrace m = merge_rank_traces({d});
  ASSERT_EQ(m.ranks.size(), 2u);
  EXPECT_EQ(m.missing_ranks, std::vector<int>{2});
  ASSERT_EQ(m.events.size(), 2u);
  EXPECT_NEAR(m.base_unix_s, 1000.0, 1e-6);
  EXPECT_NEAR(m.events[0].t0, 0.0, 1e-6);
  EXPECT_NEAR(m.events[1].t0, 0.25, 1e-6);  // 1003.25 - 3 - 1000
  EXPECT_NEAR(m.events[1].t1, 0.5, 1e-6);
  const MergedTrace raw = merge_rank_traces({d}, /*align=*/false);
  EXPECT_NEAR(raw.events[1].t0, 3.25, 1e-6);
  // The merged file names each process by its rank's label.
  const nlohmann::json c = to_chrome(m);
  int named = 0;
  for (const auto& e : c["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "process_name")
      named += e["args"]["name"] == "rank " + std::to_string(e["pid"].get<int>());
  EXPECT_EQ(named, 2);
  EXPECT_EQ(c["megatrain"]["missing_ranks"], nlohmann::json::array({2}));
}

TEST(ChromeTrace, BadFilesAreErrorsNamingThem) {
  const std::string d = fresh("bad");
  write_file_atomic(d + "/cut.json", std::string("{\"traceEvents\": [ {\"ph\": \"X\""));
  EXPECT_NE(error_of([&] { merge_rank_traces({d + "/cut.json"}); }).find("cut.json: not JSON"), std::string::npos);
  write_file_atomic(d + "/other.json", std::string("{\"traceEvents\": []}"));
  EXPECT_NE(error_of([&] { merge_rank_traces({d + "/other.json"}); }).find("not a megatrain rank trace"),
            std::string::npos);
  write_rank_trace(d + "/a.json", info(0, 2), {});
  write_rank_trace(d + "/b.json", info(0, 2), {});
  EXPECT_NE(error_of([&] {
              merge_rank_traces({d + "/a.json", d + "/b.json"});
            }).find("are both traces of rank 0"),
            std::string::npos);
  write_rank_trace(d + "/c.json", info(1, 4), {});
  EXPECT_NE(error_of([&] {
              merge_rank_traces({d + "/a.json", d + "/c.json"});
            }).find("traces of different jobs"),
            std::string::npos);
  std::filesystem::create_directories(d + "/empty");
  EXPECT_NE(error_of([&] { merge_rank_traces({d + "/empty"}); }).find("no rank*.json"), std::string::npos);
  EXPECT_NE(error_of([&] { merge_rank_traces({d + "/none.json"}); }).find("none.json"), std::string::npos);
}

// Two ranks, one allreduce and one transfer, with hand-set times on one clock (offset 0).
// A folder per test case: ctest runs the cases as parallel processes, and two of them sharing one folder delete each
// other's files (seen under ctest -j 4).
MergedTrace two_ranks(double rank1_start, double recv_end, double error = 0) {
  const std::string d = fresh(std::string("check-") + ::testing::UnitTest::GetInstance()->current_test_info()->name());
  write_rank_trace(d + "/rank0.json", info(0, 2, 0, error),
                   {comm("allreduce", "dp[0,1]", 4, 10.0, 10.3), comm("send", "pp[0-1]", 2, 10.4, 10.5, 1)});
  write_rank_trace(d + "/rank1.json", info(1, 2, 0, error),
                   {comm("allreduce", "dp[0,1]", 4, rank1_start, 10.3),
                    comm("recv", "pp[0-1]", 2, 10.35, recv_end, 0)});
  return merge_rank_traces({d});
}

TEST(TraceCheck, NamesWhoEnteredLastAndHowLongTheOthersWaited) {
  const TraceReport r = check_trace(two_ranks(10.2, 10.6));
  ASSERT_EQ(r.meetings.size(), 1u);
  EXPECT_EQ(r.meetings[0].last_in, 1);
  EXPECT_NEAR(r.meetings[0].wait_s, 0.2, 1e-9);  // rank 0 was in from 10.0, rank 1 came at 10.2
  EXPECT_EQ(r.last_in.at("dp").at(1), 1);
  EXPECT_NEAR(r.caused_wait_s.at("dp").at(1), 0.2, 1e-9);
  EXPECT_EQ(r.transfers, 1u);
  EXPECT_EQ(r.unmatched, 0u);
  EXPECT_TRUE(r.violations.empty());
}

TEST(TraceCheck, AnOpCompletedBeforeItsPartnerBeganIsAViolationBeyondTheClockBound) {
  // Rank 1 "enters" the allreduce at 10.5, after rank 0 completed it at 10.3; its recv ends at 10.38, before the
  // send started at 10.4.
  TraceReport r = check_trace(two_ranks(10.5, 10.38));
  ASSERT_EQ(r.violations.size(), 2u);
  EXPECT_NE(r.violations[0].what.find("allreduce #4 of dp[0,1]"), std::string::npos) << r.violations[0].what;
  EXPECT_NEAR(r.violations[0].excess_s, 0.2, 1e-9);
  EXPECT_NE(r.violations[1].what.find("from rank 0 to rank 1"), std::string::npos) << r.violations[1].what;
  // Within the clocks' error bounds (0.11 s a rank, 0.22 s a pair) the same times are consistent.
  r = check_trace(two_ranks(10.5, 10.38, 0.11));
  EXPECT_TRUE(r.violations.empty());
}

}  // namespace

namespace {

// One step of 10 s on rank 0: data 0-1, compute 1-4 inside forward-backward 1-6 with a pipeline wait 4-5, gradients
// 6-7, optimizer 7-9; the remaining 1.5 s (5-6 inside forward-backward, 9-9.5, 9.5-10) is "other". A second step
// doubles every part, so the mean is 1.5x the first step's.
TEST(TraceCheck, StepBreakdownSumsEachKindOfSpanAndLeavesTheRestAsOther) {
  const std::string d = fresh("breakdown");
  std::vector<Span> spans;
  for (int k = 0; k < 2; ++k) {
    const double o = 100.0 * k, x = k + 1.0;  // step k starts at o and is x times as long
    spans.push_back({"step", "step", "main", o, o + 10 * x, nullptr});
    spans.push_back({"data", "phase", "main", o, o + 1 * x, nullptr});
    spans.push_back({"forward-backward", "phase", "main", o + 1 * x, o + 6 * x, nullptr});
    spans.push_back({"F0", "compute", "main", o + 1 * x, o + 4 * x, nullptr});
    spans.push_back({"wrB0", "wait", "main", o + 4 * x, o + 5 * x, nullptr});
    spans.push_back({"gradients", "phase", "main", o + 6 * x, o + 7 * x, nullptr});
    spans.push_back({"optimizer", "phase", "main", o + 7 * x, o + 9 * x, nullptr});
    spans.push_back(comm("allreduce", "dp[0,1]", k, o + 6 * x, o + 7 * x));  // another track: not a part
  }
  write_rank_trace(d + "/rank0.json", info(0, 1), spans);
  const std::vector<StepBreakdown> b = step_breakdown(merge_rank_traces({d}));
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].steps, 2);
  EXPECT_NEAR(b[0].step_s, 15.0, 1e-6);
  const std::map<std::string, double> want = {{"compute", 4.5},   {"comm wait", 1.5}, {"data", 1.5},
                                              {"gradients", 1.5}, {"optimizer", 3.0}, {"eval", 0},
                                              {"checkpoint", 0},  {"other", 3.0}};
  for (const auto& [part, s] : want) EXPECT_NEAR(b[0].parts_s.at(part), s, 1e-6) << part;
}

}  // namespace
