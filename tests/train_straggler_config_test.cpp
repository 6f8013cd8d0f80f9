// Straggler coding's settings (parallel.straggler_*) and its fault (slowburst): what a run accepts, and the errors
// that name the key and the problem for what it refuses.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "megatrain/core/error.h"
#include "megatrain/core/fault_spec.h"
#include "megatrain/train/run_config.h"

using namespace mt;

namespace {

std::string config_error(const std::vector<std::string>& ov) {
  try {
    parse_run_config("", "test.toml", ov);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(StragglerCodingConfig, TheDefaultIsNoneAndChangesNothing) {
  const RunConfig c = parse_run_config("", "test.toml");
  EXPECT_EQ(c.parallel.straggler_coding, StragglerScheme::None);
  EXPECT_EQ(config_error({"--parallel.straggler_s=3"}), "");  // read only under gc
}

TEST(StragglerCodingConfig, GcAcceptsADivisibleLayout) {
  const RunConfig c = parse_run_config("", "test.toml",
                                       {"--parallel.dp=4", "--parallel.straggler_coding=gc",
                                        "--parallel.straggler_s=1"});
  EXPECT_EQ(c.parallel.straggler_code().scheme, StragglerScheme::Gc);
  EXPECT_EQ(c.parallel.straggler_code().s, 1);
}

TEST(StragglerCodingConfig, GcWithThreeReplicasAndSOneNamesTheDivisibility) {
  const std::string e = config_error({"--parallel.dp=3", "--parallel.straggler_coding=gc", "--parallel.straggler_s=1"});
  EXPECT_TRUE(has(e, "parallel.straggler_coding = \"gc\"")) << e;
  EXPECT_TRUE(has(e, "parallel.straggler_s")) << e;
  EXPECT_TRUE(has(e, "parallel.dp = 3")) << e;
}

TEST(StragglerCodingConfig, OneReplicaIsRefused) {
  const std::string e = config_error({"--parallel.straggler_coding=gc", "--parallel.straggler_s=0"});
  EXPECT_TRUE(has(e, "parallel.dp >= 2")) << e;
}

TEST(StragglerCodingConfig, PipelineAndTensorParallelismAreAccepted) {
  EXPECT_EQ(config_error({"--parallel.dp=2", "--parallel.pp=2", "--parallel.tp=2", "--parallel.straggler_coding=gc",
                          "--parallel.straggler_s=1", "--model.n_layer=4"}),
            "");
}

TEST(StragglerCodingConfig, AGpuRunIsRefusedByName) {
  const std::string e = config_error({"--parallel.dp=2", "--train.device=cuda", "--parallel.straggler_coding=gc",
                                      "--parallel.straggler_s=1"});
  EXPECT_TRUE(has(e, "train.device = \"cpu\" only")) << e;
}

TEST(StragglerCodingConfig, MSgcNamesTheGradAccumThatFits) {
  // B=1, W=2, lambda=1 on 4 replicas: jobs of 3 micro-batches per replica.
  const std::string e = config_error({"--parallel.dp=4", "--parallel.straggler_coding=m-sgc",
                                      "--parallel.straggler_burst=1", "--parallel.straggler_window=2",
                                      "--parallel.straggler_lambda=1", "--train.grad_accum=2"});
  EXPECT_TRUE(has(e, "train.grad_accum = 2 must be a multiple of 3")) << e;
}

TEST(StragglerCodingConfig, SrSgcNamesTheDelayAgainstGradAccum) {
  const std::string e = config_error({"--parallel.dp=4", "--parallel.straggler_coding=sr-sgc",
                                      "--parallel.straggler_burst=1", "--parallel.straggler_window=2",
                                      "--parallel.straggler_lambda=1", "--train.grad_accum=1"});
  EXPECT_TRUE(has(e, "train.grad_accum - 1")) << e;
}

TEST(StragglerCodingConfig, TheDeadlineIsAtLeastOneMedianRound) {
  const std::string e = config_error({"--parallel.straggler_deadline=0.5"});
  EXPECT_TRUE(has(e, "parallel.straggler_deadline")) << e;
}

TEST(SlowBurstFault, ParsesListedRoundsAndABurstyModel) {
  const auto a = parse_faults("slowburst:rank=2:factor=30:rounds=3.0,4.1");
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, FaultKind::SlowBurst);
  EXPECT_EQ(a[0].rank, 2);
  EXPECT_EQ(a[0].rounds, (std::vector<std::pair<int, int>>{{3, 0}, {4, 1}}));
  const auto b = parse_faults("slowburst:rank=1:factor=5:b=2:w=4:lambda=1:p=0.3:seed=9");
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].burst_b, 2);
  EXPECT_EQ(b[0].burst_w, 4);
  EXPECT_EQ(b[0].burst_lambda, 1);
  EXPECT_DOUBLE_EQ(b[0].burst_p, 0.3);
  EXPECT_EQ(b[0].burst_seed, 9u);
}

TEST(SlowBurstFault, RoundsAndAModelTogetherOrNeitherAreRefused) {
  auto error = [](const std::string& spec) {
    try {
      parse_faults(spec);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_TRUE(has(error("slowburst:rank=1:factor=5"), "either rounds=... or all of b, w and lambda"));
  EXPECT_TRUE(has(error("slowburst:rank=1:factor=5:rounds=1.0:b=1:w=2:lambda=1"), "either rounds"));
  EXPECT_TRUE(has(error("slowburst:rank=1:factor=5:b=1:w=2"), "all of b, w and lambda"));
  EXPECT_TRUE(has(error("slowburst:rank=1:factor=5:rounds=3"), "STEP.ROUND"));
}

}  // namespace
