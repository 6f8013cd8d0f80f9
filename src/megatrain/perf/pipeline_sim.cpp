#include "megatrain/perf/pipeline_sim.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "megatrain/core/error.h"

namespace mt::perf {

namespace {

using K = ActionKind;

bool forward_dir(K k) {
  return k == K::PostRecvForward || k == K::WaitRecvForward || k == K::Forward || k == K::PostSendForward ||
         k == K::WaitSendForward;
}

struct Message {
  double send_post = -1, recv_post = -1;
};

class Sim {
 public:
  Sim(const Schedule& s, const PipelineCosts& c) : s_(s), c_(c) {
    const int P = s.pp, v = s.virtual_stages;
    pc_.assign(P, 0);
    clock_.assign(P, 0);
    in_flight_.assign(P, 0);
    bwd_count_.assign(P, std::vector<int>(v, 0));
    fwd_seen_.assign(P, std::vector<bool>(v, false));
    ag_done_.assign(P, std::vector<double>(v, 0));
    dp_free_.assign(P, 0);
    res_.busy.assign(P, 0);
    res_.peak_in_flight.assign(P, 0);
    dp_ = !c.dp_all_gather.empty();
    if (dp_)
      for (int r = 0; r < P; ++r) {
        double t = 0;
        for (int k = 0; k < v; ++k) {
          t += (k == 0 && c.dp_prefetch_first) ? 0 : c.dp_all_gather[r][k];
          ag_done_[r][k] = t;
        }
        dp_free_[r] = t;
      }
  }

  PipelineResult run() {
    for (bool progress = true; progress;) {
      progress = false;
      for (int r = 0; r < s_.pp; ++r)
        while (pc_[r] < s_.per_rank[r].size() && step(r)) {
          ++pc_[r];
          progress = true;
        }
    }
    std::string stuck;
    for (int r = 0; r < s_.pp; ++r)
      if (pc_[r] < s_.per_rank[r].size())
        stuck += fmt::format(" rank {} at action #{} {};", r, pc_[r],
                             to_string(s_.per_rank[r][pc_[r]], s_.virtual_stages));
    MT_CHECK(stuck.empty(), "pipeline simulation deadlocks:{}", stuck);
    for (int r = 0; r < s_.pp; ++r) {
      res_.finish.push_back(std::max(clock_[r], dp_free_[r]));
      res_.makespan = std::max(res_.makespan, res_.finish.back());
    }
    return res_;
  }

 private:
  int64_t tag(bool fwd, int mb, int dest_stage) const {
    return ((fwd ? 0 : 1) * int64_t(s_.microbatches) + mb) * s_.stages() + dest_stage;
  }

  bool step(int r) {
    const Action& a = s_.per_rank[r][pc_[r]];
    const bool fwd = forward_dir(a.kind);
    const int stage = s_.stage_of(r, a.chunk);
    double& now = clock_[r];
    const double tc = c_.p2p_seconds;
    switch (a.kind) {
      case K::Forward:
      case K::Backward: {
        if (fwd && dp_ && !fwd_seen_[r][a.chunk]) {  // the chunk's parameters must be gathered first
          fwd_seen_[r][a.chunk] = true;
          now = std::max(now, ag_done_[r][a.chunk]);
        }
        const double t = fwd ? c_.fwd[stage] : c_.bwd[stage];
        now += t;
        res_.busy[r] += t;
        if (fwd) {
          res_.peak_in_flight[r] = std::max(res_.peak_in_flight[r], ++in_flight_[r]);
        } else {
          --in_flight_[r];
          if (++bwd_count_[r][a.chunk] == s_.microbatches && dp_) {  // gradients of this chunk are complete
            const double start = std::max(dp_free_[r], now);
            dp_free_[r] = start + c_.dp_reduce_scatter[r][a.chunk];
          }
        }
        return true;
      }
      case K::PostRecvForward:
      case K::PostRecvBackward: {
        if (c_.p2p_overlap) msgs_[tag(fwd, a.microbatch, stage)].recv_post = now;
        return true;
      }
      case K::PostSendForward:
      case K::PostSendBackward: {
        const int dest = stage + (fwd ? 1 : -1);
        Message& m = msgs_[tag(fwd, a.microbatch, dest)];
        m.send_post = now;
        if (!c_.p2p_overlap) now += tc;  // the transfer occupies the sender's stream
        return true;
      }
      case K::WaitRecvForward:
      case K::WaitRecvBackward: {
        auto it = msgs_.find(tag(fwd, a.microbatch, stage));
        if (it == msgs_.end() || it->second.send_post < 0) return false;  // the sender has not got there yet
        const Message& m = it->second;
        if (c_.p2p_overlap) {
          MT_CHECK(m.recv_post >= 0, "pipeline simulation: rank {} waits on a receive it never posted ({})", r,
                   to_string(a, s_.virtual_stages));
          now = std::max(now, std::max(m.send_post, m.recv_post) + tc);
        } else {
          now = std::max(now, m.send_post) + tc;  // the receive is issued now and lasts the whole transfer
        }
        return true;
      }
      case K::WaitSendForward:
      case K::WaitSendBackward: {
        if (!c_.p2p_overlap) return true;  // already paid at the post
        const int dest = stage + (fwd ? 1 : -1);
        auto it = msgs_.find(tag(fwd, a.microbatch, dest));
        MT_CHECK(it != msgs_.end() && it->second.send_post >= 0,
                 "pipeline simulation: rank {} waits on a send it never posted ({})", r,
                 to_string(a, s_.virtual_stages));
        if (it->second.recv_post < 0) return false;  // the receiver has not posted yet
        now = std::max(now, std::max(it->second.send_post, it->second.recv_post) + tc);
        return true;
      }
    }
    return true;
  }

  const Schedule& s_;
  const PipelineCosts& c_;
  bool dp_ = false;
  std::vector<size_t> pc_;
  std::vector<double> clock_, dp_free_;
  std::vector<int> in_flight_;
  std::vector<std::vector<int>> bwd_count_;
  std::vector<std::vector<bool>> fwd_seen_;
  std::vector<std::vector<double>> ag_done_;
  std::unordered_map<int64_t, Message> msgs_;
  PipelineResult res_;
};

}  // namespace

PipelineResult simulate_pipeline(const Schedule& s, const PipelineCosts& c) {
  const int S = s.stages();
  MT_CHECK((int)s.per_rank.size() == s.pp, "pipeline simulation: schedule has {} action lists for pp = {}",
           s.per_rank.size(), s.pp);
  MT_CHECK((int)c.fwd.size() == S && (int)c.bwd.size() == S,
           "pipeline simulation: {} forward and {} backward costs for {} virtual stages", c.fwd.size(), c.bwd.size(),
           S);
  for (int i = 0; i < S; ++i)
    MT_CHECK(c.fwd[i] >= 0 && c.bwd[i] >= 0 && std::isfinite(c.fwd[i]) && std::isfinite(c.bwd[i]),
             "pipeline simulation: stage {} has cost forward {} backward {} (must be finite and >= 0)", i, c.fwd[i],
             c.bwd[i]);
  MT_CHECK(c.p2p_seconds >= 0 && std::isfinite(c.p2p_seconds), "pipeline simulation: p2p time {} must be >= 0",
           c.p2p_seconds);
  if (!c.dp_all_gather.empty()) {
    MT_CHECK((int)c.dp_all_gather.size() == s.pp && (int)c.dp_reduce_scatter.size() == s.pp,
             "pipeline simulation: data-parallel costs must be given per rank ({} ranks)", s.pp);
    for (int r = 0; r < s.pp; ++r)
      MT_CHECK((int)c.dp_all_gather[r].size() == s.virtual_stages &&
                   (int)c.dp_reduce_scatter[r].size() == s.virtual_stages,
               "pipeline simulation: data-parallel costs of rank {} must be given per chunk ({} chunks)", r,
               s.virtual_stages);
  }
  return Sim(s, c).run();
}

}  // namespace mt::perf
