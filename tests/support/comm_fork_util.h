// Multi-process tests without MPI: fork one child per rank, run a function in it, collect its verdict.
// A child reports failure by throwing (its message comes back through a pipe) and never returns into GoogleTest:
// it leaves with _exit. Children die with the parent (PR_SET_PDEATHSIG) and are killed at the deadline, so none
// outlives the test.
#pragma once
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace comm_test {

// Runs fn(rank) in one child per entry of `ranks`. Returns "" when every child exits cleanly within deadline_s;
// otherwise one line per failing rank with its message. deadline_s only guards against a hang: generous for a slow or
// busy machine, and above the groups' and stores' 60 s timeouts so that those report first.
inline std::string run_procs(const std::vector<int>& ranks, const std::function<void(int)>& fn,
                             double deadline_s = 120) {
  struct Child {
    int rank;
    pid_t pid;
    int fd;
    std::string msg;
    bool eof = false;
  };
  std::vector<Child> kids;
  const pid_t parent = ::getpid();
  for (int rank : ranks) {
    int p[2];
    if (::pipe(p) != 0) throw std::runtime_error("pipe failed");
    pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(3);
      ::signal(SIGPIPE, SIG_IGN);  // as a rank does (cmd_train.cpp): a write to a dead peer is then a PeerLost error
      ::close(p[0]);
      for (auto& k : kids) ::close(k.fd);
      std::string err;
      try {
        fn(rank);
      } catch (const std::exception& e) {
        err = e.what();
      } catch (...) {
        err = "unknown exception";
      }
      if (!err.empty()) {
        ssize_t w = ::write(p[1], err.data(), err.size());
        (void)w;
      }
      ::_exit(err.empty() ? 0 : 1);
    }
    ::close(p[1]);
    kids.push_back({rank, pid, p[0], {}});
  }
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration<double>(deadline_s);
  size_t open = kids.size();
  while (open > 0 && Clock::now() < deadline) {
    std::vector<pollfd> fds;
    for (auto& k : kids)
      if (!k.eof) fds.push_back({k.fd, POLLIN, 0});
    ::poll(fds.data(), fds.size(), 50);
    for (auto& f : fds) {
      if (!(f.revents & (POLLIN | POLLHUP | POLLERR))) continue;
      for (auto& k : kids) {
        if (k.fd != f.fd || k.eof) continue;
        char buf[4096];
        ssize_t n = ::read(k.fd, buf, sizeof buf);
        if (n > 0) {
          k.msg.append(buf, static_cast<size_t>(n));
        } else {
          k.eof = true;
          --open;
        }
      }
    }
  }
  std::string report;
  for (auto& k : kids) {
    bool timed_out = !k.eof;
    if (timed_out) ::kill(k.pid, SIGKILL);
    int status = 0;
    ::waitpid(k.pid, &status, 0);
    ::close(k.fd);
    if (timed_out) {
      report += fmt::format("rank {}: still running after {} s, killed\n", k.rank, deadline_s);
    } else if (WIFSIGNALED(status)) {
      report += fmt::format("rank {}: killed by signal {} {}\n", k.rank, WTERMSIG(status), k.msg);
    } else if (WEXITSTATUS(status) != 0) {
      report += fmt::format("rank {}: {}\n", k.rank,
                            k.msg.empty() ? "exit code " + std::to_string(WEXITSTATUS(status)) : k.msg);
    }
  }
  return report;
}

inline std::string run_procs(int n, const std::function<void(int)>& fn, double deadline_s = 120) {
  std::vector<int> ranks;
  for (int i = 0; i < n; ++i) ranks.push_back(i);
  return run_procs(ranks, fn, deadline_s);
}

}  // namespace comm_test
