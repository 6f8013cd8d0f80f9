// Pipeline schedules as data: for every pipeline rank, the ordered list of actions (compute, and point-to-point
// communication split into post and wait) that an executor runs one after another. 1F1B and Megatron's
// interleaved 1F1B (virtual stages), with MegaScale's decoupled communication: an activation receive is posted
// one compute before the forward that needs it, a gradient receive right after the forward whose backward will
// need it, and each is waited right before its compute; sends are posted as soon as the data exists and waited
// only when the buffer must be released (an activation before its own backward, input gradients double-buffered).
// A simulator executes the lists with message matching, checks every dependency and measures makespan and bubble.
//
// Executor note: posted operations must progress independently (Gloo unbound buffers, or NCCL p2p on separate
// streams); a receive posted early must not block a later send issued on the same in-order queue.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mt {

enum class ActionKind : uint8_t {
  PostRecvForward,   // post a receive for the activation that Forward(mb, chunk) consumes (from the previous stage)
  WaitRecvForward,   // block until it has arrived; placed right before that Forward
  Forward,           // forward of (mb, chunk); on the last virtual stage it includes the loss
  PostSendForward,   // post an async send of Forward(mb, chunk)'s output to the next stage
  WaitSendForward,   // block until that send completed (its buffer may then be freed)
  PostRecvBackward,  // post a receive for the output gradient that Backward(mb, chunk) consumes (from the next stage)
  WaitRecvBackward,
  Backward,          // backward of (mb, chunk); on the last virtual stage it starts from the loss
  PostSendBackward,  // post an async send of Backward(mb, chunk)'s input gradient to the previous stage
  WaitSendBackward,
};

struct Action {
  ActionKind kind = ActionKind::Forward;
  int microbatch = 0;
  int chunk = 0;  // model chunk on this rank; it holds virtual stage chunk * pp + rank
  int peer = -1;  // the other rank of a Post*/Wait* action, -1 for compute
  bool operator==(const Action&) const = default;
};

struct Schedule {
  int pp = 1, virtual_stages = 1, microbatches = 1;
  std::vector<std::vector<Action>> per_rank;  // [pp][i]
  int stages() const { return pp * virtual_stages; }
  int stage_of(int rank, int chunk) const { return chunk * pp + rank; }
  int rank_of(int stage) const { return stage % pp; }
  int chunk_of(int stage) const { return stage / pp; }
};

// Non-interleaved 1F1B: rank r runs min(pp-1-r, m) warm-up forwards, then alternates one forward and one
// backward, then drains the remaining backwards. Any microbatches >= 1.
Schedule make_1f1b(int pp, int microbatches);
// Megatron's interleaved 1F1B with v model chunks per rank (chunk c on rank r is virtual stage c*pp + r).
// Microbatches run in groups of pp through each chunk, so microbatches must be a multiple of pp; v == 1 is
// exactly make_1f1b.
Schedule make_interleaved_1f1b(int pp, int virtual_stages, int microbatches);

// A tag that names the message an action sends or receives, equal on both sides and unique within one
// schedule run (direction, microbatch, receiving stage). For Post*/Wait* actions only.
int p2p_tag(const Schedule& s, int rank, const Action& a);

// Compact text: F3 / B3 compute (F3.1 = chunk 1 when v > 1); rF3 / wrF3 post / wait the receive feeding F3;
// sF3 / wsF3 post / wait the send of F3's output; likewise rB3, wrB3, sB3, wsB3.
std::string to_string(ActionKind k);
std::string to_string(const Action& a, int virtual_stages = 1);
// One line per rank, "rank 0: F0 sF0 ..."; compute_only shows just the F/B order.
std::string to_string(const Schedule& s, bool compute_only = false);

struct TimedAction {
  Action action;
  int rank;
  double start, end;
};

struct SimResult {
  double makespan = 0;
  std::vector<double> busy, idle;   // per rank: compute time, and makespan - busy
  double bubble_fraction = 0;       // sum(idle) / (pp * makespan)
  std::vector<int> peak_in_flight;  // per rank: most (mb, chunk) forwarded but not yet backwarded at once
  // per rank: time blocked in WaitSend* that delayed a later compute (waits after the last compute excluded)
  std::vector<double> send_stall;
  std::vector<std::vector<TimedAction>> timeline;  // per rank: the compute actions with their times
};

// Runs every rank's list: compute takes fwd_time / bwd_time per (mb, chunk); posting never blocks; a transfer
// starts once both its send and its receive are posted and lasts comm_time (no link contention); a wait
// returns when its transfer is done. Throws mt::Error naming the offending rank and action when the schedule
// is wrong: a dependency broken (forward of stage s before stage s-1's forward of that microbatch arrived,
// backward before its own forward or before the gradient of stage s+1 arrived), a send/receive without its
// partner or posted twice, a wait without its post, a microbatch not run exactly once per stage, or a
// deadlock (listing what each rank is stuck on).
SimResult simulate(const Schedule& s, double fwd_time, double bwd_time, double comm_time);

}  // namespace mt
