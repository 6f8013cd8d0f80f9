#include "megatrain/launch/process_util.h"

#include <dirent.h>
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

namespace mt::launch {

void write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t k = ::write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return;
    p += k, n -= size_t(k);
  }
}

void say(const std::string& msg) {
  std::string line = "launch: " + msg + "\n";
  write_all(2, line.data(), line.size());
}

std::string describe_status(int st) {
  if (WIFEXITED(st)) return fmt::format("exited with code {}", WEXITSTATUS(st));
  int sig = WTERMSIG(st);
  return fmt::format("was killed by signal {} ({})", sig, ::strsignal(sig));
}

int exit_code_of(int st) { return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st); }

std::string plural(int n, const char* what) { return fmt::format("{} {}{}", n, what, n == 1 ? "" : "s"); }

std::vector<pid_t> my_children() {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc/self/task");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(fmt::format("/proc/self/task/{}/children", e->d_name));
    for (pid_t p; f >> p;) out.push_back(p);
  }
  ::closedir(d);
  return out;
}

}  // namespace mt::launch
