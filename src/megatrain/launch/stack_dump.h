// The native stacks of a hung rank, taken before the supervisor kills it: which function each of its threads is in
// (a Gloo recv, a cudaStreamSynchronize, a lock in the data loader). The hang's blame line says which rank and which
// collective; the stacks say where in the code it stopped, which is what a person needs to fix a hang that comes
// back. They are read with gdb (Debian's package, which scripts/setup installs), attached for a moment:
//   gdb -batch -nx -iex "set debuginfod enabled off" -iex "set auto-load off" -p PID -ex "thread apply all bt"
// (about a second on an idle node; many times that on a loaded one: --stack-timeout).
// A rank under the launcher lets its parent's descendants attach (prctl PR_SET_PTRACER in main.cpp), so this works
// where Yama restricts ptrace to ancestors (ptrace_scope 1); scope 2 or 3, or no gdb, gives an error that says so.
#pragma once
#include <sys/types.h>

#include <string>
#include <vector>

namespace mt::launch {

struct StackDump {
  std::string text;                 // gdb's output: every thread's backtrace
  std::vector<std::string> frames;  // per thread that has one, its innermost megatrain function (mt::...), once each
  std::string error;                // "" on success; else why there are no stacks
  double seconds = 0;               // how long it took
};

// Attaches gdb to `pid` for at most timeout_s (then gdb is killed and the error says so).
StackDump dump_stacks(pid_t pid, double timeout_s);

// The innermost mt:: function of each thread in a gdb backtrace (the part of `frames` above), in thread order.
std::vector<std::string> innermost_project_frames(const std::string& gdb_text);

}  // namespace mt::launch
