// When the supervisor restarts a failed attempt, and when it gives up. Pure decisions, so they are unit-tested
// without processes:
//  - Codes that restarting cannot help (usage 2; config 10, data 11, checkpoint 12: core/error.h) end the job
//    with that code at once.
//  - Anything else (non-finite 20, comm timeout 21, peer lost 22, device 23, I/O 24, a crash by signal, an
//    unclassified error 1, a hang the supervisor detected) is restarted, up to max_restarts times, after a backoff
//    that doubles from backoff_s to backoff_max_s.
//  - An attempt that ends without passing the best step any earlier attempt reached made no progress; after
//    no_progress_limit such attempts in a row the job exits with kNoProgressExit, which tells a scheduler not to
//    requeue it (the fault follows the job: a bad batch, a bad checkpoint, a broken node it keeps landing on).
#pragma once
#include <set>
#include <string>

#include "megatrain/core/error.h"  // kNoProgressExit, kRestartsSpentExit

namespace mt::launch {

struct RestartPolicy {
  int max_restarts = 0;
  double backoff_s = 1.0;
  double backoff_max_s = 30.0;
  int no_progress_limit = 3;
};

struct RestartDecision {
  bool restart = false;
  int exit_code = 0;   // when not restarting
  double delay_s = 0;  // when restarting
  std::string reason;
};

// exit_code: the failed attempt's code (the first failing rank's, 128 + signal for a signal; 0 never comes here);
// restarts_done: restarts before this one; no_progress_run: consecutive attempts, this one included, that did not
// pass the best step before them.
RestartDecision decide_restart(const RestartPolicy& p, int exit_code, int restarts_done, int no_progress_run);

// Whether a restart can change the outcome of a failure with this exit code.
bool restart_may_help(int exit_code);

// The bookkeeping across attempts that both supervisors keep (one node's agent, and the job driver for several):
// the best step reached, restarts used, attempts in a row without progress, and the batches to skip. A batch that
// makes the loss non-finite at the same step in two attempts in a row is the data's fault, not the machine's: the
// next attempts skip it (train.skip_steps).
class RestartTracker {
 public:
  explicit RestartTracker(RestartPolicy p) : p_(p) {}

  int best_step() const { return best_; }
  int restarts() const { return restarts_; }
  const std::set<int>& skip_steps() const { return skip_; }

  // An attempt ended. code 0 is success (no decision needed: the job is done); otherwise the decision, and in
  // `skip_note` a line when a step was added to skip_steps. attempt_best: the best step the attempt reached;
  // nonfinite_step: the step a rank reported a non-finite loss at (-1: none).
  RestartDecision after_attempt(int code, int attempt_best, int nonfinite_step, std::string* skip_note = nullptr);

 private:
  RestartPolicy p_;
  int best_ = 0, restarts_ = 0, no_progress_run_ = 0, last_nonfinite_ = -1;
  std::set<int> skip_;
};

}  // namespace mt::launch
