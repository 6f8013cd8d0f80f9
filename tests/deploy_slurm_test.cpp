// deploy/slurm/megatrain.sbatch on a real Slurm cluster: Debian's slurmctld, slurmd and munged, on the hosts of a
// test network (net_hosts.h). Host 0 is the controller (the login node, where sbatch runs); hosts 1..n are the
// compute nodes n1..nN, each a slurmd in its host's network namespace under its own hostname (a UTS namespace), so
// Slurm sees N machines with N addresses. The job is launch_testutil.h's node_job (dp2 x tp2, 2 ranks a node) on
// 3 nodes with MEGATRAIN_SPARES=1, submitted with sbatch from the controller host. Two faults, one after the other:
//  - node 1's agent is killed (kill -9) mid-run: Slurm reports that task's failure, the spare takes its place;
//  - then node 0's agent, the driver: the others leave within their lease, and the script requeues the job, whose
//    next run resumes from the newest checkpoint.
// The job must complete with exit code 0, and its per-step losses must equal the undisturbed run's (the oracle). A
// webhook on the login node must hear the node lost, the requeue and the end (MEGATRAIN_NOTIFY_URL).
// (One test, not a clean run and faulty ones: the clean path is inside it, and each cluster costs seconds of CI.)
// Needs root, iproute2, nsenter and unshare (util-linux), and the Slurm and MUNGE daemons; without them the tests
// skip, saying what is missing.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <regex>
#include <thread>

#include "support/files.h"
#include "support/launch_testutil.h"
#include "support/megatrain.h"
#include "support/metrics.h"
#include "support/webhook_receiver.h"
#include "support/net_hosts.h"
#include "support/test_util.h"

using namespace mt;
using namespace mt::test;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

// The programs a Slurm cluster needs here that are not installed ("" when none).
std::string missing_programs() {
  std::string missing;
  for (const char* p : {"slurmctld", "slurmd", "munged", "sbatch", "scontrol", "sinfo", "nsenter", "unshare"})
    if (run_shell(fmt::format("command -v {}", p)) != 0) missing += std::string(missing.empty() ? "" : ", ") + p;
  return missing;
}

// A Slurm cluster on the hosts of `net`: MUNGE (one daemon, on a socket in `dir`, which every host's processes
// reach: they share the file system), slurmctld on host 0 and a slurmd on each of hosts 1..nodes. Everything it
// writes is under `dir`; the destructor stops its daemons (the hosts' NetHosts kills whatever is left in them).
class SlurmCluster {
 public:
  SlurmCluster(NetHosts& net, int nodes, const fs::path& dir) : net_(net), nodes_(nodes), dir_(dir) {
    fs::create_directories(dir_ / "state");
    for (int i = 1; i <= nodes_; ++i) fs::create_directories(dir_ / fmt::format("spool-n{}", i));
    {
      std::ifstream rnd("/dev/urandom", std::ios::binary);
      std::string key(1024, '\0');
      rnd.read(key.data(), std::streamsize(key.size()));
      std::ofstream(dir_ / "munge.key", std::ios::binary) << key;
    }
    fs::permissions(dir_ / "munge.key", fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::replace);
    std::ofstream conf(conf_path());
    conf << fmt::format(
        "ClusterName=mt\nSlurmctldHost=ctl({})\nSlurmUser=root\nSlurmdUser=root\n"
        "AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={d}/munge.sock\n"
        "StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool-%n\nSlurmctldPidFile={d}/slurmctld.pid\n"
        "SlurmdPidFile={d}/slurmd-%n.pid\nSlurmctldLogFile={d}/slurmctld.log\nSlurmdLogFile={d}/slurmd-%n.log\n"
        // No cgroups (a container may not have them): processes are tracked by their parent pids.
        "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nSwitchType=switch/none\nMpiDefault=none\n"
        "SelectType=select/linear\nJobAcctGatherType=jobacct_gather/none\n"
        "AccountingStorageType=accounting_storage/none\nReturnToService=2\nKillWait=5\nMinJobAge=600\n",
        net_.address(0), fmt::arg("d", dir_.string()));
    std::string names;
    for (int i = 1; i <= nodes_; ++i) {
      conf << fmt::format("NodeName=n{} NodeAddr={} CPUs=1 State=UNKNOWN\n", i, net_.address(i));
      names += fmt::format("{}n{}", i > 1 ? "," : "", i);
    }
    conf << fmt::format("PartitionName=p Nodes={} Default=YES MaxTime=INFINITE State=UP\n", names);
    conf.close();

    std::string out;
    const std::string d = dir_.string();
    if (run_shell(fmt::format("munged -f --socket={d}/munge.sock --key-file={d}/munge.key --log-file={d}/munged.log "
                              "--pid-file={d}/munged.pid --seed-file={d}/munged.seed",
                              fmt::arg("d", d)),
                  &out) != 0) {
      why_ = "munged did not start: " + out;
      return;
    }
    if (on_host(0, "ctl", fmt::format("slurmctld -f {} -i", conf_path()), &out) != 0) {
      why_ = "slurmctld did not start: " + out + slurp(dir_ / "slurmctld.log");
      return;
    }
    for (int i = 1; i <= nodes_; ++i)
      if (on_host(i, fmt::format("n{}", i), fmt::format("slurmd -f {}", conf_path()), &out) != 0) {
        why_ = fmt::format("slurmd of n{} did not start: {}{}", i, out, slurp(dir_ / fmt::format("slurmd-n{}.log", i)));
        return;
      }
    // Up when every node is idle (the slurmds registered with the controller).
    const double t0 = now_seconds();
    for (;;) {
      slurm("sinfo -h -o %t", &out);
      if (std::count(out.begin(), out.end(), '\n') >= 1 && out.find("idle") != std::string::npos &&
          out.find_first_not_of("idle\n") == std::string::npos)
        break;
      if (now_seconds() - t0 > 60) {
        why_ = "the nodes never became idle: sinfo says '" + out + "'\n" + slurp(dir_ / "slurmctld.log");
        return;
      }
      std::this_thread::sleep_for(100ms);
    }
    ok_ = true;
  }
  ~SlurmCluster() {
    std::vector<std::string> pid_files = {"slurmctld.pid", "munged.pid"};
    for (int i = 1; i <= nodes_; ++i) pid_files.push_back(fmt::format("slurmd-n{}.pid", i));
    for (const auto& f : pid_files)
      if (const int pid = std::atoi(slurp(dir_ / f).c_str()); pid > 0) ::kill(pid, SIGKILL);
  }

  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  std::string conf_path() const { return (dir_ / "slurm.conf").string(); }

  // A Slurm client command on the controller host (the login node), with `env` before it.
  int slurm(const std::string& cmd, std::string* out = nullptr, const std::string& env = "") const {
    return run_shell(fmt::format("nsenter --net=/run/netns/{} env SLURM_CONF={} {} {}", net_.netns(0), conf_path(), env,
                                 cmd),
                     out);
  }

  // The job's state and exit code once it has ended (polls `scontrol show job`).
  std::pair<std::string, int> wait_for(const std::string& job, double timeout_s) const {
    const std::regex state(R"(JobState=(\S+))"), code(R"( ExitCode=(\d+):)");
    const double t0 = now_seconds();
    for (std::string out;; std::this_thread::sleep_for(100ms)) {
      slurm("scontrol show job -o " + job, &out);
      std::smatch s, c;
      if (std::regex_search(out, s, state) && std::regex_search(out, c, code) && s[1] != "PENDING" &&
          s[1] != "RUNNING" && s[1] != "CONFIGURING" && s[1] != "COMPLETING")
        return {s[1], std::stoi(c[1])};
      if (now_seconds() - t0 > timeout_s) {
        ADD_FAILURE() << "job " << job << " did not end within " << timeout_s << " s: " << out;
        return {"", -1};
      }
    }
  }

 private:
  // Starts a daemon on host i, in its network namespace and under `hostname` (a UTS namespace of its own: Slurm
  // knows its nodes by their host names). Mounts are shared: /sys/fs/cgroup stays visible (`ip netns exec` would
  // remount /sys).
  int on_host(int i, const std::string& hostname, const std::string& cmd, std::string* out) const {
    return run_shell(fmt::format("nsenter --net=/run/netns/{} unshare --uts sh -c 'hostname {} && exec {}'",
                                 net_.netns(i), hostname, cmd),
                     out);
  }

  NetHosts& net_;
  int nodes_;
  fs::path dir_;
  bool ok_ = false;
  std::string why_;
};

class SlurmJob : public ::testing::Test {
 protected:
  void SetUp() override {
    prepare_launch_data();
    dir_ = case_dir("mt-slurm-");
  }
  void TearDown() override {
    cluster_.reset();  // the daemons first, then the hosts they ran on
    net_.reset();
    if (!HasFailure() && !std::getenv("MT_KEEP_TEST_DIRS")) {
      fs::remove_all(dir_);
      if (!slurm_dir_.empty()) fs::remove_all(slurm_dir_);
    }
  }

  // Starts a controller and `nodes` compute nodes (cluster_). Returns why a test must skip: this machine cannot
  // have such a cluster at all ("" when it can; whether it came up, cluster_->ok() says).
  std::string start_cluster(int nodes) {
    if (std::string m = missing_programs(); !m.empty()) return "not installed: " + m;
    net_ = std::make_unique<NetHosts>(nodes + 1);
    if (!net_->ok()) return "no test network on this machine: " + net_->why();
    // The daemons' folder is short: slurmstepd makes Unix sockets in it, whose paths may not exceed 108 bytes.
    char tmpl[] = "/tmp/mt-slurm-XXXXXX";
    MT_CHECK(::mkdtemp(tmpl), "mkdtemp: {}", std::strerror(errno));
    slurm_dir_ = tmpl;
    cluster_ = std::make_unique<SlurmCluster>(*net_, nodes, slurm_dir_);
    return "";
  }

  // Submits the script for `nodes` nodes from the login node, with MEGATRAIN_FAULTS = `faults` for the ranks; the
  // job id.
  std::string submit(int nodes, int spares, const std::string& faults = "", const std::string& notify_url = "") {
    const SlurmCluster& c = *cluster_;
    std::string args = "--max-restarts 3 --backoff 0 --";
    for (const auto& a : node_job(out())) args += " '" + a + "'";
    std::string env =
        fmt::format("MEGATRAIN={} MEGATRAIN_NPROC=2 MEGATRAIN_SPARES={} MEGATRAIN_RUN_DIR={} MEGATRAIN_FAULTS='{}'",
                    kMegatrain, spares, run_dir(), faults);
    if (!notify_url.empty()) env += " MEGATRAIN_NOTIFY_URL=" + notify_url;
    std::string id;
    EXPECT_EQ(c.slurm(fmt::format("sbatch --parsable --nodes={} --chdir={} -o {} {}/deploy/slurm/megatrain.sbatch {}",
                                  nodes, dir_.string(), job_log(), MT_SOURCE_DIR, args),
                      &id, env),
              0)
        << id;
    return id.substr(0, id.find_first_of(";\n"));
  }

  std::string out() const { return (dir_ / "run").string(); }
  std::string run_dir() const { return (dir_ / "slurm-run").string(); }
  std::string job_log() const { return (dir_ / "job.out").string(); }
  std::string events(int node) const { return fmt::format("{}/events-{}.jsonl", run_dir(), node); }
  // The daemons' logs, for a failure's message.
  std::string daemon_logs() const {
    std::string s;
    for (const auto& e : fs::directory_iterator(slurm_dir_))
      if (e.path().extension() == ".log") s += "---- " + e.path().filename().string() + "\n" + slurp(e.path());
    return s;
  }

  // Polls `done` until it holds. Fails at once when the job ended, or Slurm requeued it unasked (a failed launch),
  // or after the guard of 300 s.
  void wait_until(const std::string& job, const std::function<bool()>& done, const std::string& what,
                  bool requeue_expected = false) {
    const double t0 = now_seconds();
    for (int polls = 0; !done(); ++polls) {
      ASSERT_LT(now_seconds() - t0, 300) << what << " never came\n" << slurp(job_log()) << daemon_logs();
      if (polls % 25 == 0) {
        std::string st;
        cluster_->slurm("scontrol show job -o " + job, &st);
        const bool alive = st.find("JobState=RUNNING") != std::string::npos ||
                           st.find("JobState=COMPLETING") != std::string::npos ||
                           st.find("JobState=REQUEUED") != std::string::npos ||
                           (st.find("JobState=PENDING") != std::string::npos &&
                            (requeue_expected || st.find("Restarts=0") != std::string::npos));
        ASSERT_TRUE(alive) << "waiting for " << what << ": " << st << "\n" << slurp(job_log()) << daemon_logs();
      }
      std::this_thread::sleep_for(20ms);
    }
  }

  // The job's agent on host i (its `megatrain launch` process), or -1.
  pid_t agent_on(int host) const {
    for (pid_t p : net_->pids(host))
      if (slurp(fmt::format("/proc/{}/cmdline", p)).find(std::string("launch\0--nproc", 14)) != std::string::npos)
        return p;
    return -1;
  }

  // The `run` lines in the job's metrics: one per start of training (attempt or requeued run).
  int run_lines() const {
    int n = 0;
    for (const auto& e : events_of(out() + "/metrics.jsonl")) n += e.value("kind", "") == "run";
    return n;
  }

  fs::path dir_, slurm_dir_;
  std::unique_ptr<NetHosts> net_;
  std::unique_ptr<SlurmCluster> cluster_;
};

TEST_F(SlurmJob, AKilledAgentIsReplacedByTheSpareAndALostDriverRequeuesTheJob) {
  if (std::string skip = start_cluster(3); !skip.empty()) GTEST_SKIP() << skip;
  ASSERT_TRUE(cluster_->ok()) << cluster_->why();
  const auto want = node_job_undisturbed(dir_);
  // The test kills an agent after step 5 of attempt 0 and another once attempt 1 has started: both attempts are
  // slowed (slow_from_step6, launch_testutil.h, says why), attempt 1 from its first step. A test process starved on
  // a busy machine (ctest -j 8 on 2 cores) once saw step 5 only after the job had finished. The requeued run starts
  // at attempt 0 again and is slowed from step 6 too.
  std::string faults = slow_from_step6();
  for (int r = 0; r < 4; ++r) faults += fmt::format("slow:rank={}:factor=100:attempt=1;", r);
  // The team's webhook, on the login node (host 0): the driver posts to it, and the script when the driver is lost.
  Receiver webhook(std::make_unique<httplib::Server>(), "/run/netns/" + net_->netns(0));
  ASSERT_GT(webhook.port(), 0);
  const std::string job = submit(3, 1, faults, webhook.url("http", net_->address(0)));
  // 1. Node 1 of the job is n2 (host 2): kill its agent once training is under way; the spare (n3) takes over.
  wait_until(
      job, [&] { return last_step(out() + "/metrics.jsonl") >= 5; }, "step 5");
  if (HasFatalFailure()) return;
  ASSERT_GT(agent_on(2), 0) << "no agent on n2";
  ::kill(agent_on(2), SIGKILL);
  // 2. As soon as the next attempt has started (its `run` line), kill node 0's agent (n1: the driver). The other
  //    agents leave within their lease, and the script requeues the job.
  wait_until(
      job, [&] { return run_lines() >= 2; }, "the second attempt");
  if (HasFatalFailure()) return;
  ASSERT_GT(agent_on(1), 0) << "no agent on n1";
  ::kill(agent_on(1), SIGKILL);
  // Slurm holds a requeued job for 2 minutes (its begin time), time for the nodes to clean up after the run that
  // ended; the test waits for that cleanup (every node idle again) and moves the begin time to now.
  std::string st, nodes;
  wait_until(
      job,
      [&] {
        cluster_->slurm("scontrol show job -o " + job, &st);
        cluster_->slurm("sinfo -h -o %t", &nodes);
        return st.find("Restarts=1") != std::string::npos && st.find("JobState=PENDING") != std::string::npos &&
               nodes.find_first_not_of("idle\n") == std::string::npos;
      },
      "the requeue", /*requeue_expected=*/true);
  if (HasFatalFailure()) return;
  // A requeue revokes the job's credential, and a slurmd refuses a new one issued within the same second ("Job
  // credential revoked": the job fails). Slurm's own 2 minutes cover that; the test waits 2 s.
  std::this_thread::sleep_for(2s);
  ASSERT_EQ(cluster_->slurm(fmt::format("scontrol update JobId={} StartTime=now", job), &st), 0) << st;
  const auto [state, code] = cluster_->wait_for(job, 300);
  const std::string log = slurp(job_log());
  EXPECT_EQ(state, "COMPLETED") << log;
  EXPECT_EQ(code, 0) << log;
  EXPECT_EQ(step_losses(out() + "/metrics.jsonl"), want) << log;
  // Slurm saw node 1's task fail (the script's shell around the agent reports its SIGKILL as 137).
  EXPECT_NE(log.find("n2: task 1: Exited with exit code 137"), std::string::npos) << log;
  EXPECT_NE(log.find("requeueing the job (requeue 1 of 3"), std::string::npos) << log;
  EXPECT_NE(log.find("(run 2)"), std::string::npos) << log;
  EXPECT_NE(log.find("the job driver's exit code: 0"), std::string::npos) << log;
  // Node 0 is the allocation's first node, reached at its NodeAddr; each node's agent logged its own events.
  EXPECT_NE(log.find(fmt::format("driver on n1 ({}:29500)", net_->address(1))), std::string::npos) << log;
  for (int node : {0, 1, 2}) EXPECT_FALSE(events_of(events(node)).empty()) << events(node);
  // The first run's driver put the spare in node 1's place; the second run planned all over again.
  std::vector<nlohmann::json> planned;
  for (const auto& e : events_of(events(0)))
    if (e.value("by", "") == "driver" && e["event"] == "planned") planned.push_back(e);
  ASSERT_EQ(planned.size(), 3u) << slurp(events(0));
  EXPECT_EQ(planned[1]["nodes"], nlohmann::json::array({0, 2})) << planned[1].dump();

  // The webhook heard the story: node 1 lost (from the first run's driver), the requeue (from the script: the driver
  // was gone), and the end (from the second run's driver). Each driver line it got is one of node 0's log, in the
  // log's order (the first driver may have died with a message still queued: nothing more is asked of it).
  std::vector<nlohmann::json> driver_lines, got_driver;
  for (const auto& e : events_of(events(0)))
    if (e.value("by", "") == "driver") driver_lines.push_back(e);
  nlohmann::json requeued;
  for (const auto& b : webhook.bodies()) {
    EXPECT_EQ(b["job"], "megatrain") << b.dump();  // #SBATCH --job-name
    if (b["event"].value("by", "") == "driver") got_driver.push_back(b["event"]);
    if (b["event"]["event"] == "requeued") requeued = b["event"];
  }
  size_t at = 0;
  for (const auto& g : got_driver) {
    while (at < driver_lines.size() && driver_lines[at] != g) ++at;
    EXPECT_LT(at, driver_lines.size()) << "not in node 0's log, or out of its order: " << g.dump();
  }
  auto received = [&](const std::string& event, const std::string& reason) {
    for (const auto& g : got_driver)
      if (g["event"] == event && (reason.empty() || g.value("reason", "") == reason)) return true;
    return false;
  };
  EXPECT_TRUE(received("detected", "node_lost")) << nlohmann::json(got_driver).dump();
  EXPECT_TRUE(received("done", "")) << nlohmann::json(got_driver).dump();
  ASSERT_TRUE(requeued.is_object()) << "no requeued message from the script\n" << log;
  EXPECT_EQ(requeued["requeue"], 1);
  EXPECT_EQ(requeued["of"], 3);
  EXPECT_EQ(requeued["slurm_job"], std::stoi(job));
  EXPECT_NE(requeued["reason"].get<std::string>().find("the driver"), std::string::npos) << requeued.dump();
}

}  // namespace
