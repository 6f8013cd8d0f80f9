// Tensor + sequence parallelism end to end: `megatrain launch --nproc N -- train --parallel.tp=2` (and dp=2 x tp=2)
// against a single process on the same global batch. Per-step losses and the final parameters (checkpoints are
// full tensors) must agree within 1e-5 relative, for the GPT-2 layout, the parallel block, a Llama-style model
// (RMSNorm, SwiGLU, RoPE, GQA, untied head, a vocabulary whose tp padding differs), LAMB, overlap off, gradient
// accumulation. (LAMB runs without biases: the key bias's update is rounding noise - see expect_same_run - and
// LAMB's per-tensor trust ratio would spread that noise over the whole c_attn.bias.) Also: ShardSpec slicing/assembly against hand-built layouts, and the clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "megatrain/ckpt/checkpoint.h"
#include "megatrain/model/layout.h"
#include "megatrain/model/shard.h"

using namespace mt;
namespace fs = std::filesystem;

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
  c.mlp = "swiglu";
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

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ShardSpec, IndivisibleDimensionsAreNamed) {
  ModelConfig c;
  c.d_model = 96;
  c.n_head = 6;
  ParamStore s;
  EXPECT_NE(error_of([&] { declare_gpt_params(c, s, 4, 0); }).find("model.n_head (6) must be divisible by parallel.tp (4)"),
            std::string::npos);
  c.n_head = 4;
  c.n_kv_head = 2;
  EXPECT_NE(error_of([&] { declare_gpt_params(c, s, 4, 0); }).find("model.n_kv_head (2)"), std::string::npos);
}

// ---- end to end ----------------------------------------------------------------------------------------------

const std::string kBin = std::string(MT_BINARY_DIR) + "/megatrain";
const std::string kData = std::string(MT_BINARY_DIR) + "/test-data/brown-dp";

void prepare() {
  if (fs::exists(kData + "/meta.json")) return;
  std::string cmd = kBin + " prepare-data --preset brown --out " + kData + " >/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

// Adam's first update of an element is lr * g/(|g| + eps): for a gradient that is ~0 (a unit that is nearly
// dead on this batch) its sign is rounding noise, which any change of summation order (row chunks, sharded
// GEMMs) flips, moving that one element by 2 lr. A larger eps keeps such elements still without affecting the
// others, so the comparison tests the tensor-parallel arithmetic rather than Adam's noise amplification.
const std::string kEps = " --optim.eps=1e-6";

std::string common(const std::string& out, int batch) {
  return " --data.dir=" + kData + " --train.out_dir=" + out +
         " --model.n_layer=2 --model.d_model=64 --model.n_head=4 --model.max_seq_len=32 --data.seq_len=32"
         " --data.batch_size=" + std::to_string(batch) +
         " --optim.lr=3e-3 --optim.warmup_steps=2 --train.eval_every=0 --sample.tokens=0 --train.steps=5"
         " --train.log_every=100 --train.threads=1 --ckpt.resume=none --parallel.bucket_mb=1" + kEps;
}

std::vector<double> losses(const std::string& out) {
  std::vector<double> l;
  std::ifstream f(out + "/metrics.jsonl");
  std::string line;
  while (std::getline(f, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["kind"] == "train") l.push_back(j["loss"].get<double>());
  }
  return l;
}

constexpr size_t kQkvWidth = 3 * 64;  // c_attn rows of the common config (d_model 64, plain multi-head)

void expect_same_run(const std::string& a, const std::string& b) {
  std::vector<double> la = losses(a), lb = losses(b);
  ASSERT_EQ(la.size(), 5u);
  ASSERT_EQ(lb.size(), la.size());
  for (size_t i = 0; i < la.size(); ++i) EXPECT_NEAR(la[i], lb[i], 1e-5 * std::abs(la[i])) << "step " << i + 1;
  Checkpoint ca = Checkpoint::load(a + "/ckpt"), cb = Checkpoint::load(b + "/ckpt");
  for (const std::string& file : {std::string("model.safetensors"), std::string("optim.safetensors")}) {
    auto names = ca.tensor_names(file);
    ASSERT_EQ(names, cb.tensor_names(file));
    for (const std::string& n : names) {
      const TensorData& x = ca.get(n);
      const TensorData& y = cb.get(n);
      ASSERT_EQ(x.shape, y.shape) << n;
      const float* p = static_cast<const float*>(x.data);
      const float* q = static_cast<const float*>(y.data);
      // The key bias has an exactly zero true gradient (softmax ignores a constant added to every score), so
      // what Adam makes of its rounding noise (~1e-5 here) differs with any change of summation order. It is
      // checked separately, in absolute terms; the query and value biases must match like everything else.
      const bool kbias = n.ends_with("attn.c_attn.bias");
      const size_t k0 = kbias ? kQkvWidth / 3 : 0, k1 = kbias ? 2 * kQkvWidth / 3 : 0;
      double d = 0, s = 0, dk = 0;
      for (size_t i = 0; i < x.nbytes / 4; ++i) {
        const double e = (p[i] - q[i]) * double(p[i] - q[i]);
        if (i >= k0 && i < k1)
          dk += e;
        else
          d += e, s += p[i] * double(p[i]);
      }
      EXPECT_LE(std::sqrt(dk), 1e-4) << n << " (key bias part)";
      // Moments: the second moment of a gradient element that is ~0 is dominated by rounding; a looser bound.
      const double tol = file == "model.safetensors" ? 1e-5 : 1e-3;
      EXPECT_LE(std::sqrt(d), tol * std::sqrt(s) + 1e-12) << n;
    }
  }
}

void run(const std::string& cmd) { ASSERT_EQ(std::system((cmd + " > /dev/null 2>&1").c_str()), 0) << cmd; }

struct Case {
  std::string name, extra;
  int dp = 1;
};

class TensorParallelVsSingle : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallelVsSingle, LossesAndParametersMatch) {
  prepare();
  const Case& c = GetParam();
  std::string single = ::testing::TempDir() + "/mt_tp_single_" + c.name, multi = ::testing::TempDir() + "/mt_tp_multi_" + c.name;
  fs::remove_all(single);
  fs::remove_all(multi);
  run(kBin + " train" + common(single, 4) + c.extra);
  run(kBin + " launch --nproc " + std::to_string(2 * c.dp) + " -- train" + common(multi, 4 / c.dp) +
      " --parallel.tp=2 --parallel.dp=" + std::to_string(c.dp) + c.extra);
  expect_same_run(single, multi);
}

const std::string kLlama =
    " --model.norm=rmsnorm --model.mlp=swiglu --model.pos=rope --model.n_kv_head=2 --model.bias=false"
    " --model.tied_embeddings=false --model.vocab_pad_to=1";

INSTANTIATE_TEST_SUITE_P(
    Tp2, TensorParallelVsSingle,
    ::testing::Values(Case{"gpt2", ""}, Case{"no_overlap", " --parallel.overlap=false"},
                      Case{"chunks3", " --parallel.tp_chunks=3"},
                      Case{"parallel_block_accum", " --model.block=parallel --train.grad_accum=2"},
                      Case{"llama", kLlama}, Case{"lamb", " --optim.name=lamb --model.bias=false"},
                      Case{"dp2_tp2", "", 2}, Case{"dp2_tp2_llama_lamb", kLlama + " --optim.name=lamb", 2}),
    [](const auto& info) { return info.param.name; });

TEST(TensorParallel, ResumeAcrossLayoutsKeepsTheRun) {
  // A tp=2 run checkpointed at step 3 (full tensors, tp-padded vocabulary trimmed) resumes in a single process,
  // and a single-process checkpoint resumes under tp=2, with the same losses.
  prepare();
  const std::string x = " --model.vocab_pad_to=1";
  std::string a = ::testing::TempDir() + "/mt_tp_resume_a", b = ::testing::TempDir() + "/mt_tp_resume_b",
              c = ::testing::TempDir() + "/mt_tp_resume_c";
  for (auto& d : {a, b, c}) fs::remove_all(d);
  run(kBin + " train" + common(a, 4) + x);
  run(kBin + " launch --nproc 2 -- train" + common(b, 4) + x +
      " --parallel.tp=2 --ckpt.every=3 --ckpt.save_final=false");
  fs::remove(b + "/metrics.jsonl");
  run(kBin + " train" + common(b, 4) + x + " --ckpt.resume=" + b + "/ckpt/step_00000003");
  run(kBin + " train" + common(c, 4) + x + " --ckpt.every=3 --ckpt.save_final=false");
  fs::remove(c + "/metrics.jsonl");
  run(kBin + " launch --nproc 2 -- train" + common(c, 4) + x + " --parallel.tp=2 --ckpt.resume=" + c +
      "/ckpt/step_00000003");
  std::vector<double> la = losses(a), lb = losses(b), lc = losses(c);
  ASSERT_EQ(lb.size(), 2u);
  ASSERT_EQ(lc.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_NEAR(la[3 + i], lb[i], 1e-5 * la[3 + i]);
    EXPECT_NEAR(la[3 + i], lc[i], 1e-5 * la[3 + i]);
  }
}

TEST(TensorParallel, RowsNotDividingIsAClearError) {
  prepare();
  std::string out = ::testing::TempDir() + "/mt_tp_bad";
  std::string log = out + ".log";
  int rc = std::system((kBin + " train" + common(out, 1) + " --data.seq_len=31 --parallel.tp=2 > " + log + " 2>&1").c_str());
  EXPECT_NE(rc, 0);
  std::ifstream f(log);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("must divide evenly"), std::string::npos) << text;
}

}  // namespace
