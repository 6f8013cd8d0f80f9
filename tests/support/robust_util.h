// Ranks of the built `megatrain train` started by hand (no launcher in between, so a test sees each rank's own exit
// status and signal), each with a heartbeat pipe the test reads, and stdout/stderr in a log file.
#pragma once
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "files.h"
#include "megatrain.h"
#include "megatrain/core/error.h"
#include "small_job.h"
#include "test_util.h"

extern char** environ;

namespace robust_test {

using mt::test::has;
using mt::test::kMegatrain;
using mt::test::slurp;

inline void prepare() { mt::test::prepare_small_brown(); }

// A small model on the Brown shards (the small test vocabulary), one thread per rank.
inline std::vector<std::string> small_flags(const std::string& out) {
  return mt::test::SmallJob(out).set("train.peak_tflops", 1).args();
}

// One rank: its pid, the read end of its heartbeat pipe, the lines read so far, its log.
struct Rank {
  int rank = 0;
  pid_t pid = -1;
  int hb_fd = -1;
  std::string partial;
  std::vector<nlohmann::json> lines;
  std::vector<std::string> raw;  // as read, for the size check
  std::string log;
  int status = -1;  // waitpid status once reaped
  bool reaped = false;

  // Reads what is in the pipe now (non-blocking); returns whether the writer side is closed.
  bool drain() {
    char buf[8192];
    for (;;) {
      const ssize_t n = ::read(hb_fd, buf, sizeof buf);
      if (n > 0) {
        partial.append(buf, static_cast<size_t>(n));
        size_t nl;
        while ((nl = partial.find('\n')) != std::string::npos) {
          raw.push_back(partial.substr(0, nl));
          lines.push_back(nlohmann::json::parse(raw.back()));
          partial.erase(0, nl + 1);
        }
        continue;
      }
      return n == 0;
    }
  }
  bool alive() {
    if (reaped) return false;
    if (::waitpid(pid, &status, WNOHANG) == pid) reaped = true;
    return !reaped;
  }
  // Waits up to `seconds` for the process to end; returns whether it did.
  bool wait_exit(double seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (alive() && std::chrono::steady_clock::now() < end) {
      drain();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    drain();
    return !alive();
  }
  void kill_now() {
    if (alive()) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      reaped = true;
    }
    drain();
    if (hb_fd >= 0) ::close(hb_fd);
    hb_fd = -1;
  }
  int exit_code() const { return reaped && WIFEXITED(status) ? WEXITSTATUS(status) : -1; }
  int signal() const { return reaped && WIFSIGNALED(status) ? WTERMSIG(status) : 0; }
  // Lines of a type ("hb") and, for hb lines, an "at" ("step"), or events of a name.
  std::vector<nlohmann::json> hb(const std::string& at = "") const {
    std::vector<nlohmann::json> out;
    for (auto& l : lines)
      if (l["type"] == "hb" && (at.empty() || l["at"] == at)) out.push_back(l);
    return out;
  }
  std::vector<nlohmann::json> events(const std::string& name) const {
    std::vector<nlohmann::json> out;
    for (auto& l : lines)
      if (l["type"] == "event" && l["event"] == name) out.push_back(l);
    return out;
  }
};

// Starts rank `rank` of `world` with a file store in store_dir, heartbeats on fd 3 every `interval` seconds, and
// the given extra environment (e.g. MEGATRAIN_FAULTS=...). Output goes to log.
inline Rank start_rank(int rank, int world, const std::string& store_dir, const std::vector<std::string>& args,
                       const std::string& log, const std::vector<std::string>& extra_env = {}, double interval = 0.2) {
  int p[2];
  MT_CHECK(::pipe(p) == 0, "pipe failed");
  std::vector<std::string> env = {"MEGATRAIN_HEARTBEAT_FD=3",
                                  "MEGATRAIN_HEARTBEAT_INTERVAL=" + std::to_string(interval), "OMP_NUM_THREADS=1"};
  if (world > 1)  // else a single process, as `megatrain train` run by hand
    env.insert(env.end(), {"RANK=" + std::to_string(rank), "WORLD_SIZE=" + std::to_string(world),
                           "LOCAL_RANK=" + std::to_string(rank), "LOCAL_WORLD_SIZE=" + std::to_string(world),
                           "MEGATRAIN_STORE=file://" + store_dir});
  env.insert(env.end(), extra_env.begin(), extra_env.end());
  for (char** e = environ; *e; ++e) {
    const std::string s = *e;
    const std::string key = s.substr(0, s.find('='));
    bool ours = false;
    for (const std::string& x : env) ours = ours || x.substr(0, x.find('=')) == key;
    const bool launcher = key == "RANK" || key == "WORLD_SIZE" || key == "LOCAL_RANK" || key == "LOCAL_WORLD_SIZE" ||
                          key.rfind("MEGATRAIN_", 0) == 0 || key.rfind("SLURM_", 0) == 0;
    if (!ours && !launcher) env.push_back(s);
  }
  std::vector<std::string> argv_s = {kMegatrain, "train"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv, envp;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  MT_CHECK(pid >= 0, "fork failed");
  if (pid == 0) {  // async-signal-safe calls only until exec
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::close(p[0]);  // first: it may be fd 3
    ::dup2(out, 1);
    ::dup2(out, 2);
    if (p[1] != 3) {
      ::dup2(p[1], 3);
      ::close(p[1]);
    }
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(p[1]);
  ::fcntl(p[0], F_SETFL, O_NONBLOCK);
  Rank r;
  r.rank = rank;
  r.pid = pid;
  r.hb_fd = p[0];
  r.log = log;
  return r;
}

// Polls every rank's pipe until pred() holds or `seconds` pass (a hang guard); returns whether it held.
inline bool poll_until(std::vector<Rank*> ranks, const std::function<bool()>& pred, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    for (Rank* r : ranks) r->drain();
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (Rank* r : ranks) r->drain();
  return pred();
}

// The newest hb line's step (0 without one).
inline int last_step(const Rank& r) {
  auto hb = r.hb();
  return hb.empty() ? 0 : hb.back()["step"].get<int>();
}

}  // namespace robust_test
