// Helpers of the tests that run supervised jobs with the built `megatrain` (launch_faults_test: one node;
// launch_nodes_test: several agents on this host as nodes): starting a launcher with its output in a file, waiting
// for it, and finding a rank's process. (Its event log and metrics: metrics.h.)
#pragma once
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <sys/file.h>

#include <chrono>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <functional>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "files.h"
#include "megatrain.h"
#include "megatrain/core/clock.h"
#include "metrics.h"
#include "small_job.h"
#include "test_util.h"

namespace mt::test {

// The Brown shards in the small test vocabulary (kSmallBrown) that every job here trains on.
inline void prepare_launch_data() { prepare_small_brown(); }

// The pid of the process whose environment has RANK=<rank>, among the launcher's children.
inline pid_t rank_pid(pid_t launcher, int rank) {
  namespace fs = std::filesystem;
  for (auto& t : fs::directory_iterator(fmt::format("/proc/{}/task", launcher))) {
    std::ifstream kids(t.path() / "children");
    for (pid_t p; kids >> p;) {
      std::string env = slurp(fmt::format("/proc/{}/environ", p));
      std::string want = fmt::format("RANK={}", rank);
      for (size_t at = 0; (at = env.find(want, at)) != std::string::npos; ++at)
        if ((at == 0 || env[at - 1] == '\0') && (at + want.size() == env.size() || env[at + want.size()] == '\0'))
          return p;
    }
  }
  return -1;
}

// Starts `binary args...` with stdout and stderr in `log`; it dies with the test process.
inline pid_t start_logged(const std::string& binary, const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> all = {binary};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

// Why gdb cannot read a process's stacks on this machine ("" when it can): not installed (scripts/setup installs
// it), or ptrace refused (a container without CAP_SYS_PTRACE, Yama's ptrace_scope 2-3). Tried once on a child
// `sleep`, as the agent tries on a rank.
inline std::string gdb_cannot_attach() {
  static const std::string why = [] {
    const std::string out = std::filesystem::temp_directory_path() / fmt::format("mt-gdb-probe-{}.txt", ::getpid());
    const std::string cmd =
        fmt::format("command -v gdb >/dev/null || {{ echo 'no gdb' > {0}; exit 1; }}; sleep 30 & p=$!; "
                    "timeout 60 gdb -p $p -batch -nx -q -ex 'thread apply all bt' > {0} 2>&1; kill $p",
                    out);
    const int rc = std::system(cmd.c_str());
    const std::string text = slurp(out);
    std::filesystem::remove(out);
    if (rc == 0 && text.find("#0 ") != std::string::npos) return std::string();
    return "gdb cannot attach here: " + text.substr(0, text.find('\n'));
  }();
  return why;
}

// Waits for pid; its exit code (128 + signal when killed), or -1 (and a test failure) past timeout_s.
inline int finish_within(pid_t pid, double timeout_s) {
  const double t0 = now_seconds();
  int st = 0;
  for (pid_t r; (r = ::waitpid(pid, &st, WNOHANG)) != pid;) {
    if (r < 0) {  // reaped already (a WNOHANG check that saw it end): waiting on would last the whole timeout
      ADD_FAILURE() << "process " << pid << " cannot be waited for (" << std::strerror(errno)
                    << "): it ended and was reaped earlier";
      return -1;
    }
    if (now_seconds() - t0 > timeout_s) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &st, 0);
      ADD_FAILURE() << "launch did not finish within " << timeout_s << " s";
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return shell_exit_code(st);
}

// Losses of an undisturbed run, computed once per build of the binary and per job: ctest runs each case as its own
// process, so the first case to take the lock runs `compute` and the others read its file. The key is the binary's
// size and time, a hash of the job's arguments but its --train.out_dir (each case writes its own), and the BLAS
// kernel OPENBLAS_CORETYPE forces, so neither a rebuilt megatrain, a changed job nor another kernel's rounding (a
// run under OPENBLAS_CORETYPE=Haswell, then one without: losses 5e-8 apart) meets old losses.
inline std::vector<std::string> cached_losses(const std::string& name, const std::vector<std::string>& job,
                                              const std::function<std::vector<std::string>()>& compute) {
  namespace fs = std::filesystem;
  std::string joined;  // where the run writes is no part of what it computes: cases with their own out_dir share
  for (const auto& a : job)
    if (a.rfind("--train.out_dir=", 0) != 0) joined += a + '\n';
  const char* core = std::getenv("OPENBLAS_CORETYPE");
  joined += std::string("OPENBLAS_CORETYPE=") + (core ? core : "") + '\n';
  const std::string cache = fmt::format("{}/test-data/{}-{}-{}-{:016x}.txt", MT_BINARY_DIR, name,
                                        fs::file_size(kMegatrain),
                                        fs::last_write_time(kMegatrain).time_since_epoch().count(),
                                        std::hash<std::string>{}(joined));
  const int fd = ::open((cache + ".lock").c_str(), O_CREAT | O_RDWR, 0644);
  EXPECT_GE(fd, 0);
  ::flock(fd, LOCK_EX);
  std::vector<std::string> losses;
  if (fs::exists(cache)) {
    std::ifstream f(cache);
    for (std::string l; std::getline(f, l);) losses.push_back(l);
  } else {
    losses = compute();
    std::ofstream f(cache + ".tmp");
    for (auto& l : losses) f << l << "\n";
    f.close();
    fs::rename(cache + ".tmp", cache);
  }
  ::flock(fd, LOCK_UN);
  ::close(fd);
  return losses;
}

// The job of the fault matrix and the multi-node tests: dp2 x tp2 on 4 ranks, 2 rows a rank, 10 steps, a line a
// step, a checkpoint every 2 steps and none at the end, 60 s for a collective; one tp piece per collective
// (launch_faults_test.cpp says why).
inline SmallJob dp2_tp2_job(const std::string& out) {
  return std::move(SmallJob(out)
                       .batch(2)
                       .steps(10)
                       .log_every(1)
                       .set("ckpt.every", 2)
                       .set("ckpt.save_final", "false")
                       .set("parallel.timeout_s", 60)
                       .set("parallel.tp_chunks", 1)
                       .with({"--parallel.dp=2", "--parallel.tp=2"}));
}

// The training job of the multi-node tests (launch_nodes_test, deploy_slurm_test): dp2_tp2_job (2 ranks per node,
// tp inside a node) keeping all its checkpoints. The `train` subcommand and its options, after launch's `--`.
inline std::vector<std::string> node_job(const std::string& out, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> a = {"train"};
  for (const std::string& f : dp2_tp2_job(out).set("ckpt.keep_last", 100).with(extra).args()) a.push_back(f);
  return a;
}

// MEGATRAIN_FAULTS for a test that disturbs node_job (4 ranks) once it has logged step 5: every rank's compute
// stretched 100 times (~1-2 s a step) from step 6 of attempt 0 on. Unslowed, steps take ~0.1 s, and a test process
// starved on a busy machine (ctest -j 8 on 2 cores) saw step 5 only after the job had finished, too late to disturb
// it. `slow` only sleeps, so the losses stay the undisturbed run's; later attempts run at full speed.
inline std::string slow_from_step6() {
  std::string f;
  for (int r = 0; r < 4; ++r) f += fmt::format("slow:rank={}:factor=100:step=6;", r);
  return f;
}

// The per-step losses of node_job undisturbed, on one 4-rank launcher (the oracle of the multi-node tests), run in
// `dir` once per build and shared by every test that asks (cached_losses).
inline std::vector<std::string> node_job_undisturbed(const std::filesystem::path& dir) {
  const std::string out = (dir / "undisturbed").string(), log = (dir / "undisturbed.log").string();
  std::vector<std::string> args = {"launch", "--nproc", "4", "--"};
  for (auto& s : node_job(out)) args.push_back(s);
  std::vector<std::string> losses = cached_losses("nodes-undisturbed", args, [&] {
    EXPECT_EQ(finish_within(start_logged(kMegatrain, args, log), 400), 0) << slurp(log);
    return step_losses(out + "/metrics.jsonl");
  });
  EXPECT_EQ(losses.size(), 10u);
  return losses;
}

}  // namespace mt::test
