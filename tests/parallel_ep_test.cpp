// Expert parallelism end to end: `megatrain launch --nproc N -- train --parallel.dp=D --parallel.ep=E` (and with
// --parallel.tp / --parallel.pp, the compositions) against a single process training on the same global batch. The
// experts are sharded over the ep ranks and the tokens travel to them and back by all-to-all, but dropless routing
// is per token, the z-loss a per-token mean, the expert gradients are summed over every rank's tokens and the
// optimizer is elementwise: the run must equal one process. Per-step losses and gradient norms, the final parameters
// and both optimizer moments (assembled from the sharded checkpoint) must agree up to the noise floor the test
// measures (ptest::expect_equivalent: a reordered single-process run gives each observable's floor). The
// load-balancing loss is left out: it is taken over each rank's own tokens (docs/moe.md), so it is not the
// one-process loss.
#include <gtest/gtest.h>

#include <string>

#include "support/files.h"
#include "support/metrics.h"
#include "support/megatrain.h"
#include "support/parallel_testutil.h"

using namespace ptest;

namespace {

// A 2-layer model whose every layer is MoE: 4 experts of width 32, top 2.
const std::string kMoe = " --model.moe_experts=4 --model.moe_top_k=2 --model.moe_d_ff=32";

std::string common(const std::string& out, int batch, int n_layer = 2) {
  return common_args(out, batch, n_layer) + kMoe;
}

// With tp or pp (parallel_tp_test.cpp): a larger Adam eps keeps the ~0 gradients' rounding-noise updates still.
const std::string kEps = " --optim.eps=1e-6";
// Under pp: 4 layers, the first dense (stage 0: dense layer 0 and MoE layer 1; stage 1: MoE layers 2 and 3).
const std::string kPpModel = " --model.moe_first_dense=1";

struct Case {
  std::string name;
  int dp, ep;
  std::string extra;
  int tp = 1, pp = 1;             // pp > 1: 2 micro-batches per step, 4 layers (kPpModel)
  std::string layout_extra = "";  // for the layout's run only
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// The launch flags and rank count of a case's layout; each rank reads batch 4 / (dp x micro-batches) rows.
std::string layout_run(const Case& c, const std::string& out, int n_layer) {
  const int micro = c.pp > 1 ? 2 : 1;
  std::string flags = common(out, 4 / (c.dp * micro), n_layer) + " --parallel.dp=" + std::to_string(c.dp) +
                      " --parallel.ep=" + std::to_string(c.ep);
  if (c.tp > 1) flags += " --parallel.tp=" + std::to_string(c.tp);
  if (c.pp > 1) flags += " --parallel.pp=" + std::to_string(c.pp) + " --parallel.microbatches=2";
  return kMegatrain + " launch --nproc " + std::to_string(c.dp * c.tp * c.pp) + " -- train" + flags + c.extra +
         c.layout_extra;
}

class ExpertParallelVsSingle : public ::testing::TestWithParam<Case> {};

TEST_P(ExpertParallelVsSingle, LossesAndParametersMatch) {
  prepare();
  const Case& c = GetParam();
  const Trio t = fresh_trio("mt_ep", c.name);
  const int n_layer = c.pp > 1 ? 4 : 2;
  run(kMegatrain + " train" + common(t.single, 4, n_layer) + c.extra);
  // A layout whose ranks hold one row each (dp 4) sums one-row gradients: so does its twin (noise_floor.h).
  const int rows_per_rank = 4 / (c.dp * (c.pp > 1 ? 2 : 1));
  run_twin(4, common(t.alt, 4, n_layer) + c.extra, rows_per_rank == 1 ? 4 : 2);
  run(layout_run(c, t.multi, n_layer));
  expect_equivalent(t, c.name);
  if (c.extra.find("--sample.tokens") == std::string::npos) return;
  // Evaluation and the final sample run forwards that every rank of an ep group (and every stage) takes part in:
  // the validation loss is one process's (up to the floor), and one sample is written after the last step.
  std::vector<Deviation> devs;
  add_series(devs, "val_loss", series(t.single, "val_loss", "val"), series(t.alt, "val_loss", "val"),
             series(t.multi, "val_loss", "val"), 1);
  expect_within_floor(devs, c.name + " evaluation");
  EXPECT_EQ(series(t.multi, "step", "sample"), std::vector<double>{5}) << "one sample, after the last step";
}

// Evaluation and a sample of 6 tokens after step 5.
const std::string kEvalSample = " --train.eval_every=5 --train.eval_batches=2 --sample.tokens=6 --sample.prompt=The";

INSTANTIATE_TEST_SUITE_P(
    Ep, ExpertParallelVsSingle,
    ::testing::Values(Case{"ep2", 2, 2, ""},
                      // two expert replicas: the expert gradients are reduced over the expert-dp pairs
                      Case{"ep2_x_dp2", 4, 2, ""},
                      // every micro-batch exchanges its tokens; the gradients reduced after the last one
                      Case{"ep2_accum", 2, 2, " --train.grad_accum=2"},
                      // the shared expert computed while the dispatch is in flight, and the router z-loss
                      Case{"ep2_shared_z", 2, 2, " --model.moe_shared_experts=1 --model.moe_z_loss=0.01"},
                      // the exchanges waited for at once (nothing overlapped), and LAMB's per-tensor norms
                      Case{"ep2_no_overlap_lamb", 2, 2, " --parallel.ep_overlap=false --optim.name=lamb"},
                      // the bias steps from the loads summed over all data-parallel ranks
                      Case{"ep2_sigmoid_bias", 2, 2, " --model.moe_router=sigmoid_bias --model.moe_bias_rate=0.01"},
                      Case{"dp2_sigmoid_bias", 2, 1, " --model.moe_router=sigmoid_bias --model.moe_bias_rate=0.01"},
                      // ep2 x tp2: each tp coordinate its own ep group; the experts' gradients summed over tp, the
                      // routing statistics (z-loss, counts) shared over tp before the exchange's results are used
                      Case{"ep2_x_tp2_shared_z", 2, 2, kEps + " --model.moe_shared_experts=1 --model.moe_z_loss=0.01",
                           2},
                      // the bias loads: the micro-batch's over tp (the token group), then summed over dp only
                      Case{"ep2_x_tp2_sigmoid_bias", 2, 2,
                           kEps + " --model.moe_router=sigmoid_bias --model.moe_bias_rate=0.01", 2},
                      // ep2 x pp2: each stage's ep group exchanges for its own MoE layers, its experts reduced over
                      // its own expert-dp group; evaluation and the sample run through both stages
                      Case{"ep2_x_pp2_shared_z_eval", 2, 2,
                           kEps + kPpModel + " --model.moe_shared_experts=1 --model.moe_z_loss=0.01" + kEvalSample, 1,
                           2},
                      // all three: 8 ranks, two expert replicas per tp coordinate; evaluation and the sample with
                      // the first ep group of each tp coordinate
                      Case{"ep2_x_dp2_x_tp2_eval", 4, 2, kEps + " --model.moe_z_loss=0.01" + kEvalSample, 2},
                      // all four: 8 ranks, each stage's ep groups per tp coordinate
                      Case{"ep2_x_pp2_x_tp2", 2, 2, kEps + kPpModel + " --model.moe_z_loss=0.01", 2, 2},
                      // interleaved stages (two MoE chunks a stage), each stage stepping its layers' sigmoid_bias
                      Case{"ep2_x_pp2_interleaved_sigmoid_bias", 2, 2,
                           kEps + kPpModel + " --model.moe_router=sigmoid_bias --model.moe_bias_rate=0.01", 1, 2,
                           " --parallel.virtual_stages=2"},
                      // every layer recomputed in backward (the exchanges and the tp sharing again), accumulating
                      Case{"ep2_x_tp2_recompute_accum", 2, 2,
                           kEps + " --model.moe_z_loss=0.01 --model.recompute=all --train.grad_accum=2", 2},
                      // LAMB's per-tensor norms: an expert shard counted once over its tp replicas
                      Case{"ep2_x_tp2_lamb_no_overlap", 2, 2,
                           kEps + " --optim.name=lamb --model.bias=false --parallel.ep_overlap=false", 2}),
    CaseName());

// A Mixtral (an MoE Llama exported with `convert --to-hf`, per-expert w1/w2/w3 tensors) read by model.init_from
// under ep2 x dp2 and ep2 x tp2: each rank reads the tensors of its own experts only, the router and the rest whole
// (or its tp slices of them). Each run must be one process's reading the whole directory (up to the floor of its
// reordered twin, shared by both layouts) and start from the source's weights.
TEST(ExpertParallel, InitFromAnHfMixtralMatchesOneProcess) {
  prepare();
  const std::string src = fresh_dir("mt_ep_mixtral_src"), hf = fresh_dir("mt_ep_mixtral_hf");
  make_hf_mixtral(common(src, 4) + kLlama, src, hf);
  if (::testing::Test::HasFatalFailure()) return;
  const std::string from_hf = kLlama + kEps + " --model.moe_z_loss=0.01 --model.init_from=" + hf;
  const std::string single = fresh_dir("mt_ep_mixtral_single"), alt = fresh_dir("mt_ep_mixtral_alt");
  run(kMegatrain + " train" + common(single, 4) + from_hf);
  run_twin(4, common(alt, 4) + from_hf);
  for (const Case& c : {Case{"ep2_x_dp2", 4, 2, from_hf}, Case{"ep2_x_tp2", 2, 2, from_hf, 2}}) {
    const Trio t{single, alt, fresh_dir("mt_ep_mixtral_multi_" + c.name)};
    run(layout_run(c, t.multi, 2));
    expect_equivalent(t, c.name + " init_from an HF Mixtral");
    EXPECT_LT(losses(t.multi)[0], losses(src)[0] - 0.05)
        << c.name << ": the run did not start from the source's weights";
  }
}

// An ep2 run checkpointed at step 3 resumes with the uninterrupted run's losses in one process (the experts
// gathered back from their shards) and with every expert on its own rank (dp = ep = 4: the shards cut anew); and the
// one-process run's own step-3 checkpoint resumes under ep2 (its experts cut into shards). Up to the noise floor of a
// reordered single run (alt).
TEST(ExpertParallel, ResumeUnderAnotherEpKeepsTheRun) {
  prepare();
  const std::string a = fresh_dir("mt_ep_resume_a"), alt = fresh_dir("mt_ep_resume_alt"),
                    b = fresh_dir("mt_ep_resume_b"), c = fresh_dir("mt_ep_resume_c"), d = fresh_dir("mt_ep_resume_d");
  run(kMegatrain + " train" + common(a, 4) + " --ckpt.every=3");
  run_twin(4, common(alt, 4));
  run(kMegatrain + " launch --nproc 2 -- train" + common(b, 2) +
      " --parallel.dp=2 --parallel.ep=2 --ckpt.every=3 --ckpt.save_final=false");
  fs::remove(b + "/metrics.jsonl");
  run(kMegatrain + " train" + common(b, 4) + " --ckpt.resume=" + step3(b));
  run(kMegatrain + " launch --nproc 4 -- train" + common(c, 1) +
      " --parallel.dp=4 --parallel.ep=4 --ckpt.resume=" + step3(b));
  run(kMegatrain + " launch --nproc 2 -- train" + common(d, 2) +
      " --parallel.dp=2 --parallel.ep=2 --ckpt.resume=" + step3(a));
  expect_resumed_tail(a, alt, {b, c, d}, "ep2 -> 1, ep2 -> ep4 and 1 -> ep2 resume");
}

// The compositions' checkpoints are layout-free too: an ep2 x tp2 run checkpointed at step 3 (each expert shard
// written by one of its tp replicas) resumes with the uninterrupted run's losses in one process and under ep2 x pp2
// (the experts cut into ep shards again, the layers into stages).
TEST(ExpertParallel, ResumeFromEpTimesTpUnderOneProcessAndEpTimesPp) {
  prepare();
  const std::string x = kEps + " --model.moe_z_loss=0.01 --model.vocab_pad_to=1";
  const std::string a = fresh_dir("mt_ep_tp_resume_a"), alt = fresh_dir("mt_ep_tp_resume_alt"),
                    b = fresh_dir("mt_ep_tp_resume_b"), c = fresh_dir("mt_ep_tp_resume_c");
  run(kMegatrain + " train" + common(a, 4) + x);
  run_twin(4, common(alt, 4) + x);
  run(kMegatrain + " launch --nproc 4 -- train" + common(b, 2) + x +
      " --parallel.dp=2 --parallel.ep=2 --parallel.tp=2 --ckpt.every=3 --ckpt.save_final=false");
  fs::remove(b + "/metrics.jsonl");
  run(kMegatrain + " train" + common(b, 4) + x + " --ckpt.resume=" + step3(b));
  run(kMegatrain + " launch --nproc 4 -- train" + common(c, 1) + x +
      " --parallel.dp=2 --parallel.ep=2 --parallel.pp=2 --parallel.microbatches=2 --ckpt.resume=" + step3(b));
  expect_resumed_tail(a, alt, {b, c}, "ep2 x tp2 -> 1 and ep2 x tp2 -> ep2 x pp2 resume");
}

// Evaluation and the final sample run forwards too, which under expert parallelism every rank of an ep group must
// take part in (each holds some experts): an ep2 x dp2 run evaluates to one process's validation loss (up to the
// floor) and samples the requested tokens (the first ep group together, its rank 0 picking).
TEST(ExpertParallel, EvaluationAndSamplingRunOnEveryEpRank) {
  prepare();
  const std::string extra = " --train.eval_every=5 --train.eval_batches=2 --sample.tokens=6 --sample.prompt=The";
  const Trio t = fresh_trio("mt_ep", "eval_sample");
  run(kMegatrain + " train" + common(t.single, 4) + extra);
  run_twin(4, common(t.alt, 4) + extra);
  run(kMegatrain + " launch --nproc 4 -- train" + common(t.multi, 1) + " --parallel.dp=4 --parallel.ep=2" + extra);
  std::vector<Deviation> devs;
  add_series(devs, "val_loss", series(t.single, "val_loss", "val"), series(t.alt, "val_loss", "val"),
             series(t.multi, "val_loss", "val"), 1);
  expect_within_floor(devs, "ep2 x dp2 evaluation");
  const std::vector<double> sampled = series(t.multi, "step", "sample");
  EXPECT_EQ(sampled, std::vector<double>{5}) << "one sample, after the last step";
}

// The all-to-alls are their own communication plane and timeline spans: every step of an ep2 run reports ep time
// (a single process none), and a traced step shows, per rank and MoE layer, one counts exchange and four all-to-alls
// (dispatch and combine forward, their mirrors backward): 2 ranks x 2 layers x (1 + 4).
TEST(ExpertParallel, ExchangesAreTheirOwnCommPlaneAndTimelineSpans) {
  prepare();
  const std::string one = fresh_dir("mt_ep_plane_one"), two = fresh_dir("mt_ep_plane_two");
  run(kMegatrain + " train" + common(one, 4) + " --train.steps=2");
  run(kMegatrain + " launch --nproc 2 -- train" + common(two, 2) +
      " --train.steps=2 --parallel.dp=2 --parallel.ep=2 '--train.trace_steps=[2,2]'");
  for (const auto& step : mt::test::metrics_of(one + "/metrics.jsonl", "train"))
    EXPECT_EQ(step["comm_busy_s"]["ep"].get<double>(), 0.0) << "one process exchanges nothing";
  const auto steps = mt::test::metrics_of(two + "/metrics.jsonl", "train");
  ASSERT_EQ(steps.size(), 2u);
  for (const auto& step : steps) EXPECT_GT(step["comm_busy_s"]["ep"].get<double>(), 0.0) << step.dump();
  std::ifstream in(two + "/trace.json");
  ASSERT_TRUE(in.good()) << "no trace.json in " << two;
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::map<std::string, int> spans;
  for (const auto& e : trace.is_object() ? trace["traceEvents"] : trace)
    if (e.value("cat", "") == "ep") ++spans[e.value("name", "")];
  EXPECT_EQ(spans, (std::map<std::string, int>{{"ep all-to-all", 16}, {"ep counts", 4}}));
}

}  // namespace
