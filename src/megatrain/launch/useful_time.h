// Effective training time, the measure MegaScale gives a job that must survive faults: the time of the steps whose
// results the job kept, over the job's wall time. Everything else is lost to faults or overhead: starting and
// rendezvous, loading checkpoints, detecting a failure, the backoff, the steps a restart computes again (those after
// the checkpoint it resumes from), evaluation and checkpoint stalls.
//
// A step's time is rank 0's step time (its heartbeat's step_time, the very double of its metrics line's
// step_seconds). When a step is reported again (a restart recomputes it), the new report replaces the old one and
// every later step is forgotten: those were lost with the attempt that made them. What remains is the run's final
// history, one entry per step, as metrics.jsonl keeps it (a resumed run drops the lines of steps it runs again).
#pragma once
#include <map>
#include <string>

#include <nlohmann/json.hpp>

namespace mt::launch {

class EventLog;  // event_log.h

class UsefulTime {
 public:
  // Rank 0 completed `step` in `seconds`.
  void step(int step, double seconds);
  // The kept steps' time: summed in step order from 0, so it equals summing metrics.jsonl's train lines in order.
  double seconds() const { return sum_; }
  int steps() const { return int(steps_.size()); }

 private:
  std::map<int, double> steps_;
  double sum_ = 0;  // of steps_, in step order (O(1) a new step; a restart's replay sums afresh, once)
};

// {"useful_s", "wall_s", "effective_training"} for the job's last event (done, gave_up), wall_s since it started.
nlohmann::json effective_training_json(const UsefulTime& u, double wall_s);
// "effective training time 87.3%: the 120 steps kept took 52.4 s of the job's 60.0 s" (for the launcher's output).
std::string effective_training_line(const UsefulTime& u, double wall_s);

// Writes the job's last event (done, gave_up) with `fields`. A training job's (useful non-null) also carries its
// effective training time over wall_s, which is said too, after `prefix` (the driver's "driver: ").
void write_job_end(EventLog& log, const std::string& event, nlohmann::json fields, const UsefulTime* useful,
                   double wall_s, const std::string& prefix);

}  // namespace mt::launch
