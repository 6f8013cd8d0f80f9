// Errors: every failure the user can cause (bad config, bad file, bad layout) becomes an mt::Error whose
// message names the problem; the CLI prints it and exits non-zero. Programming errors use the same path.
//
// Each error has a kind, and each kind its own exit code (exit_code below; the table in docs/running.md), so that whatever
// supervises a rank can tell "restarting cannot help" (a bad config, bad data: codes 10-19) from "restarting may
// help" (a timeout, a lost peer, a device or I/O fault, a non-finite step, replicas whose
// parameters disagree: codes 20-29). MT_CHECK throws kind
// Internal; the layers that know what a failure means give it its kind, either where they throw (fail_as) or by
// re-labelling what a whole phase threw (with_kind: everything that fails while loading the config is Config).
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace mt {

enum class ErrorKind {
  Internal,     // a broken invariant, or a failure nobody classified yet
  Config,       // the run config or the command line is wrong (an impossible layout, a value out of range)
  Data,         // the data (shards, tokenizer files) is missing, corrupt or does not fit the config
  Checkpoint,   // a checkpoint is missing, corrupt or does not fit the run
  NonFinite,    // a loss, gradient norm or value to be saved is inf/nan
  CommTimeout,  // a collective or the store did not answer within parallel.timeout_s
  PeerLost,     // another rank or the store went away (connection closed or refused)
  Device,       // the accelerator failed (CUDA error, out of device memory)
  IO,           // a read or write of the file system failed (disk full, permission)
  Sdc,          // silent data corruption: data-parallel replicas' parameters disagree (train/sdc_check.h)
  Stopped,      // a stop was requested (SIGTERM/SIGINT) and the run stopped cleanly at a step boundary
};

// The process exit code of each kind. 1 is any other failure, 2 a command-line usage error.
constexpr int exit_code(ErrorKind k) {
  switch (k) {
    case ErrorKind::Internal: return 1;
    case ErrorKind::Config: return 10;
    case ErrorKind::Data: return 11;
    case ErrorKind::Checkpoint: return 12;
    case ErrorKind::NonFinite: return 20;
    case ErrorKind::CommTimeout: return 21;
    case ErrorKind::PeerLost: return 22;
    case ErrorKind::Device: return 23;
    case ErrorKind::IO: return 24;
    case ErrorKind::Sdc: return 25;
    case ErrorKind::Stopped: return 30;
  }
  return 1;
}

constexpr const char* kind_name(ErrorKind k) {
  switch (k) {
    case ErrorKind::Internal: return "internal";
    case ErrorKind::Config: return "config";
    case ErrorKind::Data: return "data";
    case ErrorKind::Checkpoint: return "checkpoint";
    case ErrorKind::NonFinite: return "non-finite";
    case ErrorKind::CommTimeout: return "communication timeout";
    case ErrorKind::PeerLost: return "peer lost";
    case ErrorKind::Device: return "device";
    case ErrorKind::IO: return "I/O";
    case ErrorKind::Sdc: return "silent data corruption";
    case ErrorKind::Stopped: return "stopped";
  }
  return "internal";
}

// The launcher's own exit codes (`megatrain launch`: the agent and the job driver), beside the ranks' codes above
// (which it passes on) and 128 + a signal that stopped it. docs/running.md has the whole table.
constexpr int kNoProgressExit = 40;     // gave up: no progress across restarts; do not requeue
constexpr int kRestartsSpentExit = 41;  // gave up: --max-restarts used up (the last failure's code is in the log)
constexpr int kNoNodesExit = 42;        // gave up: too few healthy nodes for any layout of the job (requeue: yes)
constexpr int kEvictedExit = 43;        // an agent's own exit: the driver evicted this node (replace it)
// The codes of an attempt the supervisor stopped itself (the ranks' own codes then only say they were stopped), each
// one that a restart may help: a hang (or a straggler to evict) is a timeout's, a node that stopped answering a lost
// peer's.
constexpr int kHangExit = exit_code(ErrorKind::CommTimeout);
constexpr int kNodeLostExit = exit_code(ErrorKind::PeerLost);

// Whether starting the same job again can succeed (a supervisor restarts only these).
constexpr bool restart_may_help(ErrorKind k) { return exit_code(k) >= 20 && exit_code(k) < 30; }

struct Error : std::runtime_error {
  explicit Error(const std::string& what, ErrorKind kind = ErrorKind::Internal)
      : std::runtime_error(what), kind(kind) {}
  ErrorKind kind;
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

template <typename... Args>
[[noreturn]] void fail_as(ErrorKind kind, fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...), kind);
}

// Runs f(); an mt::Error of kind Internal that escapes it is re-thrown with `kind` (an error that already has a
// kind keeps it: a lost peer while reading a checkpoint stays PeerLost).
template <typename F>
decltype(auto) with_kind(ErrorKind kind, F&& f) {
  try {
    return std::forward<F>(f)();
  } catch (const Error& e) {
    if (e.kind != ErrorKind::Internal) throw;
    throw Error(e.what(), kind);
  }
}

}  // namespace mt

// MT_CHECK(cond, "format {}", args...): throws mt::Error (kind Internal) with the message when cond is false.
#define MT_CHECK(cond, ...)               \
  do {                                    \
    if (!(cond)) ::mt::fail(__VA_ARGS__); \
  } while (0)
