// Heartbeats (train/heartbeat.h), read from the pipe as the supervisor's agent would:
//  * every line is one JSON object of at most PIPE_BUF bytes; step lines carry the step's loss (the same as
//    metrics.jsonl's), step and compute time, RSS, coordinates, phases; ticks come from the background thread;
//    the last line says done; a skipped batch sends its event with the data positions;
//  * while a rank waits in a collective for a peer that is stopped (SIGSTOP), its heartbeats go on, showing the
//    collective in flight with a growing wait, and the stopped rank's stop; after SIGCONT both train on.
#include <gtest/gtest.h>
#include <limits.h>

#include <cmath>
#include <filesystem>
#include <set>
#include <unistd.h>
#include <thread>
#include <sstream>

#include "support/comm_fork_util.h"
#include "megatrain/core/clock.h"
#include "megatrain/train/heartbeat.h"
#include "support/files.h"
#include "support/metrics.h"
#include "support/robust_util.h"

using namespace robust_test;
namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const std::string& name) {
  const std::string d = mt::test::temp_root() + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(Heartbeat, LinesCarryTheProtocolsFields) {
  prepare();
  const std::string out = fresh_dir("mt_hb_fields");
  mt::test::ScratchDir store;
  std::vector<std::string> args = small_flags(out + "/run");
  args.insert(args.end(), {"--train.steps=5", "--train.skip_steps=[2]"});
  Rank r = start_rank(0, 1, store.path, args, out + "/log", {}, 0.05);
  ASSERT_TRUE(r.wait_exit(120)) << slurp(out + "/log");
  ASSERT_EQ(r.exit_code(), 0) << slurp(out + "/log");
  while (!r.drain()) std::this_thread::sleep_for(std::chrono::milliseconds(10));

  ASSERT_FALSE(r.lines.empty());
  for (const std::string& l : r.raw) EXPECT_LE(l.size() + 1, static_cast<size_t>(PIPE_BUF)) << l;
  const std::set<std::string> phases = {"init", "forward_backward", "optimizer", "eval", "checkpoint", "done"};
  double t_prev = 0;
  for (const auto& l : r.hb()) {
    EXPECT_EQ(l["rank"], 0);
    EXPECT_TRUE(phases.count(l["phase"].get<std::string>())) << l.dump();
    EXPECT_GT(l["rss"].get<uint64_t>(), 1u << 20) << l.dump();
    EXPECT_GE(l["t"].get<double>(), t_prev) << l.dump();
    t_prev = l["t"].get<double>();
    EXPECT_TRUE(l["colls"].is_array());
  }
  EXPECT_EQ(r.hb().front()["phase"], "init");  // the first tick comes before the topology is built
  EXPECT_TRUE(r.hb().front()["coord"].is_null());
  EXPECT_FALSE(r.hb("tick").empty());
  EXPECT_EQ(r.hb().back()["at"], "exit");
  EXPECT_EQ(r.hb().back()["phase"], "done");

  // One step line per trained step, with metrics.jsonl's loss; step 2 was skipped.
  const std::vector<std::string> metrics = mt::test::step_losses(out + "/run/metrics.jsonl");
  const auto steps = r.hb("step");
  ASSERT_EQ(steps.size(), metrics.size()) << slurp(out + "/log");
  ASSERT_EQ(steps.size(), 4u);
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto& l = steps[i];
    const std::string& m = metrics[i];
    EXPECT_EQ(std::to_string(l["step"].get<int>()), m.substr(0, m.find(':')));
    EXPECT_EQ(static_cast<float>(l["loss"].get<double>()), std::stof(m.substr(m.find(':') + 1))) << l.dump();
    EXPECT_EQ(l["coord"], nlohmann::json({0, 0, 0}));
    EXPECT_GT(l["step_time"].get<double>(), 0);
    // One process: no communication, so all of the step is compute.
    EXPECT_EQ(l["compute_time"].get<double>(), l["step_time"].get<double>());
  }
  EXPECT_EQ(steps[1]["step"], 3);
  // The skipped step's event: its batch is positions 4..7 of epoch 0 (step 1 read 0..3; batch_size 4, one rank).
  const auto skipped = r.events("batch_skipped");
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0]["step"], 2);
  EXPECT_EQ(skipped[0]["batches"], nlohmann::json::parse(R"([{"epoch":0,"first":4,"last":7}])"));
  EXPECT_TRUE(has(slurp(out + "/log"), "skipping the batch of step 2 (data rows: epoch 0, positions 4-7"));
}

// Lines leave in the order of their time stamps even while the training thread writes step lines and events as
// fast as it can and the writer thread stamps a tick at every turn (interval 0): a line stamped before a tick must
// not be written after it. The reader's oracle is the stamps themselves: "t" never decreases along the pipe.
TEST(Heartbeat, LinesReachTheReaderInTheOrderOfTheirStamps) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  std::string text;
  std::thread reader([&] {
    char buf[65536];
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
  });
  {
    mt::Heartbeat hb(mt::HeartbeatSettings{fds[1], 0.0}, 0);
    for (int i = 1; i <= 3000; ++i) {
      hb.step_done(i, 1.0, 0.001, 0.001, 1000.0, 0.5);
      if (i % 3 == 0) hb.event("probe", {{"i", i}});
      // Now and then the queue drains, and the writer, finding it empty, stamps ticks between producers' lines.
      if (i % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  ::close(fds[1]);
  reader.join();
  ::close(fds[0]);
  double prev = 0;
  size_t lines = 0, ticks = 0, out_of_order = 0;
  std::stringstream ss(text);
  for (std::string l; std::getline(ss, l);) {
    const auto j = nlohmann::json::parse(l);
    ++lines;
    ticks += j.value("at", "") == "tick";
    out_of_order += j["t"].get<double>() < prev;
    prev = j["t"].get<double>();
  }
  // (A writer that falls 1,024 lines behind drops the oldest, so the count of lines is not asserted.)
  EXPECT_GT(lines, ticks);
  EXPECT_GT(ticks, 0u) << "the test needs ticks among the producers' lines";
  EXPECT_EQ(out_of_order, 0u) << "of " << lines << " lines (" << ticks << " ticks)";
}

TEST(Heartbeat, GoOnWhileARankWaitsForAStoppedPeer) {
  prepare();
  const std::string out = fresh_dir("mt_hb_stopped_peer");
  mt::test::ScratchDir store;
  std::vector<std::string> args = small_flags(out + "/run");
  args.insert(args.end(),
              {"--train.steps=100000", "--parallel.dp=2", "--data.batch_size=2", "--parallel.timeout_s=120"});
  Rank r0 = start_rank(0, 2, store.path, args, out + "/log0");
  Rank r1 = start_rank(1, 2, store.path, args, out + "/log1");
  ASSERT_TRUE(poll_until(
      {&r0, &r1}, [&] { return last_step(r0) >= 2 && last_step(r1) >= 2; }, 120))
      << slurp(out + "/log0") << slurp(out + "/log1");

  ::kill(r1.pid, SIGSTOP);
  const double stopped_at = mt::unix_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // lines written before the stop arrive
  r1.drain();
  const size_t r1_lines = r1.lines.size();
  const size_t r0_lines = r0.lines.size();
  // Rank 0 finishes what it can and blocks in a collective that rank 1 never enters: its heartbeats go on.
  ASSERT_TRUE(poll_until(
      {&r0},
      [&] {
        const auto hb = r0.hb();
        if (hb.size() < r0_lines + 10) return false;
        for (const auto& c : hb.back()["colls"])
          if (c.contains("wait_s") && c["wait_s"].get<double>() > 1.0) return true;
        return false;
      },
      60))
      << r0.hb().back().dump();
  const auto hb0 = r0.hb();
  const nlohmann::json& last = hb0.back();
  EXPECT_EQ(last["at"], "tick");
  EXPECT_EQ(last["coord"], nlohmann::json({0, 0, 0}));
  const int frozen = last["step"].get<int>();
  // The op in flight: a collective of a group holding rank 1, started (rank 0 is inside it), its wait growing.
  nlohmann::json waiting;
  for (const auto& c : last["colls"])
    if (c.contains("wait_s") && c["wait_s"].get<double>() > 1.0) waiting = c;
  ASSERT_FALSE(waiting.is_null()) << last.dump();
  EXPECT_EQ(waiting["state"], "started") << last.dump();
  EXPECT_TRUE(has(waiting["group"].get<std::string>(), "0-1") || has(waiting["group"].get<std::string>(), "0,1"))
      << last.dump();
  EXPECT_GE(waiting["seq"].get<int>(), 0);
  // The stopped rank sent nothing since.
  r1.drain();
  EXPECT_EQ(r1.lines.size(), r1_lines);
  for (const auto& l : r1.lines) EXPECT_LT(l["t"].get<double>(), stopped_at + 0.5) << l.dump();

  // Resumed, both train on past the frozen step.
  ::kill(r1.pid, SIGCONT);
  EXPECT_TRUE(poll_until(
      {&r0, &r1}, [&] { return last_step(r0) > frozen + 1 && last_step(r1) > frozen + 1; }, 120))
      << slurp(out + "/log0") << slurp(out + "/log1");
  r0.kill_now();
  r1.kill_now();
}

}  // namespace
