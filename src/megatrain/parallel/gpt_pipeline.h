// One pipeline-parallel training step of a GPT stage: the model chunks of this pp rank (GPT built with a
// GptPart) run a Schedule's actions through run_pipeline over the micro-batches of a step.
//
// Activations are not kept per micro-batch: the GPT holds one set per layer, so a chunk's backward of micro-batch
// mb re-runs its forward first unless the chunk's last forward was of mb (as on the last stage in 1F1B). The
// forward is deterministic, so the recomputed activations are bit-identical; only the boundary buffers (input,
// output and their gradients) exist per micro-batch.
#pragma once
#include <memory>
#include <vector>

#include "megatrain/core/buffer.h"
#include "megatrain/dist/process_group.h"
#include "megatrain/model/gpt.h"
#include "megatrain/parallel/pipeline.h"
#include "megatrain/parallel/schedule.h"

namespace mt {

class GptPipeline {
 public:
  // B x T rows per micro-batch; the model's chunks must match s.virtual_stages.
  GptPipeline(GPT& model, const Schedule& s, int pp_rank, int B, int T);
  ~GptPipeline();

  // Runs every micro-batch through this rank's chunks: tokens / targets hold s.microbatches * B rows of T (read on
  // the first / last stage only). Each micro-batch's loss gradient is scaled by loss_scale. sync_tp_grads: let
  // the model all-reduce tensor-parallel replicated gradients in each chunk's last backward (the last pipeline
  // run of an accumulation). Returns the sum of the micro-batch mean losses on the last stage, 0 elsewhere.
  float run(ProcessGroup& pp_group, const int32_t* tokens, const int32_t* targets, float loss_scale,
            bool sync_tp_grads);
  const PipelineStats& stats() const { return stats_; }  // of the last run
  int recomputed_forwards() const { return recomputed_; }  // in the last run

 private:
  class Chunk;
  GPT& model_;
  const Schedule& sched_;
  int rank_;
  std::vector<std::unique_ptr<Chunk>> chunks_;
  PipelineStats stats_;
  int recomputed_ = 0;
};

}  // namespace mt
