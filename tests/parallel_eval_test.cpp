// Evaluation and sampling under every parallel layout: `megatrain launch -- train` with tp, pp, dp x pp, pp x tp
// and interleaved pp against one process on the same global batch. The validation losses (two evaluations, at
// steps 2 and 3) agree up to the noise floor a reordered single run measures (ptest::expect_within_floor), and the
// text sampled after training (fixed seed, long enough for the window to slide past model.max_seq_len and, with tp,
// to be padded at odd lengths) is the same string. (A sampled token changes only if rounding, ~1e-6 relative, moves
// the sampler's cumulative probability across its uniform draw: about 34 draws x 1e-6 odds per run.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "support/files.h"
#include "support/megatrain.h"
#include "support/metrics.h"
#include "support/parallel_testutil.h"

using namespace ptest;

namespace {

struct RunOut {
  std::vector<double> val;  // val loss per evaluation
  std::string sample;
  std::vector<int> tokens;  // the sampled ids
};

RunOut read_run(const std::string& out) {
  RunOut r;
  r.val = mt::test::metric_series(out + "/metrics.jsonl", "val_loss", "val");
  for (nlohmann::json& j : mt::test::metrics_of(out + "/metrics.jsonl", "sample")) {
    r.sample = j["text"].get<std::string>();
    r.tokens = j["tokens"].get<std::vector<int>>();
  }
  return r;
}

// 3 steps, evaluations at steps 2 and 3 over 3 batches, a 34-token sample; `batch` rows per micro-batch.
std::string args(const std::string& out, int batch) {
  return common_args(out, batch, /*n_layer=*/4,
                     " --optim.eps=1e-6 --train.steps=3 --train.eval_every=2 --train.eval_batches=3"
                     " --sample.tokens=34 --sample.seed=11 --ckpt.save_final=false");
}

constexpr int kGlobalRows = 4;

// The single-process reference, run once per test process (ctest runs each case as its own process, in parallel:
// the folder is per process so concurrent cases never share it); `reorder` gives its reordered twin, the noise floor.
RunOut single_run(bool reorder) {
  const std::string out = fresh_dir("mt_eval_single_" + std::string(reorder ? "alt_" : "") +
                                    std::to_string(::getpid()));
  run(kMegatrain + " train" + args(out, kGlobalRows) + (reorder ? reordered(kGlobalRows, args(out, kGlobalRows)) : ""));
  return read_run(out);
}
const RunOut& single() {
  static RunOut r = single_run(false);
  return r;
}
const RunOut& single_alt() {
  static RunOut r = single_run(true);
  return r;
}

struct Case {
  std::string name;
  int dp = 1, pp = 1, tp = 1, micro = 1, virtual_stages = 1;
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name << " (dp=" << c.dp << " pp=" << c.pp << " tp=" << c.tp << " microbatches=" << c.micro
      << " virtual_stages=" << c.virtual_stages << ")";
}

class EvalVsSingle : public ::testing::TestWithParam<Case> {};

TEST_P(EvalVsSingle, ValLossAndSampleMatch) {
  prepare();
  const Case& c = GetParam();
  const RunOut& ref = single();
  ASSERT_EQ(ref.val.size(), 2u);
  ASSERT_GE(ref.tokens.size(), 30u) << "the reference sampled too little to slide the window";

  const std::string out = fresh_dir("mt_eval_" + c.name);
  const int world = c.dp * c.pp * c.tp;
  std::string layout = " --parallel.dp=" + std::to_string(c.dp) + " --parallel.pp=" + std::to_string(c.pp) +
                       " --parallel.tp=" + std::to_string(c.tp);
  if (c.pp > 1)
    layout += " --parallel.microbatches=" + std::to_string(c.micro) +
              " --parallel.virtual_stages=" + std::to_string(c.virtual_stages);
  run(kMegatrain + " launch --nproc " + std::to_string(world) + " -- train" +
      args(out, kGlobalRows / (c.dp * c.micro)) + layout);
  const RunOut got = read_run(out);
  ASSERT_EQ(got.val.size(), ref.val.size());
  std::vector<Deviation> devs;
  add_series(devs, "val_loss", ref.val, single_alt().val, got.val);
  expect_within_floor(devs, "eval " + c.name);
  EXPECT_EQ(got.tokens, ref.tokens);
  EXPECT_EQ(got.sample, ref.sample);
}

INSTANTIATE_TEST_SUITE_P(Layouts, EvalVsSingle,
                         ::testing::Values(Case{"tp2", 1, 1, 2, 1, 1}, Case{"pp2", 1, 2, 1, 2, 1},
                                           Case{"dp2_pp2", 2, 2, 1, 2, 1}, Case{"pp2_tp2", 1, 2, 2, 2, 1},
                                           Case{"pp2_interleaved", 1, 2, 1, 4, 2}),
                         CaseName());

}  // namespace
