// The trainer's side of the timeline (obs/timeline.h): it measures this rank's clock against rank 0's once at the
// start, switches recording on for the steps of train.trace_steps = [first, last], and when the window closes (or
// the run ends inside it) writes <out_dir>/trace/rank<R>.json. Then every rank meets once on the host mesh and the
// main rank, where it sees all ranks' files (one host, or a shared file system), merges them into
// <out_dir>/trace.json and prints what the merged trace says (obs/trace_check.h), unless the files are too large to
// merge on the job's clock (over 256 MiB); otherwise it says how to merge them.
// A run without train.trace_steps does none of this and records nothing.
// On a GPU the host spans show when work was enqueued; the backend's op timings (Ops::set_op_timing, CUDA events)
// add each op's device time on a "device" track, placed from the idle device's first op (Ops::op_timing_base).
#pragma once
#include <string>

#include "megatrain/comm/clock_offset.h"
#include "megatrain/train/run_config.h"
#include "megatrain/train/topology.h"

namespace mt {

class TraceWindow {
 public:
  TraceWindow(const RunConfig& cfg, Topology& topo);  // measures the clock offset when a window is set
  ~TraceWindow();                                     // a window still open is written, without the merge
  void before_step(int step);
  void after_step(int step);  // closes the window after its last step: write, meet, merge
  void finish();              // the run ended normally: a window still open closes as after its last step
  bool enabled() const { return first_ > 0; }

 private:
  void write();
  void merge();
  void drain_device();  // the finished ops' device times, as spans on the "device" track

  const RunConfig& cfg_;
  Topology& topo_;
  int first_ = 0, last_ = 0;
  bool open_ = false, done_ = false;
  bool device_ = false;  // a GPU backend: its ops' device times are traced too
  int first_recorded_ = 0, last_recorded_ = 0;
  ClockOffset clock_;
  std::string dir_;
};

}  // namespace mt
