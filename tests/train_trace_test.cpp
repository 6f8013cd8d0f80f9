// The timeline end to end (train.trace_steps, docs/observability.md): real ranks under `megatrain launch`, each with its
// clock shifted by a known amount (clock_skew faults in MEGATRAIN_FAULTS), trace a window of steps; the trainer
// measures each clock against rank 0's and merges the files. Oracles:
//   - the injected skews: each rank's measured offset must recover its skew within the bound it states;
//   - causality: on the merged clock no collective completes before all its members entered it and no receive
//     before its send; with the offsets not applied, the same files break it (so the alignment is what fixes it);
//   - the pipeline schedule: each rank's forward/backward spans are its schedule's compute actions, in order, once
//     per traced step (parallel/schedule.h, the object the executor runs);
//   - an injected slow rank: the heat map `trace merge --heatmap` draws must show it as the hottest row.
#include <map>
#include <regex>

#include "support/files.h"
#include "support/megatrain.h"
#include "support/metrics.h"
#include "support/parallel_testutil.h"

#include "megatrain/core/fs.h"
#include "megatrain/obs/chrome_trace.h"
#include "megatrain/obs/trace_check.h"
#include "megatrain/parallel/schedule.h"

using namespace ptest;
using namespace mt;

namespace {

const std::vector<double> kSkew = {0, 40, -25, 15};  // seconds, by rank: at least 15 s apart

TEST(TimelineJob, FourRanksOnSkewedClocksMergeIntoOneConsistentTrace) {
  prepare();
  const std::string out = fresh_dir("trace_dp2_pp2");
  const std::string log = out + ".log";
  const std::string cmd =
      "MEGATRAIN_FAULTS='clock_skew:rank=1:seconds=40;clock_skew:rank=2:seconds=-25;clock_skew:rank=3:seconds=15' " +
      kMegatrain + " launch --nproc 4 -- train" +
      common_args(out, 2, 2,
                  " --parallel.dp=2 --parallel.pp=2 --parallel.microbatches=4 --train.steps=4"
                  " --train.trace_steps=[2,3]") +
      " > " + log + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << mt::read_text_file(log);
  ASSERT_TRUE(fs::exists(out + "/trace.json")) << mt::read_text_file(log);
  EXPECT_NE(mt::read_text_file(log).find("consistent"), std::string::npos) << mt::read_text_file(log);

  const obs::MergedTrace m = obs::merge_rank_traces({out + "/trace"});
  ASSERT_EQ(m.ranks.size(), 4u);
  EXPECT_TRUE(m.missing_ranks.empty());
  double min_gap = 1e9;
  for (size_t a = 0; a < kSkew.size(); ++a)
    for (size_t b = a + 1; b < kSkew.size(); ++b) min_gap = std::min(min_gap, std::abs(kSkew[a] - kSkew[b]));
  for (const obs::RankTrace& r : m.ranks) {
    // Rank r's clock reads true time + skew[r], so adding skew[0] - skew[r] reads rank 0's.
    const double truth = kSkew[0] - kSkew[r.rank];
    EXPECT_LE(std::abs(r.clock_offset_s - truth), r.clock_error_s + 1e-9)
        << "rank " << r.rank << ": offset " << r.clock_offset_s << " vs " << truth << " +- " << r.clock_error_s;
    // The bound only has to tell the injected skews apart for the checks below to mean anything. It is half the
    // shortest of 8 round trips over the host mesh (under a millisecond here); with skews 15 s or more apart this
    // fails only if every one of the 8 took over 7.5 s, which no machine that can run the job at all does (the
    // test asserts nothing about how fast the job runs).
    EXPECT_LT(r.clock_error_s, min_gap / 4) << "rank " << r.rank;
    EXPECT_EQ(r.first_step, 2);
    EXPECT_EQ(r.last_step, 3);
    EXPECT_EQ(r.dropped, 0u);
  }

  const obs::TraceReport aligned = obs::check_trace(m);
  EXPECT_TRUE(aligned.violations.empty()) << aligned.violations.front().what;
  EXPECT_GT(aligned.transfers, 0u);
  EXPECT_GT(aligned.last_in.count("dp"), 0u);  // ZeRO's collectives, seen by both members of each dp group
  EXPECT_GT(aligned.last_in.count("pp"), 0u);
  const obs::TraceReport raw = obs::check_trace(obs::merge_rank_traces({out + "/trace"}, /*align=*/false));
  EXPECT_FALSE(raw.violations.empty()) << "the skews should break causality on the ranks' own clocks";

  // Where the steps went: the parts sum to the step, and every rank computed and waited for its pipeline peer
  // (1F1B over 2 stages cannot run without waits).
  for (const obs::StepBreakdown& b : obs::step_breakdown(m)) {
    EXPECT_EQ(b.steps, 2) << "rank " << b.rank;
    double sum = 0;
    for (const auto& [part, s] : b.parts_s) sum += s;
    EXPECT_NEAR(sum, b.step_s, 1e-6 * b.step_s) << "rank " << b.rank;
    EXPECT_GT(b.parts_s.at("compute"), 0) << "rank " << b.rank;
    EXPECT_GT(b.parts_s.at("comm wait"), 0) << "rank " << b.rank;
  }

  // Each rank's compute spans: its schedule's Forward/Backward actions, once per traced step; and each lies inside
  // its step's forward-backward phase.
  const Schedule s = make_1f1b(2, 4);
  for (int rank = 0; rank < 4; ++rank) {
    const int pp_rank = rank / 2;  // rank = (pp * dp + dp_i) * tp + tp_i, with dp 2 and tp 1
    std::vector<std::string> want, got;
    for (int step = 0; step < 2; ++step)
      for (const Action& a : s.per_rank[pp_rank])
        if (a.kind == ActionKind::Forward || a.kind == ActionKind::Backward) want.push_back(to_string(a, 1));
    std::vector<const obs::TraceEvent*> phases;
    for (const obs::TraceEvent& e : m.events)
      if (e.rank == rank && e.name == "forward-backward") phases.push_back(&e);
    ASSERT_EQ(phases.size(), 2u) << "rank " << rank;
    for (const obs::TraceEvent& e : m.events) {
      if (e.rank != rank || e.cat != "compute") continue;
      got.push_back(e.name);
      const bool inside = std::any_of(phases.begin(), phases.end(),
                                      [&](const obs::TraceEvent* p) { return p->t0 <= e.t0 && e.t1 <= p->t1; });
      EXPECT_TRUE(inside) << "rank " << rank << ": " << e.name << " outside every forward-backward phase";
    }
    EXPECT_EQ(got, want) << "rank " << rank;
  }
}

TEST(TimelineJob, OffByDefaultAndAWindowCutShortByTheRunStillCloses) {
  prepare();
  const std::string plain = fresh_dir("trace_off");
  run(kMegatrain + " train" + common_args(plain, 2, 1, " --train.steps=2"));
  EXPECT_FALSE(fs::exists(plain + "/trace"));
  EXPECT_FALSE(fs::exists(plain + "/trace.json"));

  const std::string out = fresh_dir("trace_cut");
  run(kMegatrain + " train" + common_args(out, 2, 1, " --train.steps=3 --train.trace_steps=[2,9]"));
  const obs::MergedTrace m = obs::merge_rank_traces({out + "/trace/rank0.json"});
  ASSERT_EQ(m.ranks.size(), 1u);
  EXPECT_EQ(m.ranks[0].first_step, 2);
  EXPECT_EQ(m.ranks[0].last_step, 3);
  std::vector<std::string> steps;
  for (const obs::TraceEvent& e : m.events)
    if (e.cat == "step") steps.push_back(e.name);
  EXPECT_EQ(steps, (std::vector<std::string>{"step 2", "step 3"}));
  EXPECT_TRUE(fs::exists(out + "/trace.json"));
}

}  // namespace

namespace {

// The timeline never ends a run: a rank file that cannot be written (here a directory sits at its path) is
// reported, and training completes every step.
TEST(TimelineJob, ATraceThatCannotBeWrittenIsReportedAndTrainingGoesOn) {
  prepare();
  const std::string out = fresh_dir("trace_unwritable");
  fs::create_directories(out + "/trace/rank0.json");
  const std::string log = out + ".log";
  const std::string cmd = kMegatrain + " train" + common_args(out, 2, 1, " --train.steps=3 --train.trace_steps=[1,2]") +
                          " > " + log + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << mt::read_text_file(log);
  const std::string text = mt::read_text_file(log);
  EXPECT_NE(text.find("timeline: rank 0 could not write its trace"), std::string::npos) << text;
  EXPECT_NE(text.find("training goes on"), std::string::npos) << text;
  EXPECT_EQ(mt::test::step_losses(out + "/metrics.jsonl").size(), 3u);
}

}  // namespace

namespace {

// The heat map of slow ranks from a finished job's trace (`megatrain trace merge --heatmap`). The oracle is the
// injected fault: in a dp2 x tp2 job rank 2 sleeps 3 x its step's compute each step (slow:factor=4), its peers
// wait for it in their collectives, which the compute time leaves out; so rank 2's row must be the hottest, about
// 4 x the median, and be named first among the slowest.
TEST(TimelineJob, TheSlowRankIsTheHottestRowOfTheTracesHeatMap) {
  prepare();
  const std::string out = fresh_dir("trace_slow_rank");
  const std::string log = out + ".log";
  std::string cmd = "MEGATRAIN_FAULTS='slow:rank=2:factor=4' " + kMegatrain + " launch --nproc 4 -- train" +
                    common_args(out, 2, 1,
                                " --parallel.dp=2 --parallel.tp=2 --train.steps=5 --train.trace_steps=[2,5]") +
                    " > " + log + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << mt::read_text_file(log);

  const std::string svg_path = out + "/heat.svg", merge_log = out + "/merge.log";
  cmd = kMegatrain + " trace merge " + out + "/trace -o " + out + "/merged.json --heatmap " + svg_path + " > " +
        merge_log + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << mt::read_text_file(merge_log);
  EXPECT_NE(mt::read_text_file(merge_log).find("slowest: rank 2 at"), std::string::npos)
      << mt::read_text_file(merge_log);
  const std::string svg = mt::read_text_file(svg_path);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(svg, m,
                                std::regex(R"re(<g class="heat-row" data-rank="(\d+)"[^>]*data-hottest="true")re")))
      << svg;
  EXPECT_EQ(m[1], "2") << svg;
  ASSERT_TRUE(std::regex_search(svg, m, std::regex(R"re(<text class="slowest" data-rank="(\d+)")re"))) << svg;
  EXPECT_EQ(m[1], "2") << "the first named is the slowest";
  // Every rank has its row, in (dp, pp, tp) order (here rank order: rank = dp * 2 + tp), over the 4 traced steps.
  std::map<int, double> mean;
  std::vector<int> order;
  const std::regex row(R"re(<g class="heat-row" data-rank="(\d+)" data-node="\d+" data-mean="([0-9.]+)")re");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), row); it != std::sregex_iterator(); ++it) {
    order.push_back(std::stoi((*it)[1]));
    mean[order.back()] = std::stod((*it)[2]);
  }
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_NE(svg.find("steps 2 to 5"), std::string::npos);
  EXPECT_GT(mean[2], 2.0) << "4 x its own compute against peers at about 1 x the median";
  for (int r : {0, 1, 3}) EXPECT_LT(mean[r], mean[2] / 1.5) << "rank " << r;
}

// --heatmap to a place it cannot write is refused before the merge, naming the path and why.
TEST(TimelineJob, AHeatMapThatCannotBeWrittenIsRefusedNamingThePath) {
  prepare();
  const std::string out = fresh_dir("trace_heatmap_bad_path");
  run(kMegatrain + " train" + common_args(out, 2, 1, " --train.steps=2 --train.trace_steps=[1,2]"));
  const std::string log = out + "/merge.log";
  const std::string bad = out + "/no-such-dir/heat.svg";
  const std::string cmd = kMegatrain + " trace merge " + out + "/trace --heatmap " + bad + " > " + log + " 2>&1";
  EXPECT_NE(std::system(cmd.c_str()), 0);
  EXPECT_NE(mt::read_text_file(log).find("--heatmap " + bad + ": cannot write there: the directory " + out +
                                         "/no-such-dir does not exist"),
            std::string::npos)
      << mt::read_text_file(log);
  const std::string dir_cmd = kMegatrain + " trace merge " + out + "/trace --heatmap " + out + " > " + log + " 2>&1";
  EXPECT_NE(std::system(dir_cmd.c_str()), 0);
  EXPECT_NE(mt::read_text_file(log).find("that is a directory, not a file"), std::string::npos)
      << mt::read_text_file(log);
}

}  // namespace
