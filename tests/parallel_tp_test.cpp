// Tensor + sequence parallelism end to end: `megatrain launch --nproc N -- train --parallel.tp=2` (and dp=2 x tp=2)
// against a single process on the same global batch. Per-step losses and gradient norms, the final parameters and
// moments must agree up to the noise floor the test measures (ptest::expect_equivalent), for the GPT-2 layout, the
// parallel block, a Llama-style model (RMSNorm, SwiGLU, RoPE, GQA, untied head, a vocabulary whose tp padding
// differs), LAMB, overlap off, gradient accumulation. (LAMB runs without biases: the key bias's update is rounding noise - see ptest::Compare - and
// LAMB's per-tensor trust ratio would spread that noise over the whole c_attn.bias.) Also: ShardSpec slicing/assembly against hand-built layouts, and the clear errors.
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "megatrain/core/fs.h"
#include "megatrain/model/layout.h"
#include "megatrain/model/shard.h"
#include "support/files.h"
#include "support/megatrain.h"
#include "support/parallel_testutil.h"

using namespace mt;
using namespace ptest;

namespace {

// ---- ShardSpec ----------------------------------------------------------------------------------------------

std::vector<float> iota(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(i);
  return v;
}

TEST(ShardSpec, QkvRowsKeepMyRowsOfEachPart) {
  // Full [q 4 rows | k 2 | v 2] x 3 columns, tp = 2: rank 1 holds q rows 2-3, k row 5, v row 7.
  ShardSpec s = split_spec(ShardSpec::Kind::Rows, {8, 3}, {4, 2, 2}, 2, 1, "qkv");
  EXPECT_EQ(s.local_shape(), (std::vector<int64_t>{4, 3}));
  std::vector<float> full = iota(24), local(12);
  shard_slice(s, full.data(), local.data());
  std::vector<float> want;
  for (int r : {2, 3, 5, 7})
    for (int c = 0; c < 3; ++c) want.push_back(static_cast<float>(r * 3 + c));
  EXPECT_EQ(local, want);
  auto p = s.pieces(1);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[1].full_begin, 5);
  EXPECT_EQ(p[1].local_begin, 2);
  EXPECT_EQ(p[1].len, 1);
}

TEST(ShardSpec, ColumnsSplitAndAssembleBack) {
  // [3, 6] split by columns over 3 ranks: rank r holds columns 2r, 2r+1 of every row.
  const int tp = 3;
  std::vector<float> full = iota(18), rebuilt(18, -1.0f);
  for (int r = 0; r < tp; ++r) {
    ShardSpec s = split_spec(ShardSpec::Kind::Cols, {3, 6}, {6}, tp, r, "c_proj");
    std::vector<float> local(6);
    shard_slice(s, full.data(), local.data());
    for (int row = 0; row < 3; ++row)
      for (int c = 0; c < 2; ++c) EXPECT_EQ(local[row * 2 + c], full[row * 6 + 2 * r + c]);
    shard_place(s, r, local.data(), rebuilt.data());
  }
  EXPECT_EQ(rebuilt, full);
}

TEST(ShardSpec, SwigluBiasAndReplicated) {
  ShardSpec s = split_spec(ShardSpec::Kind::Rows, {8}, {4, 4}, 2, 0, "c_fc.bias");  // gate | up
  std::vector<float> full = iota(8), local(4);
  shard_slice(s, full.data(), local.data());
  EXPECT_EQ(local, (std::vector<float>{0, 1, 4, 5}));
  ShardSpec r = replicated_spec({5});
  EXPECT_FALSE(r.sharded());
  EXPECT_EQ(r.describe(), "replicated");
  EXPECT_EQ(s.describe(), "rows{4,4}/2");
}

TEST(ShardSpec, LayoutShardsEveryMatrixAndCountsAddUp) {
  ModelConfig c;
  c.vocab_size = 1000;
  c.n_layer = 2;
  c.d_model = 64;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.mlp = MlpKind::SwiGlu;
  c.max_seq_len = 32;
  ParamStore one, half;
  declare_gpt_params(c, one);
  declare_gpt_params(c, half, 2, 1);
  ASSERT_EQ(one.size(), half.size());
  for (size_t i = 0; i < one.size(); ++i) {
    const ParamInfo &a = one.info(static_cast<int>(i)), &b = half.info(static_cast<int>(i));
    EXPECT_EQ(a.name, b.name);
    if (b.shard.sharded())
      EXPECT_EQ(2 * b.numel, b.shard.full_numel()) << b.name;
    else
      EXPECT_EQ(a.shape, b.shape) << b.name;
  }
  EXPECT_EQ(half.info(half.index("h.0.attn.c_attn.weight")).shape, (std::vector<int64_t>{64, 64}));  // (2+1+1)*16
  EXPECT_EQ(half.info(half.index("h.0.attn.c_proj.weight")).shape, (std::vector<int64_t>{64, 32}));
  EXPECT_FALSE(half.info(half.index("h.0.attn.c_proj.bias")).shard.sharded());
  EXPECT_FALSE(half.info(half.index("h.1.ln_2.weight")).shard.sharded());
  EXPECT_EQ(half.info(half.index("wte.weight")).shape[0] * 2, c.padded_vocab(2));
}

TEST(ShardSpec, IndivisibleDimensionsAreNamed) {
  ModelConfig c;
  c.d_model = 96;
  c.n_head = 6;
  ParamStore s;
  EXPECT_NE(error_of([&] {
              declare_gpt_params(c, s, 4, 0);
            }).find("model.n_head (6) must be divisible by parallel.tp (4)"),
            std::string::npos);
  c.n_head = 4;
  c.n_kv_head = 2;
  EXPECT_NE(error_of([&] { declare_gpt_params(c, s, 4, 0); }).find("model.n_kv_head (2)"), std::string::npos);
}

// ---- end to end ----------------------------------------------------------------------------------------------

// Adam's first update of an element is lr * g/(|g| + eps): for a gradient that is ~0 (a unit that is nearly
// dead on this batch) its sign is rounding noise, which any change of summation order (row chunks, sharded
// GEMMs) flips, moving that one element by 2 lr. A larger eps keeps such elements still without affecting the
// others, so the comparison tests the tensor-parallel arithmetic rather than Adam's noise amplification.
const std::string kEps = " --optim.eps=1e-6";

std::string common(const std::string& out, int batch) { return common_args(out, batch, /*n_layer=*/2, kEps); }

struct Case {
  std::string name, extra;
  int dp = 1;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name << " (dp=" << c.dp << " tp=2)"; }

class TensorParallelVsSingle : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallelVsSingle, LossesAndParametersMatch) {
  prepare();
  const Case& c = GetParam();
  const Trio t = fresh_trio("mt_tp", c.name);
  run(kMegatrain + " train" + common(t.single, 4) + c.extra);
  run_twin(4, common(t.alt, 4) + c.extra);
  run(kMegatrain + " launch --nproc " + std::to_string(2 * c.dp) + " -- train" + common(t.multi, 4 / c.dp) +
      " --parallel.tp=2 --parallel.dp=" + std::to_string(c.dp) + c.extra);
  expect_equivalent(t, "tp2 " + c.name);
  // A MoE model's metrics: the micro-batch's counts and losses on each rank (tolerance: see
  // TensorParallel.MoeAuxLossAndCountsAreTheMicroBatchs below). With dp, the metrics are one replica's (docs/moe.md).
  if (c.dp == 1 && c.extra.find("moe_experts") != std::string::npos)
    expect_same_moe_metrics(t.single, t.multi, 1e-4, c.name);
}

// MoE (docs/moe.md): the router and the experts replicated over tp, each rank routing its own sequence-parallel
// rows, their gradients summed over tp. Dropless (the capacity counts a rank's rows), with the z-loss (a mean over
// the micro-batch's tokens) and, in the Llama case, a dense first layer and every layer recomputed in backward (the
// MoE's statistics shared over tp again). The aux loss is the micro-batch's, which the reordered twin halves, so it
// has a test of its own (TensorParallel.MoeAuxLossAndCountsAreTheMicroBatchs).
const std::string kMoe = " --model.moe_experts=4 --model.moe_top_k=2 --model.moe_d_ff=32 --model.moe_shared_experts=1"
                         " --model.moe_z_loss=0.01";

INSTANTIATE_TEST_SUITE_P(
    Tp2, TensorParallelVsSingle,
    ::testing::Values(
        Case{"gpt2", ""}, Case{"no_overlap", " --parallel.overlap=false"}, Case{"chunks3", " --parallel.tp_chunks=3"},
        Case{"parallel_block_accum", " --model.block=parallel --train.grad_accum=2"}, Case{"llama", kLlama},
        // The norms' outputs rebuilt in backward: each rank rebuilds its rows, then gathers them again.
        Case{"lamb_recompute_norm", " --optim.name=lamb --model.bias=false --model.recompute_norm=true"},
        Case{"parallel_block_recompute_norm_act",
             " --model.block=parallel --model.recompute_norm=true --model.recompute_act=true"},
        Case{"dp2_tp2", "", 2}, Case{"dp2_tp2_llama_lamb", kLlama + " --optim.name=lamb", 2}, Case{"moe", kMoe},
        // The balancing bias steps from the micro-batch's loads (shared over tp): the same on both ranks.
        Case{"dp2_tp2_moe", kMoe, 2},
        Case{"moe_sigmoid_bias", kMoe + " --model.moe_router=sigmoid_bias --model.moe_bias_rate=0.01"},
        Case{"moe_llama_first_dense_recompute", kLlama + kMoe + " --model.moe_first_dense=1 --model.recompute=all"}),
    CaseName());

// A tp=2 run checkpointed at step 3 (full tensors, tp-padded vocabulary trimmed) resumes in a single process, and a
// single-process checkpoint resumes under tp=2, with the same losses. `model` adds model flags; `name` prefixes the
// folders and names the comparison.
void expect_tp_resume_keeps_the_run(const std::string& name, const std::string& model) {
  prepare();
  const std::string x = model + " --model.vocab_pad_to=1";
  std::string a = fresh_dir(name + "_a"), b = fresh_dir(name + "_b"), c = fresh_dir(name + "_c");
  std::string alt = fresh_dir(name + "_alt");
  run(kMegatrain + " train" + common(a, 4) + x);
  run_twin(4, common(alt, 4) + x);
  run(kMegatrain + " launch --nproc 2 -- train" + common(b, 4) + x +
      " --parallel.tp=2 --ckpt.every=3 --ckpt.save_final=false");
  fs::remove(b + "/metrics.jsonl");
  run(kMegatrain + " train" + common(b, 4) + x + " --ckpt.resume=" + step3(b));
  run(kMegatrain + " train" + common(c, 4) + x + " --ckpt.every=3 --ckpt.save_final=false");
  fs::remove(c + "/metrics.jsonl");
  run(kMegatrain + " launch --nproc 2 -- train" + common(c, 4) + x + " --parallel.tp=2 --ckpt.resume=" + step3(c));
  expect_resumed_tail(a, alt, {b, c}, name + ": tp2 <-> 1 resume");
}

TEST(TensorParallel, ResumeAcrossLayoutsKeepsTheRun) { expect_tp_resume_keeps_the_run("mt_tp_resume", ""); }

// The same for a MoE model (experts replicated over tp, 3-D expert tensors).
TEST(TensorParallel, MoeResumeAcrossLayoutsKeepsTheRun) { expect_tp_resume_keeps_the_run("mt_tp_moe_resume", kMoe); }

// GPT-2 from HF under dp2 x tp2, each rank reading its slices of the HF file: the Conv1D weights are stored
// transposed, so a rank's rows of c_attn are columns of HF's tensor; the vocabulary and the tied head are split by
// rows; the learned positions and biases are replicated. One process reading the whole file is the oracle.
TEST(TensorParallel, InitFromAnHfGpt2MatchesOneProcess) {
  prepare();
  const std::string src = fresh_dir("mt_tp_init_src"), hf = fresh_dir("mt_tp_init_hf");
  run(kMegatrain + " train" + common(src, 4) + " --train.steps=2");
  run(kMegatrain + " convert --to-hf " + src + "/ckpt --out " + hf + "/model.safetensors");
  const Trio t = fresh_trio("mt_tp_init", "gpt2");
  const std::string from_hf = " --model.init_from=" + hf + "/model.safetensors";
  run(kMegatrain + " train" + common(t.single, 4) + from_hf);
  run_twin(4, common(t.alt, 4) + from_hf);
  run(kMegatrain + " launch --nproc 4 -- train" + common(t.multi, 2) + from_hf + " --parallel.tp=2 --parallel.dp=2");
  expect_equivalent(t, "dp2 x tp2 init_from an HF GPT-2");
  EXPECT_LT(losses(t.multi)[0], losses(src)[0] - 0.05) << "the run did not start from the source's weights";
}

// The MoE load-balancing loss is the micro-batch's: E * sum_e f_e P_e over its tokens. Under tp each rank routes
// its rows of the micro-batch, and the layer sums the per-expert counts and probability sums over tp, so the aux
// loss, its gradient and the routing counts are those one process computes on the same micro-batch (here the
// whole step's 4 rows in both runs). The reordered twin cannot give a floor for this (it halves the micro-batch,
// which changes the aux loss), so the check is against the arithmetic: the two runs' weights differ by rounding
// only (relative ~1e-6 after 5 steps: see the suite above), which moves the router's logits, and the aux and z
// values computed from them, by as little; rel 1e-4 leaves two orders of magnitude. Routing counts are integers and
// must agree exactly. Each rank's own f_e P_e (the statistics not shared) misses by ~1e-2 here.
TEST(TensorParallel, MoeAuxLossAndCountsAreTheMicroBatchs) {
  prepare();
  const std::string moe = kMoe + " --model.moe_aux_loss=0.1 --model.moe_first_dense=1";
  const std::string single = fresh_dir("mt_tp_moe_aux_single"), multi = fresh_dir("mt_tp_moe_aux_multi");
  run(kMegatrain + " train" + common(single, 4) + moe);
  run(kMegatrain + " launch --nproc 2 -- train" + common(multi, 4) + moe + " --parallel.tp=2");
  expect_same_moe_metrics(single, multi, 1e-4, "tp2 moe aux");
  // The aux loss's gradient (coefficient 0.1) is part of the first step's gradient norm, on the same weights.
  const std::vector<double> a = series(single, "grad_norm"), b = series(multi, "grad_norm");
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  EXPECT_NEAR(b[0], a[0], 1e-5 * a[0]);
}

// With a capacity, each tp rank caps each expert at ceil(cf * rows * k / E) of its own rows' assignments
// (docs/moe.md): the drops are those of one process whose micro-batches are the ranks' rows. Rank r holds rows
// [r N/2, (r+1) N/2) of the stream, i.e. sequences 2r, 2r+1 of the 4; one process with data.batch_size = 2 and
// two accumulation rounds routes the same two halves with the same capacity (no aux loss: that one is per
// micro-batch, which differs). The counts must agree exactly, the z-loss within 1e-4 (as above), and the first
// step (same weights) within 1e-5 in loss and gradient norm (rounding only).
TEST(TensorParallel, MoeCapacityCountsEachRanksRows) {
  prepare();
  const std::string moe = kMoe + " --model.moe_capacity_factor=1.0";
  const std::string single = fresh_dir("mt_tp_moe_cap_single"), multi = fresh_dir("mt_tp_moe_cap_multi");
  run(kMegatrain + " train" + common(single, 2) + moe + " --train.grad_accum=2");
  run(kMegatrain + " launch --nproc 2 -- train" + common(multi, 4) + moe + " --parallel.tp=2");
  expect_same_moe_metrics(single, multi, 1e-4, "tp2 moe capacity");
  int64_t dropped = 0;
  for (const nlohmann::json& j : mt::test::metrics_of(multi + "/metrics.jsonl", "train"))
    for (const nlohmann::json& l : j["moe"]) dropped += l["dropped"].get<int64_t>();
  EXPECT_GT(dropped, 0) << "capacity factor 1 should drop some assignments here";
  for (const char* field : {"loss", "grad_norm"}) {
    const std::vector<double> a = series(single, field), b = series(multi, field);
    ASSERT_FALSE(a.empty());
    ASSERT_EQ(a.size(), b.size());
    EXPECT_NEAR(b[0], a[0], 1e-5 * a[0]) << field;
  }
}

// A Mixtral (an MoE Llama exported with `convert --to-hf`) read by model.init_from under tp2, each rank reading the
// whole (replicated) expert and router tensors and its slices of the rest: the run is one process's reading the
// whole directory, and starts from the source's weights.
TEST(TensorParallel, InitFromAnHfMixtralMatchesOneProcess) {
  prepare();
  const std::string mixtral = kLlama + " --model.moe_experts=4 --model.moe_top_k=2 --model.moe_d_ff=32";
  const std::string src = fresh_dir("mt_tp_mixtral_src"), hf = fresh_dir("mt_tp_mixtral_hf");
  make_hf_mixtral(common(src, 4) + mixtral, src, hf);
  if (::testing::Test::HasFatalFailure()) return;
  const Trio t = fresh_trio("mt_tp_mixtral", "init");
  const std::string from_hf = mixtral + " --model.moe_z_loss=0.01 --model.init_from=" + hf;
  run(kMegatrain + " train" + common(t.single, 4) + from_hf);
  run_twin(4, common(t.alt, 4) + from_hf);
  run(kMegatrain + " launch --nproc 2 -- train" + common(t.multi, 4) + from_hf + " --parallel.tp=2");
  expect_equivalent(t, "tp2 init_from an HF Mixtral");
  EXPECT_LT(losses(t.multi)[0], losses(src)[0] - 0.05) << "the run did not start from the source's weights";
}

TEST(TensorParallel, RowsNotDividingIsAClearError) {
  prepare();
  std::string out = mt::test::temp_root() + "mt_tp_bad";
  const std::string args = " --data.seq_len=31 --parallel.tp=2";
  std::string text = failing_output(kMegatrain + " train" + common(out, 1) + args, out + ".log", args);
  EXPECT_NE(text.find("must divide evenly"), std::string::npos) << text;
}

}  // namespace
