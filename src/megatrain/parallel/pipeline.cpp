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

PipelineStats run_pipeline(const Schedule& s, int rank, const std::vector<PipelineChunk*>& chunks,
                           ProcessGroup& pp_group, bool overlap_p2p) {
  MT_CHECK(static_cast<int>(chunks.size()) == s.virtual_stages, "pipeline: {} model chunks on rank {} but the "
           "schedule has {} virtual stages", chunks.size(), rank, s.virtual_stages);
  MT_CHECK(pp_group.size() == s.pp, "pipeline: the pp group has {} ranks but the schedule {}", pp_group.size(), s.pp);
  PipelineStats st;
  // Outstanding transfers by (kind of the post, microbatch, chunk).
  std::map<std::tuple<int, int, int>, WorkPtr> pending;
  auto key = [](ActionKind k, const Action& a) { return std::make_tuple(static_cast<int>(k), a.microbatch, a.chunk); };
  auto wait = [&](ActionKind post, const Action& a) {
    auto it = pending.find(key(post, a));
    MT_CHECK(it != pending.end(), "pipeline rank {}: {} without its post", rank, to_string(a, s.virtual_stages));
    obs::ScopedSpan span("wait", [&] {
      return obs::SpanInfo{to_string(a, s.virtual_stages), {{"mb", a.microbatch}, {"chunk", a.chunk}}};
    });
    double t0 = now_seconds();
    it->second->wait();
    st.wait_seconds += now_seconds() - t0;
    st.comm_seconds += it->second->exec_seconds();
    pending.erase(it);
  };
  // Posts the transfer of a Post* action into the buffer its chunk provides.
  auto post = [&](const Action& a) {
    PipelineChunk& c = *chunks.at(a.chunk);
    const int tag = p2p_tag(s, rank, a);
    WorkPtr w;
    switch (a.kind) {
      case ActionKind::PostRecvForward: w = pp_group.recv(c.input(a.microbatch), a.peer, tag); break;
      case ActionKind::PostSendForward: w = pp_group.send(c.output(a.microbatch), a.peer, tag); break;
      case ActionKind::PostRecvBackward: w = pp_group.recv(c.grad_output(a.microbatch), a.peer, tag); break;
      case ActionKind::PostSendBackward: w = pp_group.send(c.grad_input(a.microbatch), a.peer, tag); break;
      default: fail("pipeline rank {}: {} is not a post", rank, to_string(a, s.virtual_stages));
    }
    pending[key(a.kind, a)] = std::move(w);
  };
  const std::vector<Action>& actions = s.per_rank.at(rank);
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
  std::map<int, Incoming> incoming;
  for (int p = 0; p < s.pp; ++p) {
    if (p == rank) continue;
    for (const Action& a : s.per_rank.at(p))
      if ((a.kind == ActionKind::PostSendForward || a.kind == ActionKind::PostSendBackward) && a.peer == rank)
        incoming[p].tags.push_back(p2p_tag(s, p, a));
  }
  std::map<int, Action> recv_by_tag;  // this rank's receives
  for (const Action& a : actions)
    if (a.kind == ActionKind::PostRecvForward || a.kind == ActionKind::PostRecvBackward)
      recv_by_tag.emplace(p2p_tag(s, rank, a), a);
  std::set<int> posted;  // tags of the receives posted so far
  auto post_recv = [&](const Action& a) {
    const int tag = p2p_tag(s, rank, a);
    if (posted.count(tag)) return;
    Incoming& in = incoming[a.peer];
    while (in.next < in.tags.size()) {
      const int t = in.tags[in.next++];
      auto it = recv_by_tag.find(t);
      MT_CHECK(it != recv_by_tag.end(), "pipeline rank {}: rank {} sends message {} that this rank never receives",
               rank, a.peer, t);
      post(it->second);
      posted.insert(t);
      if (t == tag) return;
    }
    fail("pipeline rank {}: {} waits for message {} that rank {} never sends", rank, to_string(a, s.virtual_stages),
         tag, a.peer);
  };
  // Serialised mode: the receive a Wait* action waits for, posted on the spot unless it already is.
  auto post_recv_for = [&](const Action& wait_action) {
    const ActionKind k =
        wait_action.kind == ActionKind::WaitRecvForward ? ActionKind::PostRecvForward : ActionKind::PostRecvBackward;
    post_recv(Action{k, wait_action.microbatch, wait_action.chunk, wait_action.peer});
  };
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    PipelineChunk& c = *chunks.at(a.chunk);
    switch (a.kind) {
      case ActionKind::PostRecvForward:
      case ActionKind::PostRecvBackward:
        if (overlap_p2p) post_recv(a);  // serialised: deferred to the wait (or to a send's pairing below)
        break;
      case ActionKind::WaitRecvForward:
        if (!overlap_p2p) post_recv_for(a);
        wait(ActionKind::PostRecvForward, a);
        break;
      case ActionKind::WaitRecvBackward:
        if (!overlap_p2p) post_recv_for(a);
        wait(ActionKind::PostRecvBackward, a);
        break;
      case ActionKind::Forward:
      case ActionKind::Backward: {
        // The span's name is the schedule's own spelling of the action, so a trace reads as the schedule does.
        obs::ScopedSpan span("compute", [&] {
          return obs::SpanInfo{to_string(a, s.virtual_stages),
                               {{"mb", a.microbatch}, {"chunk", a.chunk}, {"stage", s.stage_of(rank, a.chunk)}}};
        });
        if (a.kind == ActionKind::Forward) c.forward(a.microbatch);
        else c.backward(a.microbatch);
        break;
      }
      case ActionKind::PostSendForward:
      case ActionKind::PostSendBackward:
        post(a);
        if (!overlap_p2p) {
          // Pair the blocking send with the receive(s) this rank needs next (see pipeline.h), then block on it.
          // 1F1B: the next receive. Interleaved: the next of each direction, as Megatron batches them; with
          // every chunk talking to the same neighbours, the next one alone leaves a cycle of blocked sends.
          bool fwd_done = false, bwd_done = false;
          for (size_t j = i + 1; j < actions.size() && !(fwd_done && bwd_done); ++j) {
            const ActionKind k = actions[j].kind;
            bool& done = k == ActionKind::WaitRecvForward ? fwd_done : bwd_done;
            if ((k == ActionKind::WaitRecvForward || k == ActionKind::WaitRecvBackward) && !done) {
              post_recv_for(actions[j]);
              done = true;
              if (s.virtual_stages == 1) break;
            }
          }
          wait(a.kind, a);
        }
        break;
      case ActionKind::WaitSendForward:
        if (overlap_p2p) wait(ActionKind::PostSendForward, a);  // serialised: already waited at the post
        break;
      case ActionKind::WaitSendBackward:
        if (overlap_p2p) wait(ActionKind::PostSendBackward, a);
        break;
    }
  }
  MT_CHECK(pending.empty(), "pipeline rank {}: {} transfers never waited", rank, pending.size());
  return st;
}

}  // namespace mt
