#include "megatrain/parallel/pipeline.h"

#include <algorithm>

#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"

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
                           ProcessGroup& pp_group) {
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
    double t0 = now_seconds();
    it->second->wait();
    st.wait_seconds += now_seconds() - t0;
    st.comm_seconds += it->second->exec_seconds();
    pending.erase(it);
  };
  for (const Action& a : s.per_rank.at(rank)) {
    PipelineChunk& c = *chunks.at(a.chunk);
    const int tag = a.peer >= 0 ? p2p_tag(s, rank, a) : 0;
    switch (a.kind) {
      case ActionKind::PostRecvForward:
        pending[key(a.kind, a)] = pp_group.recv(c.input(a.microbatch), a.peer, tag);
        break;
      case ActionKind::WaitRecvForward: wait(ActionKind::PostRecvForward, a); break;
      case ActionKind::Forward: c.forward(a.microbatch); break;
      case ActionKind::PostSendForward:
        pending[key(a.kind, a)] = pp_group.send(c.output(a.microbatch), a.peer, tag);
        break;
      case ActionKind::WaitSendForward: wait(ActionKind::PostSendForward, a); break;
      case ActionKind::PostRecvBackward:
        pending[key(a.kind, a)] = pp_group.recv(c.grad_output(a.microbatch), a.peer, tag);
        break;
      case ActionKind::WaitRecvBackward: wait(ActionKind::PostRecvBackward, a); break;
      case ActionKind::Backward: c.backward(a.microbatch); break;
      case ActionKind::PostSendBackward:
        pending[key(a.kind, a)] = pp_group.send(c.grad_input(a.microbatch), a.peer, tag);
        break;
      case ActionKind::WaitSendBackward: wait(ActionKind::PostSendBackward, a); break;
    }
  }
  MT_CHECK(pending.empty(), "pipeline rank {}: {} transfers never waited", rank, pending.size());
  return st;
}

}  // namespace mt
