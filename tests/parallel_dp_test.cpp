// Data parallelism (ZeRO-2) end to end: `megatrain launch --nproc 2 -- train --parallel.dp=2` against a single
// process training on the same global batch, for AdamW and LAMB, with and without overlap, with accumulation.
// Per-step losses and gradient norms, the final parameters and both optimizer moments must agree up to the noise
// floor the test measures (ptest::expect_equivalent: a reordered single-process run gives each observable's floor).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "megatrain/comm/mesh.h"
#include "megatrain/core/bf16.h"
#include "megatrain/kernels/cpu/cpu_ops.h"
#include "megatrain/parallel/data_parallel.h"
#include "support/files.h"
#include "support/megatrain.h"
#include "support/parallel_testutil.h"

using namespace ptest;

namespace {

std::string common(const std::string& out, int batch) { return common_args(out, batch, /*n_layer=*/2); }

struct Case {
  std::string name, extra;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class DataParallelVsSingle : public ::testing::TestWithParam<Case> {};

TEST_P(DataParallelVsSingle, LossesAndParametersMatch) {
  prepare();
  const Case& c = GetParam();
  const Trio t = fresh_trio("mt_dp", c.name);
  run(kMegatrain + " train" + common(t.single, 4) + c.extra);
  run_twin(4, common(t.alt, 4) + c.extra);
  run(kMegatrain + " launch --nproc 2 -- train" + common(t.multi, 2) + " --parallel.dp=2" + c.extra);
  expect_equivalent(t, "dp2 " + c.name);
}

INSTANTIATE_TEST_SUITE_P(Dp2, DataParallelVsSingle,
                         ::testing::Values(Case{"adamw", ""}, Case{"adamw_no_overlap", " --parallel.overlap=false"},
                                           Case{"lamb", " --optim.name=lamb"},
                                           Case{"accum_parallel_block", " --train.grad_accum=2 --model.block=parallel"},
                                           // MoE experts are replicated parameters: dropless routing is per token
                                           // and the z-loss a per-token mean, so dp2 is one process's batch. (Not
                                           // the aux loss: its f_e P_e product is taken over each rank's tokens.)
                                           Case{"moe", " --model.moe_experts=4 --model.moe_top_k=2 --model.moe_d_ff=32"
                                                       " --model.moe_shared_experts=1 --model.moe_z_loss=0.01"}),
                         CaseName());

// A blend of two sources (Brown's train split, and its val split as the second source's) under dp2: the ranks cut
// each global batch of the blend as one process reads it, so the run matches the single process up to the floor.
TEST(DataParallel, ABlendMatchesOneProcess) {
  prepare();
  const std::string second = fresh_dir("mt_dp_blend_source");
  fs::create_directories(second);
  fs::copy(kSmallBrown + "/val_000000.bin", second + "/train_000000.bin");
  const std::string blend = " '--data.blend=[{dir=\"" + kSmallBrown + "\",weight=2},{dir=\"" + second +
                            "\",weight=1}]'";
  auto with_blend = [&](std::string args) {
    const std::string dir = " --data.dir=" + kSmallBrown;
    const size_t at = args.find(dir);
    EXPECT_NE(at, std::string::npos);
    return args.replace(at, dir.size(), blend);
  };
  const Trio t = fresh_trio("mt_dp", "blend");
  run(kMegatrain + " train" + with_blend(common(t.single, 4)));
  run(kMegatrain + " train" + with_blend(common(t.alt, 4)) + reordered(4, common(t.alt, 4)));
  run(kMegatrain + " launch --nproc 2 -- train" + with_blend(common(t.multi, 2)) + " --parallel.dp=2");
  expect_equivalent(t, "dp2 blend");
}

TEST(DataParallel, ResumeAcrossLayoutsKeepsTheRun) {
  // A dp=2 run checkpointed at step 3 resumes in a single process with the uninterrupted run's losses, up to the
  // noise floor of a reordered single run (alt).
  prepare();
  std::string a = fresh_dir("mt_dp_resume_a"), alt = fresh_dir("mt_dp_resume_alt"), b = fresh_dir("mt_dp_resume_b");
  run(kMegatrain + " train" + common(a, 4));
  run_twin(4, common(alt, 4));
  run(kMegatrain + " launch --nproc 2 -- train" + common(b, 2) +
      " --parallel.dp=2 --ckpt.every=3 --ckpt.save_final=false");
  fs::remove(b + "/metrics.jsonl");
  run(kMegatrain + " train" + common(b, 4) + " --ckpt.resume=" + step3(b));
  expect_resumed_tail(a, alt, {b}, "dp2 -> 1 resume");
}

}  // namespace

namespace {

// A rank whose peers never show up: `train` must stop after parallel.timeout_s with a message naming the missing
// rank, not hang. Rank 0 of a world of 2 is started alone on a file store.
TEST(DataParallel, MissingPeerIsATimeoutNamingTheRank) {
  ptest::prepare();
  std::string dir = ptest::fresh_dir("mt_dp_missing_peer");
  std::string store = dir + "/store";
  std::filesystem::create_directories(store);
  std::string cmd = "RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MEGATRAIN_STORE=file://" + store + " " +
                    ptest::kMegatrain + " train" + ptest::common_args(dir + "/out", 2, 2) +
                    " --parallel.dp=2 --parallel.timeout_s=2";
  std::string out = ptest::failing_output(cmd, dir + "/log", "a lone rank of a world of 2 must fail");
  EXPECT_NE(out.find("never arrived"), std::string::npos) << out;
  EXPECT_NE(out.find("1"), std::string::npos) << out;
  // Layout errors are refused up front, naming the numbers.
  out = ptest::failing_output(ptest::kMegatrain + " train" + ptest::common_args(dir + "/out2", 2, 2) +
                                  " --parallel.dp=3",
                              dir + "/log2", "dp=3 in a single process must fail");
  EXPECT_NE(out.find("WORLD_SIZE"), std::string::npos) << out;
}

}  // namespace

namespace {

// The CPU backend with a bf16 compute copy, as on CUDA (ParamStore keeps fp32 master weights and the copy the layers
// read). Only the copy's dtype differs, and the data-parallel update and all-gather are all this test runs.
class Bf16CopyOps final : public mt::CpuOps {
 public:
  mt::DType compute_dtype() const override { return mt::DType::BF16; }
};

// One update through DataParallel (a group of one: the all-gather is a copy), then the compute copy must be the
// updated master weights rounded to bf16, element for element. The oracle is the conversion itself.
void expect_compute_copy_follows_the_update(bool overlap) {
  using namespace mt;
  Bf16CopyOps ops;
  ModelConfig c;
  c.vocab_size = 97, c.n_layer = 2, c.n_head = 2, c.d_model = 32, c.max_seq_len = 16;
  GPT model(c, ops, dp_pad_multiple(1));
  model.init_weights(7);
  ParamStore& ps = model.params();
  const size_t n = ps.total_floats();
  ASSERT_TRUE(ps.compute_flat().defined()) << "the test backend must give the model a compute copy";
  for (size_t i = 0; i < n; ++i) ps.grads_data()[i] = 0.01f * static_cast<float>(static_cast<int>(i % 13) - 6);
  std::vector<float> before(ps.params_data(), ps.params_data() + n);

  auto group = make_local_group(0, "dp");
  OptimConfig oc;
  DataParallelOptions o;
  o.bucket_floats = 1024;  // several buckets
  o.overlap = overlap;
  DataParallel ddp(model, *group, ops, oc, o);
  ddp.finish_gradients();
  ddp.step(1e-2f, 1.0f, 1);
  ddp.sync_params();

  const auto* copy = static_cast<const uint16_t*>(ps.compute_flat().ptr);
  size_t changed = 0, stale = 0;
  for (size_t i = 0; i < n; ++i) {
    changed += ps.params_data()[i] != before[i];
    stale += copy[i] != float_to_bf16(ps.params_data()[i]);
  }
  EXPECT_GT(changed, n / 2) << "the update moved too few weights for the check to mean anything";
  EXPECT_EQ(stale, 0u) << stale << " of " << n << " compute-copy elements are not the updated weights in bf16 "
                       << "(overlap " << overlap << ")";
}

}  // namespace

TEST(DataParallel, TheComputeCopyFollowsTheGatheredWeights) {
  expect_compute_copy_follows_the_update(true);
  expect_compute_copy_follows_the_update(false);
}
