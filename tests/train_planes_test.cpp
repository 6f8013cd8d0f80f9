// The two planes of process groups (train/trainer.cpp): on a GPU run the model's tensors move over NCCL groups,
// which can only read device memory, and host memory (norms, losses, sampled ids, checkpoint traffic) over Gloo
// groups, which can only read host memory. A mix-up would surface only on several GPUs, so this test checks the
// separation on the CPU: the trainer runs with a backend that records every allocation it hands out (standing in
// for device memory) and with groups that check every tensor they are given - the device plane must see only the
// backend's memory, the host plane never. Layouts cover every parallel code path (ZeRO buckets and norms, tp
// collectives and norms, pipeline transfers, the tied-embedding group, evaluation, sampling, sharded checkpoints,
// resume) and the result must still match one process (a check that the planes were wired, not just watched).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/comm_fork_util.h"
#include "megatrain/core/error.h"
#include "megatrain/comm/mesh.h"
#include "megatrain/kernels/cpu/cpu_ops.h"
#include "megatrain/train/run_config.h"
#include "megatrain/train/trainer.h"
#include "support/files.h"
#include "support/megatrain.h"
#include "support/noise_floor.h"
#include "support/small_job.h"
#include "support/test_util.h"

using namespace mt;

namespace {

// Every live allocation of the recording backend, [begin, end) by begin.
struct Registry {
  std::mutex mu;
  std::map<const char*, const char*> live;
  bool owns(const void* p, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu);
    const char* b = static_cast<const char*>(p);
    auto it = live.upper_bound(b);
    if (it == live.begin()) return false;
    --it;
    return b >= it->first && b + bytes <= it->second;
  }
  bool touches(const void* p, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu);
    const char* b = static_cast<const char*>(p);
    auto it = live.lower_bound(b + bytes);  // the first allocation starting at or after the end
    if (it == live.begin()) return false;
    --it;
    return it->second > b;
  }
};
Registry& registry() {
  static Registry r;
  return r;
}
void release(void* p) {
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    registry().live.erase(static_cast<const char*>(p));
  }
  std::free(p);
}

// The CPU backend whose memory is recorded: "device memory" for this test.
class RecordingOps final : public CpuOps {
 public:
  Buffer alloc(size_t bytes) override {
    const size_t n = std::max<size_t>(256, (bytes + 255) / 256 * 256);
    void* p = std::aligned_alloc(256, n);
    MT_CHECK(p != nullptr, "RecordingOps: out of memory for {} bytes", n);
    std::memset(p, 0, n);
    {
      std::lock_guard<std::mutex> lock(registry().mu);
      registry().live[static_cast<const char*>(p)] = static_cast<const char*>(p) + n;
    }
    return Buffer(p, bytes, Device::CPU, &release);
  }
};

// A group that checks every tensor handed to it, then forwards to the real (Gloo or local) group.
class CheckedGroup final : public ProcessGroup {
 public:
  CheckedGroup(std::unique_ptr<ProcessGroup> g, bool data_plane) : g_(std::move(g)), data_(data_plane) {}
  int rank() const override { return g_->rank(); }
  int size() const override { return g_->size(); }
  const std::string& name() const override { return g_->name(); }
  int global_rank(int r) const override { return g_->global_rank(r); }
  WorkPtr allreduce(Tensor t, ReduceOp op) override { return check(t, "allreduce"), g_->allreduce(t, op); }
  WorkPtr reduce_scatter(Tensor out, Tensor in, ReduceOp op) override {
    check(out, "reduce_scatter out");
    check(in, "reduce_scatter in");
    return g_->reduce_scatter(out, in, op);
  }
  WorkPtr all_gather(Tensor out, Tensor in) override {
    check(out, "all_gather out");
    check(in, "all_gather in");
    return g_->all_gather(out, in);
  }
  WorkPtr broadcast(Tensor t, int root) override { return check(t, "broadcast"), g_->broadcast(t, root); }
  WorkPtr all_to_all_v(Tensor out, Tensor in, const std::vector<int64_t>& recv_counts,
                       const std::vector<int64_t>& send_counts) override {
    return check(out, "all_to_all_v output"), check(in, "all_to_all_v input"),
           g_->all_to_all_v(out, in, recv_counts, send_counts);
  }
  WorkPtr send(Tensor t, int dst, int tag) override { return check(t, "send"), g_->send(t, dst, tag); }
  WorkPtr recv(Tensor t, int src, int tag) override { return check(t, "recv"), g_->recv(t, src, tag); }
  WorkPtr barrier() override { return g_->barrier(); }

 private:
  void check(const Tensor& t, const char* op) {
    if (t.numel() == 0) return;
    if (data_)
      MT_CHECK(registry().owns(t.ptr, t.nbytes()),
               "device-plane group {}: {} of {} {} is not the backend's memory (a "
               "GPU run would hand NCCL a host pointer)",
               name(), op, dtype_name(t.dtype), t.shape_str());
    else
      MT_CHECK(!registry().touches(t.ptr, t.nbytes()),
               "host-plane group {}: {} of {} {} is the backend's memory (a "
               "GPU run would hand Gloo a device pointer)",
               name(), op, dtype_name(t.dtype), t.shape_str());
  }
  std::unique_ptr<ProcessGroup> g_;
  bool data_;
};

GroupFactory checked(bool data_plane) {
  return [data_plane](Store& store, GroupRole, const std::string& name, const std::vector<int>& ranks, int me,
                      const GroupOptions& opt) -> std::unique_ptr<ProcessGroup> {
    std::unique_ptr<ProcessGroup> g = ranks.size() == 1 ? make_local_group(me, name)
                                                        : make_gloo_group(store, name, ranks, me, opt);
    return std::make_unique<CheckedGroup>(std::move(g), data_plane);
  };
}

using mt::test::kMegatrain;
const std::string kConfig = std::string(MT_SOURCE_DIR) + "/configs/tiny.toml";  // what `megatrain train` starts from

// 4 layers, d_model 64, 4 heads, 32 positions, `batch` rows a rank, 4 steps with an evaluation at the last and a
// sample, a sharded checkpoint every 2 steps; then `layout` (the parallel flags).
std::vector<std::string> flags(const std::string& out, int batch, const std::string& layout) {
  return mt::test::SmallJob(out)
      .model(4, 64, 4, 32)
      .batch(batch)
      .steps(4)
      .set("train.eval_every", 4)
      .set("train.eval_batches", 2)
      .set("sample.tokens", 4)
      .log_every(100)
      .set("ckpt.every", 2)
      .set("ckpt.resume", "none")
      .set("parallel.bucket_mb", 1)
      .set("parallel.timeout_s", 30)
      // peer copies of the checkpoint snapshots, every step: host plane, host memory only
      .set("ckpt.snapshot_every", 1)
      .with(layout)
      .args();
}

struct Case {
  const char* name;
  int world, batch, single_batch;  // data.batch_size per rank, and of the one process with the same global batch
  const char* layout;              // the parallel flags
  const char* extra;               // flags of both runs
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

using mt::test::SmallJob;

class Planes : public ::testing::TestWithParam<Case> {};

TEST_P(Planes, DevicePlaneSeesOnlyBackendMemoryAndHostPlaneNever) {
  const Case& c = GetParam();
  mt::test::prepare_small_brown();
  const std::string root = ::testing::TempDir() + "/mt_planes_" + c.name;
  std::filesystem::remove_all(root);
  // The oracle: one process with the same global batch (a separate process: this one forks the ranks below), and
  // its reordered twin for the noise floor (ptest::reordered, ptest::expect_within_floor).
  const std::string single = SmallJob::joined(flags(root + "/single", c.single_batch, c.extra));
  ASSERT_EQ(std::system((kMegatrain + " train" + single + " > " + root + ".log 2>&1").c_str()), 0)
      << "see " << root << ".log";
  const std::string alt = SmallJob::joined(flags(root + "/alt", c.single_batch, c.extra));
  ASSERT_EQ(std::system((kMegatrain + " train" + alt + ptest::reordered(c.single_batch, alt) + " > " + root +
                         ".alt.log 2>&1")
                            .c_str()),
            0)
      << "see " << root << ".alt.log";

  mt::test::ScratchDir store, store2;  // one store per job: group names (store keys) repeat in the resumed job
  const std::string err = comm_test::run_procs(
      c.world,
      [&](int rank) {
        ::setenv("RANK", std::to_string(rank).c_str(), 1);
        ::setenv("WORLD_SIZE", std::to_string(c.world).c_str(), 1);
        ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
        ::setenv("LOCAL_WORLD_SIZE", std::to_string(c.world).c_str(), 1);
        ::setenv("MEGATRAIN_STORE", ("file://" + store.path).c_str(), 1);
        TrainSeams seams;
        seams.make_ops = [] { return std::unique_ptr<Ops>(std::make_unique<RecordingOps>()); };
        seams.device_groups = checked(true);
        seams.host_groups = checked(false);
        run_training(load_run_config(kConfig, flags(root + "/multi", c.batch, std::string(c.layout) + " " + c.extra)),
                     seams);
        // Resume from the step-2 sharded checkpoint, through the same planes.
        std::vector<std::string> f = flags(root + "/resumed", c.batch, std::string(c.layout) + " " + c.extra);
        f.push_back("--ckpt.resume=" + root + "/multi/ckpt/step_00000002");
        ::setenv("MEGATRAIN_STORE", ("file://" + store2.path).c_str(), 1);
        run_training(load_run_config(kConfig, f), seams);
      },
      180);
  ASSERT_EQ(err, "") << c.name;
  // The planes were wired, not just watched: the run is the one process's run, and resumes to it.
  // The resumed job repeats the job's arithmetic on the same layout and thread count: bit for bit.
  std::vector<ptest::Deviation> devs;
  for (const char* field : {"loss", "val_loss"}) {
    const char* kind = field[0] == 'l' ? "train" : "val";
    const std::vector<double> ref = ptest::series(root + "/single", field, kind);
    ptest::add_series(devs, field, ref, ptest::series(root + "/alt", field, kind),
                      ptest::series(root + "/multi", field, kind));
    const std::vector<double> multi = ptest::series(root + "/multi", field, kind),
                              resumed = ptest::series(root + "/resumed", field, kind);
    ASSERT_FALSE(resumed.empty()) << field;
    EXPECT_EQ(resumed.back(), multi.back()) << field << " of the resumed job";
  }
  ptest::expect_within_floor(devs, std::string("planes ") + c.name);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, Planes,
    ::testing::Values(Case{"dp2_tp2_lamb", 4, 4, 8, "--parallel.dp=2 --parallel.tp=2", "--optim.name=lamb"},
                      Case{"dp2_pp2_interleaved", 4, 2, 16,
                           "--parallel.dp=2 --parallel.pp=2 --parallel.virtual_stages=2 --parallel.microbatches=4", ""},
                      Case{"pp2_tp2", 4, 4, 8, "--parallel.pp=2 --parallel.tp=2 --parallel.microbatches=2", ""}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

}  // namespace
