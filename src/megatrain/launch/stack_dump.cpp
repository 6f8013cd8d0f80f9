#include "megatrain/launch/stack_dump.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "megatrain/core/clock.h"
#include "megatrain/launch/process_util.h"

namespace mt::launch {

namespace {

// The mt:: function a backtrace line is in, or "": "#3  0x55d0 in mt::comm::X::recv(int) ()", or without an address
// (an inlined frame, or a build with -g) "#3  mt::X::f (this=...) at f.cpp:12". The name runs to its argument list,
// the first '(' outside template brackets that is not part of "(anonymous namespace)" or "{lambda(...)#1}".
std::string project_function(const std::string& line) {
  if (line.rfind("#", 0) != 0) return "";
  size_t at = line.find(" in mt::");
  if (at != std::string::npos) {
    at += 4;
  } else {
    const size_t sp = line.find(' ');
    at = sp == std::string::npos ? sp : line.find_first_not_of(' ', sp);
    if (at == std::string::npos || line.compare(at, 4, "mt::") != 0) return "";
  }
  int depth = 0;
  size_t end = at;
  for (; end < line.size(); ++end) {
    const char c = line[end];
    if (c == '<') ++depth;
    if (c == '>') --depth;
    if (c != '(' || depth != 0) continue;
    if (line.compare(end, 21, "(anonymous namespace)") == 0) {
      end += 20;
      continue;
    }
    if (end >= 7 && line.compare(end - 7, 7, "{lambda") == 0) {
      for (int paren = 0; end < line.size(); ++end) {
        if (line[end] == '(') ++paren;
        if (line[end] == ')' && --paren == 0) break;
      }
      continue;
    }
    break;
  }
  std::string name = line.substr(at, end - at);
  while (!name.empty() && name.back() == ' ') name.pop_back();  // "mt::f (this=...)": gdb's form with arguments
  return name;
}

}  // namespace

std::vector<std::string> innermost_project_frames(const std::string& text) {
  // Per thread, its innermost megatrain frames: three for the main thread (gdb's Thread 1: where the step is), one
  // for the others (what each helper thread is: a group's worker, the loader, the heartbeat). Main first; a helper
  // line that repeats another is left out.
  std::vector<std::string> out;
  std::string main_line;
  std::istringstream in(text);
  std::vector<std::string> names;
  bool is_main = false;
  auto flush = [&] {
    if (names.empty()) return;
    if (is_main) {
      std::string l = "main: " + names[0];
      for (size_t i = 1; i < names.size() && i < 3; ++i) l += " < " + names[i];
      main_line = l;
    } else if (std::find(out.begin(), out.end(), names[0]) == out.end()) {
      out.push_back(names[0]);
    }
    names.clear();
  };
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("Thread ", 0) == 0) {
      flush();
      is_main = line.rfind("Thread 1 ", 0) == 0;
      continue;
    }
    if (std::string f = project_function(line); !f.empty()) names.push_back(f);
  }
  flush();
  if (!main_line.empty()) out.insert(out.begin(), main_line);
  return out;
}

StackDump dump_stacks(pid_t pid, double timeout_s) {
  StackDump d;
  const double t0 = now_seconds();
  char path[] = "/tmp/mt-stacks-XXXXXX";
  const int fd = ::mkstemp(path);
  if (fd < 0) {
    d.error = fmt::format("cannot make a temporary file: {}", std::strerror(errno));
    return d;
  }
  const std::string pid_s = std::to_string(pid);
  const pid_t child = ::fork();
  if (child == 0) {
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    const int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0) ::dup2(null, 0);
    ::setpgid(0, 0);  // a group of its own: a timeout kills gdb and whatever it started
    sigset_t none;    // the agent blocks the signals it reads through a signalfd; gdb gets them back
    ::sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    // Before attaching (-iex): never ask a debuginfod server (a cluster node may wait on one it cannot reach) and
    // load no Python pretty-printers (bt does not use them). Shared libraries' symbols stay, though skipping them
    // made gdb 3x faster here (0.35 s against 1 s): a hang inside NCCL or the CUDA runtime is named by them.
    const char* argv[] = {"gdb",  "-batch",
                          "-nx",  "-q",
                          "-iex", "set debuginfod enabled off",
                          "-iex", "set auto-load off",
                          "-p",   pid_s.c_str(),
                          "-ex",  "set pagination off",
                          "-ex",  "thread apply all bt",
                          nullptr};
    ::execvp("gdb", const_cast<char* const*>(argv));
    std::fprintf(stderr, "cannot run gdb: %s\n", std::strerror(errno));
    ::_exit(127);
  }
  ::close(fd);
  int st = 0;
  bool timed_out = false;
  if (child < 0) {
    d.error = fmt::format("cannot fork: {}", std::strerror(errno));
  } else {
    for (;;) {
      const pid_t r = ::waitpid(child, &st, WNOHANG);
      if (r == child) break;
      if (r < 0 && errno != EINTR) break;
      if (now_seconds() - t0 > timeout_s) {
        ::kill(-child, SIGKILL);
        ::waitpid(child, &st, 0);
        timed_out = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    d.text = ss.str();
  }
  ::unlink(path);
  d.seconds = now_seconds() - t0;
  d.frames = innermost_project_frames(d.text);
  if (d.error.empty()) {
    if (timed_out) {
      d.error = fmt::format("gdb did not finish within {:.0f} s", timeout_s);
    } else if (WIFEXITED(st) && WEXITSTATUS(st) == 127) {
      d.error = "no gdb on this node (apt-get install gdb)";
    } else if (d.text.find("Thread ") == std::string::npos && d.text.find("#0 ") == std::string::npos) {
      // gdb says why on its output: "ptrace: Operation not permitted." and the like
      std::string first = d.text.substr(0, d.text.find('\n'));
      for (const char* key : {"ptrace:", "Could not attach", "warning: process"})
        if (size_t k = d.text.find(key); k != std::string::npos) first = d.text.substr(k, d.text.find('\n', k) - k);
      d.error = "gdb got no stacks: " + (first.empty() ? describe_status(st) : first);
    }
  }
  return d;
}

}  // namespace mt::launch
