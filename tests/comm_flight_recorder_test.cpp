// The flight recorder (comm/flight_recorder.h) over real Gloo groups, one forked process per rank:
//  * a known sequence of collectives and transfers gets the sequence numbers and states the header promises, the
//    same on every member (collectives per group; send/recv per direction and peer);
//  * while one member has not entered a collective, the others show it started with seq k and the absent one
//    shows seq k-1 done and nothing pending; a member held in the enter hook (how a hang is injected) shows seq k
//    posted, never started;
//  * the record is bounded, and its JSON form carries what a hang report needs.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "support/comm_fork_util.h"
#include "support/files.h"
#include "megatrain/comm/flight_recorder.h"
#include "megatrain/comm/process_group.h"
#include "megatrain/comm/store.h"
#include "megatrain/core/error.h"

using namespace mt;
using comm_test::run_procs;
using mt::test::ScratchDir;

namespace {

// This process's record of the group named `name`.
GroupFlight flight_of(const std::string& name) {
  for (const GroupFlight& g : flight_recorder().snapshot())
    if (g.group == name) return g;
  fail("no open group named {} in the flight recorder", name);
}

std::string describe(const FlightEntry& e) {
  return fmt::format("{} #{} {}{}", e.op, e.seq, op_state_name(e.state),
                     e.p2p() ? fmt::format(" peer {}", e.peer) : "");
}
std::string describe(const std::optional<FlightEntry>& e) { return e ? describe(*e) : "none"; }

void expect_entry(const std::optional<FlightEntry>& e, const std::string& want, const std::string& what) {
  MT_CHECK(describe(e) == want, "{}: {} (expected {})", what, describe(e), want);
}

// Polls until pred() holds (a hang guard of 30 s: the states change within milliseconds).
template <typename P>
void wait_until(P pred, const std::string& what) {
  for (int i = 0; i < 3000; ++i) {
    if (pred()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  fail("timed out waiting until {}", what);
}

TEST(FlightRecorder, AKnownSequenceHasTheSameNumbersOnEveryMember) {
  ScratchDir dir;
  const std::string report = run_procs(2, [&](int rank) {
    auto store = make_file_store(dir.path);
    auto g = make_gloo_group(*store, "dp[0-1]", {0, 1}, rank);
    std::vector<float> a(4, 1.0f), gathered(8), scattered(2), big(4, 2.0f);
    expect_entry(flight_of("dp[0-1]").last, "none", "before any op");
    g->allreduce(f32_view(a.data(), {4}))->wait();
    g->all_gather(f32_view(gathered.data(), {8}), f32_view(a.data(), {4}))->wait();
    g->reduce_scatter(f32_view(scattered.data(), {2}), f32_view(big.data(), {4}))->wait();
    g->broadcast(f32_view(a.data(), {4}), 1)->wait();
    g->barrier()->wait();
    // Three transfers 0 -> 1 and one 1 -> 0: counted per direction and peer, apart from the collectives.
    for (int i = 0; i < 3; ++i) {
      if (rank == 0)
        g->send(f32_view(a.data(), {4}), 1, i)->wait();
      else
        g->recv(f32_view(a.data(), {4}), 0, i)->wait();
    }
    if (rank == 1)
      g->send(f32_view(a.data(), {4}), 0, 7)->wait();
    else
      g->recv(f32_view(a.data(), {4}), 1, 7)->wait();
    g->allreduce(f32_view(a.data(), {4}))->wait();

    const GroupFlight f = flight_of("dp[0-1]");
    MT_CHECK(f.rank == rank && f.ranks == std::vector<int>({0, 1}), "group rank {}, {} members", f.rank,
             f.ranks.size());
    MT_CHECK(f.collectives == 6, "{} collectives recorded, expected 6", f.collectives);
    expect_entry(f.last, "allreduce #5 done", "last");
    expect_entry(f.oldest_pending, "none", "oldest pending");
    const std::string peer = std::to_string(1 - rank);
    const std::string out = rank == 0 ? "send" : "recv", in = rank == 0 ? "recv" : "send";
    const std::vector<std::string> want = {"allreduce #0 done",
                                           "all_gather #1 done",
                                           "reduce_scatter #2 done",
                                           "broadcast #3 done",
                                           "barrier #4 done",
                                           out + " #0 done peer " + peer,
                                           out + " #1 done peer " + peer,
                                           out + " #2 done peer " + peer,
                                           in + " #0 done peer " + peer,
                                           "allreduce #5 done"};
    std::vector<std::string> got;
    for (const FlightEntry& e : flight_recorder().entries("dp[0-1]")) {
      got.push_back(describe(e));
      MT_CHECK(e.t_posted > 1e9 && e.t_started >= e.t_posted && e.t_ended >= e.t_started,
               "{}: timestamps posted {} started {} ended {}", describe(e), e.t_posted, e.t_started, e.t_ended);
    }
    MT_CHECK(got == want, "entries: {}", fmt::join(got, ", "));
    const nlohmann::json j = flight_recorder().json();
    MT_CHECK(j["groups"].size() == 1 && j["groups"][0]["group"] == "dp[0-1]" && j["groups"][0]["collectives"] == 6 &&
                 j["groups"][0]["ranks"] == nlohmann::json({0, 1}) && j["groups"][0]["rank"] == rank &&
                 j["groups"][0]["last"]["op"] == "allreduce" && j["groups"][0]["last"]["seq"] == 5 &&
                 j["groups"][0]["last"]["state"] == "done" && j["groups"][0]["oldest_pending"].is_null(),
             "json: {}", j.dump());
    g.reset();
    MT_CHECK(flight_recorder().snapshot().empty(), "a destroyed group stays in the recorder");
  });
  EXPECT_EQ(report, "");
}

// Three ranks; rank 2 enters collective #1 only after ranks 0 and 1 have seen themselves waiting in it.
TEST(FlightRecorder, AMemberThatHasNotEnteredShowsTheCollectiveBeforeIt) {
  ScratchDir dir;
  const std::string report = run_procs(3, [&](int rank) {
    auto store = make_file_store(dir.path);
    auto g = make_gloo_group(*store, "tp[0-2]", {0, 1, 2}, rank);
    std::vector<float> a(3, 1.0f);
    g->allreduce(f32_view(a.data(), {3}))->wait();  // #0, everyone
    if (rank < 2) {
      WorkPtr w = g->allreduce(f32_view(a.data(), {3}));  // #1: blocks in Gloo until rank 2 comes
      wait_until([] { return describe(flight_of("tp[0-2]").oldest_pending) == "allreduce #1 started"; },
                 "allreduce #1 shows started");
      const GroupFlight f = flight_of("tp[0-2]");
      expect_entry(f.last, "allreduce #1 started", "the waiting member's last");
      MT_CHECK(!w->done(), "allreduce #1 completed without rank 2");
      store->set(fmt::format("waiting/{}", rank), nlohmann::json(to_json(f)).dump());
      w->wait();
    } else {
      store->wait({"waiting/0", "waiting/1"}, Millis(30000));
      // What each side reports, as the JSON a hang report would read.
      for (int r : {0, 1}) {
        auto j = nlohmann::json::parse(store->get(fmt::format("waiting/{}", r), Millis(1000)));
        MT_CHECK(j["oldest_pending"]["seq"] == 1 && j["oldest_pending"]["state"] == "started" &&
                     j["oldest_pending"]["op"] == "allreduce" && j["oldest_pending"].contains("t_started"),
                 "rank {} reported {}", r, j.dump());
      }
      const GroupFlight f = flight_of("tp[0-2]");
      expect_entry(f.last, "allreduce #0 done", "the absent member's last");
      expect_entry(f.oldest_pending, "none", "the absent member's pending");
      MT_CHECK(f.collectives == 1, "the absent member has posted {} collectives", f.collectives);
      g->allreduce(f32_view(a.data(), {3}))->wait();
    }
    expect_entry(flight_of("tp[0-2]").last, "allreduce #1 done", "after all entered");
    MT_CHECK(a[0] == 9.0f, "allreduce result {}", a[0]);  // 3 after #0, 9 after #1
  });
  EXPECT_EQ(report, "");
}

// Rank 1 is held in the enter hook at collective #1 (the hang fault's place): it shows #1 posted, never started,
// while rank 0 shows #1 started; released, both complete.
TEST(FlightRecorder, AMemberHeldInTheEnterHookShowsThePostedCollective) {
  ScratchDir dir;
  const std::string report = run_procs(2, [&](int rank) {
    auto store = make_file_store(dir.path);
    auto g = make_gloo_group(*store, "pp[0-1]", {0, 1}, rank);
    std::atomic<bool> held{false}, release{false};
    std::string hook_saw;
    if (rank == 1) {
      flight_recorder().set_enter_hook([&](const std::string& group, const FlightEntry& e) {
        if (e.seq != 1 || e.p2p()) return;
        hook_saw = group + " " + describe(e);
        held = true;
        while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      });
    }
    std::vector<float> a(2, 1.0f);
    g->barrier()->wait();
    WorkPtr w = g->allreduce(f32_view(a.data(), {2}));
    if (rank == 1) {
      wait_until([&] { return held.load(); }, "the hook holds #1");
      expect_entry(flight_of("pp[0-1]").oldest_pending, "allreduce #1 posted", "held member");
      store->wait({"started/0"}, Millis(30000));
      release = true;
    } else {
      wait_until([] { return describe(flight_of("pp[0-1]").oldest_pending) == "allreduce #1 started"; },
                 "rank 0 waits in #1");
      store->set("started/0", "1");
    }
    w->wait();
    expect_entry(flight_of("pp[0-1]").last, "allreduce #1 done", "after release");
    if (rank == 1) {
      MT_CHECK(hook_saw == "pp[0-1] allreduce #1 posted", "the hook saw '{}'", hook_saw);
      flight_recorder().set_enter_hook(nullptr);
    }
  });
  EXPECT_EQ(report, "");
}

// A device op (an NCCL collective: the host moves on as soon as it is queued) takes its state from its probe
// whenever the record is read: posted, started, then done, after which the probe is no longer asked.
TEST(FlightRecorder, ADeviceOpTakesItsStateFromItsProbe) {
  GroupRecord g("dp[0,1]", {0, 1}, 0);
  OpState device = OpState::Posted;
  int asked = 0;
  const uint64_t id = g.post_collective("allreduce");
  g.track(id, [&] {
    ++asked;
    return device;
  });
  GroupFlight f = g.flight();
  ASSERT_TRUE(f.oldest_pending);
  EXPECT_EQ(f.oldest_pending->state, OpState::Posted);
  EXPECT_EQ(f.oldest_pending->t_started, 0);
  device = OpState::Started;
  f = g.flight();
  ASSERT_TRUE(f.oldest_pending);
  EXPECT_EQ(f.oldest_pending->state, OpState::Started);
  EXPECT_GT(f.oldest_pending->t_started, 0);
  device = OpState::Done;
  f = g.flight();
  EXPECT_FALSE(f.oldest_pending);
  ASSERT_TRUE(f.last);
  EXPECT_EQ(f.last->state, OpState::Done);
  EXPECT_GE(f.last->t_ended, f.last->t_started);
  const int asked_before = asked;
  g.flight();
  EXPECT_EQ(asked, asked_before) << "a completed op's probe is asked again";
  // The next collective fails on the device; the first stays done.
  g.track(g.post_collective("all_gather"), [] { return OpState::Failed; });
  const std::vector<FlightEntry> es = g.entries();
  ASSERT_EQ(es.size(), 2u);
  EXPECT_EQ(es[0].state, OpState::Done);
  EXPECT_EQ(es[1].state, OpState::Failed);
  EXPECT_EQ(es[1].seq, 1);
  EXPECT_FALSE(es[1].error.empty());
  // Without readers (no heartbeats) each new op's post retires the completed ones before it, so the record and the
  // probes' CUDA events stay bounded.
  GroupRecord h("tp[0,1]", {0, 1}, 0);
  int retired = 0;
  for (int i = 0; i < 1000; ++i)
    h.track(h.post_collective("allreduce"), [&] {
      ++retired;
      return OpState::Done;
    });
  EXPECT_EQ(retired, 999) << "the posts did not ask the earlier ops' probes";
  EXPECT_LE(h.entries().size(), GroupRecord::kDoneKept);
  EXPECT_EQ(retired, 1000);
}

TEST(FlightRecorder, KeepsTheNewestCompletedEntriesAndEveryPendingOne) {
  ScratchDir dir;
  const std::string report = run_procs(1, [&](int) {
    auto store = make_file_store(dir.path);
    auto g = make_gloo_group(*store, "dp[0]", {0}, 0);
    std::vector<float> a(1, 1.0f);
    const int n = 3 * static_cast<int>(GroupRecord::kDoneKept);
    for (int i = 0; i < n; ++i) g->allreduce(f32_view(a.data(), {1}))->wait();
    auto all = flight_recorder().entries("dp[0]");
    MT_CHECK(all.size() == GroupRecord::kDoneKept, "{} entries kept", all.size());
    MT_CHECK(all.front().seq == n - static_cast<int>(GroupRecord::kDoneKept) && all.back().seq == n - 1,
             "kept seqs {}..{}", all.front().seq, all.back().seq);

    // A record of its own, driven by hand: one entry never completes while many after it do; it is kept.
    auto rec = flight_recorder().open("manual", {0}, 0);
    const uint64_t stuck = rec->post_collective("broadcast");
    rec->enter(stuck);
    for (int i = 0; i < n; ++i) {
      const uint64_t id = rec->post_collective("allreduce");
      rec->enter(id);
      rec->finish(id);
    }
    const std::string err = "boom";
    const uint64_t failed = rec->post_p2p("recv", 3);
    rec->finish(failed, &err);
    const GroupFlight f = rec->flight();
    expect_entry(f.oldest_pending, "broadcast #0 started", "the stuck entry");
    expect_entry(f.last, "recv #0 failed peer 3", "newest");
    MT_CHECK(f.last->error == "boom", "error '{}'", f.last->error);
    MT_CHECK(rec->entries().size() == GroupRecord::kDoneKept + 1, "{} entries", rec->entries().size());
    flight_recorder().close(rec);
  });
  EXPECT_EQ(report, "");
}

}  // namespace
