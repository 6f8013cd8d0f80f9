// Sharded checkpoints end to end: a `megatrain launch` run with (dp, pp, tp) = (2, 1, 2) saves one file per rank
// (sizes ~ what each rank uniquely holds), whose assembled tensors equal those of the same run saved gathered
// (ckpt.sharded=false); resuming it on the same layout, in one process, and under (1, 2, 2) continues the
// uninterrupted single-process run's losses.
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "megatrain/ckpt/reader.h"
#include "support/files.h"
#include "support/megatrain.h"
#include "support/parallel_testutil.h"

using namespace mt;
using namespace ptest;

namespace {

std::string common(const std::string& out, int batch) { return common_args(out, batch, 4); }

TEST(ShardedCheckpoint, ParallelRunSavesPerRankFilesAndResumesUnderAnyLayout) {
  prepare();
  std::string a = fresh_dir("mt_shard_a"), b = fresh_dir("mt_shard_b"), g = fresh_dir("mt_shard_gathered");
  std::string c = fresh_dir("mt_shard_c"), d = fresh_dir("mt_shard_d"), e = fresh_dir("mt_shard_e");
  std::string alt = fresh_dir("mt_shard_alt");
  const std::string dp2tp2 = " --parallel.dp=2 --parallel.tp=2 --ckpt.every=3 --ckpt.save_final=false";
  run(kMegatrain + " train" + common(a, 4));
  run_twin(4, common(alt, 4));  // the noise floor of a's losses
  run(kMegatrain + " launch --nproc 4 -- train" + common(b, 2) + dp2tp2);
  run(kMegatrain + " launch --nproc 4 -- train" + common(g, 2) + dp2tp2 + " --ckpt.sharded=false");

  // One file per rank and the manifest, nothing else.
  const std::string dir = step3(b);
  CheckpointReader r = CheckpointReader::open(dir);
  EXPECT_EQ(r.format_version(), 2);
  EXPECT_EQ(r.extra()["parallel"]["tp"], 2);
  std::set<std::string> names;
  for (auto& f : fs::directory_iterator(dir)) names.insert(f.path().filename().string());
  EXPECT_EQ(names,
            (std::set<std::string>{"manifest.json", "shard-pp0-tp0-dp0.safetensors", "shard-pp0-tp0-dp1.safetensors",
                                   "shard-pp0-tp1-dp0.safetensors", "shard-pp0-tp1-dp1.safetensors"}));
  // Sizes: the full state is P parameters and 2P moments; dp rank 0 writes its tp half of the parameters and a
  // quarter of the moments (P/2 + P/2 = 1/3 of it), dp rank 1 a quarter of the moments (1/6); nothing twice.
  double full = 0, sum = 0;
  for (const std::string& t : r.tensor_names()) full += 4.0 * shape_numel(r.shape(t));
  for (const std::string& f : names) {
    if (f == "manifest.json") continue;
    const double bytes = static_cast<double>(fs::file_size(dir + "/" + f));
    sum += bytes;
    const double want = f.find("-dp0") != std::string::npos ? full / 3 : full / 6;
    EXPECT_NEAR(bytes, want, 0.03 * full) << f;
  }
  EXPECT_NEAR(sum, full, 0.01 * full);

  // Assembled, the pieces are bit-identical to the gathered checkpoint of the same run.
  Checkpoint sharded = Checkpoint::load(dir), gathered = Checkpoint::load(step3(g));
  ASSERT_EQ(sharded.tensor_names(), gathered.tensor_names());
  for (const char* file : {"model.safetensors", "optim.safetensors"})
    EXPECT_EQ(sharded.tensor_names(file), gathered.tensor_names(file)) << file;
  for (const std::string& n : sharded.tensor_names()) {
    const TensorData &x = sharded.get(n), &y = gathered.get(n);
    ASSERT_EQ(x.shape, y.shape) << n;
    EXPECT_EQ(std::memcmp(x.data, y.data, x.nbytes), 0) << n;
  }

  // Resumed at step 3: on the same layout, in one process, and under pp=2 x tp=2.
  run(kMegatrain + " launch --nproc 4 -- train" + common(c, 2) +
      " --parallel.dp=2 --parallel.tp=2 --ckpt.resume=" + dir);
  run(kMegatrain + " train" + common(d, 4) + " --ckpt.resume=" + dir);
  run(kMegatrain + " launch --nproc 4 -- train" + common(e, 1) +
      " --parallel.pp=2 --parallel.tp=2 --parallel.microbatches=4 --ckpt.resume=" + dir);
  expect_resumed_tail(a, alt, {c, d, e}, "sharded dp2xtp2 resume");
  // The final checkpoints of parallel runs are sharded too; a single-process tool reads them whole.
  EXPECT_EQ(CheckpointReader::open(e + "/ckpt").format_version(), 2);
  EXPECT_EQ(Checkpoint::load(e + "/ckpt").tensor_names("model.safetensors"),
            Checkpoint::load(d + "/ckpt").tensor_names("model.safetensors"));
}

}  // namespace
