// A stop request: SIGTERM or SIGINT (a scheduler's preemption, a supervisor, Ctrl-C) sets a flag instead of killing
// the process mid-step. The trainer polls it at step boundaries, finishes the step, writes a checkpoint when
// checkpoints are configured, and exits with the Stopped exit code (core/error.h). A second SIGINT kills at once,
// so a stuck run can still be interrupted by hand.
#pragma once

namespace mt {

// Installs the handlers (idempotent). Only the CLI installs them: a library user keeps its own signal policy.
void install_stop_handlers();
bool stop_requested();
void request_stop();        // the same as a signal, for tests and embedders
void clear_stop_request();

}  // namespace mt
