// One rank as the launcher sees it: a child process in its own process group, with its stdout and stderr read
// through pipes and copied to the launcher's, line by line, behind a "[rank R] " prefix.
#pragma once
#include <signal.h>
#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

namespace mt::launch {

// One output stream of a rank. Bytes are split into lines and each line goes to `target` in a single write, so the
// ranks' lines never interleave mid-line. A line longer than 64 KiB is cut there (a rank printing a huge blob
// without a newline must not grow the launcher without bound).
class OutputStream {
 public:
  using LineHook = std::function<void(const std::string& line)>;  // the line without its newline

  OutputStream() = default;
  // target < 0: lines only go to the hook.
  OutputStream(int fd, int target, std::string prefix, bool prefixed);

  int fd() const { return fd_; }
  void set_hook(LineHook hook) { hook_ = std::move(hook); }
  // Reads everything the pipe holds now (it is non-blocking); closes the stream at end of file.
  void drain();
  // Splits and forwards bytes; drain() calls it, tests call it directly.
  void feed(const char* data, size_t n);
  // Forwards a partial last line and closes the pipe.
  void close();

 private:
  void flush_partial();
  void forward(std::string_view line);  // line without newline

  int fd_ = -1;
  int target_ = 1;
  std::string prefix_;
  bool prefixed_ = true;
  std::string partial_;
  LineHook hook_;
};

// The rank's end of its heartbeat pipe (train/heartbeat.h writes there when MEGATRAIN_HEARTBEAT_FD names it).
constexpr int kHeartbeatFd = 3;

// What every rank of a launch is started with; env differs per rank.
struct SpawnSpec {
  std::vector<std::string> argv;  // argv[0]: a path (search_path = false) or a program name looked up in PATH
  bool search_path = false;
  std::string exec_path;   // when set, the file executed (argv[0] is then only the name the rank sees)
  bool heartbeat = false;  // give the rank a heartbeat pipe (MEGATRAIN_HEARTBEAT_FD)
  sigset_t child_mask{};   // the signal mask the child gets back before exec
};

struct RankProcess {
  int global = 0;  // global rank
  pid_t pid = -1;  // also its process group id
  bool running = false;
  OutputStream out, err;
  OutputStream hb;  // the heartbeat pipe's lines (not forwarded); fd -1 without one

  // Forks and execs the rank in a process group of its own that dies with the launcher (PR_SET_PDEATHSIG), with
  // stdin from /dev/null. Returns "" on success, else why it could not start (nothing is left running).
  std::string spawn(const SpawnSpec& spec, std::vector<std::string> env, bool prefixed);
};

}  // namespace mt::launch
