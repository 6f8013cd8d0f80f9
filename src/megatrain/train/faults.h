// Fault injection, for the supervisor's tests and benchmarks: the injector that fires the faults MEGATRAIN_FAULTS
// asks for (the kinds and their syntax: core/fault_spec.h). crash, hang, nan, slow, bitflip and sdcgrad fire here,
// at the points the trainer calls (sdcgrad from the update, right before a gradient's reduction:
// Update::set_before_reduce); stage2_delay and kill_after_snapshot in the checkpointer
// (train/checkpoint/staged_save.h); clock_skew in the trace clock (obs/timeline.h); badnode in `megatrain diagnose`.
// A fault that fires here prints "fault injected: <item> (rank R, step S, attempt A)" to stderr, after a heartbeat
// event {"type":"event","event":"fault_injected","fault":<item>,"kind":..,"step":S,"attempt":A} when heartbeats are
// on.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "megatrain/core/fault_spec.h"

namespace mt {

class GPT;

// Whether a badnode fault names `node` in this attempt (MEGATRAIN_FAULTS, MEGATRAIN_ATTEMPT).
bool fault_badnode(int node);

// The faults of one rank in one attempt, fired at the points the trainer calls.
class FaultInjector {
 public:
  // Keeps the faults that target `rank` in `attempt`; installs the flight recorder's enter hook when one is a hang.
  FaultInjector(const std::vector<Fault>& faults, int rank, int attempt);
  ~FaultInjector();  // removes the hook
  FaultInjector(const FaultInjector&) = delete;
  FaultInjector& operator=(const FaultInjector&) = delete;

  // Throws a Config error when a fault names a rank outside the world (it could never fire).
  void check_world(int world_size) const;
  // At the start of step `step`, before its forward: crash, nan, slow; arms the hang from this step on.
  void begin_step(int step, GPT& model);
  // Right after step `step`'s optimizer update (before anything reads the new parameters): bitflip. settle waits
  // for the update's parameter traffic (called only when a flip fires: waiting early changes no value).
  void after_update(int step, GPT& model, const std::function<void()>& settle);
  // Right before the data-parallel reduction of the local gradients' flat range [begin, end) (a bucket; the whole
  // buffer with dp = 1), in the step begin_step last saw: sdcgrad, once per step (the step's rerun, train/sdc_rerun.h,
  // computes clean, as after a transient fault).
  void before_reduce(GPT& model, size_t begin, size_t end);
  // The compute time the last step took (step time minus blocked communication), for slow.
  void step_compute(double seconds);

 private:
  struct Shared;  // what the enter hook reads: the current step, the hang, this rank
  void fired(const Fault& f, int step);

  std::vector<Fault> mine_;
  std::vector<Fault> all_;
  int rank_, attempt_;
  std::shared_ptr<Shared> shared_;
  bool slow_announced_ = false;
  int sdcgrad_fired_step_ = 0;  // the step whose sdcgrad fired (a rerun of it does not fire again)
  double base_compute_ = 0;     // the last step's compute time without our own sleep
  double slept_ = 0;            // what this step slept
};

}  // namespace mt
