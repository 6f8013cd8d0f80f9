// The fault matrix of the supervisor (issue 12) on real training jobs: each fault is done to a running
// `megatrain launch --max-restarts ... -- train` job, which must finish by itself with the per-step losses of an
// undisturbed run (the oracle), and the event log must name the right rank and reason. Tests assert outcomes, not
// speed: the timeouts only guard against a test that would otherwise hang.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "megatrain/core/clock.h"
#include "test_util.h"

using namespace mt;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

const std::string kMegatrain = std::string(MT_BINARY_DIR) + "/megatrain";
const std::string kData = std::string(MT_BINARY_DIR) + "/test-data/brown";

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<nlohmann::json> events_of(const fs::path& p) {
  std::vector<nlohmann::json> out;
  std::ifstream f(p);
  for (std::string l; std::getline(f, l);) out.push_back(nlohmann::json::parse(l));
  return out;
}

// The newest step in a metrics file (0 when none yet).
int last_step(const fs::path& metrics) {
  int s = 0;
  std::ifstream f(metrics);
  for (std::string l; std::getline(f, l);) {
    auto j = nlohmann::json::parse(l, nullptr, false);
    if (!j.is_discarded() && j.value("kind", "") == "train") s = std::max(s, j.value("step", 0));
  }
  return s;
}

// The pid of the process whose environment has RANK=<rank>, among the launcher's children.
pid_t rank_pid(pid_t launcher, int rank) {
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

class LaunchFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    mt::test::prepare_brown_once(kMegatrain, kData);
    dir_ = fs::path(mt::test::temp_root()) /
           ("mt-faults-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // A 2-rank dp job of a very small model, 10 steps, a checkpoint every 2 steps.
  std::vector<std::string> job(const std::string& out, std::vector<std::string> launch_opts) {
    std::vector<std::string> a = {"launch", "--nproc", "2"};
    a.insert(a.end(), launch_opts.begin(), launch_opts.end());
    for (std::string s : {"--", "train", "--parallel.dp=2", "--model.n_layer=2", "--model.d_model=64",
                          "--model.n_head=2", "--model.max_seq_len=64", "--data.seq_len=32", "--data.batch_size=2",
                          "--optim.lr=3e-3", "--optim.warmup_steps=2", "--train.eval_every=0", "--sample.tokens=0",
                          "--train.log_every=1", "--train.threads=1", "--train.steps=10", "--ckpt.every=2",
                          "--ckpt.save_final=false", "--parallel.timeout_s=60"})
      a.push_back(s);
    a.push_back("--data.dir=" + kData);
    a.push_back("--train.out_dir=" + out);
    return a;
  }

  pid_t start(const std::vector<std::string>& args, const std::string& name) {
    std::vector<std::string> all = {kMegatrain};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const std::string log = (dir_ / (name + ".log")).string();
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

  int finish(pid_t pid, double timeout_s = 400) {
    const double t0 = now_seconds();
    int st = 0;
    while (::waitpid(pid, &st, WNOHANG) != pid) {
      if (now_seconds() - t0 > timeout_s) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &st, 0);
        ADD_FAILURE() << "launch did not finish within " << timeout_s << " s";
        return -1;
      }
      std::this_thread::sleep_for(20ms);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }

  // Waits until the run at `out` has logged step >= s (or the launcher is gone).
  void wait_for_step(pid_t launcher, const std::string& out, int s) {
    const double t0 = now_seconds();
    while (last_step(out + "/metrics.jsonl") < s) {
      ASSERT_EQ(::waitpid(launcher, nullptr, WNOHANG), 0) << "the job ended before step " << s;
      ASSERT_LT(now_seconds() - t0, 300) << "step " << s << " never came";
      std::this_thread::sleep_for(20ms);
    }
  }

  // The undisturbed run's losses, computed once per test binary run.
  std::vector<std::string> undisturbed() {
    static std::vector<std::string> cached;
    if (!cached.empty()) return cached;
    const std::string out = (dir_ / "undisturbed").string();
    EXPECT_EQ(finish(start(job(out, {}), "undisturbed")), 0) << slurp(dir_ / "undisturbed.log");
    cached = mt::test::step_losses(out + "/metrics.jsonl");
    EXPECT_EQ(cached.size(), 10u);
    return cached;
  }

  fs::path dir_;
};

TEST_F(LaunchFaults, KillNineOfARankIsRecoveredWithTheLossesOfAnUndisturbedRun) {
  const auto want = undisturbed();
  const std::string out = (dir_ / "run").string(), events = (dir_ / "events.jsonl").string();
  pid_t launcher = start(job(out, {"--max-restarts", "2", "--backoff", "0", "--events", events}), "run");
  wait_for_step(launcher, out, 5);
  pid_t victim = rank_pid(launcher, 1);
  ASSERT_GT(victim, 0);
  ::kill(victim, SIGKILL);
  ASSERT_EQ(finish(launcher), 0) << slurp(dir_ / "run.log");
  EXPECT_EQ(mt::test::step_losses(out + "/metrics.jsonl"), want);
  auto ev = events_of(events);
  ASSERT_GE(ev.size(), 5u);
  auto find = [&](const std::string& name) {
    for (auto& e : ev)
      if (e["event"] == name) return e;
    return nlohmann::json();
  };
  EXPECT_EQ(find("detected")["rank"], 1);
  EXPECT_NE(find("detected")["status"].get<std::string>().find("signal 9"), std::string::npos);
  EXPECT_EQ(find("restarting")["attempt"], 0);
  EXPECT_EQ(ev.back()["event"], "done");
  EXPECT_EQ(ev.back()["attempt"], 1);
}

}  // namespace
