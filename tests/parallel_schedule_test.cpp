// Pipeline schedules against independent checks:
//  * structure, checked here from the action lists alone: every (microbatch, virtual stage) forwarded and
//    backwarded exactly once, on the rank that owns the stage, forward first; every send has exactly one
//    receive (same message, right peers), every post exactly one later wait, waits before the compute that
//    consumes the data and sends after the compute that makes it;
//  * timing, from the simulator, against closed forms: 1F1B makespan (m + pp - 1)(tf + tb), interleaved
//    (v m + pp - 1)(tf + tb) per-chunk (the bubble shrinks by v), a one-microbatch chain with latency;
//  * activation memory: peak in-flight microbatches per rank;
//  * the simulator itself: deadlocks and broken dependencies are reported, naming rank and action;
//  * bad arguments refused with messages naming the setting.
#include <gtest/gtest.h>

#include "support/test_util.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "megatrain/core/error.h"
#include "megatrain/parallel/schedule.h"

using namespace mt;
using K = ActionKind;

namespace {

bool fwd_dir(K k) {
  return k == K::PostRecvForward || k == K::WaitRecvForward || k == K::Forward || k == K::PostSendForward ||
         k == K::WaitSendForward;
}
bool compute(K k) { return k == K::Forward || k == K::Backward; }
bool recv_kind(K k) {
  return k == K::PostRecvForward || k == K::WaitRecvForward || k == K::PostRecvBackward || k == K::WaitRecvBackward;
}
bool post_kind(K k) {
  return k == K::PostRecvForward || k == K::PostSendForward || k == K::PostRecvBackward || k == K::PostSendBackward;
}

// (direction 0 = activation / 1 = gradient, microbatch, from stage, to stage)
using Msg = std::tuple<int, int, int, int>;

// Structural checks derived from the definition (stage = chunk * pp + rank), not from the simulator.
void check_structure(const Schedule& s) {
  SCOPED_TRACE(::testing::Message() << "pp=" << s.pp << " v=" << s.virtual_stages << " m=" << s.microbatches);
  const int pp = s.pp, v = s.virtual_stages, m = s.microbatches, S = pp * v;
  ASSERT_EQ((int)s.per_rank.size(), pp);
  std::map<Msg, int> sends, recvs;
  for (int r = 0; r < pp; ++r) {
    const auto& acts = s.per_rank[r];
    std::map<std::tuple<bool, int, int>, int> computed_at;  // (fwd, mb, chunk) -> index
    std::map<std::tuple<K, int, int>, int> posted;          // post kind -> index, until waited
    for (int i = 0; i < (int)acts.size(); ++i) {
      const Action& a = acts[i];
      ASSERT_GE(a.microbatch, 0);
      ASSERT_LT(a.microbatch, m);
      ASSERT_GE(a.chunk, 0);
      ASSERT_LT(a.chunk, v);
      const int stage = a.chunk * pp + r;
      const bool fwd = fwd_dir(a.kind);
      if (compute(a.kind)) {
        EXPECT_EQ(a.peer, -1);
        auto key = std::make_tuple(fwd, a.microbatch, a.chunk);
        EXPECT_EQ(computed_at.count(key), 0u) << "rank " << r << " repeats " << to_string(a, v);
        computed_at[key] = i;
        if (!fwd) {
          EXPECT_TRUE(computed_at.count({true, a.microbatch, a.chunk})) << "backward before forward";
        }
        // Its input arrived: the wait for the matching receive is done (posted -> erased below).
        int src = fwd ? stage - 1 : stage + 1;
        if (src >= 0 && src < S && src % pp != r) {
          K post = fwd ? K::PostRecvForward : K::PostRecvBackward;
          EXPECT_EQ(posted.count({post, a.microbatch, a.chunk}), 0u) << "receive not waited before " << to_string(a, v);
          EXPECT_EQ(recvs.count({fwd ? 0 : 1, a.microbatch, src, stage}), 1u)
              << "rank " << r << " computes " << to_string(a, v) << " without receiving its input";
        }
        continue;
      }
      const bool recv = recv_kind(a.kind);
      const int other = (fwd != recv) ? stage + 1 : stage - 1;
      ASSERT_TRUE(other >= 0 && other < S) << "message past the pipeline ends: " << to_string(a, v);
      EXPECT_EQ(a.peer, other % pp) << "rank " << r << " " << to_string(a, v);
      EXPECT_NE(a.peer, r);
      if (post_kind(a.kind)) {
        auto key = std::make_tuple(a.kind, a.microbatch, a.chunk);
        EXPECT_EQ(posted.count(key), 0u) << "posted twice: " << to_string(a, v);
        posted[key] = i;
        Msg msg = recv ? Msg{fwd ? 0 : 1, a.microbatch, other, stage} : Msg{fwd ? 0 : 1, a.microbatch, stage, other};
        ++(recv ? recvs : sends)[msg];
        if (!recv) {
          EXPECT_TRUE(computed_at.count({fwd, a.microbatch, a.chunk})) << "sent before computed";
        }
        EXPECT_EQ(p2p_tag(s, r, a), (fwd ? 0 : 1) * m * S + a.microbatch * S + (recv ? stage : other));
      } else {
        K post = fwd ? (recv ? K::PostRecvForward : K::PostSendForward)
                     : (recv ? K::PostRecvBackward : K::PostSendBackward);
        EXPECT_EQ(posted.erase({post, a.microbatch, a.chunk}), 1u) << "wait without post: " << to_string(a, v);
      }
    }
    EXPECT_TRUE(posted.empty()) << "rank " << r << " leaves " << posted.size() << " posts unwaited";
    for (int c = 0; c < v; ++c)
      for (int mb = 0; mb < m; ++mb) {
        EXPECT_TRUE(computed_at.count({true, mb, c})) << "rank " << r << " never forwards mb " << mb << " chunk " << c;
        EXPECT_TRUE(computed_at.count({false, mb, c}))
            << "rank " << r << " never backwards mb " << mb << " chunk " << c;
      }
  }
  // One-to-one: every message between different ranks is sent once and received once.
  std::map<Msg, int> expected;
  for (int st = 0; st + 1 < S; ++st)
    for (int mb = 0; mb < m; ++mb)
      if (st % pp != (st + 1) % pp) {
        expected[{0, mb, st, st + 1}] = 1;
        expected[{1, mb, st + 1, st}] = 1;
      }
  EXPECT_EQ(sends, expected);
  EXPECT_EQ(recvs, expected);
}

std::string compute_line(const Schedule& s, int rank) {
  std::string out;
  for (const Action& a : s.per_rank[rank])
    if (compute(a.kind)) {
      if (!out.empty()) out += ' ';
      out += to_string(a, s.virtual_stages);
    }
  return out;
}

using mt::test::error_of;

}  // namespace

TEST(PipelineSchedule, OneF1BKnownOrderForTwoStages) {
  Schedule s = make_1f1b(2, 4);
  EXPECT_EQ(compute_line(s, 0), "F0 F1 B0 F2 B1 F3 B2 B3");
  EXPECT_EQ(compute_line(s, 1), "F0 B0 F1 B1 F2 B2 F3 B3");
  EXPECT_EQ(
      to_string(s),
      "rank 0: F0 sF0 rB0 F1 sF1 rB1 wrB0 wsF0 B0 F2 sF2 rB2 wrB1 wsF1 B1 F3 sF3 rB3 wrB2 wsF2 B2 wrB3 wsF3 B3\n"
      "rank 1: rF0 wrF0 F0 rF1 B0 sB0 wrF1 F1 rF2 B1 sB1 wrF2 F2 rF3 wsB0 B2 sB2 wrF3 F3 wsB1 B3 sB3 wsB2 wsB3\n");
  EXPECT_EQ(to_string(s, true), "rank 0: F0 F1 B0 F2 B1 F3 B2 B3\nrank 1: F0 B0 F1 B1 F2 B2 F3 B3\n");
}

// Megatron's interleaved order worked out by hand for pp=2, v=2, m=4: rank 0 warms up with 2(pp-1) + (v-1)pp = 4
// forwards, rank 1 with 2; microbatches go through a chunk in groups of pp.
TEST(PipelineSchedule, InterleavedKnownOrder) {
  Schedule s = make_interleaved_1f1b(2, 2, 4);
  EXPECT_EQ(compute_line(s, 0), "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(compute_line(s, 1), "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
}

TEST(PipelineSchedule, OneF1BStructureMakespanAndMemory) {
  for (int pp = 1; pp <= 8; ++pp)
    for (int m = 1; m <= 20; ++m) {
      SCOPED_TRACE(::testing::Message() << "pp=" << pp << " m=" << m);
      Schedule s = make_1f1b(pp, m);
      check_structure(s);
      EXPECT_EQ(make_interleaved_1f1b(pp, 1, m).per_rank, s.per_rank);
      for (double tb : {1.0, 2.0}) {
        SimResult r = simulate(s, 1.0, tb, 0.0);
        EXPECT_DOUBLE_EQ(r.makespan, (m + pp - 1) * (1.0 + tb));
        for (int k = 0; k < pp; ++k) {
          EXPECT_DOUBLE_EQ(r.busy[k], m * (1.0 + tb));
          EXPECT_DOUBLE_EQ(r.idle[k], (pp - 1) * (1.0 + tb));
          EXPECT_EQ(r.send_stall[k], 0.0);
        }
        EXPECT_NEAR(r.bubble_fraction, double(pp - 1) / (m + pp - 1), 1e-12);
      }
      // Activation memory: rank k holds at most pp - k microbatches (the first stage the most).
      SimResult r = simulate(s, 1, 1, 0);
      for (int k = 0; k < pp; ++k) EXPECT_EQ(r.peak_in_flight[k], std::min(pp - k, m));
    }
}

TEST(PipelineSchedule, InterleavedStructureMakespanAndMemory) {
  for (int pp = 2; pp <= 6; ++pp)
    for (int v = 2; v <= 4; ++v)
      for (int m = pp; m <= 4 * pp; m += pp) {
        SCOPED_TRACE(::testing::Message() << "pp=" << pp << " v=" << v << " m=" << m);
        Schedule s = make_interleaved_1f1b(pp, v, m);
        check_structure(s);
        // Per-chunk times tf, tb: a rank computes v m (tf + tb); the bubble is (pp - 1)(tf + tb), i.e. 1/v of
        // 1F1B's bubble for the same model split into pp stages of v chunks each.
        for (double tb : {1.0, 2.0, 0.5}) {
          SimResult r = simulate(s, 1.0, tb, 0.0);
          EXPECT_DOUBLE_EQ(r.makespan, v * m * (1.0 + tb) + (pp - 1) * (1.0 + tb));
          EXPECT_NEAR(r.bubble_fraction, double(pp - 1) / (v * m + pp - 1), 1e-12);
          SimResult one = simulate(make_1f1b(pp, m), v * 1.0, v * tb, 0.0);
          EXPECT_NEAR((one.makespan - m * v * (1.0 + tb)) / (r.makespan - m * v * (1.0 + tb)), v, 1e-9);
        }
        // Activation memory, in chunk-microbatches: rank k holds its warm-up 2(pp-1-k) + (v-1)pp plus one.
        // In whole-stage units that is at most ((v+1)pp - 1)/v < pp (1 + 1/v) on the first rank.
        SimResult r = simulate(s, 1, 1, 0);
        for (int k = 0; k < pp; ++k) {
          EXPECT_EQ(r.peak_in_flight[k], std::min(2 * (pp - 1 - k) + (v - 1) * pp + 1, v * m));
          EXPECT_LE(r.peak_in_flight[k], (v + 1) * pp - 1);
        }
      }
}

// Decoupled communication: with latency up to one compute, no send ever delays a compute (a gradient's
// receive is posted before it can be sent; send buffers are double-buffered), every schedule still runs, and
// posting receives one compute early beats posting them right before the wait.
TEST(PipelineSchedule, CommunicationOverlapsCompute) {
  for (int pp = 2; pp <= 5; ++pp)
    for (int v = 1; v <= 3; ++v)
      for (int m = pp; m <= 3 * pp; m += pp)
        for (double c : {0.25, 0.5, 1.0}) {
          SCOPED_TRACE(::testing::Message() << "pp=" << pp << " v=" << v << " m=" << m << " comm=" << c);
          Schedule s = make_interleaved_1f1b(pp, v, m);
          SimResult early = simulate(s, 1.0, 2.0, c);
          for (double st : early.send_stall) EXPECT_EQ(st, 0.0);
          EXPECT_GE(early.makespan, (v * m + pp - 1) * 3.0);

          Schedule late = s;  // every receive posted just before its wait
          for (auto& acts : late.per_rank) {
            std::vector<Action> out;
            for (const Action& a : acts) {
              if (a.kind == K::PostRecvForward || a.kind == K::PostRecvBackward) continue;
              if (a.kind == K::WaitRecvForward || a.kind == K::WaitRecvBackward)
                out.push_back({a.kind == K::WaitRecvForward ? K::PostRecvForward : K::PostRecvBackward, a.microbatch,
                               a.chunk, a.peer});
              out.push_back(a);
            }
            acts = out;
          }
          check_structure(late);
          EXPECT_LT(early.makespan, simulate(late, 1.0, 2.0, c).makespan);
        }
}

// One microbatch is a pure chain: pp forwards, pp backwards and 2(pp-1) transfers.
TEST(PipelineSchedule, SingleMicrobatchLatencyChain) {
  for (int pp = 1; pp <= 6; ++pp) {
    SimResult r = simulate(make_1f1b(pp, 1), 1.0, 2.0, 0.5);
    EXPECT_DOUBLE_EQ(r.makespan, pp * 3.0 + 2 * (pp - 1) * 0.5) << "pp=" << pp;
    // The timeline: stage k's forward starts after k forwards and k transfers.
    for (int k = 0; k < pp; ++k) EXPECT_DOUBLE_EQ(r.timeline[k].front().start, k * 1.5);
  }
}

TEST(PipelineSchedule, SimulatorReportsDeadlock) {
  // Rank 0 waits for microbatch 0's gradient before running its forward: neither rank can move.
  Schedule s{2, 1, 1, {}};
  s.per_rank = {{{K::PostRecvBackward, 0, 0, 1},
                 {K::WaitRecvBackward, 0, 0, 1},
                 {K::Forward, 0, 0},
                 {K::PostSendForward, 0, 0, 1},
                 {K::WaitSendForward, 0, 0, 1},
                 {K::Backward, 0, 0}},
                {{K::PostRecvForward, 0, 0, 0},
                 {K::WaitRecvForward, 0, 0, 0},
                 {K::Forward, 0, 0},
                 {K::Backward, 0, 0},
                 {K::PostSendBackward, 0, 0, 0},
                 {K::WaitSendBackward, 0, 0, 0}}};
  std::string e = error_of([&] { simulate(s, 1, 1, 0); });
  EXPECT_NE(e.find("deadlock"), std::string::npos) << e;
  EXPECT_NE(e.find("rank 0 action #1 wrB0"), std::string::npos) << e;
  EXPECT_NE(e.find("rank 1 action #1 wrF0"), std::string::npos) << e;

  // A send whose receive is never posted: the sender blocks forever while the peer finishes.
  Schedule t = make_1f1b(2, 1);
  auto& r1 = t.per_rank[1];
  r1.erase(std::remove_if(r1.begin(), r1.end(),
                          [](const Action& a) {
                            return a.kind == K::PostSendBackward || a.kind == K::WaitSendBackward;
                          }),
           r1.end());
  e = error_of([&] { simulate(t, 1, 1, 0); });
  EXPECT_NE(e.find("deadlock"), std::string::npos) << e;
  EXPECT_NE(e.find("wrB0"), std::string::npos) << e;
  EXPECT_NE(e.find("rank 1 finished"), std::string::npos) << e;
}

TEST(PipelineSchedule, SimulatorRejectsBrokenDependencies) {
  auto broken = [](auto edit) {
    Schedule s = make_1f1b(2, 2);
    edit(s);
    return error_of([&] { simulate(s, 1, 1, 0); });
  };
  auto find = [](std::vector<Action>& acts, K k, int mb) {
    return std::find_if(acts.begin(), acts.end(), [&](const Action& a) { return a.kind == k && a.microbatch == mb; });
  };
  // Last stage runs B0 before F0.
  std::string e = broken([&](Schedule& s) {
    std::iter_swap(find(s.per_rank[1], K::Forward, 0), find(s.per_rank[1], K::Backward, 0));
  });
  EXPECT_NE(e.find("backward before its own forward"), std::string::npos) << e;
  EXPECT_NE(e.find("rank 1"), std::string::npos) << e;
  // Rank 1 computes F0 before waiting for the activation.
  e = broken([&](Schedule& s) {
    std::iter_swap(find(s.per_rank[1], K::WaitRecvForward, 0), find(s.per_rank[1], K::Forward, 0));
  });
  EXPECT_NE(e.find("was not received"), std::string::npos) << e;
  // Rank 0 sends F1's output before computing it.
  e = broken([&](Schedule& s) {
    std::iter_swap(find(s.per_rank[0], K::PostSendForward, 1), find(s.per_rank[0], K::Forward, 1));
  });
  EXPECT_NE(e.find("not computed yet"), std::string::npos) << e;
  // Wrong peer.
  e = broken([&](Schedule& s) { find(s.per_rank[0], K::PostSendForward, 0)->peer = 0; });
  EXPECT_NE(e.find("peer should be rank 1"), std::string::npos) << e;
  // A receive posted twice, and a wait without its post.
  e = broken([&](Schedule& s) {
    auto& a = s.per_rank[1];
    a.insert(a.begin(), a.front());
  });
  EXPECT_NE(e.find("receive posted twice"), std::string::npos) << e;
  e = broken([&](Schedule& s) { s.per_rank[1].erase(find(s.per_rank[1], K::PostRecvForward, 0)); });
  EXPECT_NE(e.find("never posted"), std::string::npos) << e;
  // A microbatch dropped on one rank (no messages involved with pp = 1).
  Schedule one = make_1f1b(1, 2);
  one.per_rank[0].pop_back();
  e = error_of([&] { simulate(one, 1, 1, 0); });
  EXPECT_NE(e.find("microbatch 1 never runs backward at virtual stage 0"), std::string::npos) << e;
  // A forward run twice.
  one = make_1f1b(1, 2);
  one.per_rank[0].insert(one.per_rank[0].begin(), one.per_rank[0].front());
  e = error_of([&] { simulate(one, 1, 1, 0); });
  EXPECT_NE(e.find("runs a second time"), std::string::npos) << e;
}

TEST(PipelineSchedule, BadArgumentsRefused) {
  std::string e = error_of([] { make_interleaved_1f1b(4, 2, 6); });
  EXPECT_NE(e.find("parallel.microbatches"), std::string::npos) << e;
  EXPECT_NE(e.find("parallel.pp"), std::string::npos) << e;
  EXPECT_NE(error_of([] { make_1f1b(0, 4); }).find("parallel.pp"), std::string::npos);
  EXPECT_NE(error_of([] { make_1f1b(2, 0); }).find("parallel.microbatches"), std::string::npos);
  EXPECT_NE(error_of([] { make_interleaved_1f1b(2, 0, 4); }).find("parallel.virtual_stages"), std::string::npos);
  EXPECT_NE(error_of([] { make_interleaved_1f1b(1, 2, 4); }).find("parallel.pp >= 2"), std::string::npos);
  EXPECT_NE(error_of([] { make_interleaved_1f1b(2, 2, 0); }).find("parallel.microbatches"), std::string::npos);
  Schedule s = make_1f1b(2, 2);
  EXPECT_NE(error_of([&] { simulate(s, -1, 1, 0); }).find("times must be >= 0"), std::string::npos);
  s.per_rank.pop_back();
  EXPECT_NE(error_of([&] { simulate(s, 1, 1, 0); }).find("1 action lists for pp = 2"), std::string::npos);
  EXPECT_NE(error_of([] {
              p2p_tag(make_1f1b(2, 1), 0, Action{K::Forward, 0, 0});
            }).find("compute action"),
            std::string::npos);
}
