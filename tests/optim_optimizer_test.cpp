// The optimizers against independent oracles: one AdamW step against its formula (in double), LAMB trust ratios
// against their definition, LAMB's tensor-parallel norm reduction between its two passes, and the learning-rate
// schedule's warmup and decay at known points. A tiny GPT supplies a realistic ParamStore (decayed and not decayed
// tensors of several shapes).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "megatrain/core/rng.h"
#include "megatrain/model/gpt.h"
#include "megatrain/optim/optimizer.h"
#include "support/model_testutil.h"

using namespace mt;

namespace {

ModelConfig tiny_gpt2() { return mt::test::tiny_model("gpt2"); }

TEST(Optim, AdamWStepMatchesFormula) {
  ModelConfig c = tiny_gpt2();
  auto ops = make_cpu_ops();
  GPT m(c, *ops);
  m.init_weights(1);
  OptimConfig oc;
  oc.weight_decay = 0.1f;
  Optimizer opt(oc, m.params(), *ops);
  Rng r(2);
  std::vector<double> p0(m.params().total_floats()), g(m.params().total_floats());
  for (size_t i = 0; i < g.size(); ++i) {
    m.params().grads_data()[i] = r.normal();
    g[i] = m.params().grads_data()[i];
    p0[i] = m.params().params_data()[i];
  }
  const float lr = 1e-2f, scale = 0.5f;
  opt.step(m.params(), lr, scale, 1);
  for (auto& info : m.params().infos()) {
    const float* p = m.params().param(info.name).f32();
    for (size_t k = 0; k < info.numel; ++k) {
      size_t i = info.offset + k;
      double gg = g[i] * scale;
      double mh = (1 - oc.beta1) * gg / (1 - oc.beta1), vh = (1 - oc.beta2) * gg * gg / (1 - oc.beta2);
      double wd = info.decay ? oc.weight_decay : 0;
      double want = p0[i] - lr * (mh / (std::sqrt(vh) + oc.eps) + wd * p0[i]);
      ASSERT_NEAR(p[k], want, 1e-6) << info.name << "[" << k << "]";
    }
  }
}

TEST(Optim, LambTrustRatioIsWeightNormOverUpdateNorm) {
  ModelConfig c = tiny_gpt2();
  auto ops = make_cpu_ops();
  GPT m(c, *ops);
  m.init_weights(1);
  OptimConfig oc;
  oc.name = OptimizerKind::Lamb;
  oc.weight_decay = 0.01f;
  Optimizer opt(oc, m.params(), *ops);
  Rng r(2);
  for (size_t i = 0; i < m.params().total_floats(); ++i) m.params().grads_data()[i] = r.normal();
  std::vector<double> p0(m.params().params_data(), m.params().params_data() + m.params().total_floats());
  opt.step(m.params(), 1e-2f, 1.0f, 1);
  ASSERT_EQ(opt.last_trust().size(), m.params().size());
  for (size_t t = 0; t < m.params().size(); ++t) {
    const ParamInfo& info = m.params().info(static_cast<int>(t));
    double w2 = 0, u2 = 0;
    for (size_t k = 0; k < info.numel; ++k) {
      size_t i = info.offset + k;
      double g = m.params().grads_data()[i];
      double u = g / (std::abs(g) + oc.eps) + (info.decay ? oc.weight_decay : 0) * p0[i];  // step 1: mhat=g, vhat=g^2
      w2 += p0[i] * p0[i];
      u2 += u * u;
    }
    double want = (w2 > 0 && u2 > 0) ? std::sqrt(w2 / u2) : 1.0;
    EXPECT_NEAR(opt.last_trust()[t], want, 1e-4 * want) << info.name;
  }
}

// The tensor-parallel path of LAMB: the weighted norms go through the reduce callback (once per step, all 2 per
// tensor) between the two passes and come back. A reduce that scales every norm by 4 (exact) leaves the trust ratios
// and the update bit for bit as without one; weight 0 on a tensor zeroes its norms, so its trust becomes 1.
TEST(Optim, LambNormReduceRunsBetweenThePasses) {
  ModelConfig c = tiny_gpt2();
  auto ops = make_cpu_ops();
  GPT a(c, *ops), b(c, *ops);
  a.init_weights(1);
  b.init_weights(1);
  OptimConfig oc;
  oc.name = OptimizerKind::Lamb;
  oc.weight_decay = 0.01f;
  Optimizer oa(oc, a.params(), *ops), ob(oc, b.params(), *ops);
  const size_t nt = a.params().size();
  int calls = 0;
  std::vector<float> weights(nt, 1.0f);
  weights[1] = 0.0f;
  ob.set_norm_reduce(weights, [&](float* data, size_t n) {
    ++calls;
    ASSERT_EQ(n, 2 * nt);
    for (size_t k = 0; k < n; ++k) data[k] *= 4.0f;
  });
  EXPECT_TRUE(ob.last_trust().empty());  // before the first step
  Rng r(3);
  for (int step = 1; step <= 2; ++step) {
    for (size_t i = 0; i < a.params().total_floats(); ++i)
      a.params().grads_data()[i] = b.params().grads_data()[i] = r.normal();
    oa.step(a.params(), 1e-2f, 1.0f, step);
    ob.step(b.params(), 1e-2f, 1.0f, step);
  }
  EXPECT_EQ(calls, 2);
  const std::vector<float> ta = oa.last_trust(), tb = ob.last_trust();
  ASSERT_EQ(ta.size(), nt);
  ASSERT_EQ(tb.size(), nt);
  EXPECT_NE(ta[1], 1.0f);
  EXPECT_EQ(tb[1], 1.0f) << "weight 0: no norms, trust 1";
  for (size_t t = 0; t < nt; ++t) {
    if (t == 1) continue;
    EXPECT_EQ(ta[t], tb[t]) << a.params().info(static_cast<int>(t)).name;
    const ParamInfo& info = a.params().info(static_cast<int>(t));
    for (size_t k = 0; k < info.numel; ++k)
      ASSERT_EQ(a.params().params_data()[info.offset + k], b.params().params_data()[info.offset + k])
          << info.name << "[" << k << "]";
  }
}

TEST(Optim, ScheduleWarmupAndDecay) {
  OptimConfig c;
  c.lr = 1.0f;
  c.min_lr = 0.1f;
  c.warmup_steps = 10;
  EXPECT_FLOAT_EQ(lr_at(c, 5, 100), 0.5f);
  EXPECT_FLOAT_EQ(lr_at(c, 10, 100), 1.0f);
  EXPECT_NEAR(lr_at(c, 55, 100), 0.55f, 1e-6);  // cosine midpoint
  EXPECT_NEAR(lr_at(c, 100, 100), 0.1f, 1e-6);
  c.schedule = LrSchedule::Linear;
  EXPECT_NEAR(lr_at(c, 55, 100), 0.55f, 1e-6);
  EXPECT_NEAR(lr_at(c, 28, 100), 0.82f, 1e-6);
}

}  // namespace
