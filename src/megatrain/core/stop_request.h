// A stop request: SIGTERM or SIGINT (a scheduler's preemption, a supervisor, Ctrl-C) sets a flag instead of killing
// the process mid-step. The trainer polls it at step boundaries, finishes the step, writes a checkpoint when
// checkpoints are configured, and exits with the Stopped exit code (core/error.h). A second SIGINT kills at once,
// so a stuck run can still be interrupted by hand.
#pragma once

namespace mt {

// Installs the handlers (idempotent). Only the CLI installs them: a library user keeps its own signal policy.
void install_stop_handlers();
bool stop_requested();
void request_stop();  // the same as a signal, for tests and embedders
void clear_stop_request();

// An abandon request: SIGUSR1 from a supervisor that has ended the attempt because a peer is gone (a crashed rank, a
// lost node). A rank waiting for a collective then gives up at once with a lost-peer error, instead of waiting for a
// peer that may never answer (a host that died or was cut off sends no reset: the wait would last the group
// timeout, and the supervisor's SIGKILL after its grace period would take this rank's in-memory snapshots with it).
// The trainer writes those snapshots for the restart and exits 22. A rank that is computing notices at its next wait.
// install_stop_handlers installs this handler too.
bool abandon_requested();
void request_abandon();  // the same as the signal, for tests
void clear_abandon_request();

}  // namespace mt
