// `megatrain launch`: the agent's pieces in process (line forwarding, wait-status descriptions), then the built
// binary: environment per rank, output prefixing, rendezvous through the launcher's tcp store, and supervision (a
// failing rank or a signal stops everyone; nothing survives the launcher).
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"
#include "megatrain/comm/env.h"
#include "megatrain/comm/store.h"
#include "megatrain/launch/process_util.h"
#include "megatrain/launch/rank_process.h"
#include "support/files.h"
#include "support/megatrain.h"
#include "support/metrics.h"

extern char** environ;

using namespace mt;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

// Rank mode: run by the launcher with MT_LAUNCH_TEST_RANK=1, this binary is a rank that reads its environment,
// rendezvouses with the others through MEGATRAIN_STORE (every rank waits for every rank's key: a cross-process
// blocking wait), prints what it saw and exits.
const int kRankMode = [] {
  if (!std::getenv("MT_LAUNCH_TEST_RANK")) return 0;
  try {
    RankInfo r = rank_info_from_env();
    auto store = open_store(r.store_url, 60s);
    store->set("pid/" + std::to_string(r.rank), std::to_string(::getpid()));
    int64_t arrived = store->add("arrived", 1);
    std::vector<std::string> keys;
    for (int i = 0; i < r.world_size; ++i) keys.push_back("pid/" + std::to_string(i));
    store->wait(keys, 60s);
    std::printf("child rank=%d world=%d local=%d/%d master=%s:%d store=%s source=%s\n", r.rank, r.world_size,
                r.local_rank, r.local_world_size, r.master_addr.c_str(), r.master_port, r.store_url.c_str(),
                r.source.c_str());
    std::fprintf(stderr, "arrived as number %lld\n", static_cast<long long>(arrived));
    std::fflush(nullptr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank failed: %s\n", e.what());
    ::_exit(1);
  }
  ::_exit(0);
}();

using mt::test::kMegatrain;
using mt::test::slurp;

struct Result {
  int status = 0;
  std::string out, err;
  double seconds = 0;
  int code() const { return mt::test::shell_exit_code(status); }
};

class LaunchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mt-launch-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Starts `megatrain ARGS...` with stdout/stderr to files; killed if this test dies.
  pid_t start(const std::vector<std::string>& args) {
    std::vector<std::string> all = {kMegatrain};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    std::string out = (dir_ / "stdout").string(), err = (dir_ / "stderr").string();
    t0_ = now_seconds();
    pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      ::dup2(::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), 1);
      ::dup2(::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), 2);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    return pid;
  }

  // timeout_s only guards against a hang: longer than any wait the tests set up (60 s sleeps, grace periods, store
  // timeouts), so that those fail on their own terms first.
  Result finish(pid_t pid, double timeout_s = 120) {
    Result r;
    for (;;) {
      pid_t p = ::waitpid(pid, &r.status, WNOHANG);
      if (p == pid) break;
      if (now_seconds() - t0_ > timeout_s) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &r.status, 0);
        ADD_FAILURE() << "launcher did not finish within " << timeout_s << " s";
        break;
      }
      std::this_thread::sleep_for(5ms);
    }
    r.seconds = now_seconds() - t0_;
    r.out = slurp(dir_ / "stdout");
    r.err = slurp(dir_ / "stderr");
    return r;
  }

  Result launch(const std::vector<std::string>& args) { return finish(start(args)); }

  // Pids the ranks wrote to files named <prefix>.*: all must be gone once the launcher has exited.
  // The pids the ranks wrote to files `prefix.*` with `echo $$ > prefix.$RANK`. A file the shell has created but
  // not yet written is empty: it is skipped (not parsed), until echo's single write puts "pid\n" in it.
  std::vector<pid_t> pids(const std::string& prefix) {
    std::vector<pid_t> out;
    for (auto& e : fs::directory_iterator(dir_)) {
      if (e.path().filename().string().rfind(prefix + ".", 0) != 0) continue;
      const std::string text = slurp(e.path());
      if (!text.empty() && text.back() == '\n') out.push_back(std::stoi(text));
    }
    return out;
  }
  void expect_all_gone(const std::vector<pid_t>& ps) {
    for (pid_t p : ps) {
      errno = 0;
      EXPECT_TRUE(::kill(p, 0) == -1 && errno == ESRCH) << "pid " << p << " outlived the launcher";
    }
  }
  void wait_for_files(const std::string& prefix, size_t n) {
    for (double t = now_seconds(); pids(prefix).size() < n && now_seconds() - t < 60;)
      std::this_thread::sleep_for(10ms);
    ASSERT_EQ(pids(prefix).size(), n);
  }
  std::string sh(const std::string& script) { return "cd '" + dir_.string() + "' || exit 99; " + script; }

  fs::path dir_;
  double t0_ = 0;
};

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

TEST_F(LaunchTest, RanksRendezvousThroughTheLaunchersStore) {
  Result r = launch({"launch", "--nproc", "3", "--exec", "--", "/usr/bin/env", "MT_LAUNCH_TEST_RANK=1",
                     fs::read_symlink("/proc/self/exe").string()});
  ASSERT_EQ(r.code(), 0) << r.out << r.err;
  std::regex line(R"(\[rank (\d)\] child rank=(\d) world=3 local=(\d)/3 master=127\.0\.0\.1:(\d+) )"
                  R"(store=tcp://127\.0\.0\.1:(\d+) source=megatrain)");
  std::set<int> seen;
  std::set<std::string> ports;
  for (auto& l : lines_of(r.out)) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(l, m, line)) << "unexpected line: " << l;
    EXPECT_EQ(m[1], m[2]);
    EXPECT_EQ(m[2], m[3]);  // one node: local rank == global rank
    EXPECT_EQ(m[4], m[5]);  // the store listens on MASTER_PORT
    seen.insert(std::stoi(m[1]));
    ports.insert(m[4]);
  }
  EXPECT_EQ(seen, (std::set<int>{0, 1, 2}));
  EXPECT_EQ(ports.size(), 1u);
  // stderr is prefixed too, and the store's counter handed out 1..3 once each.
  std::set<std::string> arrivals;
  for (auto& l : lines_of(r.err)) {
    std::smatch m;
    if (std::regex_match(l, m, std::regex(R"(\[rank \d\] arrived as number (\d))"))) arrivals.insert(m[1]);
  }
  EXPECT_EQ(arrivals, (std::set<std::string>{"1", "2", "3"})) << r.err;
}

TEST_F(LaunchTest, EnvironmentOfANonZeroNode) {
  Result r =
      launch({"launch", "--nproc", "2", "--nnodes", "3", "--node-rank", "1", "--master", "10.9.8.7:1234", "--store",
              "file:///shared/rdv", "--exec", "--", "/bin/sh", "-c",
              "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT $MEGATRAIN_STORE\""});
  ASSERT_EQ(r.code(), 0) << r.err;
  std::vector<std::string> l = lines_of(r.out);
  std::sort(l.begin(), l.end());
  EXPECT_EQ(l, (std::vector<std::string>{"[rank 2] 2 6 0 2 10.9.8.7 1234 file:///shared/rdv",
                                         "[rank 3] 3 6 1 2 10.9.8.7 1234 file:///shared/rdv"}));
}

// Without --max-restarts a multi-node job has no job driver, which alone sends notifications: a webhook from the
// environment is said to be unused rather than silently dropped (and --notify is refused: LaunchNotify).
TEST_F(LaunchTest, AnUnsupervisedNodeSaysTheWebhookOfItsEnvironmentIsUnused) {
  ::setenv("MEGATRAIN_NOTIFY_URL", "http://127.0.0.1:9/hook", 1);
  Result r = launch({"launch", "--nproc", "1", "--nnodes", "3", "--node-rank", "1", "--master", "10.9.8.7:1234",
                     "--store", "file:///shared/rdv", "--exec", "--", "true"});
  ::unsetenv("MEGATRAIN_NOTIFY_URL");
  ASSERT_EQ(r.code(), 0) << r.err;
  EXPECT_NE(r.err.find("MEGATRAIN_NOTIFY_URL is not used: on 3 nodes without --max-restarts there is no job driver"),
            std::string::npos)
      << r.err;
}

TEST_F(LaunchTest, OutputWithoutPrefixAndPartialLines) {
  Result r = launch({"launch", "--nproc", "1", "--no-prefix", "--exec", "--", "/bin/sh", "-c", "printf 'a\\nb'"});
  ASSERT_EQ(r.code(), 0) << r.err;
  EXPECT_EQ(r.out, "a\nb");
  r = launch({"launch", "--nproc", "1", "--exec", "--", "/bin/sh", "-c", "printf 'a\\nb'; printf 'c' >&2"});
  ASSERT_EQ(r.code(), 0) << r.err;
  EXPECT_EQ(r.out, "[rank 0] a\n[rank 0] b\n");  // a last line without newline still gets one
  EXPECT_NE(r.err.find("[rank 0] c\n"), std::string::npos) << r.err;
}

TEST_F(LaunchTest, DefaultRunsAMegatrainSubcommand) {
  Result r = launch({"launch", "--nproc", "2", "--", "launch", "--help"});
  ASSERT_EQ(r.code(), 0) << r.err;
  for (int rank : {0, 1})
    EXPECT_NE(r.out.find(fmt::format("[rank {}] Spawn this node's ranks", rank)), std::string::npos) << r.out;
}

TEST_F(LaunchTest, FailingRankStopsTheOthersAndNothingSurvives) {
  // Each rank leaves a background child in its process group; rank 2 fails after 0.3 s, the rest sleep.
  Result r = launch({"launch", "--nproc", "4", "--grace", "60", "--exec", "--", "/bin/sh", "-c",
                     sh("echo $$ > pid.$RANK; sleep 60 & echo $! > kid.$RANK; "
                        "if [ $RANK = 2 ]; then sleep 0.3; exit 3; fi; wait")});
  EXPECT_EQ(r.code(), 3) << r.err;
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(launch: rank 2 \(pid \d+\) exited with code 3; )"
                                                  R"(stopping the other 3 ranks)")))
      << r.err;
  // The bound is the behaviour under test, not a speed: without SIGTERM the ranks would live 60 s (their sleeps,
  // and the grace period before SIGKILL).
  EXPECT_LT(r.seconds, 20.0) << "SIGTERM should stop sleeping ranks at once, without waiting for the grace period";
  EXPECT_EQ(pids("pid").size(), 4u);
  EXPECT_EQ(pids("kid").size(), 4u);
  expect_all_gone(pids("pid"));
  expect_all_gone(pids("kid"));
}

TEST_F(LaunchTest, RanksIgnoringSigtermAreKilledAfterTheGracePeriod) {
  Result r = launch({"launch", "--nproc", "2", "--grace", "0.5", "--exec", "--", "/bin/sh", "-c",
                     sh("trap '' TERM; echo $$ > pid.$RANK; "
                        "if [ $RANK = 1 ]; then sleep 0.2; kill -USR1 $$; fi; sleep 60 & echo $! > kid.$RANK; wait")});
  EXPECT_EQ(r.code(), 128 + SIGUSR1) << r.err;
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(rank 1 \(pid \d+\) was killed by signal 10)"))) << r.err;
  EXPECT_NE(r.err.find("rank 0 (pid "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("still running after the grace period; killing it"), std::string::npos) << r.err;
  EXPECT_GE(r.seconds, 0.6);  // 0.2 s + the 0.5 s grace period at least
  // Rank 0 ignores SIGTERM and waits for a 60 s sleep: only the SIGKILL after the grace period ends it this early.
  EXPECT_LT(r.seconds, 20.0);
  expect_all_gone(pids("pid"));
  expect_all_gone(pids("kid"));
}

TEST_F(LaunchTest, SigtermToTheLauncherStopsEveryRank) {
  pid_t launcher = start({"launch", "--nproc", "3", "--grace", "60", "--exec", "--", "/bin/sh", "-c",
                          sh("sleep 60 & echo $! > kid.$RANK; echo $$ > pid.$RANK; wait")});
  wait_for_files("pid", 3);
  ::kill(launcher, SIGTERM);
  double t = now_seconds();
  Result r = finish(launcher);
  EXPECT_EQ(r.code(), 128 + SIGTERM) << r.err;
  EXPECT_NE(r.err.find("received SIGTERM; stopping 3 ranks"), std::string::npos) << r.err;
  // Not a speed: ranks that missed the SIGTERM would sleep 60 s, or wait out the 60 s grace period.
  EXPECT_LT(now_seconds() - t, 20.0);
  expect_all_gone(pids("pid"));
  expect_all_gone(pids("kid"));
}

TEST_F(LaunchTest, ProcessesThatEscapeTheGroupAreKilledToo) {
  // setsid moves the sleeper out of the rank's process group; only the subreaper sweep can find it.
  Result r = launch({"launch", "--nproc", "1", "--exec", "--", "/bin/sh", "-c",
                     sh("setsid sleep 60 & echo $! > kid.0; sleep 0.2")});
  EXPECT_EQ(r.code(), 0) << r.err;
  EXPECT_EQ(pids("kid").size(), 1u);
  expect_all_gone(pids("kid"));
}

TEST_F(LaunchTest, KilledLauncherTakesItsRanksAlong) {
  // The ranks are orphaned when the launcher dies; as subreaper this test inherits them and can see them die
  // (a zombie would still answer kill(pid, 0)).
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  pid_t launcher = start({"launch", "--nproc", "2", "--exec", "--", "/bin/sh", "-c",
                          sh("echo $$ > pid.$RANK; exec sleep 60")});
  wait_for_files("pid", 2);
  ::kill(launcher, SIGKILL);
  finish(launcher);
  std::set<pid_t> left;
  for (pid_t p : pids("pid")) left.insert(p);
  for (double t = now_seconds(); !left.empty() && now_seconds() - t < 60;) {  // PDEATHSIG is asynchronous
    for (auto it = left.begin(); it != left.end();) {
      int st;
      if (::waitpid(*it, &st, WNOHANG) == *it) {
        EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << st;
        it = left.erase(it);
      } else {
        ++it;
      }
    }
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_TRUE(left.empty()) << left.size() << " ranks outlived a killed launcher";
  for (pid_t p : left) ::kill(p, SIGKILL), ::waitpid(p, nullptr, 0);
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
}

TEST_F(LaunchTest, ProgramThatCannotStartIsReported) {
  Result r = launch({"launch", "--nproc", "2", "--exec", "--", "/nonexistent/program"});
  EXPECT_EQ(r.code(), 127);
  EXPECT_NE(r.err.find("cannot execute '/nonexistent/program': No such file or directory"), std::string::npos) << r.err;
}

// Item 6: the launcher gives its ranks a fresh random store secret per job (32 hex digits), which they need to reach
// its store (the rank-mode tests above connect with it); the user's MEGATRAIN_STORE_SECRET, when set, is used as is.
TEST_F(LaunchTest, RanksGetAFreshStoreSecretPerJob) {
  ::unsetenv("MEGATRAIN_STORE_SECRET");
  const std::vector<std::string> args = {"launch", "--nproc", "2",  "--exec",
                                         "--",     "/bin/sh", "-c", "echo \"$MEGATRAIN_STORE_SECRET\""};
  Result a = launch(args), b = launch(args);
  ASSERT_EQ(a.code(), 0) << a.err;
  ASSERT_EQ(b.code(), 0) << b.err;
  std::vector<std::string> la = lines_of(a.out), lb = lines_of(b.out);
  ASSERT_EQ(la.size(), 2u) << a.out;
  ASSERT_EQ(lb.size(), 2u) << b.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_match(la[0], m, std::regex(R"(\[rank \d\] ([0-9a-f]{32}))"))) << la[0];
  const std::string sa = m[1];
  EXPECT_EQ(la[1].substr(9), sa) << "both ranks of a job get the same secret";
  EXPECT_NE(lb[0].substr(9), sa) << "two jobs got the same secret";
  EXPECT_EQ(a.err.find(sa), std::string::npos) << "the secret was printed: " << a.err;

  ::setenv("MEGATRAIN_STORE_SECRET", "users-own-secret-0123456789", 1);
  Result c = launch(args);
  ::unsetenv("MEGATRAIN_STORE_SECRET");
  ASSERT_EQ(c.code(), 0) << c.err;
  EXPECT_NE(c.out.find("] users-own-secret-0123456789\n"), std::string::npos) << c.out;
}

TEST_F(LaunchTest, MultiNodeNeedsASharedSecretAndAReachableMaster) {
  ::unsetenv("MEGATRAIN_STORE_SECRET");
  Result r = launch({"launch", "--nproc", "1", "--nnodes", "2", "--master", "10.9.8.7:1234", "--exec", "--", "true"});
  EXPECT_NE(r.code(), 0);
  EXPECT_NE(r.err.find("needs the store secret every node shares: set MEGATRAIN_STORE_SECRET"), std::string::npos)
      << r.err;
  ::setenv("MEGATRAIN_STORE_SECRET", "short", 1);
  r = launch({"launch", "--nproc", "1", "--nnodes", "2", "--master", "10.9.8.7:1234", "--exec", "--", "true"});
  EXPECT_NE(r.err.find("the store secret from the environment variable MEGATRAIN_STORE_SECRET has 5 bytes"),
            std::string::npos)
      << r.err;
  ::setenv("MEGATRAIN_STORE_SECRET", "users-own-secret-0123456789", 1);
  // Node 0 would serve the store on loopback, which the other node cannot reach.
  r = launch({"launch", "--nproc", "1", "--nnodes", "2", "--master", "127.0.0.1:1234", "--exec", "--", "true"});
  ::unsetenv("MEGATRAIN_STORE_SECRET");
  EXPECT_NE(r.code(), 0);
  EXPECT_NE(r.err.find("--master '127.0.0.1:1234' is the loopback address 127.0.0.1"), std::string::npos) << r.err;
}

TEST_F(LaunchTest, IfaceMustExistAndIsPassedOn) {
  Result r = launch({"launch", "--nproc", "1", "--iface", "nosuchif0", "--exec", "--", "true"});
  EXPECT_NE(r.code(), 0);
  EXPECT_NE(r.err.find("--iface='nosuchif0' is neither an interface that is up nor one of its addresses; there are: "),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("lo 127.0.0.1"), std::string::npos) << r.err;
  r = launch({"launch", "--nproc", "1", "--iface", "lo", "--exec", "--", "/bin/sh", "-c", "echo $MEGATRAIN_IFACE"});
  ASSERT_EQ(r.code(), 0) << r.err;
  EXPECT_EQ(r.out, "[rank 0] lo\n");
}

TEST_F(LaunchTest, UsageErrors) {
  Result r = launch({"launch", "--nproc", "2"});
  EXPECT_NE(r.code(), 0);
  EXPECT_NE(r.err.find("nothing to launch"), std::string::npos) << r.err;
  r = launch({"launch", "--nproc", "2", "--nnodes", "2", "--node-rank", "2", "--exec", "--", "true"});
  EXPECT_NE(r.code(), 0);
  EXPECT_NE(r.err.find("--node-rank 2 must be below --nnodes 2"), std::string::npos) << r.err;
  r = launch({"launch", "--nproc", "2", "--nnodes", "2", "--exec", "--", "true"});
  EXPECT_NE(r.code(), 0);
  EXPECT_NE(r.err.find("needs --master"), std::string::npos) << r.err;
  r = launch({"launch", "--nproc", "1", "--master", "127.0.0.1:99999", "--exec", "--", "true"});
  EXPECT_NE(r.code(), 0);
  EXPECT_NE(r.err.find("'99999'"), std::string::npos) << r.err;
}

}  // namespace

// ---- supervision: restarts, decided by exit codes (the policy's own decisions are in launch_supervisor_test) ----

std::vector<std::string> event_names(const std::vector<nlohmann::json>& ev) {
  std::vector<std::string> out;
  for (auto& e : ev) out.push_back(e["event"]);
  return out;
}

TEST_F(LaunchTest, AFailedAttemptIsRestartedInAFreshStoreNamespaceAndTheJobFinishes) {
  const std::string events = (dir_ / "events.jsonl").string();
  Result r = launch({"launch", "--nproc", "2", "--max-restarts", "2", "--backoff", "0", "--events", events, "--exec",
                     "--", "/bin/sh", "-c",
                     sh("if [ \"$MEGATRAIN_ATTEMPT\" = 0 ] && [ \"$RANK\" = 1 ]; then exit 22; fi; sleep 0.2; "
                        "echo ok $MEGATRAIN_ATTEMPT $MEGATRAIN_STORE_PREFIX")});
  ASSERT_EQ(r.code(), 0) << r.err;
  EXPECT_NE(r.out.find("[rank 1] ok 1 attempt-1"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("rank 1 (pid"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exited with code 22"), std::string::npos) << r.err;
  auto ev = mt::test::jsonl_lines(events);
  EXPECT_EQ(event_names(ev),
            (std::vector<std::string>{"started", "detected", "stopped", "restarting", "started", "done"}));
  EXPECT_EQ(ev[1]["rank"], 1);
  EXPECT_EQ(ev[1]["code"], 22);
  EXPECT_EQ(ev[4]["attempt"], 1);
  EXPECT_EQ(ev[4]["store_prefix"], "attempt-1");
}

TEST_F(LaunchTest, ConfigDataAndCheckpointErrorsAreNotRestarted) {
  const std::string events = (dir_ / "events.jsonl").string();
  Result r = launch({"launch", "--nproc", "2", "--max-restarts", "5", "--backoff", "0", "--events", events, "--exec",
                     "--", "/bin/sh", "-c", "[ \"$RANK\" = 0 ] && exit 10; sleep 30"});
  EXPECT_EQ(r.code(), 10) << r.err;
  EXPECT_NE(r.err.find("restarting cannot help"), std::string::npos) << r.err;
  EXPECT_EQ(event_names(mt::test::jsonl_lines(events)),
            (std::vector<std::string>{"started", "detected", "stopped", "gave_up"}));
}

TEST_F(LaunchTest, AttemptsWithoutProgressEndTheJobWithTheDoNotRequeueCode) {
  // A program without heartbeats never reports a step: every failed attempt is one without progress.
  const std::string events = (dir_ / "events.jsonl").string();
  Result r = launch({"launch", "--nproc", "1", "--max-restarts", "10", "--backoff", "0", "--no-progress-limit", "3",
                     "--events", events, "--exec", "--", "/bin/sh", "-c", "exit 22"});
  EXPECT_EQ(r.code(), 40) << r.err;
  auto names = event_names(mt::test::jsonl_lines(events));
  EXPECT_EQ(std::count(names.begin(), names.end(), "started"), 3);
  EXPECT_EQ(names.back(), "gave_up");
}

// A signal while the job waits out a restart's backoff ends the job there: the driver hears it through the store
// (the agent has no attempt to stop), writes the end, and no other attempt starts.
TEST_F(LaunchTest, ASignalDuringTheBackoffEndsTheJobWithoutAnotherAttempt) {
  const std::string events = (dir_ / "events.jsonl").string();
  pid_t launcher = start({"launch", "--nproc", "1", "--max-restarts", "3", "--backoff", "60", "--events", events,
                          "--exec", "--", "/bin/sh", "-c", "exit 22"});
  for (const double t0 = now_seconds(); slurp(events).find("\"restarting\"") == std::string::npos;) {
    ASSERT_LT(now_seconds() - t0, 60) << slurp(dir_ / "stderr");
    std::this_thread::sleep_for(20ms);
  }
  ::kill(launcher, SIGTERM);
  Result r = finish(launcher);
  EXPECT_EQ(r.code(), 128 + SIGTERM) << r.err;
  EXPECT_LT(r.seconds, 30.0) << "the 60 s backoff was waited out";  // (not a speed: the backoff is 60 s)
  auto ev = mt::test::jsonl_lines(events);
  EXPECT_EQ(event_names(ev), (std::vector<std::string>{"started", "detected", "stopped", "restarting", "gave_up"}));
  EXPECT_EQ(ev.back()["reason"], "an agent was signalled") << ev.back().dump();
  EXPECT_EQ(ev.back()["exit_code"], 128 + SIGTERM) << ev.back().dump();
}

TEST_F(LaunchTest, MaxRestartsSpentEndsWithItsOwnCode) {
  Result r = launch({"launch", "--nproc", "1", "--max-restarts", "1", "--backoff", "0", "--no-progress-limit", "5",
                     "--exec", "--", "/bin/sh", "-c", "exit 21"});
  EXPECT_EQ(r.code(), 41) << r.err;
  EXPECT_NE(r.err.find("all 1 restarts"), std::string::npos) << r.err;
}

// Whatever a rank writes on its heartbeat pipe (fd 3), the agent goes on: malformed JSON, wrong types, foreign
// objects are skipped.
TEST_F(LaunchTest, GarbageOnTheHeartbeatPipeCannotBringDownTheAgent) {
  Result r = launch({"launch", "--nproc", "1", "--exec", "--", "/bin/sh", "-c",
                     "[ \"$MEGATRAIN_HEARTBEAT_FD\" = 3 ] || exit 9; "
                     "printf '%s\\n' '{\"type\":5}' '{\"type\":\"event\",\"event\":7}' "
                     "'{\"type\":\"hb\",\"step\":\"x\",\"colls\":[1]}' '[1,2' 'not json' >&3; sleep 0.3; echo ok"});
  ASSERT_EQ(r.code(), 0) << r.err;
  EXPECT_EQ(r.out, "[rank 0] ok\n");
}

TEST_F(LaunchTest, DiagnoseChecksTheNodeAndFailsAgainstAFasterNodesExpectations) {
  const std::string healthy = (dir_ / "healthy.json").string();
  Result r = launch({"diagnose", "--json", "--local-ranks", "2", "--save", healthy});
  ASSERT_EQ(r.code(), 0) << r.err << r.out;
  auto report = nlohmann::json::parse(r.out);
  EXPECT_TRUE(report["pass"].get<bool>());
  std::map<std::string, nlohmann::json> by_name;
  for (auto& c : report["checks"]) by_name[c["name"]] = c;
  ASSERT_EQ(by_name.size(), 4u);
  EXPECT_NE(by_name["local_allreduce"]["detail"].get<std::string>().find("every element exact"), std::string::npos);
  for (const char* n : {"local_allreduce", "gemm", "memory_bandwidth"})
    EXPECT_GT(by_name[n]["value"].get<double>(), 0) << n;
  // A node a thousand times faster at matmuls than this one: this one fails, and the report says which check.
  // Only gemm is expected: this machine's own other figures vary with its load, and a test must not depend on that.
  auto saved = nlohmann::json::parse(slurp(healthy));
  ASSERT_TRUE(saved.contains("local_allreduce") && saved.contains("memory_bandwidth")) << saved.dump();
  std::ofstream(dir_ / "fast.json") << nlohmann::json{{"gemm", saved["gemm"].get<double>() * 1000}}.dump();
  r = launch({"diagnose", "--json", "--expect", (dir_ / "fast.json").string()});
  EXPECT_EQ(r.code(), 1) << r.err;
  report = nlohmann::json::parse(r.out);
  EXPECT_FALSE(report["pass"].get<bool>());
  for (auto& c : report["checks"]) EXPECT_EQ(c["pass"].get<bool>(), c["name"] != "gemm") << c.dump();
  // The injected bad node fails there and only there.
  ::setenv("MEGATRAIN_FAULTS", "badnode:node=1", 1);
  r = launch({"diagnose", "--json", "--node", "1"});
  Result other = launch({"diagnose", "--json", "--node", "0"});
  ::unsetenv("MEGATRAIN_FAULTS");
  EXPECT_EQ(r.code(), 1) << r.err;
  EXPECT_NE(r.out.find("injected fault badnode:node=1"), std::string::npos) << r.out;
  EXPECT_EQ(other.code(), 0) << other.err;
}

// Two nodes' diagnose meet through a store for the pairwise check: both see an exact all-reduce and a bandwidth. A
// neighbour that never comes makes the check not run (and not fail): a missing peer says nothing of this node.
TEST_F(LaunchTest, DiagnosePairsTwoNodesOverAStoreAndAMissingNeighbourIsNoFailure) {
  const std::string store = "file://" + (dir_ / "pair-store").string();
  const std::string diagnose = kMegatrain + " diagnose --json --local-ranks 1 --pair-store " + store;
  Result r = launch({"launch", "--nproc", "2", "--no-prefix", "--exec", "--", "/bin/sh", "-c",
                     sh(diagnose + " --pair-group diag/pair-0 --pair-rank $RANK > pair.$RANK")});
  ASSERT_EQ(r.code(), 0) << r.err << r.out;
  for (int rank = 0; rank < 2; ++rank) {
    nlohmann::json pairwise, report = nlohmann::json::parse(slurp(dir_ / ("pair." + std::to_string(rank))));
    for (auto& c : report["checks"])
      if (c["name"] == "pairwise_bandwidth") pairwise = c;
    ASSERT_TRUE(pairwise["ran"].get<bool>()) << pairwise.dump();
    EXPECT_TRUE(pairwise["pass"].get<bool>()) << pairwise.dump();
    EXPECT_GT(pairwise["value"].get<double>(), 0) << pairwise.dump();
    EXPECT_NE(pairwise["detail"].get<std::string>().find("every element exact"), std::string::npos);
  }
  r = launch({"diagnose", "--json", "--local-ranks", "1", "--pair-store", store, "--pair-group", "diag/pair-alone",
              "--pair-rank", "0", "--pair-timeout", "2"});
  ASSERT_EQ(r.code(), 0) << r.err << r.out;
  const nlohmann::json report = nlohmann::json::parse(r.out);
  for (auto& c : report["checks"])
    if (c["name"] == "pairwise_bandwidth") {
      EXPECT_FALSE(c["ran"].get<bool>()) << c.dump();
      EXPECT_NE(c["detail"].get<std::string>().find("did not come"), std::string::npos) << c.dump();
    }
}

// ---- the agent's pieces, in process ------------------------------------------------------------------------------

namespace {

// Everything written to the read end of a pipe so far (the write end is closed first).
std::string read_all(int fd) {
  std::string out;
  char buf[4096];
  for (ssize_t k; (k = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, size_t(k));
  return out;
}

struct Pipe {
  int r = -1, w = -1;
  Pipe() {
    int p[2];
    EXPECT_EQ(::pipe(p), 0);
    r = p[0], w = p[1];
  }
  ~Pipe() {
    if (r >= 0) ::close(r);
    if (w >= 0) ::close(w);
  }
  std::string take() {
    ::close(w);
    w = -1;
    return read_all(r);
  }
};

}  // namespace

TEST(LaunchOutput, LinesArePrefixedAndSplitAcrossReadsAsTheyWereWritten) {
  Pipe target;
  std::vector<std::string> hooked;
  launch::OutputStream s(-1, target.w, "[rank 3] ", true);
  s.set_hook([&](const std::string& line) { hooked.push_back(line); });
  s.feed("al", 2);  // a line arriving in pieces is forwarded once, whole
  s.feed("pha\nbe", 6);
  s.feed("ta\n\ngam", 7);
  s.close();  // the last line has no newline: it still goes out, with one
  EXPECT_EQ(target.take(), "[rank 3] alpha\n[rank 3] beta\n[rank 3] \n[rank 3] gam\n");
  EXPECT_EQ(hooked, (std::vector<std::string>{"alpha", "beta", "", "gam"}));
}

TEST(LaunchOutput, WithoutPrefixBytesPassUnchangedButTheHookStillSeesLines) {
  Pipe target;
  std::vector<std::string> hooked;
  launch::OutputStream s(-1, target.w, "[rank 0] ", false);
  s.set_hook([&](const std::string& line) { hooked.push_back(line); });
  s.feed("x\ny", 3);
  s.close();
  EXPECT_EQ(target.take(), "x\ny");  // no newline added, no prefix
  EXPECT_EQ(hooked, (std::vector<std::string>{"x", "y"}));
}

TEST(LaunchOutput, AnEndlessLineIsCutRatherThanBufferedForever) {
  Pipe target;
  launch::OutputStream s(-1, target.w, "P", true);
  // 200 KiB without a newline: the stream must not hold it all; it forwards in pieces of at most 64 KiB + 1 read.
  const std::string blob(200 * 1024, 'z');
  std::string got;  // the pipe buffer (64 KiB) would fill: read concurrently
  std::thread drain([&] { got = read_all(target.r); });
  for (size_t i = 0; i < blob.size(); i += 1000) s.feed(blob.data() + i, std::min<size_t>(1000, blob.size() - i));
  s.close();
  ::close(target.w);
  target.w = -1;
  drain.join();
  size_t lines = size_t(std::count(got.begin(), got.end(), '\n'));
  EXPECT_GE(lines, 3u);  // 200 KiB / (64 KiB + 1000) > 3 pieces
  got.erase(std::remove(got.begin(), got.end(), '\n'), got.end());
  got.erase(std::remove(got.begin(), got.end(), 'P'), got.end());
  EXPECT_EQ(got, blob);  // nothing lost or duplicated
}

TEST(LaunchProcessUtil, WaitStatusesAreDescribedAsTheShellWould) {
  pid_t a = ::fork();
  if (a == 0) ::_exit(3);
  pid_t b = ::fork();
  if (b == 0) {
    ::raise(SIGKILL);
    ::_exit(0);
  }
  int sa = 0, sb = 0;
  ASSERT_EQ(::waitpid(a, &sa, 0), a);
  ASSERT_EQ(::waitpid(b, &sb, 0), b);
  EXPECT_EQ(launch::describe_status(sa), "exited with code 3");
  EXPECT_EQ(launch::exit_code_of(sa), 3);
  EXPECT_NE(launch::describe_status(sb).find("killed by signal 9"), std::string::npos);
  EXPECT_EQ(launch::exit_code_of(sb), 137);
  EXPECT_EQ(launch::plural(1, "rank"), "1 rank");
  EXPECT_EQ(launch::plural(3, "rank"), "3 ranks");
}
