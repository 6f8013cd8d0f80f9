// Fast checkpoints (issue 13), end to end with real `megatrain` jobs:
//  * an asynchronous save (stage 1 on the training thread, stage 2 in the background) writes the same bytes as a
//    synchronous one, and resuming from either continues the uninterrupted run's losses bit for bit, under dp, tp
//    and pp and in one process;
//  * kill -9 while stage 2 is writing leaves the previous checkpoint current, and nothing half-written counts;
//  * a full disk (a small tmpfs) in stage 2: the run goes on, the failure is an event, latest is unchanged;
//  * a rank killed with its newest snapshot only in memory: the survivor persists what it holds, and the restarted
//    job resumes from it (newer than any disk checkpoint), bit-identical to the undisturbed run and to the
//    checkpoint a disk save of that step writes;
//  * resume = auto skips a corrupt newest checkpoint with a warning naming the file;
//  * retention never prunes the checkpoint a run resumed from.
// Test faults (MEGATRAIN_FAULTS, read by the checkpointer): stage2_delay:seconds=T delays every stage 2 (so a kill
// lands inside it); kill_after_snapshot:rank=R:step=S makes that rank SIGKILL itself after the snapshot of that
// step.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include "megatrain/ckpt/checkpoint.h"
#include "megatrain/ckpt/reader.h"
#include "megatrain/train/ckpt_async.h"
#include "support/files.h"
#include "support/megatrain.h"
#include "support/metrics.h"
#include "support/parallel_testutil.h"
#include "support/small_job.h"

using namespace mt;
using namespace ptest;

namespace {

// A small GPT for `steps` steps; every run of a comparison shares these flags.
std::string args(const std::string& out, int steps, const std::string& extra) {
  return mt::test::SmallJob(out)
      .model(2, 64, 4, 32)
      .unset("data.batch_size")
      .log_every(100)
      .set("parallel.bucket_mb", 1)
      .set("train.peak_tflops", 1)
      .set("ckpt.keep_last", 10)
      .steps(steps)
      .with(extra)
      .line();
}

// "step:loss_exact" of every train line of a run.
std::vector<std::string> step_losses_of(const std::string& out) {
  return mt::test::step_losses(out + "/metrics.jsonl");
}

// The lines of steps > after.
std::vector<std::string> tail_after(const std::vector<std::string>& v, int after) {
  std::vector<std::string> out;
  for (const std::string& s : v)
    if (std::stoi(s.substr(0, s.find(':'))) > after) out.push_back(s);
  return out;
}

std::vector<nlohmann::json> events(const std::string& out) {
  return mt::test::metrics_of(out + "/metrics.jsonl", "checkpoint_event");
}

bool has_event(const std::string& out, int step, const std::string& stage) {
  for (const auto& e : events(out))
    if (e["step"] == step && e["stage"] == stage) return true;
  return false;
}

using mt::test::slurp;

// Every tensor of two checkpoints equal byte for byte.
void expect_same_tensors(const std::string& a, const std::string& b) {
  Checkpoint x = Checkpoint::load(a), y = Checkpoint::load(b);
  ASSERT_EQ(x.tensor_names(), y.tensor_names()) << a << " vs " << b;
  for (const std::string& n : x.tensor_names()) {
    const TensorData &p = x.get(n), &q = y.get(n);
    ASSERT_EQ(p.shape, q.shape) << n;
    EXPECT_EQ(std::memcmp(p.data, q.data, p.nbytes), 0) << n << " differs between " << a << " and " << b;
  }
  EXPECT_EQ(x.extra()["data"], y.extra()["data"]);
}

struct Layout {
  const char* name;
  int nproc;
  std::string flags;
};

std::string launcher(int nproc) {
  return nproc == 1 ? kMegatrain + " train" : kMegatrain + " launch --nproc " + std::to_string(nproc) + " -- train";
}

// ---- async == sync, across layouts

class AsyncSave : public ::testing::TestWithParam<Layout> {};

TEST_P(AsyncSave, ResumeIsBitIdenticalToSynchronousSave) {
  prepare();
  const Layout& l = GetParam();
  const std::string n = l.name;
  const std::string as = fresh_dir("mt_fast_async_" + n), sy = fresh_dir("mt_fast_sync_" + n);
  const std::string ra = fresh_dir("mt_fast_async_resumed_" + n), rs = fresh_dir("mt_fast_sync_resumed_" + n);
  const std::string save = " --ckpt.every=3 --ckpt.save_final=false --ckpt.resume=none" + l.flags;
  run(launcher(l.nproc) + args(as, 6, save + " --ckpt.async=true"));
  run(launcher(l.nproc) + args(sy, 6, save + " --ckpt.async=false"));
  // The asynchronous save went through its stages, in order, and was committed before the run ended.
  std::vector<std::string> stages;
  for (const auto& e : events(as))
    if (e["step"] == 3) stages.push_back(e["stage"]);
  EXPECT_EQ(stages, (std::vector<std::string>{"snapshot", "persisted", "committed"}));
  // The same bytes as the synchronous save, and the same losses.
  expect_same_tensors(step3(as), step3(sy));
  EXPECT_EQ(step_losses_of(as), step_losses_of(sy));
  // Resumed from each, on the same layout: steps 4-6 equal the uninterrupted run's, bit for bit.
  run(launcher(l.nproc) + args(ra, 6, " --ckpt.every=0 --ckpt.save_final=false --ckpt.resume=" + step3(as) + l.flags));
  run(launcher(l.nproc) + args(rs, 6, " --ckpt.every=0 --ckpt.save_final=false --ckpt.resume=" + step3(sy) + l.flags));
  const auto want = tail_after(step_losses_of(as), 3);
  ASSERT_EQ(want.size(), 3u);
  EXPECT_EQ(step_losses_of(ra), want);
  EXPECT_EQ(step_losses_of(rs), want);
}

INSTANTIATE_TEST_SUITE_P(Layouts, AsyncSave,
                         ::testing::Values(Layout{"single", 1, " --data.batch_size=4"},
                                           Layout{"dp2", 2, " --data.batch_size=2 --parallel.dp=2"},
                                           Layout{"tp2", 2, " --data.batch_size=4 --parallel.tp=2"},
                                           Layout{"pp2", 2, " --data.batch_size=2 --parallel.pp=2"}),
                         CaseName());

// ---- kill -9 inside stage 2

// Starts `cmd` (through sh, output to log) as a child; returns its pid.
pid_t spawn(const std::string& cmd, const std::string& log) {
  const std::string line = "exec " + cmd + " > " + log + " 2>&1";
  pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

// Waits until pred() holds (checked every 20 ms), at most `limit` seconds (a guard against a hang, not a timing
// assertion).
bool wait_for(const std::function<bool()>& pred, double limit = 120) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit);
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

TEST(FastCheckpoint, KillDuringStage2LeavesThePreviousCheckpointCurrent) {
  prepare();
  const std::string out = fresh_dir("mt_fast_kill"), ref = fresh_dir("mt_fast_kill_ref");
  const std::string resumed = out;  // the restarted job continues in the same folder
  const std::string flags = " --data.batch_size=2 --parallel.dp=2 --ckpt.every=2 --ckpt.save_final=false";
  // Stage 2 sleeps 2 s before writing: the step-2 save commits, then the step-4 save is still in stage 2 when the
  // launcher (and with it, by PR_SET_PDEATHSIG, every rank) is killed.
  ::setenv("MEGATRAIN_FAULTS", "stage2_delay:seconds=2", 1);
  const pid_t pid = spawn(launcher(2) + args(out, 8, flags + " --ckpt.resume=none"), out + ".log");
  ::unsetenv("MEGATRAIN_FAULTS");
  const bool reached = wait_for([&] { return has_event(out, 2, "committed") && has_event(out, 4, "snapshot"); });
  ::kill(pid, SIGKILL);
  int st = 0;
  ::waitpid(pid, &st, 0);
  ASSERT_TRUE(reached) << slurp(out + ".log");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the ranks die with the launcher
  const std::string root = out + "/ckpt";
  EXPECT_FALSE(has_event(out, 4, "committed"));
  EXPECT_EQ(*find_latest(root), root + "/step_00000002");
  ASSERT_EQ(list_checkpoints(root).size(), 1u);  // the half-written step 4 is no checkpoint
  EXPECT_EQ(list_checkpoints(root)[0].step, 2);
  Checkpoint::load(root);  // whole

  // resume = auto continues from step 2, exactly as the uninterrupted run.
  run(launcher(2) + args(ref, 8, flags + " --ckpt.resume=none"));
  fs::remove(out + "/metrics.jsonl");
  run(launcher(2) + args(resumed, 8, flags + " --ckpt.resume=auto"));
  EXPECT_EQ(step_losses_of(resumed), tail_after(step_losses_of(ref), 2));
  // The staging directory the kill left behind was cleared by the next commit.
  for (auto& e : fs::directory_iterator(root))
    EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << e.path();
}

// ---- full disk in stage 2

TEST(FastCheckpoint, FullDiskInStage2IsAnEventAndTrainingGoesOn) {
  prepare();
  const std::string out = fresh_dir("mt_fast_full"), mnt = fresh_dir("mt_fast_full_tmpfs");
  fs::create_directories(mnt);
  // One checkpoint of this model is ~40 MB (3.3M parameters and two moments, fp32): 64 MiB holds one, not two. GPT-2's
  // vocabulary size (the later flag wins over args' small one; the data's 1,024 tokens fit in it) makes it that big.
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=64m") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs at " << mnt << " (" << std::strerror(errno)
                 << "): this test needs root (CAP_SYS_ADMIN) to make a small disk";
  struct Unmount {
    std::string m;
    ~Unmount() { ::umount2(m.c_str(), MNT_DETACH); }
  } unmount{mnt};
  const std::string root = mnt + "/ckpt";
  const std::string log = out + ".log";
  fs::create_directories(out);
  const std::string flags = " --data.batch_size=2 --parallel.dp=2 --ckpt.every=2 --ckpt.save_final=false"
                            " --ckpt.keep_last=5 --ckpt.resume=none --model.vocab_size=50257 --ckpt.dir=" +
                            root;
  const int rc = std::system((launcher(2) + args(out, 6, flags) + " > " + log + " 2>&1").c_str());
  const std::string text = slurp(log);
  EXPECT_EQ(rc, 0) << text;
  // Every step ran; step 2 was committed; step 4 failed (the disk is full) as an event and a log line.
  EXPECT_EQ(step_losses_of(out).size(), 6u) << text;
  EXPECT_TRUE(has_event(out, 2, "committed"));
  EXPECT_TRUE(has_event(out, 4, "failed")) << text;
  EXPECT_FALSE(has_event(out, 4, "committed"));
  EXPECT_NE(text.find("step 4 FAILED in stage 2"), std::string::npos) << text;
  EXPECT_NE(text.find("No space left on device"), std::string::npos) << text;
  EXPECT_NE(text.find("the latest checkpoint is still " + root + "/step_00000002"), std::string::npos) << text;
  // And it was said at start: 64 MiB free against about 40 MB a checkpoint, up to 6 at once with keep_last 5.
  EXPECT_NE(text.find("warning: ckpt.dir " + root +
                      " has 0.07 GB free, but a checkpoint of this model takes about "
                      "0.04 GB and up to 6 are on disk at once (ckpt.keep_last 5 and the one being written; 0 there "
                      "now)"),
            std::string::npos)
      << text;
  // No "checkpoint" (committed) line for it in the metrics, and latest names the last complete checkpoint.
  for (const std::string& l : {std::string("\"kind\":\"checkpoint\",\"step\":4")})
    EXPECT_EQ(slurp(out + "/metrics.jsonl").find(l), std::string::npos);
  EXPECT_EQ(*find_latest(root), root + "/step_00000002");
  Checkpoint::load(root);
}

// ---- peer snapshots after a lost rank

TEST(FastCheckpoint, PeerSnapshotRestoreAfterKillingOneRankIsBitIdentical) {
  prepare();
  const std::string out = fresh_dir("mt_fast_peer"), ref = fresh_dir("mt_fast_peer_ref");
  const std::string flags = " --data.batch_size=2 --parallel.dp=2 --ckpt.snapshot_every=1 --ckpt.save_final=false";
  // The undisturbed run, with a disk checkpoint at every step (the oracle for whatever step the recovery finds).
  run(launcher(2) + args(ref, 10, flags + " --ckpt.every=1 --ckpt.keep_last=20 --ckpt.resume=none"));
  // Disk checkpoints every 4 steps; rank 1 dies right after its snapshot of step 7.
  ::setenv("MEGATRAIN_FAULTS", "kill_after_snapshot:rank=1:step=7", 1);
  const int rc = std::system(
      (launcher(2) + args(out, 10, flags + " --ckpt.every=4 --ckpt.resume=none") + " > " + out + ".log 2>&1").c_str());
  ::unsetenv("MEGATRAIN_FAULTS");
  const std::string text = slurp(out + ".log");
  ASSERT_NE(rc, 0) << text;
  EXPECT_EQ(*find_latest(out + "/ckpt"), out + "/ckpt/step_00000004") << text;
  EXPECT_NE(text.find("peer snapshot: wrote its predecessor's snapshot"), std::string::npos) << text;

  // The restart recovers a step newer than the disk checkpoint (6: every copy of it had completed; or 7 if rank 1's
  // copy of 7 reached rank 0 before it died).
  fs::remove(out + "/metrics.jsonl");
  const std::string log2 = out + ".restart.log";
  ASSERT_EQ(std::system((launcher(2) + args(out, 10, flags + " --ckpt.every=4 --ckpt.resume=auto") + " > " + log2 +
                         " 2>&1")
                            .c_str()),
            0)
      << slurp(log2);
  const std::string t2 = slurp(log2);
  EXPECT_NE(t2.find("from the peer snapshots"), std::string::npos) << t2;
  auto m = nlohmann::json::parse(slurp(out + "/metrics.jsonl").substr(0, slurp(out + "/metrics.jsonl").find('\n')));
  const int start = m["start_step"].get<int>();
  EXPECT_TRUE(start == 6 || start == 7) << t2;
  // Bit-identical: the recovered checkpoint holds what the disk save of that step wrote, and the losses after it
  // are the undisturbed run's.
  expect_same_tensors(out + "/ckpt/" + checkpoint_dir_name(start), ref + "/ckpt/" + checkpoint_dir_name(start));
  EXPECT_EQ(step_losses_of(out), tail_after(step_losses_of(ref), start));
}

// ---- a corrupt newest checkpoint

// Survivors of a dp2 job whose peer died mid-exchange hold only their own shards of the newest step: that set can
// never be completed (its other writers are gone), so the restart neither uses it nor leaves it behind. Neither
// does it leave a set whose extra.json cannot be read.
TEST(FastCheckpoint, PeerSnapshotSetsThatCanNeverBeUsedAreRemoved) {
  const std::string root = fresh_dir("mt_fast_unusable_sets");
  const fs::path incomplete = fs::path(root) / "snapshots" / "step_00000006",
                 unreadable = fs::path(root) / "snapshots" / "step_00000007";
  fs::create_directories(incomplete);
  fs::create_directories(unreadable);
  std::ofstream(incomplete / "extra.json") << R"({"parallel": {"pp": 1, "tp": 1, "dp": 2}})";
  for (const std::string f : {"shard-pp0-tp0-dp0.safetensors", "shard-pp0-tp0-dp0.safetensors.pieces.json"})
    std::ofstream(incomplete / f) << "x";
  std::ofstream(unreadable / "extra.json") << "{";
  EXPECT_EQ(promote_peer_snapshots(root, 3), "");
  EXPECT_FALSE(fs::exists(incomplete));
  EXPECT_FALSE(fs::exists(unreadable));
}

TEST(FastCheckpoint, CorruptNewestCheckpointFallsBackWithAWarning) {
  prepare();
  const std::string out = fresh_dir("mt_fast_corrupt");
  const std::string flags = " --data.batch_size=2 --parallel.dp=2 --ckpt.every=2 --ckpt.save_final=false";
  run(launcher(2) + args(out, 8, flags + " --ckpt.resume=none"));  // checkpoints of steps 2, 4, 6
  const std::vector<std::string> ref = step_losses_of(out);
  // Flip a byte in the data of the newest checkpoint's dp-rank-1 shard (its moment slices: only rank 1 reads it,
  // so rank 0 learns of it through the agreement).
  const std::string bad = out + "/ckpt/step_00000006/shard-pp0-tp0-dp1.safetensors";
  ASSERT_TRUE(fs::exists(bad));
  {
    std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-100, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    f.seekp(-100, std::ios::end);
    c ^= 0x5a;
    f.write(&c, 1);
  }
  fs::remove(out + "/metrics.jsonl");
  const std::string log = out + ".resume.log";
  ASSERT_EQ(std::system((launcher(2) + args(out, 8, flags + " --ckpt.resume=auto") + " > " + log + " 2>&1").c_str()), 0)
      << slurp(log);
  const std::string text = slurp(log);
  EXPECT_NE(text.find("skipping checkpoint " + out + "/ckpt/step_00000006"), std::string::npos) << text;
  EXPECT_NE(text.find("shard-pp0-tp0-dp1.safetensors' fails its checksum"), std::string::npos) << text;
  EXPECT_NE(text.find("falling back to " + out + "/ckpt/step_00000004"), std::string::npos) << text;
  EXPECT_EQ(step_losses_of(out), tail_after(ref, 4));
}

// ---- one reader per dp group

// dp rank 0's shard holds the parameters. With one reader per dp group only dp rank 0 opens it (and broadcasts the
// parameters); with ckpt.one_reader = false every dp rank opens it. A corrupt byte in it therefore makes both ranks
// report its checksum in the second case, and only rank 0 in the first (rank 1 learns of it through the agreement).
TEST(FastCheckpoint, OneReaderPerDpGroupReadsTheReplicatedStateOnce) {
  prepare();
  const std::string out = fresh_dir("mt_fast_one_reader");
  const std::string flags = " --data.batch_size=2 --parallel.dp=2 --ckpt.every=2 --ckpt.save_final=false";
  run(launcher(2) + args(out, 4, flags + " --ckpt.resume=none"));
  const std::string dir = out + "/ckpt/step_00000002";
  const std::string bad = dir + "/shard-pp0-tp0-dp0.safetensors";
  ASSERT_TRUE(fs::exists(bad));
  {
    std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-8, std::ios::end);
    f.write("\x7f\x7f\x7f\x7f", 4);
  }
  const std::string checksum = "shard-pp0-tp0-dp0.safetensors' fails its checksum";
  for (bool one : {true, false}) {
    SCOPED_TRACE(one ? "one reader" : "every rank reads");
    const std::string log = out + (one ? ".one.log" : ".all.log");
    const std::string text = failing_output(launcher(2) + args(out + "_" + std::to_string(one), 4,
                                                               flags + " --ckpt.resume=" + dir +
                                                                   " --ckpt.one_reader=" + (one ? "true" : "false")),
                                            log, "a restore from a corrupt checkpoint");
    EXPECT_NE(text.find("[rank 0] megatrain train: error: " + std::string("checkpoint ") + dir + ": file '" + checksum),
              std::string::npos)
        << text;
    const bool rank1_read_it = text.find("[rank 1] megatrain train: error: checkpoint " + dir + ": file '" +
                                         checksum) != std::string::npos;
    EXPECT_EQ(rank1_read_it, !one) << text;
    if (one) {
      EXPECT_NE(text.find("[rank 1] megatrain train: error: rank(s) 0 could not read checkpoint"), std::string::npos)
          << text;
    }
  }
}

// ---- retention

TEST(FastCheckpoint, RetentionNeverPrunesTheCheckpointBeingLoaded) {
  const std::string root = fresh_dir("mt_fast_retention");
  std::vector<float> x(4, 1.0f);
  CheckpointFiles files{{"model.safetensors", {TensorRef{"w", DType::F32, {4}, x.data()}}}};
  const std::string loaded = save_checkpoint(root, 1, files, nlohmann::json::object());
  SaveOptions so;
  so.keep_last = 1;
  so.protect = loaded;
  for (int s = 2; s <= 4; ++s) save_checkpoint(root, s, files, nlohmann::json::object(), so);
  std::vector<int64_t> steps;
  for (const auto& c : list_checkpoints(root)) steps.push_back(c.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 4}));  // the newest, and the protected one
}

}  // namespace
