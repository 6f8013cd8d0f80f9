#include "megatrain/parallel/pipeline.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"
#include "megatrain/obs/timeline.h"

namespace mt {

std::vector<int> peak_in_flight_per_chunk(const Schedule& s, int rank) {
  MT_CHECK(rank >= 0 && rank < s.pp, "pipeline rank {} out of range [0, {})", rank, s.pp);
  std::vector<int> now(s.virtual_stages, 0), peak(s.virtual_stages, 0);
  for (const Action& a : s.per_rank[rank]) {
    MT_CHECK(a.chunk >= 0 && a.chunk < s.virtual_stages, "pipeline rank {}: action {} names chunk {} of {}", rank,
             to_string(a, s.virtual_stages), a.chunk, s.virtual_stages);
    if (a.kind == ActionKind::Forward) peak[a.chunk] = std::max(peak[a.chunk], ++now[a.chunk]);
    if (a.kind == ActionKind::Backward) --now[a.chunk];
  }
  return peak;
}

namespace {

// One rank's run of its action list: the transfers in flight, and the receives it is still owed by each peer.
class PipelineRun {
 public:
  PipelineRun(const Schedule& s, int rank, const std::vector<PipelineChunk*>& chunks, ProcessGroup& pp_group,
              bool overlap_p2p)
      : s_(s), rank_(rank), chunks_(chunks), pp_group_(pp_group), overlap_p2p_(overlap_p2p),
        actions_(s.per_rank.at(rank)) {
    index_receives();
  }

  // Executes the action list in order.
  PipelineStats run() {
    for (size_t i = 0; i < actions_.size(); ++i) execute(i);
    MT_CHECK(pending_.empty(), "pipeline rank {}: {} transfers never waited", rank_, pending_.size());
    return st_;
  }

 private:
  // Outstanding transfers by (kind of the post, microbatch, chunk).
  using Key = std::tuple<int, int, int>;
  static Key key(ActionKind k, const Action& a) { return std::make_tuple(static_cast<int>(k), a.microbatch, a.chunk); }

  // Receives are posted in the order the sending peer posts its sends to this rank, never in another: a backend
  // without tags (NCCL) matches the transfers of a directed pair by issue order alone. Under interleaving the
  // schedule's own order differs (a neighbour sends chunk 1's gradients before chunk 0's, or activations and
  // gradients in another interleaving than this rank expects them), so posting one receive posts every receive
  // from that peer that the peer sends before it. Posting earlier than the schedule says is safe: each receive
  // has its own buffer (per chunk and micro-batch), unused until the compute that waits for it.
  struct Incoming {
    std::vector<int> tags;  // the peer's sends to this rank, in its issue order
    size_t next = 0;        // the first not yet posted here
  };

  // Every peer's sends to this rank in the peer's issue order, and this rank's receives by tag.
  void index_receives() {
    for (int p = 0; p < s_.pp; ++p) {
      if (p == rank_) continue;
      for (const Action& a : s_.per_rank.at(p))
        if ((a.kind == ActionKind::PostSendForward || a.kind == ActionKind::PostSendBackward) && a.peer == rank_)
          incoming_[p].tags.push_back(p2p_tag(s_, p, a));
    }
    for (const Action& a : actions_)
      if (a.kind == ActionKind::PostRecvForward || a.kind == ActionKind::PostRecvBackward)
        recv_by_tag_.emplace(p2p_tag(s_, rank_, a), a);
  }

  void wait(ActionKind post, const Action& a) {
    auto it = pending_.find(key(post, a));
    MT_CHECK(it != pending_.end(), "pipeline rank {}: {} without its post", rank_, to_string(a, s_.virtual_stages));
    obs::ScopedSpan span("wait", [&] {
      return obs::SpanInfo{to_string(a, s_.virtual_stages), {{"mb", a.microbatch}, {"chunk", a.chunk}}};
    });
    double t0 = now_seconds();
    it->second->wait();
    st_.wait_seconds += now_seconds() - t0;
    st_.comm_seconds += it->second->exec_seconds();
    pending_.erase(it);
  }

  // Posts the transfer of a Post* action into the buffer its chunk provides.
  void post(const Action& a) {
    PipelineChunk& c = *chunks_.at(a.chunk);
    const int tag = p2p_tag(s_, rank_, a);
    WorkPtr w;
    switch (a.kind) {
      case ActionKind::PostRecvForward: w = pp_group_.recv(c.input(a.microbatch), a.peer, tag); break;
      case ActionKind::PostSendForward: w = pp_group_.send(c.output(a.microbatch), a.peer, tag); break;
      case ActionKind::PostRecvBackward: w = pp_group_.recv(c.grad_output(a.microbatch), a.peer, tag); break;
      case ActionKind::PostSendBackward: w = pp_group_.send(c.grad_input(a.microbatch), a.peer, tag); break;
      default: fail("pipeline rank {}: {} is not a post", rank_, to_string(a, s_.virtual_stages));
    }
    pending_[key(a.kind, a)] = std::move(w);
  }

  // Posts receive a, and first every receive its peer sends before it (see Incoming).
  void post_recv(const Action& a) {
    const int tag = p2p_tag(s_, rank_, a);
    if (posted_.count(tag)) return;
    Incoming& in = incoming_[a.peer];
    while (in.next < in.tags.size()) {
      const int t = in.tags[in.next++];
      auto it = recv_by_tag_.find(t);
      MT_CHECK(it != recv_by_tag_.end(), "pipeline rank {}: rank {} sends message {} that this rank never receives",
               rank_, a.peer, t);
      post(it->second);
      posted_.insert(t);
      if (t == tag) return;
    }
    fail("pipeline rank {}: {} waits for message {} that rank {} never sends", rank_, to_string(a, s_.virtual_stages),
         tag, a.peer);
  }

  // Serialised mode: the receive a Wait* action waits for, posted on the spot unless it already is.
  void post_recv_for(const Action& wait_action) {
    const ActionKind k = wait_action.kind == ActionKind::WaitRecvForward ? ActionKind::PostRecvForward
                                                                         : ActionKind::PostRecvBackward;
    post_recv(Action{k, wait_action.microbatch, wait_action.chunk, wait_action.peer});
  }

  void compute(const Action& a, PipelineChunk& c) {
    // The span's name is the schedule's own spelling of the action, so a trace reads as the schedule does.
    obs::ScopedSpan span("compute", [&] {
      return obs::SpanInfo{to_string(a, s_.virtual_stages),
                           {{"mb", a.microbatch}, {"chunk", a.chunk}, {"stage", s_.stage_of(rank_, a.chunk)}}};
    });
    if (a.kind == ActionKind::Forward)
      c.forward(a.microbatch);
    else
      c.backward(a.microbatch);
  }

  // Serialised mode: the send at actions_[i] is posted; pair it with the receive(s) this rank needs next (see
  // pipeline.h), then block on it. 1F1B: the next receive. Interleaved: the next of each direction, as Megatron
  // batches them; with every chunk talking to the same neighbours, the next one alone leaves a cycle of blocked sends.
  void blocking_send(size_t i) {
    bool fwd_done = false, bwd_done = false;
    for (size_t j = i + 1; j < actions_.size() && !(fwd_done && bwd_done); ++j) {
      const ActionKind k = actions_[j].kind;
      bool& done = k == ActionKind::WaitRecvForward ? fwd_done : bwd_done;
      if ((k == ActionKind::WaitRecvForward || k == ActionKind::WaitRecvBackward) && !done) {
        post_recv_for(actions_[j]);
        done = true;
        if (s_.virtual_stages == 1) break;
      }
    }
    wait(actions_[i].kind, actions_[i]);
  }

  void execute(size_t i) {
    const Action& a = actions_[i];
    PipelineChunk& c = *chunks_.at(a.chunk);
    switch (a.kind) {
      case ActionKind::PostRecvForward:
      case ActionKind::PostRecvBackward:
        if (overlap_p2p_) post_recv(a);  // serialised: deferred to the wait (or to a send's pairing)
        break;
      case ActionKind::WaitRecvForward:
        if (!overlap_p2p_) post_recv_for(a);
        wait(ActionKind::PostRecvForward, a);
        break;
      case ActionKind::WaitRecvBackward:
        if (!overlap_p2p_) post_recv_for(a);
        wait(ActionKind::PostRecvBackward, a);
        break;
      case ActionKind::Forward:
      case ActionKind::Backward: compute(a, c); break;
      case ActionKind::PostSendForward:
      case ActionKind::PostSendBackward:
        post(a);
        if (!overlap_p2p_) blocking_send(i);
        break;
      case ActionKind::WaitSendForward:
        if (overlap_p2p_) wait(ActionKind::PostSendForward, a);  // serialised: already waited at the post
        break;
      case ActionKind::WaitSendBackward:
        if (overlap_p2p_) wait(ActionKind::PostSendBackward, a);
        break;
    }
  }

  const Schedule& s_;
  const int rank_;
  const std::vector<PipelineChunk*>& chunks_;
  ProcessGroup& pp_group_;
  const bool overlap_p2p_;
  const std::vector<Action>& actions_;
  PipelineStats st_;
  std::map<Key, WorkPtr> pending_;
  std::map<int, Incoming> incoming_;
  std::map<int, Action> recv_by_tag_;  // this rank's receives
  std::set<int> posted_;               // tags of the receives posted so far
};

}  // namespace

PipelineStats run_pipeline(const Schedule& s, int rank, const std::vector<PipelineChunk*>& chunks,
                           ProcessGroup& pp_group, bool overlap_p2p) {
  MT_CHECK(static_cast<int>(chunks.size()) == s.virtual_stages,
           "pipeline: {} model chunks on rank {} but the "
           "schedule has {} virtual stages",
           chunks.size(), rank, s.virtual_stages);
  MT_CHECK(pp_group.size() == s.pp, "pipeline: the pp group has {} ranks but the schedule {}", pp_group.size(), s.pp);
  return PipelineRun(s, rank, chunks, pp_group, overlap_p2p).run();
}

}  // namespace mt
