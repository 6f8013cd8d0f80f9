#include "megatrain/parallel/schedule.h"

#include <algorithm>
#include <unordered_map>

#include "megatrain/core/error.h"

namespace mt {

namespace {

using K = ActionKind;

struct Op {
  bool fwd;
  int mb, chunk;
};

bool is_forward_dir(K k) {
  return k == K::PostRecvForward || k == K::WaitRecvForward || k == K::Forward || k == K::PostSendForward ||
         k == K::WaitSendForward;
}
bool is_recv(K k) {
  return k == K::PostRecvForward || k == K::WaitRecvForward || k == K::PostRecvBackward || k == K::WaitRecvBackward;
}
bool is_post(K k) {
  return k == K::PostRecvForward || k == K::PostSendForward || k == K::PostRecvBackward || k == K::PostSendBackward;
}
bool is_compute(K k) { return k == K::Forward || k == K::Backward; }

// The stage at the other end of a message that `stage` receives (recv) or sends (!recv) in direction fwd.
int neighbour_stage(int stage, bool fwd, bool recv) { return stage + ((fwd != recv) ? 1 : -1); }

// Megatron's interleaved order: microbatches go through each chunk in groups of pp (forward: chunks ascending,
// backward: descending), and rank r runs enough warm-up forwards that the first backward of the last stage
// arrives just as it is needed. With v == 1 this is plain 1F1B.
std::vector<Op> compute_order(int pp, int v, int m, int rank) {
  const int total = m * v;
  auto op = [&](int k, bool fwd) {
    int group = k / pp;
    int chunk = group % v;
    int mb = (k / (pp * v)) * pp + k % pp;
    return Op{fwd, mb, fwd ? chunk : v - 1 - chunk};
  };
  int warmup = v == 1 ? pp - rank - 1 : (pp - rank - 1) * 2 + (v - 1) * pp;
  warmup = std::min(warmup, total);
  std::vector<Op> ops;
  ops.reserve(2 * total);
  for (int k = 0; k < warmup; ++k) ops.push_back(op(k, true));
  for (int k = 0; k < total - warmup; ++k) {
    ops.push_back(op(warmup + k, true));
    ops.push_back(op(k, false));
  }
  for (int k = total - warmup; k < total; ++k) ops.push_back(op(k, false));
  return ops;
}

// Adds decoupled communication around one rank's compute order.
std::vector<Action> with_communication(const Schedule& s, int rank, const std::vector<Op>& ops) {
  const int S = s.stages();
  auto peer = [&](const Op& o, bool recv) {
    int other = neighbour_stage(s.stage_of(rank, o.chunk), o.fwd, recv);
    if (other < 0 || other >= S || s.rank_of(other) == rank) return -1;  // loss end, or a local hand-over
    return s.rank_of(other);
  };
  std::vector<Action> out;
  // Activations are received one compute ahead, so the transfer overlaps the compute before the one that
  // needs it. A gradient receive is posted as soon as the forward that will need it is done: the next stage
  // can then never send a gradient before its receive exists, so backward sends complete without waiting on
  // the peer's progress (a rendezvous send to a busy peer would stall the sender).
  auto post_activation_recv = [&](const Op& o) {
    if (int p = peer(o, true); p >= 0 && o.fwd) out.push_back({K::PostRecvForward, o.mb, o.chunk, p});
  };
  std::vector<Action> fwd_sends, bwd_sends;  // posted, not yet waited

  if (!ops.empty()) post_activation_recv(ops[0]);
  for (size_t k = 0; k < ops.size(); ++k) {
    const Op& o = ops[k];
    if (k + 1 < ops.size()) post_activation_recv(ops[k + 1]);
    if (int p = peer(o, true); p >= 0)
      out.push_back({o.fwd ? K::WaitRecvForward : K::WaitRecvBackward, o.mb, o.chunk, p});
    if (!o.fwd) {
      // This forward output reached the next stage before its gradient came back, so the wait is free; it
      // bounds the live activation send buffers by the in-flight microbatches.
      auto it = std::find_if(fwd_sends.begin(), fwd_sends.end(),
                             [&](const Action& a) { return a.microbatch == o.mb && a.chunk == o.chunk; });
      if (it != fwd_sends.end()) {
        out.push_back({K::WaitSendForward, it->microbatch, it->chunk, it->peer});
        fwd_sends.erase(it);
      }
      // Input gradients are double-buffered: before this backward writes a buffer, the send that used it two
      // backwards ago must be done; it has had one whole backward to complete.
      while (bwd_sends.size() >= 2) {
        const Action a = bwd_sends.front();
        out.push_back({K::WaitSendBackward, a.microbatch, a.chunk, a.peer});
        bwd_sends.erase(bwd_sends.begin());
      }
    }
    out.push_back({o.fwd ? K::Forward : K::Backward, o.mb, o.chunk, -1});
    if (int p = peer(o, false); p >= 0) {
      Action a{o.fwd ? K::PostSendForward : K::PostSendBackward, o.mb, o.chunk, p};
      out.push_back(a);
      (o.fwd ? fwd_sends : bwd_sends).push_back(a);
    }
    int grad_peer = o.fwd ? peer(Op{false, o.mb, o.chunk}, true) : -1;
    if (grad_peer >= 0) out.push_back({K::PostRecvBackward, o.mb, o.chunk, grad_peer});
  }
  for (const Action& a : fwd_sends) out.push_back({K::WaitSendForward, a.microbatch, a.chunk, a.peer});
  for (const Action& a : bwd_sends) out.push_back({K::WaitSendBackward, a.microbatch, a.chunk, a.peer});
  return out;
}

Schedule build(int pp, int v, int m) {
  Schedule s{pp, v, m, {}};
  for (int r = 0; r < pp; ++r) s.per_rank.push_back(with_communication(s, r, compute_order(pp, v, m, r)));
  return s;
}

}  // namespace

Schedule make_1f1b(int pp, int microbatches) {
  MT_CHECK(pp >= 1, "pipeline schedule: parallel.pp must be >= 1, got {}", pp);
  MT_CHECK(microbatches >= 1, "pipeline schedule: parallel.microbatches must be >= 1, got {}", microbatches);
  return build(pp, 1, microbatches);
}

Schedule make_interleaved_1f1b(int pp, int virtual_stages, int microbatches) {
  MT_CHECK(virtual_stages >= 1, "interleaved schedule: parallel.virtual_stages must be >= 1, got {}", virtual_stages);
  if (virtual_stages == 1) return make_1f1b(pp, microbatches);
  MT_CHECK(pp >= 2, "interleaved schedule: parallel.virtual_stages = {} needs parallel.pp >= 2, got {}", virtual_stages,
           pp);
  MT_CHECK(microbatches >= 1, "interleaved schedule: parallel.microbatches must be >= 1, got {}", microbatches);
  MT_CHECK(microbatches % pp == 0,
           "interleaved schedule: parallel.microbatches ({}) must be a multiple of parallel.pp ({})", microbatches, pp);
  return build(pp, virtual_stages, microbatches);
}

int p2p_tag(const Schedule& s, int rank, const Action& a) {
  MT_CHECK(!is_compute(a.kind), "p2p_tag: {} is a compute action, not a message", to_string(a.kind));
  bool fwd = is_forward_dir(a.kind);
  int stage = s.stage_of(rank, a.chunk);
  int dest = is_recv(a.kind) ? stage : neighbour_stage(stage, fwd, false);
  return ((fwd ? 0 : 1) * s.microbatches + a.microbatch) * s.stages() + dest;
}

std::string to_string(ActionKind k) {
  switch (k) {
    case K::PostRecvForward: return "PostRecvForward";
    case K::WaitRecvForward: return "WaitRecvForward";
    case K::Forward: return "Forward";
    case K::PostSendForward: return "PostSendForward";
    case K::WaitSendForward: return "WaitSendForward";
    case K::PostRecvBackward: return "PostRecvBackward";
    case K::WaitRecvBackward: return "WaitRecvBackward";
    case K::Backward: return "Backward";
    case K::PostSendBackward: return "PostSendBackward";
    case K::WaitSendBackward: return "WaitSendBackward";
  }
  return "?";
}

std::string to_string(const Action& a, int virtual_stages) {
  const char* prefix = "";
  switch (a.kind) {
    case K::PostRecvForward:
    case K::PostRecvBackward: prefix = "r"; break;
    case K::WaitRecvForward:
    case K::WaitRecvBackward: prefix = "wr"; break;
    case K::PostSendForward:
    case K::PostSendBackward: prefix = "s"; break;
    case K::WaitSendForward:
    case K::WaitSendBackward: prefix = "ws"; break;
    default: break;
  }
  std::string out = fmt::format("{}{}{}", prefix, is_forward_dir(a.kind) ? 'F' : 'B', a.microbatch);
  if (virtual_stages > 1) out += fmt::format(".{}", a.chunk);
  return out;
}

std::string to_string(const Schedule& s, bool compute_only) {
  std::string out;
  for (int r = 0; r < (int)s.per_rank.size(); ++r) {
    out += fmt::format("rank {}:", r);
    for (const Action& a : s.per_rank[r])
      if (!compute_only || is_compute(a.kind)) {
        out += ' ';
        out += to_string(a, s.virtual_stages);
      }
    out += "\n";
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------
// Simulator. Each rank's timeline depends only on when its partners post, never on the order in which the
// loop below visits ranks (messages are matched by tag, not by arrival), so running every rank as far as it
// can, round after round, gives the one true timeline, and no progress with work left is a real deadlock.

namespace {

struct Message {
  int sender = -1, receiver = -1;
  double send_post = -1, recv_post = -1;
  bool send_waited = false, recv_waited = false;
  bool both_posted() const { return send_post >= 0 && recv_post >= 0; }
};

class Simulator {
 public:
  Simulator(const Schedule& s, double tf, double tb, double tc) : s_(s), tf_(tf), tb_(tb), tc_(tc) {
    const int S = s.stages(), m = s.microbatches;
    fwd_end_.assign(S, std::vector<double>(m, -1));
    bwd_end_.assign(S, std::vector<double>(m, -1));
    pc_.assign(s.pp, 0);
    clock_.assign(s.pp, 0);
    in_flight_.assign(s.pp, 0);
    res_.busy.assign(s.pp, 0);
    res_.peak_in_flight.assign(s.pp, 0);
    res_.send_stall.assign(s.pp, 0);
    send_blocked_.assign(s.pp, 0);
    res_.timeline.resize(s.pp);
  }

  SimResult run() {
    for (bool progress = true; progress;) {
      progress = false;
      for (int r = 0; r < s_.pp; ++r)
        while (pc_[r] < s_.per_rank[r].size() && step(r)) {
          ++pc_[r];
          progress = true;
        }
    }
    report_deadlock();
    check_complete();
    res_.makespan = *std::max_element(clock_.begin(), clock_.end());
    double idle_sum = 0;
    for (int r = 0; r < s_.pp; ++r) {
      res_.idle.push_back(res_.makespan - res_.busy[r]);
      idle_sum += res_.idle.back();
    }
    res_.bubble_fraction = res_.makespan > 0 ? idle_sum / (s_.pp * res_.makespan) : 0;
    return res_;
  }

 private:
  std::string where(int r) const {
    const Action& a = s_.per_rank[r][pc_[r]];
    std::string peer = a.peer >= 0 ? fmt::format(" peer {}", a.peer) : "";
    return fmt::format("rank {} action #{} {} (microbatch {}, chunk {}{})", r, pc_[r], to_string(a, s_.virtual_stages),
                       a.microbatch, a.chunk, peer);
  }

  template <typename... Args>
  [[noreturn]] void bad(int r, fmt::format_string<Args...> f, Args&&... args) const {
    fail("pipeline schedule: {}: {}", where(r), fmt::format(f, std::forward<Args>(args)...));
  }

  // Returns false when the action must wait for another rank; throws when the schedule is wrong.
  bool step(int r) {
    const Action& a = s_.per_rank[r][pc_[r]];
    const int S = s_.stages();
    if (a.microbatch < 0 || a.microbatch >= s_.microbatches) bad(r, "microbatch out of range [0, {})", s_.microbatches);
    if (a.chunk < 0 || a.chunk >= s_.virtual_stages) bad(r, "chunk out of range [0, {})", s_.virtual_stages);
    const int stage = s_.stage_of(r, a.chunk), mb = a.microbatch;
    const bool fwd = is_forward_dir(a.kind);
    double& now = clock_[r];

    if (is_compute(a.kind)) {
      // The input (activation or output gradient) must be here: received, or made locally by the previous stage.
      int src = neighbour_stage(stage, fwd, true);
      bool from_loss = !fwd && src == S;
      if (fwd ? fwd_end_[stage][mb] >= 0 : bwd_end_[stage][mb] >= 0) bad(r, "runs a second time");
      if (!fwd && fwd_end_[stage][mb] < 0) bad(r, "backward before its own forward");
      if (src >= 0 && !from_loss) {
        const auto& done = fwd ? fwd_end_ : bwd_end_;
        double ready;
        if (s_.rank_of(src) == r) {
          if (done[src][mb] < 0) bad(r, "stage {} has not produced its input yet", src);
          ready = done[src][mb];
        } else {
          auto it = msgs_.find(tag(fwd, mb, stage));
          if (it == msgs_.end() || !it->second.recv_waited || it->second.receiver != r)
            bad(r, "input from stage {} was not received (no completed {} before it)", src,
                fwd ? "WaitRecvForward" : "WaitRecvBackward");
          ready = done[src][mb] + tc_;
        }
        if (now < ready) bad(r, "starts at {} before its input is ready at {}", now, ready);  // simulator self-check
      }
      double t = fwd ? tf_ : tb_;
      res_.timeline[r].push_back({a, r, now, now + t});
      now += t;
      res_.busy[r] += t;
      res_.send_stall[r] += send_blocked_[r];
      send_blocked_[r] = 0;
      if (fwd) {
        fwd_end_[stage][mb] = now;
        res_.peak_in_flight[r] = std::max(res_.peak_in_flight[r], ++in_flight_[r]);
      } else {
        bwd_end_[stage][mb] = now;
        --in_flight_[r];
      }
      return true;
    }

    const bool recv = is_recv(a.kind);
    const int other = neighbour_stage(stage, fwd, recv);
    if (other < 0 || other >= S)
      bad(r, "stage {} has no {} neighbour in this direction", stage, recv ? "sending" : "receiving");
    if (s_.rank_of(other) == r) bad(r, "stage {} is on this same rank; no message is needed", other);
    if (a.peer != s_.rank_of(other)) bad(r, "peer should be rank {} (stage {})", s_.rank_of(other), other);
    Message& msg = msgs_[tag(fwd, mb, recv ? stage : other)];

    if (is_post(a.kind)) {
      if (recv) {
        if (msg.recv_post >= 0) bad(r, "receive posted twice");
        msg.recv_post = now;
        msg.receiver = r;
      } else {
        if ((fwd ? fwd_end_ : bwd_end_)[stage][mb] < 0) bad(r, "sends a result not computed yet");
        if (msg.send_post >= 0) bad(r, "send posted twice");
        msg.send_post = now;
        msg.sender = r;
      }
      return true;
    }
    if (recv ? msg.receiver != r : msg.sender != r)
      bad(r, "waits on a {} that was never posted", recv ? "receive" : "send");
    if (recv ? msg.recv_waited : msg.send_waited) bad(r, "waits twice");
    if (!msg.both_posted()) return false;
    double done = std::max(msg.send_post, msg.recv_post) + tc_;
    if (!recv) send_blocked_[r] += std::max(0.0, done - now);
    now = std::max(now, done);
    (recv ? msg.recv_waited : msg.send_waited) = true;
    return true;
  }

  int64_t tag(bool fwd, int mb, int dest_stage) const {
    return ((fwd ? 0 : 1) * int64_t(s_.microbatches) + mb) * s_.stages() + dest_stage;
  }

  void report_deadlock() const {
    std::string stuck;
    bool any = false;
    for (int r = 0; r < s_.pp; ++r) {
      if (pc_[r] < s_.per_rank[r].size()) {
        any = true;
        const Action& a = s_.per_rank[r][pc_[r]];
        stuck += fmt::format("\n  {} waits for rank {}", where(r), a.peer);
      } else {
        stuck += fmt::format("\n  rank {} finished", r);
      }
    }
    if (any) fail("pipeline schedule deadlocks:{}", stuck);
  }

  void check_complete() const {
    for (int st = 0; st < s_.stages(); ++st)
      for (int mb = 0; mb < s_.microbatches; ++mb) {
        MT_CHECK(fwd_end_[st][mb] >= 0,
                 "pipeline schedule: microbatch {} never runs forward at virtual stage {} (rank {})", mb, st,
                 s_.rank_of(st));
        MT_CHECK(bwd_end_[st][mb] >= 0,
                 "pipeline schedule: microbatch {} never runs backward at virtual stage {} (rank {})", mb, st,
                 s_.rank_of(st));
      }
    for (const auto& [t, msg] : msgs_) {
      int64_t per_dir = int64_t(s_.microbatches) * s_.stages();
      std::string what = fmt::format("{} of microbatch {} to virtual stage {}", t < per_dir ? "activation" : "gradient",
                                     (t % per_dir) / s_.stages(), t % s_.stages());
      MT_CHECK(msg.send_post >= 0, "pipeline schedule: {} is received by rank {} but never sent", what, msg.receiver);
      MT_CHECK(msg.recv_post >= 0, "pipeline schedule: {} is sent by rank {} but never received", what, msg.sender);
      MT_CHECK(msg.send_waited, "pipeline schedule: send of {} by rank {} is never waited", what, msg.sender);
      MT_CHECK(msg.recv_waited, "pipeline schedule: receive of {} by rank {} is never waited", what, msg.receiver);
    }
  }

  const Schedule& s_;
  double tf_, tb_, tc_;
  std::vector<std::vector<double>> fwd_end_, bwd_end_;  // [stage][mb], -1 = not yet
  std::vector<size_t> pc_;
  std::vector<double> clock_;
  std::vector<int> in_flight_;
  std::vector<double> send_blocked_;  // per rank: time blocked in WaitSend* since its last compute
  std::unordered_map<int64_t, Message> msgs_;
  SimResult res_;
};

}  // namespace

SimResult simulate(const Schedule& s, double fwd_time, double bwd_time, double comm_time) {
  MT_CHECK(s.pp >= 1 && s.virtual_stages >= 1 && s.microbatches >= 1,
           "simulate: bad schedule shape pp={} virtual_stages={} microbatches={}", s.pp, s.virtual_stages,
           s.microbatches);
  MT_CHECK((int)s.per_rank.size() == s.pp, "simulate: schedule has {} action lists for pp = {}", s.per_rank.size(),
           s.pp);
  MT_CHECK(fwd_time >= 0 && bwd_time >= 0 && comm_time >= 0,
           "simulate: times must be >= 0 (forward {}, backward {}, comm {})", fwd_time, bwd_time, comm_time);
  return Simulator(s, fwd_time, bwd_time, comm_time).run();
}

}  // namespace mt
