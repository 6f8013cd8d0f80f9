// One data loader per node (data.node_loader, data/node_loader.h) on real jobs of the `megatrain` binary: the oracle
// is the same job with a loader per rank (data.node_loader = false), whose per-step losses a run with one reader
// per node must equal bit for bit (loss_exact), on one node (dp2 x tp2, dp2 x pp2), across two agents on this host
// (one reader per node, two in the job), after a crash of the reader's own rank (the supervisor resumes from the
// checkpoint: the cursor it saved), and with a blend. A corrupt shard read by the reader fails the job with the
// error a per-rank loader gives. The tests assert outcomes, not speed: the timeouts only guard against a hang.
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "support/comm_servers.h"
#include "support/files.h"
#include "support/launch_testutil.h"
#include "support/megatrain.h"
#include "support/metrics.h"
#include "support/test_util.h"

using namespace mt;
using namespace mt::test;
namespace fs = std::filesystem;

namespace {

class LaunchNodeLoader : public ::testing::Test {
 protected:
  void SetUp() override {
    prepare_launch_data();
    dir_ = case_dir("mt-nodeloader-");
  }
  void TearDown() override {
    if (!HasFailure() && !std::getenv("MT_KEEP_TEST_DIRS")) fs::remove_all(dir_);
  }

  // `megatrain launch --nproc 4 [opts] -- train <job>`; returns the exit code (the log in dir_/name.log).
  int launch(const std::string& name, const SmallJob& job, const std::vector<std::string>& opts = {}) {
    std::vector<std::string> args = {"launch", "--nproc", "4"};
    args.insert(args.end(), opts.begin(), opts.end());
    args.push_back("--");
    args.push_back("train");
    for (const std::string& f : job.args()) args.push_back(f);
    return finish_within(start_logged(kMegatrain, args, log_path(name)), 400);
  }
  std::string out(const std::string& name) const { return (dir_ / name).string(); }
  std::string log_path(const std::string& name) const { return (dir_ / (name + ".log")).string(); }
  std::string log(const std::string& name) const { return slurp(log_path(name)); }
  std::vector<std::string> losses(const std::string& name) const { return step_losses(out(name) + "/metrics.jsonl"); }

  // The losses of `job` with a loader per rank (the oracle), once per build and job.
  std::vector<std::string> per_rank(const std::string& key, SmallJob job) {
    job.set("data.node_loader", "false").out(out("per-rank-" + key));
    return cached_losses("nodeloader-" + key, job.args(), [&] {
      EXPECT_EQ(launch("per-rank-" + key, job), 0) << log("per-rank-" + key);
      EXPECT_EQ(log("per-rank-" + key).find("one reader per node"), std::string::npos) << log("per-rank-" + key);
      return losses("per-rank-" + key);
    });
  }

  fs::path dir_;
};

// dp2 x pp2 on 4 ranks: both stages of a replica need rows (tokens on the first, targets on the last).
SmallJob dp2_pp2_job(const std::string& out) {
  return std::move(SmallJob(out)
                       .batch(2)
                       .steps(6)
                       .log_every(1)
                       .model(4, 64, 2, 64)
                       .set("ckpt.save_final", "false")
                       .set("parallel.timeout_s", 60)
                       .with({"--parallel.dp=2", "--parallel.pp=2"}));
}

// Ranks numbered across nodes cyclically, as Slurm's --distribution=cyclic does: "node" 0 holds ranks 0 and 2
// (LOCAL_RANK 0, 1), "node" 1 ranks 1 and 3, four `megatrain train` processes started by hand with a launcher's
// environment. No node's ranks form a block, so every rank keeps a loader of its own (train/node_data.h), the main
// rank says why, and the losses are the per-rank loaders' bit for bit (instead of ranks waiting for a segment no
// reader makes).
TEST_F(LaunchNodeLoader, RanksNumberedCyclicallyAcrossNodesKeepALoaderEachAndSaySo) {
  const auto want = per_rank("dp2tp2", dp2_tp2_job(""));
  ASSERT_EQ(want.size(), 10u);
  mt::test::ScratchDir store;
  std::string cmd = "pids=; ";
  for (int r = 0; r < 4; ++r)
    cmd += fmt::format(
        "RANK={} WORLD_SIZE=4 LOCAL_RANK={} LOCAL_WORLD_SIZE=2 MEGATRAIN_IFACE=lo MEGATRAIN_STORE=file://{} "
        "{} train{} "
        "> {}.{} 2>&1 & pids=\"$pids $!\"; ",
        r, r / 2, store.path, kMegatrain, dp2_tp2_job(out("cyclic")).line(), log_path("cyclic"), r);
  cmd += "rc=0; for p in $pids; do wait $p || rc=1; done; exit $rc";
  EXPECT_EQ(std::system(("bash -c '" + cmd + "'").c_str()), 0) << slurp(log_path("cyclic") + ".0");
  EXPECT_EQ(losses("cyclic"), want) << slurp(log_path("cyclic") + ".0");
  EXPECT_NE(slurp(log_path("cyclic") + ".0")
                .find("data: a loader per rank: the nodes' ranks are not numbered in "
                      "contiguous blocks (ranks that are local rank 0: 0, 1;"),
            std::string::npos)
      << slurp(log_path("cyclic") + ".0");
}

TEST_F(LaunchNodeLoader, Dp2Tp2OnOneNodeMatchesPerRankLoaders) {
  const auto want = per_rank("dp2tp2", dp2_tp2_job(""));
  ASSERT_EQ(want.size(), 10u);
  ASSERT_EQ(launch("node", dp2_tp2_job(out("node"))), 0) << log("node");
  EXPECT_NE(log("node").find("one reader per node (a thread of local rank 0) feeds 4 of its 4 ranks"),
            std::string::npos)
      << log("node");
  EXPECT_EQ(losses("node"), want);
}

TEST_F(LaunchNodeLoader, Dp2Pp2OnOneNodeMatchesPerRankLoaders) {
  const auto want = per_rank("dp2pp2", dp2_pp2_job(""));
  ASSERT_EQ(want.size(), 6u);
  ASSERT_EQ(launch("node", dp2_pp2_job(out("node"))), 0) << log("node");
  EXPECT_EQ(losses("node"), want);
}

// pp4: the two middle stages copy no rows (3 of 4... here 2 of 4 ranks take rows).
TEST_F(LaunchNodeLoader, MiddleStagesTakeNoRowsAndThePipelineMatches) {
  SmallJob job = std::move(dp2_pp2_job("").with({"--parallel.dp=1", "--parallel.pp=4"}));
  const auto want = per_rank("pp4", job);
  ASSERT_EQ(launch("node", job.out(out("node"))), 0) << log("node");
  EXPECT_NE(log("node").find("feeds 2 of its 4 ranks"), std::string::npos) << log("node");
  EXPECT_EQ(losses("node"), want);
}

// The reader's own rank (rank 0) crashes at step 5: the supervisor restarts the job, which resumes from the step-4
// checkpoint (the data cursor in it) with a new reader; the losses are the per-rank loaders' undisturbed ones.
TEST_F(LaunchNodeLoader, ACrashOfTheReadersRankIsRecoveredWithThePerRankLosses) {
  const auto want = per_rank("dp2tp2", dp2_tp2_job(""));
  ::setenv("MEGATRAIN_FAULTS", "crash:rank=0:step=5", 1);
  const int code = launch("node", dp2_tp2_job(out("node")), {"--max-restarts", "2", "--backoff", "0"});
  ::unsetenv("MEGATRAIN_FAULTS");
  ASSERT_EQ(code, 0) << log("node");
  EXPECT_NE(log("node").find("resumed from"), std::string::npos) << log("node");
  EXPECT_EQ(losses("node"), want);
}

// The data cursor a checkpoint holds is the same whichever loader wrote it: a job crashed at step 5 (no restarts)
// and resumed by a second launch with the other setting of data.node_loader has the per-rank loaders' losses.
TEST_F(LaunchNodeLoader, ACheckpointResumesUnderTheOtherLoaderWithTheSameLosses) {
  const auto want = per_rank("dp2tp2", dp2_tp2_job(""));
  for (const auto& [first, second] : {std::pair{"true", "false"}, std::pair{"false", "true"}}) {
    SCOPED_TRACE(std::string("data.node_loader ") + first + " then " + second);
    const std::string name = std::string("resume-") + first;
    ::setenv("MEGATRAIN_FAULTS", "crash:rank=0:step=5", 1);
    EXPECT_NE(launch(name + "-a", dp2_tp2_job(out(name)).set("data.node_loader", first)), 0) << log(name + "-a");
    ::unsetenv("MEGATRAIN_FAULTS");
    ASSERT_EQ(launch(name + "-b", dp2_tp2_job(out(name)).set("data.node_loader", second)), 0) << log(name + "-b");
    EXPECT_NE(log(name + "-b").find("resumed from"), std::string::npos) << log(name + "-b");
    EXPECT_EQ(losses(name), want);
  }
}

// A blend of two sources (Brown's train split, and its val split as the second source's).
TEST_F(LaunchNodeLoader, ABlendMatchesPerRankLoaders) {
  const std::string second = out("second-source");
  fs::create_directories(second);
  fs::copy(kSmallBrown + "/val_000000.bin", second + "/train_000000.bin");
  auto blended = [&](const std::string& o) {
    return std::move(dp2_tp2_job(o)
                         .unset("data.dir")
                         .with("--data.blend=[{dir=\"" + kSmallBrown + "\",weight=2},{dir=\"" + second +
                               "\",weight=1}]"));
  };
  const auto want = per_rank("blend", blended(""));
  ASSERT_EQ(launch("node", blended(out("node"))), 0) << log("node");
  EXPECT_EQ(losses("node"), want);
}

// Every token of the shard's body made 65535, outside the vocabulary of 1,024 its header records: the header is
// sound (every rank opens the shard), and the first read fails. The reader's error reaches every rank; the job
// exits with the data error's code and the message a per-rank loader gives.
TEST_F(LaunchNodeLoader, ACorruptShardIsTheSameClearError) {
  const std::string bad = out("bad-data");
  fs::create_directories(bad);
  for (const auto& e : fs::directory_iterator(kSmallBrown))
    if (e.path().extension() == ".bin") fs::copy(e.path(), bad + "/" + e.path().filename().string());
  const std::string shard = bad + "/train_000000.bin";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(0, std::ios::end);
    const auto size = static_cast<size_t>(f.tellp());
    ASSERT_GT(size, 1024u + 2);
    f.seekp(1024);  // the 256-int header
    const std::string ones(size - 1024, '\xff');
    f.write(ones.data(), static_cast<std::streamsize>(ones.size()));
  }
  const std::string what = "shard " + shard + ": token 65535 at index";
  for (const char* node : {"false", "true"}) {
    SCOPED_TRACE(std::string("data.node_loader=") + node);
    const std::string name = std::string("corrupt-") + node;
    EXPECT_EQ(launch(name, dp2_tp2_job(out(name)).data(bad).set("data.node_loader", node)), exit_code(ErrorKind::Data))
        << log(name);
    EXPECT_NE(log(name).find(what), std::string::npos) << log(name);
    if (std::string(node) == "true") {
      EXPECT_NE(log(name).find("the data reader of node 0 (local rank 0, pid "), std::string::npos) << log(name);
    }
  }
}

// Two agents on this host as the job's two nodes (launch --nnodes 2, 2 ranks each: a tp group per node, so each
// node's reader reads one replica's rows); node 1's reader's rank (rank 2) crashes at step 5 and the driver
// restarts the job from the step-4 checkpoint. The losses equal a per-rank-loader run's on one launcher.
TEST_F(LaunchNodeLoader, TwoAgentsHaveAReaderEachAndRecoverACrash) {
  const auto want = per_rank("dp2tp2", dp2_tp2_job(""));
  const int port = comm_test::free_port();
  ::setenv("MEGATRAIN_STORE_SECRET", "0123456789abcdef0123456789abcdef", 1);
  ::setenv("MEGATRAIN_FAULTS", "crash:rank=2:step=5", 1);
  std::vector<pid_t> agents;
  for (int a = 0; a < 2; ++a) {
    std::vector<std::string> args = {"launch",
                                     "--nproc",
                                     "2",
                                     "--nnodes",
                                     "2",
                                     "--node-rank",
                                     std::to_string(a),
                                     "--master",
                                     fmt::format("127.0.0.1:{}", port),
                                     "--iface",
                                     "lo",
                                     "--max-restarts",
                                     "2",
                                     "--backoff",
                                     "0",
                                     "--",
                                     "train"};
    for (const std::string& f : dp2_tp2_job(out("node")).args()) args.push_back(f);
    agents.push_back(start_logged(kMegatrain, args, log_path(fmt::format("agent{}", a))));
  }
  ::unsetenv("MEGATRAIN_FAULTS");
  for (int a = 0; a < 2; ++a) EXPECT_EQ(finish_within(agents[size_t(a)], 400), 0) << log(fmt::format("agent{}", a));
  EXPECT_NE(log("agent0").find("feeds 2 of its 2 ranks"), std::string::npos) << log("agent0");
  EXPECT_NE(log("agent1").find("fault injected: crash:rank=2:step=5"), std::string::npos) << log("agent1");
  EXPECT_NE(log("agent0").find("resumed from"), std::string::npos) << log("agent0");
  EXPECT_EQ(losses("node"), want);
}

}  // namespace
