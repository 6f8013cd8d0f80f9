// Expert parallelism's interleave of two micro-batches (parallel.ep_interleave, docs/moe.md): a step's micro-batches
// run in pairs, layer by layer, the second one's attention while the first one's expert dispatch is in flight. Each
// rank then computes exactly what it computes without the interleave: every micro-batch's forward is the same
// operations on the same inputs (only independent work is reordered: the other micro-batch's attention reads and
// writes none of this one's buffers), the all-to-alls carry the same rows, and the backwards run one micro-batch
// after another in the same order (mb0's, mb1's, ...), so the gradients accumulate in the same order and the
// data-parallel reductions sum the same buffers. The oracle is therefore the same job without the interleave, and
// the comparison is bit for bit: per-step losses and gradient norms, every parameter and both optimizer moments of
// the final (sharded, assembled) checkpoint. The timeline shows the interleave: each "attention mb1 behind mb0's
// dispatch" span lies inside an "ep all-to-all" span of its rank.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "support/files.h"
#include "support/metrics.h"
#include "support/megatrain.h"
#include "support/parallel_testutil.h"

using namespace ptest;

namespace {

// A 2-layer model whose every layer is MoE: 4 experts of width 32, top 2, one shared expert, the z-loss.
const std::string kMoe = " --model.moe_experts=4 --model.moe_top_k=2 --model.moe_d_ff=32 --model.moe_shared_experts=1 "
                         "--model.moe_z_loss=0.01";

std::string launch(int nproc, const std::string& out, int batch, const std::string& extra) {
  return kMegatrain + " launch --nproc " + std::to_string(nproc) + " -- train" + common_args(out, batch, 2) + kMoe +
         extra;
}

// Both runs' checkpoints hold the same tensors, byte for byte.
void expect_same_checkpoints(const std::string& a, const std::string& b, const std::string& what) {
  mt::Checkpoint ca = mt::Checkpoint::load(a + "/ckpt"), cb = mt::Checkpoint::load(b + "/ckpt");
  for (const std::string file : {"model.safetensors", "optim.safetensors"}) {
    const auto names = ca.tensor_names(file);
    ASSERT_FALSE(names.empty()) << file;
    EXPECT_EQ(names, cb.tensor_names(file)) << what << " " << file;
    for (const std::string& n : names) {
      const mt::TensorData &x = ca.get(n), &y = cb.get(n);
      ASSERT_EQ(x.shape, y.shape) << what << " " << n;
      EXPECT_EQ(std::memcmp(x.data, y.data, x.nbytes), 0) << what << ": " << n << " differs";
    }
  }
}

struct Case {
  std::string name;
  int dp, ep, accum;
  std::string extra = "";
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class EpInterleave : public ::testing::TestWithParam<Case> {};

TEST_P(EpInterleave, EqualsTheSameJobWithoutIt) {
  prepare();
  const Case& c = GetParam();
  const std::string plain = fresh_dir("mt_epi_plain_" + c.name), inter = fresh_dir("mt_epi_inter_" + c.name);
  const std::string flags = " --parallel.dp=" + std::to_string(c.dp) + " --parallel.ep=" + std::to_string(c.ep) +
                            " --train.grad_accum=" + std::to_string(c.accum) + c.extra;
  const int batch = 16 / (c.dp * c.accum);  // 16 rows a step
  run(launch(c.dp, plain, batch, flags));
  run(launch(c.dp, inter, batch, flags + " --parallel.ep_interleave=true"));
  for (const char* field : {"loss", "grad_norm"}) {
    const std::vector<double> p = series(plain, field), i = series(inter, field);
    EXPECT_EQ(p.size(), 5u) << field;
    EXPECT_EQ(p, i) << c.name << ": " << field;
  }
  expect_same_checkpoints(plain, inter, c.name);
}

INSTANTIATE_TEST_SUITE_P(Ep, EpInterleave,
                         ::testing::Values(Case{"ep2_accum2", 2, 2, 2},
                                           // two pairs a step; the expert gradients reduced over the expert-dp pairs
                                           Case{"ep2_x_dp2_accum4", 4, 2, 4},
                                           // a dense first layer: the pair's forwards one after the other there
                                           Case{"ep2_first_dense_accum2", 2, 2, 2, " --model.moe_first_dense=1"}),
                         CaseName());

// The interleave is on the timeline: per rank and MoE layer of a traced step, one "attention mb1 behind mb0's
// dispatch" span (2 ranks x 2 layers), each inside one of its rank's "ep all-to-all" spans (the dispatch in
// flight); and the ep plane's busy and exposed time are still reported every step.
TEST(EpInterleaveTimeline, SecondAttentionRunsInsideTheFirstDispatch) {
  prepare();
  const std::string out = fresh_dir("mt_epi_trace");
  run(launch(2, out, 2,
             " --train.steps=2 --parallel.dp=2 --parallel.ep=2 --train.grad_accum=2 --parallel.ep_interleave=true "
             "'--train.trace_steps=[2,2]'"));
  const auto steps = mt::test::metrics_of(out + "/metrics.jsonl", "train");
  ASSERT_EQ(steps.size(), 2u);
  for (const auto& step : steps) {
    EXPECT_GT(step["comm_busy_s"]["ep"].get<double>(), 0.0) << step.dump();
    EXPECT_TRUE(step["comm_exposed_s"].contains("ep")) << step.dump();
  }
  std::ifstream in(out + "/trace.json");
  ASSERT_TRUE(in.good()) << "no trace.json in " << out;
  const nlohmann::json trace = nlohmann::json::parse(in);
  const nlohmann::json& events = trace.is_object() ? trace["traceEvents"] : trace;
  std::vector<nlohmann::json> a2a, attn;
  for (const auto& e : events) {
    if (e.value("ph", "") != "X") continue;
    if (e.value("name", "") == "ep all-to-all") a2a.push_back(e);
    if (e.value("name", "") == "attention mb1 behind mb0's dispatch") attn.push_back(e);
  }
  ASSERT_EQ(attn.size(), 4u) << "2 ranks x 2 MoE layers";
  for (const auto& s : attn) {
    const double eps = 1e-3;  // microseconds: ts + dur rounds
    const double t0 = s["ts"].get<double>(), t1 = t0 + s["dur"].get<double>();
    bool inside = false;
    for (const auto& d : a2a)
      inside |= d["pid"] == s["pid"] && d["tid"] == s["tid"] && d["ts"].get<double>() <= t0 + eps &&
                t1 <= d["ts"].get<double>() + d["dur"].get<double>() + eps;
    EXPECT_TRUE(inside) << s.dump();
  }
}

// The setting's preconditions, each refused with the keys it needs.
TEST(EpInterleaveConfig, RefusesWhatItCannotRun) {
  prepare();
  const std::string out = fresh_dir("mt_epi_cfg");
  fs::create_directories(out);  // for the logs
  const std::string base = kMegatrain + " train" + common_args(out, 2, 2) + kMoe + " --parallel.ep_interleave=true";
  std::string msg = failing_output(base + " --train.grad_accum=2", out + "/a.log", "ep = 1");
  EXPECT_NE(msg.find("parallel.ep_interleave needs parallel.ep > 1"), std::string::npos) << msg;
  msg = failing_output(kMegatrain + " launch --nproc 2 -- train" + common_args(out, 2, 2) + kMoe +
                           " --parallel.ep_interleave=true --parallel.dp=2 --parallel.ep=2 --train.grad_accum=3",
                       out + "/b.log", "odd grad_accum");
  EXPECT_NE(msg.find("train.grad_accum = 3 must be even"), std::string::npos) << msg;
}

}  // namespace
