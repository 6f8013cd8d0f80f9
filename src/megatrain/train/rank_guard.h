// The rank side of robust training (issue 12), in one observer the trainer holds for a run:
//  * heartbeats to the supervisor (train/heartbeat.h), with the step's compute time as the straggler measure;
//  * injected faults (train/faults.h, MEGATRAIN_FAULTS);
//  * skipped batches (train.skip_steps): the step's batches are read from the loader and dropped, so the data
//    position moves as if the step had trained, and nothing else happens at that step (no forward/backward, no
//    optimizer step, no train line in metrics.jsonl, no periodic checkpoint or validation of that step);
//  * the non-finite check's event, and loss-spike warnings (train.spike_*).
// Events it sends (heartbeat lines of type "event", besides fault_injected from faults.h):
//   non_finite     {"step":S,"loss":x|null,"grad_norm":y|null,"non_finite":["loss","grad_norm"]}
//   loss_spike     {"step":S,"loss":x,"rule":"sigma"|"factor","threshold":t,"mean":m,"std":s,"median":md,"window":n}
//   batch_skipped  {"step":S,"batches":[{"epoch":E,"first":i,"last":j}, ...]}  (positions in the epoch's window order)
//   error          {"step":S,"kind":"non-finite","code":20,"message":...}  (the error that ends the run)
#pragma once
#include <memory>
#include <optional>
#include <set>

#include "megatrain/data/loader.h"
#include "megatrain/train/faults.h"
#include "megatrain/train/heartbeat.h"
#include "megatrain/train/loss_spike.h"
#include "megatrain/train/observer.h"
#include "megatrain/train/run_config.h"

namespace mt {

class GPT;

class RankGuard final : public TrainObserver {
 public:
  // Reads the environment (MEGATRAIN_HEARTBEAT_FD, MEGATRAIN_FAULTS, MEGATRAIN_ATTEMPT, the rank); starts
  // heartbeating (phase init) when asked to. Config errors for malformed variables.
  explicit RankGuard(const RunConfig& cfg);
  ~RankGuard() override;

  // At the start of step `step`: phase forward_backward, injected faults; returns true when the step's batch is
  // skipped (consumed from `loader` here; the caller then goes on to the next step).
  bool begin_step(int step, DataLoader& loader, GPT& model);
  // Right after step `step`'s optimizer update: injected bitflips (settle: waits for the update's parameter traffic).
  void after_update(int step, GPT& model, const std::function<void()>& settle);
  // Right before the data-parallel reduction of the flat gradient range [begin, end): injected sdcgrad faults.
  void before_reduce(GPT& model, size_t begin, size_t end) { faults_->before_reduce(model, begin, end); }
  // The loss or gradient norm of `step` is not finite: sends the event and throws the NonFinite error.
  [[noreturn]] void fail_non_finite(int step, float loss, double norm);

  void on_run_start(const RunStart& rs) override;
  void on_step(const StepReport& r) override;
  void on_error(int step, ErrorKind kind, const std::string& what) override;

 private:
  const RunConfig& cfg_;
  int rank_ = 0;
  bool main_rank_ = true;
  int dp_ = 1;
  std::set<int> skip_;
  std::unique_ptr<Heartbeat> heartbeat_;  // null without MEGATRAIN_HEARTBEAT_FD
  std::unique_ptr<FaultInjector> faults_;
  LossSpikeDetector spikes_;
  bool failed_ = false;
};

}  // namespace mt
