// Pipeline parallelism. In process: a GPT split into pipeline stages (GptPart) and run chunk by chunk gives the
// whole model's loss and gradients (tied embedding: the two wte copies' gradients add up to the whole one), also
// with several micro-batches in flight per chunk in their activation slots, backwarded out of order. In processes:
// GptPipeline with ZeRO-2 (pp=2 x dp=2) holds the schedule's peak of slots, forwards each micro-batch once per
// chunk and launches every bucket's reduce-scatter inside backward, with the single process's gradient norm.
// End to end: `megatrain launch -- train --parallel.pp=2 ...` (with dp, tp, interleaving, the parallel block,
// LAMB, overlap off, an untied head with gradient accumulation) against a single process on the same global
// batch: per-step losses and gradient norms, the final parameters and moments agree up to the noise floor the test
// measures (ptest::expect_equivalent);
// a pp checkpoint resumes in one process and vice versa; bad layouts are clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fmt/format.h>
#include <omp.h>

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "support/comm_fork_util.h"
#include "megatrain/core/fs.h"
#include "megatrain/core/rng.h"
#include "megatrain/comm/mesh.h"
#include "megatrain/comm/store.h"
#include "megatrain/model/gpt.h"
#include "megatrain/model/layout.h"
#include "megatrain/parallel/data_parallel.h"
#include "megatrain/parallel/gpt_pipeline.h"
#include "support/files.h"
#include "support/megatrain.h"
#include "support/parallel_testutil.h"

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
  EXPECT_NE(e.find("model.n_layer = 4 must be divisible by parallel.pp * parallel.virtual_stages = 3 * 1 for an "
                   "even split"),
            std::string::npos)
      << e;
}

// parallel.stage_layers: the layers of each virtual stage, in stage order; chunk c of rank r is stage c*pp + r.
TEST(PipelinePart, AnUnevenSplitGivesEachVirtualStageItsCount) {
  ModelConfig c = tiny(true);
  c.n_layer = 7;
  // pp 2, v 2: stages 0..3 hold 1, 3, 2, 1 layers = [0,1) [1,4) [4,6) [6,7).
  const std::vector<int> counts = {1, 3, 2, 1};
  EXPECT_EQ(pipeline_part(c, 2, 2, 0, counts).chunks, (std::vector<std::pair<int, int>>{{0, 1}, {4, 6}}));
  EXPECT_EQ(pipeline_part(c, 2, 2, 1, counts).chunks, (std::vector<std::pair<int, int>>{{1, 4}, {6, 7}}));
  EXPECT_EQ(pipeline_part(c, 3, 1, 2, {3, 3, 1}).chunks, (std::vector<std::pair<int, int>>{{6, 7}}));
  EXPECT_EQ(stage_layer_counts(c, 7, 1), std::vector<int>(7, 1));  // empty: the even split
  struct Bad {
    int pp, v;
    std::vector<int> counts;
    std::string expect;
  };
  for (const Bad& b :
       std::vector<Bad>{{2,
                         2,
                         {1, 3, 3},
                         "parallel.stage_layers has 3 entries but there are parallel.pp * "
                         "parallel.virtual_stages = 2 * 2 = 4 virtual stages"},
                        {2, 1, {3, 3}, "parallel.stage_layers sums to 6 layers but model.n_layer is 7"},
                        {2, 1, {7, 0}, "parallel.stage_layers[1] = 0: every virtual stage needs at least one layer"},
                        {2,
                         1,
                         {},
                         "model.n_layer = 7 must be divisible by parallel.pp * parallel.virtual_stages = 2 * 1 for an "
                         "even split (or give parallel.stage_layers"}}) {
    const std::string e = error_of([&] { pipeline_part(c, b.pp, b.v, 0, b.counts); });
    EXPECT_NE(e.find(b.expect), std::string::npos) << e;
  }
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
    Tensor y = st[s % pp]->forward_chunk(s / pp, f32_view(act.data(), {B * T, c.d_model}), tok.data(), tg.data(), B, T,
                                         0.5f, &loss);
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

// Micro-batches in flight at once on the same stages, backwarded out of order: each backward must use its own
// forward's activations (no recomputation), so the accumulated gradients equal the whole model's over the same
// micro-batches. With a recomputed layer too (it recomputes from its saved input, as in one process), and with
// the norm and GeLU outputs rebuilt in backward on the stages only (shared scratch, every micro-batch in flight).
TEST(GptStage, ActivationSlotsKeepMicroBatchesApart) {
  for (int rec : {0, 1, 2}) {
    SCOPED_TRACE(fmt::format("recompute variant {}", rec));
    ModelConfig c = tiny(true);
    if (rec == 1) c.recompute = {false, true, false, false};
    ModelConfig stage_cfg = c;
    if (rec == 2) stage_cfg.recompute_norm = stage_cfg.recompute_act = true;
    auto ops = make_cpu_ops();
    const int B = 2, T = 8, pp = 2, v = 2, m = 3, S = pp * v;
    std::vector<std::vector<int32_t>> tok(m, std::vector<int32_t>(B * T)), tg = tok;
    Rng rng(11);
    for (int mb = 0; mb < m; ++mb)
      for (int i = 0; i < B * T; ++i) {
        tok[mb][i] = static_cast<int32_t>(rng.next_u64() % c.vocab_size);
        tg[mb][i] = static_cast<int32_t>(rng.next_u64() % c.vocab_size);
      }
    GPT whole(c, *ops);
    whole.init_weights(5);
    whole.params().zero_grads();
    std::vector<float> want_loss;
    for (int mb = 0; mb < m; ++mb) {
      want_loss.push_back(whole.forward(tok[mb].data(), tg[mb].data(), B, T, true, 1.0f / m));
      whole.backward();
    }
    std::vector<std::unique_ptr<GPT>> st;
    for (int r = 0; r < pp; ++r) {
      st.push_back(std::make_unique<GPT>(stage_cfg, *ops, 16, nullptr, pipeline_part(c, pp, v, r)));
      st.back()->init_weights(5);
      st.back()->params().zero_grads();
      for (int ch = 0; ch < v; ++ch) st.back()->reserve_activation_slots(ch, m, B, T);
    }
    for (int mb = 0; mb < m; ++mb) {  // all forwards first: m micro-batches in flight on every chunk
      std::vector<float> act;
      float loss = -1;
      for (int s = 0; s < S; ++s) {
        Tensor y = st[s % pp]->forward_chunk(s / pp, mb, f32_view(act.data(), {B * T, c.d_model}), tok[mb].data(),
                                             tg[mb].data(), B, T, 1.0f / m, &loss);
        if (s + 1 < S) act.assign(y.f32(), y.f32() + y.numel());
      }
      EXPECT_EQ(loss, want_loss[mb]) << "micro-batch " << mb;
    }
    // A fourth micro-batch has no slot; a micro-batch never forwarded has nothing to backward.
    std::string e = error_of([&] {
      st[0]->forward_chunk(0, m, Tensor{}, tok[0].data(), tg[0].data(), B, T, 1, nullptr);
    });
    EXPECT_NE(e.find("no free activation slot for micro-batch 3"), std::string::npos) << e;
    e = error_of([&] { st[1]->backward_chunk(1, 7, Tensor{}); });
    EXPECT_NE(e.find("needs a preceding forward_chunk of that micro-batch"), std::string::npos) << e;
    for (int mb : {1, 2, 0}) {
      std::vector<float> grad;
      for (int s = S - 1; s >= 0; --s) {
        Tensor dx = st[s % pp]->backward_chunk(s / pp, mb, f32_view(grad.data(), {B * T, c.d_model}));
        if (s > 0) grad.assign(dx.f32(), dx.f32() + dx.numel());
      }
    }
    for (int r = 0; r < pp; ++r) {
      EXPECT_EQ(st[r]->chunk_forwards(), v * m);  // nothing forwarded again for a backward
      const ParamStore& ps = st[r]->params();
      for (const ParamInfo& info : ps.infos()) {
        if (info.name == "wte.weight") continue;  // split over the two copies; checked by the test above
        const Tensor g = whole.params().grad(info.name);
        EXPECT_LE(rel_diff(ps.grad(info.name), std::vector<float>(g.f32(), g.f32() + g.numel())), 1e-6) << info.name;
      }
    }
  }
}

// ---- GptPipeline x DataParallel in processes (pp = 2 x dp = 2) ------------------------------------------------
// Each rank runs one step of a schedule through GptPipeline with ZeRO-2 on its stage. Checked: every chunk holds
// exactly the schedule's peak in-flight micro-batches (1F1B pp=2 m=4: stage 0 two, stage 1 one), each chunk runs
// one forward per micro-batch, every bucket's reduce-scatter is launched inside a backward (none left for
// finish_gradients), and the reduced gradient's norm equals the whole model's over the global batch.
void pipeline_with_dp(int v, int m) {
  SCOPED_TRACE(fmt::format("virtual_stages {} microbatches {}", v, m));
  const int dp = 2, pp = 2, B = 2, T = 8;
  ModelConfig c = tiny(false);
  c.recompute = {false, false, true, false};
  mt::test::ScratchDir dir;
  const std::vector<int> ranks = {0, 1, 2, 3};
  std::string err = comm_test::run_procs(
      ranks,
      [&](int rank) {
        omp_set_num_threads(1);  // four processes share the cores: no OpenMP spinning against each other
        auto store = make_file_store(dir.path);
        GroupOptions go;
        go.timeout = Millis(15000);
        DeviceMesh mesh(*store, {dp, pp, 1}, rank, go);
        const int d = mesh.coord().dp, p = mesh.coord().pp;
        auto ops = make_cpu_ops();
        // Micro-batch j of dp rank d is global micro-batch d * m + j.
        std::vector<int32_t> tok(dp * m * B * T), tg(tok.size());
        Rng rng(21);
        for (size_t i = 0; i < tok.size(); ++i) {
          tok[i] = static_cast<int32_t>(rng.next_u64() % c.vocab_size);
          tg[i] = static_cast<int32_t>(rng.next_u64() % c.vocab_size);
        }
        GPT model(c, *ops, dp_pad_multiple(dp), nullptr, pipeline_part(c, pp, v, p));
        model.init_weights(5);
        model.params().zero_grads();
        Schedule s = v > 1 ? make_interleaved_1f1b(pp, v, m) : make_1f1b(pp, m);
        GptPipeline pipe(model, s, p, B, T);
        OptimConfig oc;
        DataParallelOptions o;
        o.bucket_floats = 1024;  // many buckets
        DataParallel ddp(model, mesh.dp(), *ops, oc, o);
        pipe.set_before_last_backward([&](int ch) { ddp.begin_last_backward(ch); });
        const std::vector<int> peak = peak_in_flight_per_chunk(s, p);
        for (int ch = 0; ch < v; ++ch)
          MT_CHECK(model.activation_slots(ch) == peak[ch],
                   "chunk {}: {} activation slots, the schedule's peak "
                   "in flight is {}",
                   ch, model.activation_slots(ch), peak[ch]);
        if (v == 1)
          MT_CHECK(model.activation_slots(0) == (p == 0 ? 2 : 1), "1F1B stage {} holds {} slots", p,
                   model.activation_slots(0));
        const size_t off = static_cast<size_t>(d) * m * B * T;
        const int64_t f0 = model.chunk_forwards();
        pipe.run(mesh.pp(), tok.data() + off, tg.data() + off, 1.0f / m, true);
        MT_CHECK(model.chunk_forwards() - f0 == v * m, "{} chunk forwards for {} chunks x {} micro-batches",
                 model.chunk_forwards() - f0, v, m);
        const double norm = ddp.finish_gradients();
        MT_CHECK(ddp.num_buckets() > 1 && ddp.overlapped_buckets() == ddp.num_buckets(),
                 "{} of {} buckets reduce-scattered during backward", ddp.overlapped_buckets(), ddp.num_buckets());

        GPT whole(c, *ops);  // the oracle: the global batch in one process
        whole.init_weights(5);
        whole.params().zero_grads();
        for (int j = 0; j < dp * m; ++j) {
          whole.forward(tok.data() + static_cast<size_t>(j) * B * T, tg.data() + static_cast<size_t>(j) * B * T, B, T,
                        true, 1.0f / (dp * m));
          whole.backward();
        }
        double ss = 0;
        for (const ParamInfo& info : model.params().infos()) {
          const Tensor g = whole.params().grad(info.name);
          for (int64_t i = 0; i < g.numel(); ++i) ss += double(g.f32()[i]) * g.f32()[i];
        }
        MT_CHECK(std::abs(norm - std::sqrt(ss)) <= 1e-5 * std::sqrt(ss),
                 "gradient norm {} but one process "
                 "gives {}",
                 norm, std::sqrt(ss));
      },
      60);
  EXPECT_EQ(err, "");
}

TEST(GptPipeline, NoExtraForwardsSlotsAtPeakAndDpOverlapped) {
  pipeline_with_dp(1, 4);
  pipeline_with_dp(2, 4);
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
  const Trio t = fresh_trio("mt_pp", c.name);
  const int rows = 4;
  run(kMegatrain + " train" + common(t.single, rows) + c.extra);
  run_twin(rows, common(t.alt, rows) + c.extra);
  run(kMegatrain + " launch --nproc " + std::to_string(2 * c.dp * c.tp) + " -- train" +
      common(t.multi, rows / (c.dp * c.micro)) + " --parallel.pp=2 --parallel.microbatches=" + std::to_string(c.micro) +
      " --parallel.dp=" + std::to_string(c.dp) + " --parallel.tp=" + std::to_string(c.tp) + c.extra + c.pp_extra);
  expect_equivalent(t, "pp2 " + c.name);
  // A MoE model's metrics come from every stage: the same layers and counts as one process (tolerance: see
  // TensorParallel.MoeAuxLossAndCountsAreTheMicroBatchs in parallel_tp_test.cpp).
  if (c.extra.find("moe_experts") != std::string::npos) expect_same_moe_metrics(t.single, t.multi, 1e-4, c.name);
  if (c.pp_extra.find("stage_layers=[3,1]") != std::string::npos) {
    // The split was the one asked for, not the even one (which would match one process as well): the checkpoint
    // records each tensor's virtual stage, and layer 2 sits on stage 0.
    const auto m = nlohmann::json::parse(mt::read_text_file(t.multi + "/ckpt/step_00000005/manifest.json"));
    EXPECT_EQ(m["extra"]["pp_layout"]["h.2.ln_1.weight"], nlohmann::json::array({0}));
    EXPECT_EQ(m["extra"]["pp_layout"]["h.3.ln_1.weight"], nlohmann::json::array({1}));
  }
}

// MoE layers on both stages (layer 0 dense, on stage 0 with MoE layer 1), dropless, with the z-loss (a mean over
// the tokens; the aux loss is per micro-batch, and the pipeline's micro-batches are not the single process's). The
// sigmoid_bias router's bias steps on each stage from its layers' loads, which are the step's: the same bias.
// Evaluation's forwards (pipelined too) are not counted in the metrics.
const std::string kMoe = " --model.moe_experts=4 --model.moe_top_k=2 --model.moe_d_ff=32 --model.moe_shared_experts=1"
                         " --model.moe_z_loss=0.01 --model.moe_first_dense=1";

INSTANTIATE_TEST_SUITE_P(
    Pp2, PipelineVsSingle,
    ::testing::Values(pcase("pp2", ""), pcase("dp2_pp2", "", 2, 1, 2), pcase("pp2_tp2", "", 1, 2),
                      pcase("dp2_pp2_tp2", "", 2, 2, 2),
                      pcase("interleaved", "", 1, 1, 4, " --parallel.virtual_stages=2"),
                      pcase("dp2_interleaved", "", 2, 1, 2, " --parallel.virtual_stages=2"),
                      pcase("parallel_block", " --model.block=parallel"),
                      pcase("uneven_stages", "", 2, 1, 2, " --parallel.stage_layers=[3,1]"),
                      pcase("lamb", " --optim.name=lamb --model.bias=false"),
                      pcase("overlap_off_dp2", " --parallel.overlap=false", 2, 1, 2),
                      pcase("dp2_pp2_lamb", " --optim.name=lamb --model.bias=false", 2, 1, 2),
                      pcase("untied_accum_recompute",
                            " --model.tied_embeddings=false --train.grad_accum=2 --model.recompute=[0,2]", 1, 1, 4),
                      pcase("moe_eval", kMoe + " --train.eval_every=2 --train.eval_batches=1"),
                      pcase("moe_sigmoid_bias", kMoe + " --model.moe_router=sigmoid_bias --model.moe_bias_rate=0.01"),
                      pcase("moe_tp2", kMoe, 1, 2),
                      pcase("moe_interleaved", kMoe, 1, 1, 4, " --parallel.virtual_stages=2")),
    CaseName());

TEST(Pipeline, ResumeAcrossLayoutsKeepsTheRun) {
  // A pp=2 run checkpointed at step 3 (stages gathered into full tensors) resumes in a single process, and a
  // single-process checkpoint resumes under pp=2 x tp=2, with the same losses.
  prepare();
  std::string a = fresh_dir("mt_pp_resume_a"), b = fresh_dir("mt_pp_resume_b"), c = fresh_dir("mt_pp_resume_c");
  std::string alt = fresh_dir("mt_pp_resume_alt");
  run(kMegatrain + " train" + common(a, 4));
  run_twin(4, common(alt, 4));
  run(kMegatrain + " launch --nproc 2 -- train" + common(b, 2) +
      " --parallel.pp=2 --ckpt.every=3 --ckpt.save_final=false");
  Checkpoint ck = Checkpoint::load(step3(b));
  EXPECT_EQ(ck.extra()["pp_layout"]["h.3.mlp.c_fc.weight"], nlohmann::json::array({1}));
  EXPECT_EQ(ck.extra()["pp_layout"]["wte.weight"], nlohmann::json::array({0, 1}));
  fs::remove(b + "/metrics.jsonl");
  run(kMegatrain + " train" + common(b, 4) + " --ckpt.resume=" + step3(b));
  run(kMegatrain + " train" + common(c, 4) + " --ckpt.every=3 --ckpt.save_final=false");
  fs::remove(c + "/metrics.jsonl");
  run(kMegatrain + " launch --nproc 4 -- train" + common(c, 1) +
      " --parallel.pp=2 --parallel.tp=2 --parallel.microbatches=4"
      " --ckpt.resume=" +
      step3(c));
  expect_resumed_tail(a, alt, {b, c}, "pp2 <-> 1 resume");
}

// Continued pretraining of an HF Llama under pp2 x tp2, each rank reading only its slices: straight from the HF
// directory (HfSliceReader), and from its conversion (the sharded checkpoint reader). Each must start the run where
// one process starts reading the whole HF model (the HF importer): independent paths to the same weights. The HF
// model is this test's own: a short Llama run exported with `convert --to-hf`, in bf16 for the direct read (so the
// slices convert from bf16; the single process reads the same file).
TEST(Pipeline, InitFromAnHfLlamaUnderPp2Tp2MatchesOneProcess) {
  prepare();
  const std::string llama = " --model.norm=rmsnorm --model.mlp=swiglu --model.pos=rope --model.n_kv_head=2"
                            " --model.bias=false --model.tied_embeddings=false";
  const std::string src = fresh_dir("mt_pp_init_src"), hf = fresh_dir("mt_pp_init_hf"), ck = fresh_dir("mt_pp_init_ck");
  run(kMegatrain + " train" + common(src, 4) + llama + " --train.steps=2");
  run(kMegatrain + " convert --to-hf " + src + "/ckpt --out " + hf + "/model.safetensors --dtype bf16");
  run(kMegatrain + " convert --from-hf " + hf + " --out " + ck);
  const Trio t = fresh_trio("mt_pp_init", "llama");
  const std::string from_hf = llama + " --model.init_from=" + hf;
  const std::string pp2_tp2 = " --parallel.pp=2 --parallel.tp=2 --parallel.microbatches=4";
  run(kMegatrain + " train" + common(t.single, 4) + from_hf);
  run_twin(4, common(t.alt, 4) + from_hf);
  run(kMegatrain + " launch --nproc 4 -- train" + common(t.multi, 1) + from_hf + pp2_tp2);
  expect_equivalent(t, "pp2 x tp2 init_from an HF model");
  const Trio from_ck{t.single, t.alt, fresh_dir("mt_pp_init_multi_ck")};
  // (its model.safetensors, which stands for the checkpoint; the directory is read below)
  run(kMegatrain + " launch --nproc 4 -- train" + common(from_ck.multi, 1) + llama + " --model.init_from=" + ck +
      "/step_00000000/model.safetensors" + pp2_tp2);
  expect_equivalent(from_ck, "pp2 x tp2 init_from its conversion");
  // Not a fresh initialisation that happens to agree: the first loss is the trained source's, well below.
  const std::vector<double> fresh = losses(src), started = losses(t.multi);
  ASSERT_FALSE(started.empty());
  EXPECT_LT(started[0], fresh[0] - 0.05) << "the run did not start from the source's weights";

  // Another model than the source holds is named, on every rank, before anything is read.
  const std::string out = fresh_dir("mt_pp_init_bad");
  for (const std::string& from : {hf, ck}) {
    const std::string text = failing_output(kMegatrain + " launch --nproc 2 -- train" + common(out, 4) + llama +
                                                " --model.n_kv_head=4 --parallel.tp=2 --model.init_from=" + from,
                                            out + ".log", "init_from another model");
    EXPECT_NE(text.find("model.n_kv_head = 2 but the config says 4"), std::string::npos) << text;
  }

  // `generate` reads the HF directory and its conversion alike: the same greedy continuation.
  auto greedy = [&](const std::string& from) {
    const std::string log = out + "-generate.log";
    const std::string cmd = kMegatrain + " generate --ckpt " + from + " --vocab " + kSmallBrown +
                            "-tokenizer --prompt 'The jury'" + " --tokens 8 --temperature 0 > " + log + " 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return mt::read_text_file(log);
  };
  const std::string text_hf = greedy(hf);
  EXPECT_GT(text_hf.size(), std::string("The jury\n").size()) << text_hf;
  EXPECT_EQ(text_hf, greedy(ck));
}

// A Mixtral (an MoE Llama exported with `convert --to-hf`) read by model.init_from under pp2, each stage reading its
// layers' expert tensors whole: the run is one process's reading the whole directory, from the source's weights.
TEST(Pipeline, InitFromAnHfMixtralUnderPp2MatchesOneProcess) {
  prepare();
  const std::string mixtral = " --model.norm=rmsnorm --model.mlp=swiglu --model.pos=rope --model.n_kv_head=2"
                              " --model.bias=false --model.tied_embeddings=false --model.moe_experts=4"
                              " --model.moe_top_k=2 --model.moe_d_ff=32";
  const std::string src = fresh_dir("mt_pp_mixtral_src"), hf = fresh_dir("mt_pp_mixtral_hf");
  run(kMegatrain + " train" + common(src, 4) + mixtral + " --train.steps=2");
  run(kMegatrain + " convert --to-hf " + src + "/ckpt --out " + hf + "/model.safetensors");
  const Trio t = fresh_trio("mt_pp_mixtral", "init");
  const std::string from_hf = mixtral + " --model.moe_z_loss=0.01 --model.init_from=" + hf;
  run(kMegatrain + " train" + common(t.single, 4) + from_hf);
  run_twin(4, common(t.alt, 4) + from_hf);
  run(kMegatrain + " launch --nproc 2 -- train" + common(t.multi, 2) + from_hf +
      " --parallel.pp=2 --parallel.microbatches=2");
  expect_equivalent(t, "pp2 init_from an HF Mixtral");
  EXPECT_LT(losses(t.multi)[0], losses(src)[0] - 0.05) << "the run did not start from the source's weights";
}

std::string failing_run(const std::string& args) {
  std::string out = mt::test::temp_root() + "mt_pp_bad";
  return failing_output(kMegatrain + " train" + common(out, 1) + args, out + ".log", args);
}

TEST(Pipeline, BadLayoutsAreClearErrors) {
  prepare();
  std::string t = failing_run(" --parallel.pp=3");
  EXPECT_NE(t.find("model.n_layer = 4 must be divisible by parallel.pp * parallel.virtual_stages = 3 * 1"),
            std::string::npos)
      << t;
  t = failing_run(" --parallel.pp=2 --parallel.virtual_stages=2 --parallel.microbatches=3");
  EXPECT_NE(t.find("parallel.microbatches = 3 must be a multiple of parallel.pp = 2"), std::string::npos) << t;
  t = failing_run(" --parallel.virtual_stages=2");
  EXPECT_NE(t.find("need parallel.pp > 1"), std::string::npos) << t;
}

}  // namespace
