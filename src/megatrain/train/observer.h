// Step observers: what the trainer tells the outside world, as events. The metrics log (metrics.jsonl) and the
// progress printer are observers; the coming heartbeat, timeline and dashboard will be others. Observers run on
// the rank that owns them, synchronously, on the training thread: they must be cheap (a line written, a counter
// set) and must not call collectives.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "megatrain/comm/mesh.h"
#include "megatrain/comm/process_group.h"
#include "megatrain/core/error.h"
#include "megatrain/core/kind.h"
#include "megatrain/model/moe.h"

namespace mt {

struct RunConfig;

struct RunStart {
  const RunConfig* cfg = nullptr;
  int start_step = 0;  // the last completed step (0, or the step resumed from)
  int world_size = 1, dp = 1, pp = 1, tp = 1;
  int threads = 1;            // OpenMP threads per rank
  int64_t params = 0;         // model parameters (whole model)
  uint64_t train_tokens = 0;  // tokens in the train split
  double peak_flops = 0;      // the MFU denominator over all ranks
  std::string peak_source;    // where peak_flops came from
  std::string blas_core;      // a CPU run's OpenBLAS kernels and why (kernels/cpu/blas_probe.h), "" on a GPU
  std::string resumed_from;   // checkpoint directory, or ""
  int rank = 0;               // this process's global rank and place in the mesh
  MeshCoord coord;
};

struct StepStats {
  int step = 0, total_steps = 0;
  double loss = 0, lr = 0, grad_norm = 0;
  double step_seconds = 0, tokens_per_second = 0, model_flops_per_second = 0, mfu = 0;
};

// Straggler coding's account of one step (train/coded_forward_backward.h), the same on every rank except
// seconds_saved (the main rank's estimate).
struct StragglerStepReport {
  std::vector<std::pair<int, int>> stragglers;  // (round, replica) the step went on without
  int rounds = 0;                               // of the step
  int rounds_waited = 0;                        // rounds that waited for stragglers outside the scheme's model
  int64_t microbatches_computed = 0;            // every assigned micro-batch, abandoned ones included
  int64_t microbatches_recomputed = 0;          // repeated work (sr-sgc reattempts, m-sgc repeated chunks)
  double redundancy = 1;                        // computed / the uncoded step's micro-batches: the load as paid
  double seconds_saved = 0;  // sum over rounds of (every replica's finish - the kept replicas' last), estimated
};

// One step: its statistics and this rank's communication time on each plane of groups during it.
struct StepReport {
  StepStats stats;
  CommTime dp, tp, pp, ep;  // ep: expert parallelism's all-to-alls (parallel/expert_parallel.h)
  // What this rank has allocated through its backend (device memory on a GPU, host memory on the CPU): the model's
  // parameters, gradients, optimizer state and activations, all planned up front, so it is fixed after step 1.
  size_t memory_bytes = 0;
  // A blend: the epochs each source has given so far (rows / its windows; 2.5 = its data seen two and a half times).
  std::vector<double> blend_epochs;
  std::optional<StragglerStepReport> straggler;  // parallel.straggler_coding != none
  // A MoE model (docs/moe.md): per MoE layer, the step's routing counts and auxiliary losses; moe_loss, their share
  // of the training loss (in the gradients; `loss` is the cross-entropy alone).
  std::vector<MoeLayerStats> moe;
  double moe_loss = 0;
  // The step less the time this rank was blocked on communication on any plane: what sets a straggler apart (its
  // peers' steps are as long as its own: they wait for it). The straggler rule, the heartbeat and the trace's step
  // spans all use this one measure.
  double compute_seconds() const {
    return std::max(0.0, stats.step_seconds - (dp.exposed_seconds + tp.exposed_seconds + pp.exposed_seconds));
  }
};

// A stage of a checkpoint (train/checkpointing.h): snapshot (stage 1: this rank's state copied to memory; the
// step goes on), persisted (stage 2: this rank's shard file is durable), committed (the manifest is written: the
// checkpoint counts; also reported through on_checkpoint) or failed (stage 2 or the commit failed: the previous
// checkpoint stays current and training goes on). Spelt in metrics.jsonl as kind_name gives.
enum class CheckpointStage { Snapshot, Persisted, Committed, Failed };
// Why a checkpoint is taken: periodic (ckpt.every; stage 2 in the background with ckpt.async), final (the end of the
// run), stop (a requested stop) or snapshot (ckpt.snapshot_every: a peer copy only, nothing is written). Every save
// but a snapshot is persisted.
enum class SaveWhy { Periodic, Final, Stop, Snapshot };  // "periodic" | "final" | "stop" | "snapshot"

inline constexpr std::array<const char*, 4> kCheckpointStageNames = {"snapshot", "persisted", "committed", "failed"};
inline constexpr std::array<const char*, 4> kSaveWhyNames = {"periodic", "final", "stop", "snapshot"};
inline const std::array<const char*, 4>& kind_names(CheckpointStage) { return kCheckpointStageNames; }
inline const std::array<const char*, 4>& kind_names(SaveWhy) { return kSaveWhyNames; }

// One checkpoint event, delivered on the training thread.
struct CheckpointEvent {
  int step = 0;
  CheckpointStage stage = CheckpointStage::Snapshot;
  SaveWhy why = SaveWhy::Periodic;
  std::string dir;      // committed: the checkpoint directory
  std::string message;  // failed: what went wrong
  double seconds = 0;   // snapshot: the training thread's stall; persisted/committed: since the snapshot
};

// A blend's validation loss on one source's val split (TrainObserver::on_eval_sources).
struct SourceLoss {
  std::string dir;
  double share = 0;  // its weight over the weights' sum
  double loss = 0;
};

class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  virtual void on_run_start(const RunStart&) {}
  virtual void on_step(const StepReport&) {}
  virtual void on_eval(int /*step*/, double /*val_loss*/) {}
  // A blend: each source's validation loss, just before on_eval (whose loss is their mean weighted by share).
  virtual void on_eval_sources(int /*step*/, const std::vector<SourceLoss>& /*losses*/) {}
  // A checkpoint of `step` was committed to `dir` (why: "periodic", "final", "stop").
  virtual void on_checkpoint(int /*step*/, const std::string& /*dir*/, const std::string& /*why*/) {}
  virtual void on_checkpoint_event(const CheckpointEvent&) {}
  virtual void on_sample(int /*step*/, const std::string& /*text*/, const std::vector<int32_t>& /*tokens*/) {}
  // The run is about to end with this error (after the last completed step `step`); it is rethrown after.
  virtual void on_error(int /*step*/, ErrorKind /*kind*/, const std::string& /*what*/) {}
};

}  // namespace mt
