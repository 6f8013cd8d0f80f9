// Fault injection, for the supervisor's tests and benchmarks: MEGATRAIN_FAULTS is a ';'-separated list of
// `kind:key=value:...` items.
//   crash:rank=R:step=S       rank R kills itself with SIGKILL at the start of step S (as a real crash: no
//                              cleanup, no exit code, no checkpoint)
//   hang:rank=R:step=S        rank R blocks forever inside the first collective or transfer it enters at or after
//                              the start of step S: held before the op reaches the backend (its flight-recorder
//                              entry stays "posted"), while its heartbeat thread goes on, as with a stuck NCCL kernel
//   nan:rank=R:step=S         at the start of step S one weight of rank R's model becomes NaN, so its loss and
//                              gradients, and through the collectives every rank's gradient norm, turn NaN as in a
//                              real divergence: the run fails before the optimizer step (exit code 20)
//   slow:rank=R:factor=F[:step=S]   from step S (default 1) on, rank R sleeps (F-1) x its previous step's compute
//                              time at the start of each step: its compute time is stretched F times
//   badnode:node=N            read only by `megatrain diagnose` (fault_badnode): node N's checks fail
// Every kind also takes attempt=A. A fault fires only in attempt 0 (MEGATRAIN_ATTEMPT, set by the agent on each
// restart; default 0), or with attempt=A only in attempt A. A rank's node is MEGATRAIN_NODE_RANK (default 0).
// A fault that fires prints "fault injected: <item> (rank R, step S, attempt A)" to stderr, after a heartbeat
// event {"type":"event","event":"fault_injected","fault":<item>,"kind":..,"step":S,"attempt":A} when heartbeats are
// on. A malformed list is a Config error naming the item and what is allowed.
#pragma once
#include <atomic>
#include <memory>
#include <string>
#include <vector>

namespace mt {

class GPT;

enum class FaultKind { Crash, Hang, Nan, Slow, BadNode };
const char* fault_kind_name(FaultKind k);

struct Fault {
  FaultKind kind = FaultKind::Crash;
  std::string item;     // as written, for messages
  int rank = -1;        // crash, hang, nan, slow
  int node = -1;        // badnode
  int step = 0;         // crash, hang, nan: required (>= 1); slow: from this step on (default 1)
  double factor = 1;    // slow
  int attempt = -1;     // -1: fires in attempt 0 only
  bool fires_in(int a) const { return attempt < 0 ? a == 0 : a == attempt; }
};

// Parses a MEGATRAIN_FAULTS value (`source` names it in messages). Empty items (";;", a trailing ';') are skipped.
std::vector<Fault> parse_faults(const std::string& text, const std::string& source = "MEGATRAIN_FAULTS");
std::vector<Fault> faults_from_env();  // MEGATRAIN_FAULTS, or none
int attempt_from_env();                // MEGATRAIN_ATTEMPT, default 0 (Config error when malformed)
int node_from_env();                   // MEGATRAIN_NODE_RANK, default 0

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
  double base_compute_ = 0;  // the last step's compute time without our own sleep
  double slept_ = 0;         // what this step slept
};

}  // namespace mt
