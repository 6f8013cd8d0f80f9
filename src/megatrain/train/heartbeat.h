// Heartbeats: how a rank tells its supervisor (the per-node agent of `megatrain launch`) that it is alive and what
// it is doing. Enabled when MEGATRAIN_HEARTBEAT_FD=<fd> is set (the write end of a pipe the agent reads); without
// it nothing is written and nothing runs.
//
// The protocol: one compact JSON object per line, each line one write() of at most PIPE_BUF bytes (so lines of
// ranks sharing a pipe never interleave). Three types:
//   {"type":"hb","rank":R,"coord":[dp,pp,tp]|null,"t":<unix s>,"at":"step"|"tick"|"exit","step":S,
//    "phase":"init|forward_backward|optimizer|eval|checkpoint|done","loss":x|null,"step_time":s|null,
//    "compute_time":s|null,"tokens_per_s":x|null,"mfu":x|null,"rss":bytes,"colls":[{"group":"dp[1,3]","op":"all_gather","seq":41,"state":"started",
//    "wait_s":12.5}, ...]}
//     step: the last completed step (0 before the first); while phase is forward_backward or optimizer the rank
//     works on step+1. loss, step_time, compute_time: that step's (compute_time = step time minus the
//     communication time the rank was blocked on: the straggler measure to compare across ranks); tokens_per_s and
//     mfu: the job's, as this rank measured its step (train/observer.h StepStats; null before a step). colls: per
//     process group, its oldest op not completed (with wait_s, seconds since it was posted), else its newest
//     (comm/flight_recorder.h). "at": a step end, a timer tick, or the last line before the run returns/throws.
//   {"type":"moe",...}: the main rank's MoE routing load after each step line of a MoE model (obs/moe_load.h).
//   {"type":"event","event":NAME,"rank":R,"t":<unix s>,"step":S,...}: fault_injected, non_finite, loss_spike,
//     batch_skipped, error (see train/rank_guard.h for their fields), sdc and sdc_culprit (train/sdc_check.h).
// A line is written at every step end and by a background thread whenever none was written for
// MEGATRAIN_HEARTBEAT_INTERVAL seconds (default 2): heartbeats go on while the training thread is blocked in a
// collective, and stop when the process is stopped (SIGSTOP) or dead, which is how the agent tells them apart.
// Only the background thread writes, so the training thread never blocks on a full pipe; SIGPIPE is blocked on it
// (the agent may go away: the rank then trains on, its heartbeats dropped).
#pragma once
#include <atomic>
#include <condition_variable>
#include <functional>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "megatrain/comm/mesh.h"
#include "megatrain/obs/moe_load.h"

namespace mt {

enum class Phase { Init, ForwardBackward, Optimizer, Eval, Checkpoint, Done };
const char* phase_name(Phase p);

// The fd and interval from MEGATRAIN_HEARTBEAT_FD and MEGATRAIN_HEARTBEAT_INTERVAL; nullopt when the fd is unset.
// A malformed value is a Config error naming the variable.
struct HeartbeatSettings {
  int fd = -1;
  double interval_s = 2.0;
};
std::optional<HeartbeatSettings> heartbeat_settings_from_env();

class Heartbeat {
 public:
  // Starts the background thread (phase init) and becomes the process's current heartbeat (for heartbeat_phase
  // and heartbeat_event below).
  Heartbeat(const HeartbeatSettings& s, int rank);
  // Writes the "exit" line (phase done when finished() was called) and stops the thread.
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  void set_coord(const MeshCoord& c);
  // The job's layout: dp, pp, tp and train.grad_accum (a supervisor that changes dp must keep the global batch),
  // and the step this run started from (0, or the checkpoint's): "layout" and "start_step" in every line after.
  void set_layout(int dp, int pp, int tp, int grad_accum, int start_step);
  void set_phase(Phase p);
  void set_step(int step);  // the last completed step, without a step line (a skipped batch)
  // A step completed: records its numbers and writes the step line.
  void step_done(int step, double loss, double step_time, double compute_time, double tokens_per_s, double mfu);
  // A MoE model's routing load at the step just reported: obs/moe_load.h's "moe" lines, each under PIPE_BUF.
  void moe_load(int step, const std::vector<obs::MoeLayerLoad>& layers);
  // An event line; sync: returns once it was written (or after 10 s), for a fault about to end the process.
  void event(const std::string& name, nlohmann::ordered_json fields, bool sync = false);
  void finished() { set_phase(Phase::Done); }

  // The hb line as it would be written now ("at": at), for tests and the writer.
  std::string hb_line(const char* at) const;

 private:
  // Builds a line with make() and queues it, both under order_mu_ (see there).
  void enqueue(const std::function<std::string()>& make, bool sync);
  void run();
  bool write_line(const std::string& line);

  const HeartbeatSettings settings_;
  const int rank_;
  // Held from a line's time stamp ("t") until it is in the queue, by every producer and by the writer while it
  // stamps a tick and takes the queue: so lines reach the reader in the order of their "t". (Taken before mu_.)
  std::mutex order_mu_;
  mutable std::mutex mu_;  // the state below and the queue
  std::condition_variable cv_, written_cv_;
  std::optional<MeshCoord> coord_;
  std::optional<nlohmann::ordered_json> layout_;
  std::optional<int> start_step_;
  Phase phase_ = Phase::Init;
  int step_ = 0;
  std::optional<double> loss_, step_time_, compute_time_, tokens_per_s_, mfu_;
  std::deque<std::string> queue_;
  uint64_t enqueued_ = 0, written_ = 0;
  bool stop_ = false, broken_ = false;
  double last_write_ = 0;
  std::thread thread_;
};

// The current heartbeat's phase and events; no-ops when there is none (MEGATRAIN_HEARTBEAT_FD unset).
void heartbeat_phase(Phase p);
void heartbeat_event(const std::string& name, nlohmann::ordered_json fields, bool sync = false);

// Bytes of resident memory of this process (from /proc/self/statm; 0 where unavailable).
uint64_t resident_bytes();

}  // namespace mt
