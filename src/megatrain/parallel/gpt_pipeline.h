// One pipeline-parallel training step of a GPT stage: the model chunks of this pp rank (GPT built with a
// GptPart) run a Schedule's actions through run_pipeline over the micro-batches of a step.
//
// Each chunk keeps its micro-batches' activations in the GPT's activation slots, as many as the schedule has
// micro-batches in flight on that chunk at once (peak_in_flight_per_chunk), allocated when the pipeline is built:
// a backward reads the activations of its own forward, nothing is recomputed beyond the layers configured for
// recomputation. Only the boundary buffers (input, output and their gradients) exist per micro-batch.
#pragma once
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "megatrain/core/buffer.h"
#include "megatrain/comm/process_group.h"
#include "megatrain/model/gpt.h"
#include "megatrain/parallel/pipeline.h"
#include "megatrain/parallel/schedule.h"

namespace mt {

class GptPipeline {
 public:
  // B x T rows per micro-batch; the model's chunks must match s.virtual_stages. Reserves the model's activation
  // slots for this schedule. `s` must outlive the pipeline.
  GptPipeline(GPT& model, const Schedule& s, int pp_rank, int B, int T);
  ~GptPipeline();

  // Called with chunk c right before the backward of c's last micro-batch in the last run of a step: from then on
  // the gradients that backward finishes are final (e.g. DataParallel::begin_last_backward(c)).
  void set_before_last_backward(std::function<void(int chunk)> f) { before_last_backward_ = std::move(f); }
  // false: run_pipeline's serialised baseline (receives posted when needed, sends waited at once), for measuring
  // what overlapping the point-to-point transfers with compute buys.
  void set_overlap_p2p(bool on) { overlap_p2p_ = on; }

  // Runs every micro-batch through this rank's chunks: tokens / targets hold s.microbatches * B rows of T (read on
  // the first / last stage only). Each micro-batch's loss gradient is scaled by loss_scale. last_run: the last
  // pipeline run of a step (of a gradient accumulation): the model all-reduces tensor-parallel replicated
  // gradients in each chunk's last backward, and before_last_backward is called. Returns the sum of the
  // micro-batch mean losses on the last stage, 0 elsewhere.
  float run(ProcessGroup& pp_group, const int32_t* tokens, const int32_t* targets, float loss_scale, bool last_run);
  const PipelineStats& stats() const { return stats_; }  // of the last run
  // Point-to-point time of the pipeline runs since the last call (busy: the transfers' execution; exposed: the
  // time blocked in Wait actions).
  CommTime take_comm_time() { return std::exchange(comm_time_, CommTime{}); }

 private:
  class Chunk;
  GPT& model_;
  const Schedule& sched_;
  int rank_;
  std::vector<std::unique_ptr<Chunk>> chunks_;
  std::function<void(int)> before_last_backward_;
  bool overlap_p2p_ = true;
  PipelineStats stats_;
  CommTime comm_time_;
};

}  // namespace mt
