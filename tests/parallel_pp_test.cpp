// Pipeline parallelism. In process: a GPT split into pipeline stages (GptPart) and run chunk by chunk gives the
// whole model's loss and gradients (tied embedding: the two wte copies' gradients add up to the whole one).
// End to end: `megatrain launch -- train --parallel.pp=2 ...` (with dp, tp, interleaving, the parallel block,
// LAMB, overlap off, an untied head with gradient accumulation) against a single process on the same global
// batch: per-step losses and the final parameters (checkpoints are gathered full) agree within 1e-5 relative;
// a pp checkpoint resumes in one process and vice versa; bad layouts are clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fmt/format.h>
#include <ostream>
#include <string>
#include <vector>

#include "megatrain/core/rng.h"
#include "megatrain/model/gpt.h"
#include "megatrain/model/layout.h"
#include "parallel_testutil.h"

using namespace mt;
using namespace ptest;

namespace {

// ---- stages in one process ------------------------------------------------------------------------------------

ModelConfig tiny(bool tied) {
  ModelConfig c;
  c.vocab_size = 100;
  c.vocab_pad_to = 16;
  c.n_layer = 4;
  c.n_head = 2;
  c.d_model = 32;
  c.max_seq_len = 16;
  c.tied_embeddings = tied;
  return c;
}

TEST(PipelinePart, LayersSplitIntoVirtualStages) {
  ModelConfig c = tiny(true);
  GptPart p = pipeline_part(c, 2, 2, 1);  // virtual stages 1 and 3: layers 1 and 3
  EXPECT_EQ(p.chunks, (std::vector<std::pair<int, int>>{{1, 2}, {3, 4}}));
  EXPECT_FALSE(p.embedding);
  EXPECT_TRUE(p.head);
  ParamStore s;
  declare_gpt_params(c, s, 1, 0, p);
  EXPECT_FALSE(s.has("h.0.ln_1.weight"));
  EXPECT_TRUE(s.has("h.3.mlp.c_proj.bias"));
  EXPECT_FALSE(s.has("wpe.weight"));
  EXPECT_EQ(s.info(static_cast<int>(s.size()) - 1).name, "wte.weight");  // the tied copy, after ln_f
  ParamStore f;
  declare_gpt_params(c, f, 1, 0, pipeline_part(c, 2, 1, 0));
  EXPECT_TRUE(f.has("wte.weight") && f.has("wpe.weight") && f.has("h.1.ln_1.weight"));
  EXPECT_FALSE(f.has("h.2.ln_1.weight") || f.has("ln_f.weight"));
  std::string e = error_of([&] { pipeline_part(c, 3, 1, 0); });
  EXPECT_NE(e.find("model.n_layer = 4 must be divisible by parallel.pp * parallel.virtual_stages = 3 * 1"),
            std::string::npos)
      << e;
}

double rel_diff(const Tensor& a, const std::vector<float>& b) {
  double d = 0, s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    d += (a.f32()[i] - b[i]) * double(a.f32()[i] - b[i]);
    s += b[i] * double(b[i]);
  }
  return std::sqrt(d / (s + 1e-30));
}

void check_stages_match_whole(bool tied, int v) {
  SCOPED_TRACE(fmt::format("tied {} virtual_stages {}", tied, v));
  ModelConfig c = tiny(tied);
  auto ops = make_cpu_ops();
  const int B = 2, T = 8, pp = 2;
  std::vector<int32_t> tok(B * T), tg(B * T);
  Rng rng(3);
  for (int i = 0; i < B * T; ++i) {
    tok[i] = static_cast<int32_t>(rng.next_u64() % c.vocab_size);
    tg[i] = static_cast<int32_t>(rng.next_u64() % c.vocab_size);
  }
  GPT whole(c, *ops);
  whole.init_weights(5);
  whole.params().zero_grads();
  const float lw = whole.forward(tok.data(), tg.data(), B, T, true, 0.5f);
  whole.backward();

  std::vector<std::unique_ptr<GPT>> st;
  for (int r = 0; r < pp; ++r) {
    st.push_back(std::make_unique<GPT>(c, *ops, 16, nullptr, pipeline_part(c, pp, v, r)));
    st.back()->init_weights(5);  // same per-name streams: the same model, the wte copy included
    st.back()->params().zero_grads();
  }
  std::vector<float> act, grad;
  float loss = -1;
  for (int s = 0; s < pp * v; ++s) {
    Tensor y = st[s % pp]->forward_chunk(s / pp, f32_view(act.data(), {B * T, c.d_model}), tok.data(), tg.data(), B,
                                         T, 0.5f, &loss);
    if (s + 1 < pp * v) act.assign(y.f32(), y.f32() + y.numel());
  }
  EXPECT_EQ(loss, lw);
  for (int s = pp * v - 1; s >= 0; --s) {
    Tensor dx = st[s % pp]->backward_chunk(s / pp, f32_view(grad.data(), {B * T, c.d_model}));
    if (s > 0) grad.assign(dx.f32(), dx.f32() + dx.numel());
  }
  const ParamStore& w = whole.params();
  size_t seen = 0;
  for (int r = 0; r < pp; ++r) {
    const ParamStore& ps = st[r]->params();
    for (const ParamInfo& info : ps.infos()) {
      const int i = w.index(info.name);
      std::vector<float> want(w.grad(i).f32(), w.grad(i).f32() + w.grad(i).numel());
      EXPECT_EQ(0, std::memcmp(ps.param(info.name).f32(), w.param(i).f32(), info.numel * sizeof(float))) << info.name;
      if (info.name == "wte.weight" && tied) {
        if (r == 0) {  // the copies' gradients add up to the whole model's
          std::vector<float> sum(info.numel);
          for (size_t k = 0; k < info.numel; ++k)
            sum[k] = ps.grad(info.name).f32()[k] + st[pp - 1]->params().grad("wte.weight").f32()[k];
          EXPECT_LE(rel_diff(f32_view(sum.data(), {static_cast<int64_t>(sum.size())}), want), 1e-6);
          ++seen;
        }
        continue;
      }
      EXPECT_LE(rel_diff(ps.grad(info.name), want), 1e-6) << info.name;
      ++seen;
    }
  }
  EXPECT_EQ(seen, w.size());
}

TEST(GptStage, ChunksChainedEqualTheWholeModel) {
  check_stages_match_whole(true, 1);
  check_stages_match_whole(false, 1);
  check_stages_match_whole(true, 2);
}

TEST(GptStage, WholeModelCallsOnAStageAreClearErrors) {
  ModelConfig c = tiny(true);
  auto ops = make_cpu_ops();
  GPT s(c, *ops, 16, nullptr, pipeline_part(c, 2, 1, 1));
  std::vector<int32_t> tok(8, 1);
  EXPECT_NE(error_of([&] { s.forward(tok.data(), tok.data(), 1, 8, true); }).find("pipeline stage"), std::string::npos);
  EXPECT_NE(error_of([&] { s.forward_chunk(1, Tensor{}, nullptr, nullptr, 1, 8, 1, nullptr); }).find("chunk 1"),
            std::string::npos);
}

// ---- end to end ----------------------------------------------------------------------------------------------

// eps: see parallel_tp_test.cpp (Adam's first update of a ~0 gradient is rounding noise otherwise).
std::string common(const std::string& out, int batch) {
  return common_args(out, batch, /*n_layer=*/4, " --optim.eps=1e-6");
}

struct Case {
  std::string name, extra;
  int dp = 1, tp = 1, micro = 2;
  std::string pp_extra;  // for the pipeline run only
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name << " (dp=" << c.dp << " pp=2 tp=" << c.tp << " microbatches=" << c.micro << ")";
}

Case pcase(std::string name, std::string extra, int dp = 1, int tp = 1, int micro = 2, std::string pp_extra = "") {
  return Case{std::move(name), std::move(extra), dp, tp, micro, std::move(pp_extra)};
}

class PipelineVsSingle : public ::testing::TestWithParam<Case> {};

// The single process reads batch_size * microbatches * dp rows per step, as the whole mesh does.
TEST_P(PipelineVsSingle, LossesAndParametersMatch) {
  prepare();
  const Case& c = GetParam();
  const auto [single, multi] = fresh_pair("mt_pp", c.name);
  const int rows = 4;
  run(kBin + " train" + common(single, rows) + c.extra);
  run(kBin + " launch --nproc " + std::to_string(2 * c.dp * c.tp) + " -- train" + common(multi, rows / (c.dp * c.micro)) +
      " --parallel.pp=2 --parallel.microbatches=" + std::to_string(c.micro) + " --parallel.dp=" +
      std::to_string(c.dp) + " --parallel.tp=" + std::to_string(c.tp) + c.extra + c.pp_extra);
  expect_same_run(single, multi, Compare::kParamsAndMoments);
}

INSTANTIATE_TEST_SUITE_P(
    Pp2, PipelineVsSingle,
    ::testing::Values(pcase("pp2", ""), pcase("dp2_pp2", "", 2, 1, 2), pcase("pp2_tp2", "", 1, 2),
                      pcase("dp2_pp2_tp2", "", 2, 2, 2),
                      pcase("interleaved", "", 1, 1, 4, " --parallel.virtual_stages=2"),
                      pcase("parallel_block", " --model.block=parallel"),
                      pcase("lamb", " --optim.name=lamb --model.bias=false"),
                      pcase("overlap_off_dp2", " --parallel.overlap=false", 2, 1, 2),
                      pcase("dp2_pp2_lamb", " --optim.name=lamb --model.bias=false", 2, 1, 2),
                      pcase("untied_accum_recompute",
                           " --model.tied_embeddings=false --train.grad_accum=2 --model.recompute=[0,2]",
                           1, 1, 4)),
    CaseName());

TEST(Pipeline, ResumeAcrossLayoutsKeepsTheRun) {
  // A pp=2 run checkpointed at step 3 (stages gathered into full tensors) resumes in a single process, and a
  // single-process checkpoint resumes under pp=2 x tp=2, with the same losses.
  prepare();
  std::string a = fresh_dir("mt_pp_resume_a"), b = fresh_dir("mt_pp_resume_b"), c = fresh_dir("mt_pp_resume_c");
  run(kBin + " train" + common(a, 4));
  run(kBin + " launch --nproc 2 -- train" + common(b, 2) + " --parallel.pp=2 --ckpt.every=3 --ckpt.save_final=false");
  Checkpoint ck = Checkpoint::load(step3(b));
  EXPECT_EQ(ck.extra()["pp_layout"]["h.3.mlp.c_fc.weight"], nlohmann::json::array({1}));
  EXPECT_EQ(ck.extra()["pp_layout"]["wte.weight"], nlohmann::json::array({0, 1}));
  fs::remove(b + "/metrics.jsonl");
  run(kBin + " train" + common(b, 4) + " --ckpt.resume=" + step3(b));
  run(kBin + " train" + common(c, 4) + " --ckpt.every=3 --ckpt.save_final=false");
  fs::remove(c + "/metrics.jsonl");
  run(kBin + " launch --nproc 4 -- train" + common(c, 1) + " --parallel.pp=2 --parallel.tp=2 --parallel.microbatches=4"
      " --ckpt.resume=" + step3(c));
  std::vector<double> la = losses(a);
  ASSERT_EQ(la.size(), 5u);
  expect_resumed_tail(la, {losses(b), losses(c)});
}

std::string failing_run(const std::string& args) {
  std::string out = ::testing::TempDir() + "/mt_pp_bad";
  return failing_output(kBin + " train" + common(out, 1) + args, out + ".log", args);
}

TEST(Pipeline, BadLayoutsAreClearErrors) {
  prepare();
  std::string t = failing_run(" --parallel.pp=3");
  EXPECT_NE(t.find("model.n_layer = 4 must be divisible by parallel.pp * parallel.virtual_stages = 3 * 1"),
            std::string::npos) << t;
  t = failing_run(" --parallel.pp=2 --parallel.virtual_stages=2 --parallel.microbatches=3");
  EXPECT_NE(t.find("parallel.microbatches = 3 must be a multiple of parallel.pp = 2"), std::string::npos) << t;
  t = failing_run(" --parallel.virtual_stages=2");
  EXPECT_NE(t.find("need parallel.pp > 1"), std::string::npos) << t;
}

}  // namespace
