// The job driver (launch/driver.h) on real jobs: several `megatrain launch` agents on this host act as the nodes of
// one job (--iface lo), each with 2 ranks of a 4-rank dp2 x tp2 training job. Node faults are done to them: an agent
// killed (kill -9) or stopped (kill -STOP), a node that fails `megatrain diagnose` after a crash, a rank hung in a
// collective on another node than the driver's. The job must finish by itself, and
//  - with a spare, keep its layout: its per-step losses equal an undisturbed 4-rank run's (the oracle);
//  - without one, shrink to dp1 x tp2 on the surviving node, accumulating 2 micro-batches so the global batch stays:
//    the steps before the restart equal the undisturbed run's, and the steps after it equal a dp1 x tp2 run with
//    grad_accum 2 resumed from the same checkpoint (the oracle of a shrink).
// The event logs must name the node and the reason. Tests assert outcomes, not speed: the timeouts only guard
// against a test that would otherwise hang.
// LaunchHosts runs the same job on separate hosts of a test network (net_hosts.h: network namespaces on a bridge),
// each agent finding its own address by the route to the master, and cuts a host off the network.
#include <httplib.h>

#include <atomic>
#include <map>
#include <mutex>
#include <set>

#include "support/comm_servers.h"
#include "support/files.h"
#include "support/launch_testutil.h"
#include "support/megatrain.h"
#include "support/metrics.h"
#include "support/webhook_receiver.h"
#include "support/net_hosts.h"
#include "support/test_util.h"
#include "support/tls_testutil.h"

using namespace mt;
using namespace mt::test;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

using comm_test::free_port;  // a port nobody listens on now (node 0's store binds it a moment later)

class LaunchNodes : public ::testing::Test {
 protected:
  void SetUp() override {
    prepare_launch_data();
    dir_ = case_dir("mt-nodes-");
    ::setenv("MEGATRAIN_STORE_SECRET", "0123456789abcdef0123456789abcdef", 1);
  }
  void TearDown() override {
    for (pid_t p : agents_)
      if (p > 0) {
        ::kill(p, SIGCONT);
        ::kill(p, SIGKILL);
        ::waitpid(p, nullptr, 0);
      }
    if (!HasFailure() && !std::getenv("MT_KEEP_TEST_DIRS")) fs::remove_all(dir_);
  }

  // The training command (launch_testutil.h's node_job), after launch's options.
  static std::vector<std::string> train(const std::string& out, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> a = {"--"};
    for (auto& s : node_job(out, extra)) a.push_back(s);
    return a;
  }

  // Starts agents 0..nodes+spares-1 of the job (MEGATRAIN_FAULTS = faults, for this start only).
  void start_job(int nodes, int spares, const std::string& faults = "", std::vector<std::string> opts = {}) {
    const int port = free_port();
    if (!faults.empty()) ::setenv("MEGATRAIN_FAULTS", faults.c_str(), 1);
    for (int a = 0; a < nodes + spares; ++a) {
      std::vector<std::string> args = {"launch",
                                       "--nproc",
                                       "2",
                                       "--nnodes",
                                       std::to_string(nodes),
                                       "--node-rank",
                                       std::to_string(a),
                                       "--spares",
                                       std::to_string(spares),
                                       "--master",
                                       fmt::format("127.0.0.1:{}", port),
                                       "--iface",
                                       "lo",
                                       "--max-restarts",
                                       "3",
                                       "--backoff",
                                       "0",
                                       "--events",
                                       events(a)};
      args.insert(args.end(), opts.begin(), opts.end());
      for (auto& s : train(out(), job_extra_)) args.push_back(s);
      if (auto w = wrap_.find(a); w != wrap_.end()) {  // the agent runs under a wrapper: wrapper..., megatrain, args...
        std::vector<std::string> wrapped(w->second.begin() + 1, w->second.end());
        wrapped.push_back(kMegatrain);
        wrapped.insert(wrapped.end(), args.begin(), args.end());
        agents_.push_back(start_logged(w->second.front(), wrapped, log_path(a)));
      } else {
        agents_.push_back(start_logged(kMegatrain, args, log_path(a)));
      }
    }
    ::unsetenv("MEGATRAIN_FAULTS");
  }

  std::vector<std::string> job_extra_;  // train flags added to node_job by start_job

  // Waits for agent a's exit code.
  int finish(int a) {
    int code = finish_within(agents_[size_t(a)], 400);
    agents_[size_t(a)] = -1;
    return code;
  }

  void wait_for_step(int s) {
    const double t0 = now_seconds();
    while (last_step(out() + "/metrics.jsonl") < s) {
      ASSERT_EQ(::waitpid(agents_[0], nullptr, WNOHANG), 0) << "the job ended before step " << s << "\n" << log(0);
      ASSERT_LT(now_seconds() - t0, 300) << "step " << s << " never came";
      std::this_thread::sleep_for(20ms);
    }
  }

  // The losses of an undisturbed run of the same job on one 4-rank launcher (launch_testutil.h).
  std::vector<std::string> undisturbed() { return node_job_undisturbed(dir_); }

  // The checkpoint the last attempt resumed from, and its step: the last `run` line of the job's metrics says.
  std::pair<fs::path, int> resumed_from() const {
    std::string dir;
    for (const auto& j : events_of(out() + "/metrics.jsonl"))
      if (j.value("kind", "") == "run") dir = j.value("resumed_from", "");
    int step = -1;
    if (auto at = dir.rfind("step_"); at != std::string::npos) step = std::atoi(dir.c_str() + at + 5);
    return {dir, step};
  }

  // The oracle of a job that shrank to dp1 x tp2: the undisturbed losses up to the checkpoint it resumed from, then a
  // dp1 x tp2 run with grad_accum 2 on 2 ranks resumed from a copy of that very checkpoint.
  std::vector<std::string> shrunk_oracle() {
    auto [src, from] = resumed_from();
    EXPECT_GE(from, 2) << "resumed from '" << src.string() << "'";
    std::vector<std::string> want = undisturbed();
    want.resize(size_t(std::max(0, from)));
    const fs::path copy = dir_ / "resume-from";
    std::error_code ec;
    fs::copy(src, copy, fs::copy_options::recursive, ec);
    EXPECT_FALSE(ec) << "cannot copy " << src << ": " << ec.message();
    const std::string oracle = (dir_ / "oracle").string();
    std::vector<std::string> args = {"launch", "--nproc", "2"};
    for (auto& s : train(oracle, {"--parallel.dp=1", "--train.grad_accum=2", "--ckpt.resume=" + copy.string()}))
      args.push_back(s);
    const std::string log = (dir_ / "oracle.log").string();
    EXPECT_EQ(finish_within(start_logged(kMegatrain, args, log), 400), 0) << slurp(log);
    for (auto& l : step_losses(oracle + "/metrics.jsonl")) want.push_back(l);
    return want;
  }

  std::map<int, std::vector<std::string>> wrap_;  // agent -> the command it runs under (start_job)

  std::string out() const { return (dir_ / "run").string(); }
  std::string events(int a) const { return (dir_ / fmt::format("events-{}.jsonl", a)).string(); }
  std::string log_path(int a) const { return (dir_ / fmt::format("agent-{}.log", a)).string(); }
  std::string log(int a) const { return slurp(log_path(a)); }
  std::string logs() const {
    std::string s;
    for (size_t a = 0; a < agents_.size(); ++a) s += fmt::format("---- agent {}\n{}", a, log(int(a)));
    return s;
  }
  // The driver's events (node 0's log, "by": "driver") named `name`.
  std::vector<nlohmann::json> driver(const std::string& name) const {
    std::vector<nlohmann::json> v;
    for (auto& e : events_of(events(0)))
      if (e.value("by", "") == "driver" && e["event"] == name) v.push_back(e);
    return v;
  }
  fs::path dir_;
  std::vector<pid_t> agents_;
};

// Also watches the job through node 0's dashboard, which the driver feeds: it must show the job's ranks on the
// nodes the driver placed them on, before the fault (nodes 0 and 1) and after it (0 and the spare, 2), and a history
// with every step of each attempt and rank 0's losses, though steps here take milliseconds and the agents publish
// their ranks' statuses every half second.
TEST_F(LaunchNodes, AKilledAgentIsReplacedByASpareAndTheLayoutKept) {
  const auto want = undisturbed();
  // Every agent is given the webhook; node 0 sends the driver's events (all kinds here), the others nothing. The
  // dashboard is HTTPS, with a certificate 3 days from expiry, which the driver says as a warning once it publishes.
  Receiver webhook;
  const TestCert cert = make_test_cert(dir_ / "tls", "dash", -60, 3 * 86400);
  start_job(2, 1, slow_from_step6(),
            {"--dashboard", "127.0.0.1:0", "--notify", webhook.url(), "--notify-events", "all", "--dashboard-tls-cert",
             cert.cert, "--dashboard-tls-key", cert.key});
  // Poll /api/job until the job ends, keeping, per attempt, the nodes its running ranks were shown on (while the
  // attempt runs: the driver may see only its start of a short attempt, so "starting" counts).
  std::mutex mu;
  std::map<int, std::set<int>> nodes_of_attempt;
  std::map<std::pair<int, int>, nlohmann::json> history;  // (attempt, step): the newest point seen
  std::atomic<bool> done{false};
  std::thread watcher([&] {
    int port = 0;
    while (!done && port == 0) {
      for (const auto& e : events_of(events(0)))
        if (e.value("event", "") == "dashboard") port = std::stoi(e.value("url", "").substr(18));  // https://127.0.0.1:
      std::this_thread::sleep_for(20ms);
    }
    httplib::Client c(fmt::format("https://127.0.0.1:{}", port));
    c.enable_server_certificate_verification(true);
    c.set_ca_cert_path(cert.cert);
    while (!done) {
      if (auto r = c.Get("/api/job")) {
        auto j = nlohmann::json::parse(r->body, nullptr, false);
        const std::set<std::string> in_attempt = {"starting", "running", "stopping"};
        if (j.is_object() && in_attempt.count(j["job"]["state"].get<std::string>())) {
          std::lock_guard<std::mutex> lock(mu);
          for (const auto& rank : j["ranks"])
            if (rank["running"].get<bool>())
              nodes_of_attempt[j["job"]["attempt"].get<int>()].insert(rank["node"].get<int>());
        }
        if (j.is_object()) {
          std::lock_guard<std::mutex> lock(mu);
          for (const auto& p : j["history"]) history[{p["attempt"].get<int>(), p["step"].get<int>()}] = p;
        }
      }
      std::this_thread::sleep_for(50ms);
    }
  });
  wait_for_step(5);
  ::kill(agents_[1], SIGKILL);
  agents_[1] = -1;
  const int code0 = finish(0);
  done = true;
  watcher.join();
  ASSERT_EQ(code0, 0) << logs();
  EXPECT_EQ(finish(2), 0) << logs();
  EXPECT_EQ(nodes_of_attempt, (std::map<int, std::set<int>>{{0, {0, 1}}, {1, {0, 2}}}));
  EXPECT_EQ(step_losses(out() + "/metrics.jsonl"), want) << logs();
  // The history: per attempt, every step from its first to its last shown, with the loss rank 0 logged for it.
  std::map<int, double> logged;  // a replayed step logs the same loss again (the run is deterministic)
  for (const auto& l : events_of(out() + "/metrics.jsonl"))
    if (l.value("kind", "") == "train") logged[l["step"].get<int>()] = l["loss"].get<double>();
  std::map<int, std::vector<int>> steps_of_attempt;
  for (const auto& [key, p] : history) {
    steps_of_attempt[key.first].push_back(key.second);
    if (!p["loss"].is_null() && logged.count(key.second)) {
      EXPECT_EQ(p["loss"].get<double>(), logged[key.second]) << p.dump();
    }
  }
  EXPECT_EQ(steps_of_attempt.size(), 2u);
  for (const auto& [attempt, steps] : steps_of_attempt)  // std::map: in order
    EXPECT_EQ(steps.back() - steps.front() + 1, int(steps.size()))
        << "attempt " << attempt << " misses steps: " << nlohmann::json(steps).dump();
  EXPECT_EQ(steps_of_attempt[1].back(), 10) << nlohmann::json(steps_of_attempt[1]).dump();
  auto d = driver("detected");
  ASSERT_FALSE(d.empty()) << slurp(events(0));
  EXPECT_EQ(d[0]["reason"], "node_lost") << d[0].dump();
  EXPECT_EQ(d[0]["node"], 1) << d[0].dump();
  auto p = driver("planned");
  ASSERT_EQ(p.size(), 2u) << slurp(events(0));
  EXPECT_EQ(p[1]["nodes"], nlohmann::json::array({0, 2})) << p[1].dump();
  EXPECT_EQ(driver("evicted").at(0)["node"], 1);
  // The certificate's expiry, said once (the job is minutes, not days). Other warnings may come: on a loaded machine
  // a rank of these millisecond steps can be a straggler for a few steps (seen under ctest -j3).
  std::vector<nlohmann::json> w;
  for (auto& e : driver("warning"))
    if (e.value("reason", "") == "certificate_expiring") w.push_back(e);
  ASSERT_EQ(w.size(), 1u) << slurp(events(0));
  EXPECT_EQ(w[0]["reason"], "certificate_expiring") << w[0].dump();
  EXPECT_NE(w[0]["line"].get<std::string>().find("expires in 3.0 days"), std::string::npos) << w[0].dump();
  // The webhook got the driver's lines, each once, in order (node 0's agent sent them before it exited).
  std::vector<nlohmann::json> driver_lines;
  for (auto& e : events_of(events(0)))
    if (e.value("by", "") == "driver") driver_lines.push_back(e);
  const auto got = webhook.bodies();
  ASSERT_EQ(got.size(), driver_lines.size()) << log(0);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i]["event"], driver_lines[i]);
  // The driver's effective training time: the kept steps (rank 0's records, heard through the agents' statuses
  // every half second) took exactly what the final metrics lines say.
  double kept = 0;
  for (const auto& l : events_of(out() + "/metrics.jsonl"))
    if (l.value("kind", "") == "train") kept += l["step_seconds"].get<double>();
  const auto end = driver("done");
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0]["useful_s"].get<double>(), kept) << end[0].dump();
}

TEST_F(LaunchNodes, AKilledAgentWithoutASpareShrinksTheJobToFewerReplicas) {
  start_job(2, 0, slow_from_step6());
  wait_for_step(5);
  ::kill(agents_[1], SIGKILL);
  agents_[1] = -1;
  ASSERT_EQ(finish(0), 0) << logs();
  EXPECT_NE(log(0).find("shrinking to 1 node: dp 2 -> 1 (tp 2, pp 1), world 4 -> 2, grad_accum 1 -> 2"),
            std::string::npos)
      << log(0);
  auto p = driver("planned");
  ASSERT_EQ(p.size(), 2u) << slurp(events(0));
  EXPECT_EQ(p[1]["nodes"], nlohmann::json::array({0}));
  EXPECT_EQ(p[1]["extra_args"], nlohmann::json::array({"--parallel.dp=1", "--train.grad_accum=2"}));
  EXPECT_EQ(step_losses(out() + "/metrics.jsonl"), shrunk_oracle()) << logs();
}

// Node 1 does not see the shared checkpoint directory: its agent runs in a mount namespace of its own with a tmpfs
// over <out>/ckpt, as a node whose shared file system is not mounted there writes to its local disk. Sharded
// checkpoints cannot commit then (rank 0 never sees node 1's files): before the check, a job like this trained to
// its end and stalled in its final save, rank 0 waiting up to 10 minutes for shard files it could never see (killed
// after 120 s; its periodic checkpoint left as step_00000003.tmp-sharded). Now every rank refuses at start, kind
// Config, naming node 1's ranks, and the driver does not restart.
TEST_F(LaunchNodes, ANodeThatDoesNotShareTheCheckpointDirectoryStopsTheJobAtStart) {
  if (std::system("unshare -m --propagation private sh -c 'mount -t tmpfs none /mnt' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "cannot make a mount namespace with a tmpfs (needs root and unshare): no way to give a node a "
                    "private view of the directory";
  fs::create_directories(out() + "/ckpt");
  wrap_[1] = {"/usr/bin/unshare",
              "-m",
              "--propagation",
              "private",
              "sh",
              "-c",
              "mount -t tmpfs none '" + out() + "/ckpt' && exec \"$0\" \"$@\""};
  start_job(2, 0);
  EXPECT_EQ(finish(0), 10) << logs();
  EXPECT_EQ(finish(1), 10) << logs();
  const std::string want = "ckpt.dir " + out() +
                           "/ckpt is not one directory for every rank: rank(s) 2, 3 do not "
                           "see the file rank 0 wrote there";
  EXPECT_NE(log(0).find(want), std::string::npos) << log(0);
  EXPECT_NE(log(1).find("the probe file rank 0 wrote there: it is not there"), std::string::npos) << log(1);
  EXPECT_NE(log(0).find("restarting cannot help"), std::string::npos) << log(0);
  EXPECT_TRUE(step_losses(out() + "/metrics.jsonl").empty()) << "steps ran before the check";
  EXPECT_EQ(driver("planned").size(), 1u) << slurp(events(0));  // no second attempt
}

// A crash, after which `megatrain diagnose` fails on node 1 (badnode): node 1 is evicted and the spare takes slot 1.
TEST_F(LaunchNodes, ANodeThatFailsDiagnoseIsEvictedAndASpareTakesItsPlace) {
  const auto want = undisturbed();
  start_job(2, 1, "crash:rank=2:step=5;badnode:node=1");
  ASSERT_EQ(finish(0), 0) << logs();
  EXPECT_EQ(finish(1), 43) << log(1);  // evicted
  EXPECT_EQ(finish(2), 0) << logs();
  EXPECT_EQ(step_losses(out() + "/metrics.jsonl"), want) << logs();
  std::map<int, bool> diag;
  for (auto& e : driver("diagnosed")) diag[e["node"].get<int>()] = e["pass"].get<bool>();
  EXPECT_EQ(diag, (std::map<int, bool>{{0, true}, {1, false}})) << slurp(events(0));
  auto ev = driver("evicted");
  ASSERT_EQ(ev.size(), 1u) << slurp(events(0));
  EXPECT_EQ(ev[0]["node"], 1);
  EXPECT_NE(ev[0]["reason"].get<std::string>().find("failed diagnose"), std::string::npos) << ev[0].dump();
  EXPECT_EQ(driver("planned").at(1)["nodes"], nlohmann::json::array({0, 2}));
}

// A silent data corruption that comes back is persistent (launch/sdc_strikes.h): rank 3 (node 1) flips a weight bit
// after step 6 in attempt 0 and again in attempt 1 (dp 4: its three replicas name it by majority). The first time
// the job restarts where it is; the second, node 1 is evicted and the spare takes its slot. The job ends with the
// losses of an undisturbed dp 4 run: every restart resumes from the step-4 checkpoint the replicas agreed on.
TEST_F(LaunchNodes, ANodeNamedForASilentDataCorruptionInTwoAttemptsIsEvictedForTheSpare) {
  job_extra_ = {"--parallel.dp=4", "--parallel.tp=1"};
  std::vector<std::string> oracle = {"launch", "--nproc", "4", "--"};
  for (auto& a : node_job((dir_ / "undisturbed-dp4").string(), job_extra_)) oracle.push_back(a);
  const std::vector<std::string> want = cached_losses("nodes-undisturbed-dp4", oracle, [&] {
    const std::string l = (dir_ / "undisturbed-dp4.log").string();
    EXPECT_EQ(finish_within(start_logged(kMegatrain, oracle, l), 400), 0) << slurp(l);
    return step_losses((dir_ / "undisturbed-dp4" / "metrics.jsonl").string());
  });
  ASSERT_EQ(want.size(), 10u);
  start_job(2, 1, "bitflip:rank=3:step=6;bitflip:rank=3:step=6:attempt=1");
  ASSERT_EQ(finish(0), 0) << logs();
  EXPECT_EQ(finish(1), 43) << log(1);  // evicted
  EXPECT_EQ(finish(2), 0) << logs();
  EXPECT_EQ(step_losses(out() + "/metrics.jsonl"), want) << logs();
  auto ev = driver("evicted");
  ASSERT_EQ(ev.size(), 1u) << slurp(events(0));
  EXPECT_EQ(ev[0]["node"], 1);
  EXPECT_NE(ev[0]["reason"].get<std::string>().find("in attempt 0 and again in attempt 1: persistent"),
            std::string::npos)
      << ev[0].dump();
  const auto planned = driver("planned");
  ASSERT_EQ(planned.size(), 3u) << slurp(events(0));
  EXPECT_EQ(planned[1]["nodes"], nlohmann::json::array({0, 1}));  // named once: restarted where it was
  EXPECT_EQ(planned[2]["nodes"], nlohmann::json::array({0, 2}));
}

TEST_F(LaunchNodes, ANodeThatFailsDiagnoseWithoutASpareShrinksTheJob) {
  start_job(2, 0, "crash:rank=2:step=5;badnode:node=1");
  ASSERT_EQ(finish(0), 0) << logs();
  EXPECT_EQ(finish(1), 43) << log(1);
  EXPECT_EQ(driver("evicted").at(0)["node"], 1);
  EXPECT_EQ(driver("planned").at(1)["nodes"], nlohmann::json::array({0}));
  EXPECT_EQ(step_losses(out() + "/metrics.jsonl"), shrunk_oracle()) << logs();
}

// Rank 3 (node 1) blocks inside a collective: the driver, which sees every node's ranks, declares the hang and
// blames rank 3, not one of the ranks on its own node that wait for it; node 1 is evicted, the spare takes over.
TEST_F(LaunchNodes, AHangOnAnotherNodeIsBlamedOnItsRankAndThatNodeEvicted) {
  const auto want = undisturbed();
  start_job(2, 1, "hang:rank=3:step=6", {"--hang-floor", "5", "--stack-timeout", "300"});  // (launch_faults_test)
  ASSERT_EQ(finish(0), 0) << logs();
  EXPECT_EQ(step_losses(out() + "/metrics.jsonl"), want) << logs();
  auto d = driver("detected");
  ASSERT_FALSE(d.empty()) << slurp(events(0));
  EXPECT_EQ(d[0]["reason"], "hang") << d[0].dump();
  EXPECT_EQ(d[0]["ranks"], nlohmann::json::array({3})) << d[0].dump();
  EXPECT_NE(d[0]["blame"].get<std::string>().find("rank 3 (dp1,pp0,tp1)"), std::string::npos) << d[0].dump();
  EXPECT_EQ(d[0]["nodes"], nlohmann::json::array({1})) << d[0].dump();
  EXPECT_EQ(driver("evicted").at(0)["node"], 1);
  EXPECT_EQ(driver("planned").at(1)["nodes"], nlohmann::json::array({0, 2}));
  // The driver's stop names rank 3, and node 1's agent kills it at once instead of granting it a grace period.
  EXPECT_NE(log(1).find("is blamed for the hang; killing it now"), std::string::npos) << log(1);
  EXPECT_EQ(log(0).find("is blamed for the hang"), std::string::npos) << log(0);  // rank 3 is not node 0's
  // ... after dumping its stacks, in node 1's own event log.
  std::vector<nlohmann::json> stacks;
  for (auto& e : events_of(events(1)))
    if (e["event"] == "stacks") stacks.push_back(e);
  ASSERT_EQ(stacks.size(), 1u) << slurp(events(1));
  EXPECT_EQ(stacks[0]["rank"], 3);
  if (const std::string why = gdb_cannot_attach(); !why.empty())
    GTEST_SKIP() << "the stacks themselves are not checked: " << why;
  EXPECT_NE(stacks[0]["frames"].dump().find("mt::FaultInjector::FaultInjector"), std::string::npos) << stacks[0].dump();
}

// kill -STOP of an agent: the node's ranks live on, but the agent answers nothing; the driver declares the node
// lost after --node-timeout and goes on with the spare.
TEST_F(LaunchNodes, AStoppedAgentIsALostNode) {
  const auto want = undisturbed();
  start_job(2, 1, slow_from_step6());
  wait_for_step(5);
  ::kill(agents_[1], SIGSTOP);
  ASSERT_EQ(finish(0), 0) << logs();
  EXPECT_EQ(step_losses(out() + "/metrics.jsonl"), want) << logs();
  auto d = driver("detected");
  ASSERT_FALSE(d.empty()) << slurp(events(0));
  EXPECT_EQ(d[0]["reason"], "node_lost") << d[0].dump();
  EXPECT_EQ(d[0]["node"], 1) << d[0].dump();
  EXPECT_EQ(driver("planned").at(1)["nodes"], nlohmann::json::array({0, 2}));
}

// The same job on three hosts of a test network: nodes 0 and 1 and a spare, with no --iface: each agent and its
// ranks find their address by the route to the master (10.77.0.1), the store listens there, Gloo runs between
// the hosts' own addresses. At step 5 host 1's cable is cut (its switch port down: its packets vanish, nobody gets
// a reset). Its agent cannot renew its lease (launch/node_lease.h), so it must kill its ranks and leave before the
// driver declares the node lost; the driver then goes on with the spare, and the link comes back (a flap) while
// the job runs without host 1. Oracles:
//  - the losses equal the undisturbed run's, step for step;
//  - host 1 fenced itself before the driver's detection (the two events' times, one clock: the same machine), and
//    its ranks were gone when the driver's detection was seen;
//  - after the flap nothing of host 1 is left: its agent exited 22 and its namespace holds no process.
//  - host 0's ranks, blocked in collectives with host 1's, gave up at once when the driver stopped the attempt.
// Without the lease, host 1's ranks sat in their collectives until the link returned, then failed as a lost peer
// and wrote their snapshots into the checkpoint directory the new attempt was using.
class LaunchHosts : public LaunchNodes {
 protected:
  // As start_job, each agent on its own host of `net`.
  void start_on_hosts(NetHosts& net, int nodes, int spares, const std::string& faults = "") {
    const std::string master = net.address(0) + ":29500";  // each host has its own ports: any port is free
    if (!faults.empty()) ::setenv("MEGATRAIN_FAULTS", faults.c_str(), 1);
    for (int a = 0; a < nodes + spares; ++a) {
      std::vector<std::string> args = {kMegatrain,       "launch",
                                       "--nproc",        "2",
                                       "--nnodes",       std::to_string(nodes),
                                       "--node-rank",    std::to_string(a),
                                       "--spares",       std::to_string(spares),
                                       "--master",       master,
                                       "--max-restarts", "3",
                                       "--backoff",      "0",
                                       "--events",       events(a)};
      for (auto& s : train(out(), job_extra_)) args.push_back(s);
      const std::vector<std::string> cmd = net.on_host(a, args);
      agents_.push_back(start_logged(cmd[0], {cmd.begin() + 1, cmd.end()}, log_path(a)));
    }
    ::unsetenv("MEGATRAIN_FAULTS");
  }
};

// A process that has not exited (a zombie has: it only waits to be reaped).
bool running(pid_t pid) {
  std::ifstream f(fmt::format("/proc/{}/stat", pid));
  std::string stat;
  if (!std::getline(f, stat)) return false;
  const size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
}

TEST_F(LaunchHosts, AHostCutOffTheNetworkFencesItselfBeforeTheSpareTakesItsPlace) {
  NetHosts net(3);
  if (!net.ok()) GTEST_SKIP() << "no test network on this machine: " << net.why();
  const auto want = undisturbed();
  start_on_hosts(net, 2, 1, slow_from_step6());
  wait_for_step(5);
  const std::vector<pid_t> host1_ranks = {rank_pid(agents_[1], 2), rank_pid(agents_[1], 3)};
  ASSERT_GT(host1_ranks[0], 0) << logs();
  ASSERT_GT(host1_ranks[1], 0) << logs();
  net.cut(1);
  const double t0 = now_seconds();
  while (driver("detected").empty()) {
    ASSERT_LT(now_seconds() - t0, 300) << "the driver never noticed\n" << logs();
    std::this_thread::sleep_for(20ms);
  }
  for (pid_t p : host1_ranks) EXPECT_FALSE(running(p)) << "host 1's rank (pid " << p << ") outlived its lease";
  while (driver("evicted").empty()) {
    ASSERT_LT(now_seconds() - t0, 300) << "host 1 was never evicted\n" << logs();
    std::this_thread::sleep_for(20ms);
  }
  net.restore(1);
  ASSERT_EQ(finish(0), 0) << logs();
  EXPECT_EQ(finish(2), 0) << logs();
  EXPECT_EQ(finish(1), 22) << log(1);
  EXPECT_TRUE(net.pids(1).empty()) << "processes left on host 1";
  EXPECT_EQ(step_losses(out() + "/metrics.jsonl"), want) << logs();

  const auto d = driver("detected");
  EXPECT_EQ(d[0]["reason"], "node_lost") << d[0].dump();
  EXPECT_EQ(d[0]["node"], 1) << d[0].dump();
  std::vector<nlohmann::json> fenced;
  for (auto& e : events_of(events(1)))
    if (e["event"] == "fenced") fenced.push_back(e);
  ASSERT_EQ(fenced.size(), 1u) << slurp(events(1));
  EXPECT_EQ(fenced[0]["ranks_killed"], 2) << fenced[0].dump();
  EXPECT_LT(fenced[0]["t"].get<double>(), d[0]["t"].get<double>()) << "host 1 fenced itself only after the driver "
                                                                      "declared it lost";
  EXPECT_EQ(log(1).find("peer snapshot: wrote"), std::string::npos) << "a fenced rank wrote snapshots\n" << log(1);
  // Host 0's ranks were blocked in collectives with host 1's, which never answer: the driver's stop abandons the
  // attempt (SIGUSR1), so they give up at once as a lost peer (writing whatever snapshots they hold) instead of
  // sitting out the grace period and dying by SIGKILL.
  EXPECT_NE(log(0).find("abandoned while waiting for it"), std::string::npos) << log(0);
  EXPECT_EQ(log(0).find("still running after the grace period"), std::string::npos) << log(0);
  EXPECT_EQ(driver("planned").at(1)["nodes"], nlohmann::json::array({0, 2}));
  // Each host's ranks talked on that host's own address, found by the route to the master.
  for (int a : {0, 1, 2})
    EXPECT_NE(log(a).find(fmt::format("use {} ({}): the route to MASTER_ADDR {}", net.address(a), net.interface(a),
                                      net.address(0))),
              std::string::npos)
        << log(a);
}

// Host 1 freezes at step 5 (every process on it stopped, as a hung kernel or a paused VM stops them), the job goes
// on with the spare, and then host 1 thaws - its ranks first. They wake in collectives whose peers are long gone,
// fail as a lost peer, and a failing rank writes its in-memory snapshots for the restart: into the checkpoint
// directory of the attempt now running. Before writing, each asks the store whether the job went on without its
// attempt (train/attempt_fence.h: the next attempt's plan exists), and must write nothing. Then the agent thaws,
// finds its lease long lapsed, and leaves. The losses must still equal the undisturbed run's.
TEST_F(LaunchHosts, AFrozenHostThatThawsAfterTheJobWentOnWritesNothing) {
  NetHosts net(3);
  if (!net.ok()) GTEST_SKIP() << "no test network on this machine: " << net.why();
  const auto want = undisturbed();
  start_on_hosts(net, 2, 1, slow_from_step6());
  wait_for_step(5);
  const std::vector<pid_t> ranks = {rank_pid(agents_[1], 2), rank_pid(agents_[1], 3)};
  ASSERT_GT(ranks[0], 0) << logs();
  ASSERT_GT(ranks[1], 0) << logs();
  const std::vector<pid_t> frozen = net.pids(1);
  for (pid_t p : frozen) ::kill(p, SIGSTOP);
  const double t0 = now_seconds();
  while (driver("resumed").empty()) {  // the next attempt, on the spare, has made a step
    ASSERT_LT(now_seconds() - t0, 300) << "the job never went on\n" << logs();
    std::this_thread::sleep_for(20ms);
  }
  for (pid_t p : ranks) ::kill(p, SIGCONT);
  while (running(ranks[0]) || running(ranks[1])) {
    ASSERT_LT(now_seconds() - t0, 300) << "host 1's thawed ranks never ended\n" << log(1);
    std::this_thread::sleep_for(20ms);
  }
  for (pid_t p : frozen) ::kill(p, SIGCONT);
  ASSERT_EQ(finish(0), 0) << logs();
  EXPECT_EQ(finish(2), 0) << logs();
  const int code1 = finish(1);
  EXPECT_TRUE(code1 == 22 || code1 == 43) << code1 << "\n" << log(1);  // fenced, or read its eviction first
  EXPECT_EQ(step_losses(out() + "/metrics.jsonl"), want) << logs();
  // Survivors' snapshots are written only by a failing attempt, and the next attempt's start consumes or removes
  // them; this job's last attempt did not fail, so whatever lies under snapshots/ now came from host 1's ranks.
  // (Their own messages may be lost: the agent that copies their output left without draining it.)
  std::vector<std::string> late;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(out() + "/ckpt/snapshots", ec);
       !ec && it != fs::recursive_directory_iterator(); ++it)
    if (it->is_regular_file()) late.push_back(it->path().string());
  EXPECT_TRUE(late.empty()) << "written after the job went on:\n" << fmt::format("{}", fmt::join(late, "\n"));
  EXPECT_EQ(log(1).find("peer snapshot: wrote"), std::string::npos) << log(1);
}

}  // namespace
