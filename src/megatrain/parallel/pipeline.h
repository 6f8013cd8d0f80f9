// The pipeline executor: runs one rank's action list of a Schedule (schedule.h) over model chunks.
// Receives are posted when the schedule says (early) into buffers the chunk provides, and waited right before
// the compute that consumes them; sends are posted asynchronously and waited late. The executor knows nothing
// of models: a chunk is anything with forward/backward per microbatch and the four buffers below.
#pragma once
#include <map>
#include <tuple>
#include <vector>

#include "megatrain/comm/process_group.h"
#include "megatrain/parallel/schedule.h"

namespace mt {

class PipelineChunk {
 public:
  virtual ~PipelineChunk() = default;
  // Where the activation from the previous stage lands for microbatch mb (not called on the first stage).
  virtual Tensor input(int mb) = 0;
  // This stage's output activation for mb, valid from forward(mb) until its send completed (not on the last stage).
  virtual Tensor output(int mb) = 0;
  // Where the gradient w.r.t. output(mb) lands (not on the last stage).
  virtual Tensor grad_output(int mb) = 0;
  // The gradient w.r.t. input(mb), valid from backward(mb) until its send completed (not on the first stage).
  virtual Tensor grad_input(int mb) = 0;
  virtual void forward(int mb) = 0;   // the first stage reads its own data; the last stage computes the loss
  virtual void backward(int mb) = 0;  // accumulates parameter gradients
};

struct PipelineStats {
  double wait_seconds = 0;  // time blocked in Wait* actions (communication not hidden behind compute)
  double comm_seconds = 0;  // summed execution time of the transfers
};

// Per model chunk of pp rank `rank`: the most micro-batches forwarded on it and not yet backwarded at once, i.e.
// how many micro-batches' activations the chunk keeps when it runs the schedule. (simulate()'s peak_in_flight
// is the same count over all chunks of the rank together.)
std::vector<int> peak_in_flight_per_chunk(const Schedule& s, int rank);

// Runs the actions of pp rank `rank` (group rank in `pp_group`) with chunks[c] holding virtual stage c*pp + rank.
// overlap_p2p = false is the serialised baseline for measuring what the decoupled communication buys: a receive
// is posted only when its compute needs it and every send is waited right after it is posted. Sends rendezvous
// (they complete only once the peer's receive exists), so before blocking on a send the rank also posts the
// receive its next receiving compute will wait for (interleaved: the next one of each direction), as Megatron's
// send_forward_recv_backward (send_forward_backward_recv_forward_backward) pairs them; without that, neighbours
// blocked in sends to each other would deadlock in the steady state.
PipelineStats run_pipeline(const Schedule& s, int rank, const std::vector<PipelineChunk*>& chunks,
                           ProcessGroup& pp_group, bool overlap_p2p = true);

}  // namespace mt
