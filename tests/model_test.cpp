// The whole GPT against an independent oracle: a naive double-precision GPT written here with plain loops.
//  * forward loss matches the naive formula (sequential and parallel block, full and sliding-window attention,
//    GPT-2 style and Llama style with RMSNorm/SwiGLU/RoPE/GQA);
//  * every parameter gradient matches central finite differences of the naive double model;
//  * activation recomputation gives bit-identical gradients;
//  * optimizers: one AdamW step against the formula, LAMB trust ratios against their definition.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "megatrain/core/rng.h"
#include "megatrain/model/gpt.h"
#include "megatrain/optim/optimizer.h"

using namespace mt;

namespace {

using Vec = std::vector<double>;
using Params = std::map<std::string, Vec>;

struct Naive {
  const ModelConfig& c;
  const Params& p;
  const Vec& P(const std::string& n) const { return p.at(n); }
  bool has(const std::string& n) const { return p.count(n) > 0; }

  // y[T][C] = norm(x) row-wise
  std::vector<Vec> norm(const std::vector<Vec>& x, const std::string& n) const {
    std::vector<Vec> y(x.size(), Vec(c.d_model));
    const Vec& w = P(n + ".weight");
    for (size_t t = 0; t < x.size(); ++t) {
      double mean = 0, var = 0;
      if (c.norm == "layernorm") {
        for (double v : x[t]) mean += v;
        mean /= c.d_model;
      }
      for (double v : x[t]) var += (v - mean) * (v - mean);
      var /= c.d_model;
      double rstd = 1.0 / std::sqrt(var + c.norm_eps);
      for (int i = 0; i < c.d_model; ++i) {
        y[t][i] = (x[t][i] - mean) * rstd * w[i];
        if (has(n + ".bias")) y[t][i] += P(n + ".bias")[i];
      }
    }
    return y;
  }
  std::vector<Vec> linear(const std::vector<Vec>& x, const std::string& n) const {
    const Vec& w = P(n + ".weight");
    size_t in = x[0].size(), out = w.size() / in;
    std::vector<Vec> y(x.size(), Vec(out));
    for (size_t t = 0; t < x.size(); ++t)
      for (size_t o = 0; o < out; ++o) {
        double s = has(n + ".bias") ? P(n + ".bias")[o] : 0;
        for (size_t i = 0; i < in; ++i) s += x[t][i] * w[o * in + i];
        y[t][o] = s;
      }
    return y;
  }
  void rope(Vec& v, int off, int t) const {
    int hd = c.head_dim(), half = hd / 2;
    for (int i = 0; i < half; ++i) {
      double ang = t * std::pow(static_cast<double>(c.rope_theta), -2.0 * i / hd);
      double a = v[off + i], b = v[off + i + half];
      v[off + i] = a * std::cos(ang) - b * std::sin(ang);
      v[off + i + half] = a * std::sin(ang) + b * std::cos(ang);
    }
  }
  std::vector<Vec> attention(std::vector<Vec> qkv) const {
    int T = static_cast<int>(qkv.size()), H = c.n_head, KV = c.kv_heads(), hd = c.head_dim();
    if (c.pos == "rope")
      for (int t = 0; t < T; ++t)
        for (int h = 0; h < H + KV; ++h) rope(qkv[t], h * hd, t);
    std::vector<Vec> out(T, Vec(H * hd, 0.0));
    for (int h = 0; h < H; ++h) {
      int g = h / (H / KV);
      for (int t = 0; t < T; ++t) {
        std::vector<double> s;
        std::vector<int> idx;
        for (int u = 0; u <= t; ++u) {
          if (c.window > 0 && t - u >= c.window) continue;
          double d = 0;
          for (int i = 0; i < hd; ++i) d += qkv[t][h * hd + i] * qkv[u][(H + g) * hd + i];
          s.push_back(d / std::sqrt(static_cast<double>(hd)));
          idx.push_back(u);
        }
        double mx = -1e300, z = 0;
        for (double v : s) mx = std::max(mx, v);
        for (double& v : s) z += (v = std::exp(v - mx));
        for (size_t j = 0; j < s.size(); ++j)
          for (int i = 0; i < hd; ++i) out[t][h * hd + i] += s[j] / z * qkv[idx[j]][(H + KV + g) * hd + i];
      }
    }
    return out;
  }
  std::vector<Vec> mlp(const std::vector<Vec>& x, const std::string& pre) const {
    auto f = linear(x, pre + "mlp.c_fc");
    int F = c.ff_dim();
    std::vector<Vec> a(x.size(), Vec(F));
    for (size_t t = 0; t < x.size(); ++t)
      for (int i = 0; i < F; ++i) {
        if (c.mlp == "swiglu") {
          double g = f[t][i], u = f[t][F + i];
          a[t][i] = g / (1 + std::exp(-g)) * u;
        } else {
          double v = f[t][i];
          a[t][i] = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
        }
      }
    return linear(a, pre + "mlp.c_proj");
  }
  double loss(const std::vector<int>& tok, const std::vector<int>& tgt, int B, int T) const {
    double total = 0;
    int valid = 0;
    int C = c.d_model;
    for (int b = 0; b < B; ++b) {
      std::vector<Vec> x(T, Vec(C));
      for (int t = 0; t < T; ++t)
        for (int i = 0; i < C; ++i)
          x[t][i] = P("wte.weight")[tok[b * T + t] * C + i] + (c.pos == "learned" ? P("wpe.weight")[t * C + i] : 0);
      for (int l = 0; l < c.n_layer; ++l) {
        std::string pre = "h." + std::to_string(l) + ".";
        auto n1 = norm(x, pre + "ln_1");
        auto a = linear(attention(linear(n1, pre + "attn.c_attn")), pre + "attn.c_proj");
        if (c.block == "sequential") {
          for (int t = 0; t < T; ++t)
            for (int i = 0; i < C; ++i) x[t][i] += a[t][i];
          auto m = mlp(norm(x, pre + "ln_2"), pre);
          for (int t = 0; t < T; ++t)
            for (int i = 0; i < C; ++i) x[t][i] += m[t][i];
        } else {
          auto m = mlp(n1, pre);
          for (int t = 0; t < T; ++t)
            for (int i = 0; i < C; ++i) x[t][i] += a[t][i] + m[t][i];
        }
      }
      auto n = norm(x, "ln_f");
      const Vec& head = P(c.tied_embeddings ? "wte.weight" : "lm_head.weight");
      for (int t = 0; t < T; ++t) {
        int y = tgt[b * T + t];
        if (y < 0) continue;
        std::vector<double> z(c.vocab_size);
        double mx = -1e300, s = 0;
        for (int v = 0; v < c.vocab_size; ++v) {
          double d = 0;
          for (int i = 0; i < C; ++i) d += n[t][i] * head[v * C + i];
          z[v] = d;
          mx = std::max(mx, d);
        }
        for (double v : z) s += std::exp(v - mx);
        total += -(z[y] - mx - std::log(s));
        ++valid;
      }
    }
    return total / valid;
  }
};

Params to_double(const ParamStore& s) {
  Params p;
  for (auto& info : s.infos()) {
    const float* w = s.param(info.name).f32();
    p[info.name] = Vec(w, w + info.numel);
  }
  return p;
}

ModelConfig tiny(const std::string& style) {
  ModelConfig c;
  c.vocab_size = 37;
  c.vocab_pad_to = 16;
  c.n_layer = 2;
  c.n_head = 4;
  c.d_model = 16;
  c.max_seq_len = 8;
  c.init_std = 0.3f;
  if (style == "llama") {
    c.norm = "rmsnorm";
    c.mlp = "swiglu";
    c.pos = "rope";
    c.n_kv_head = 2;
    c.bias = false;
    c.tied_embeddings = false;
    c.d_ff = 24;
  }
  return c;
}

struct Batch {
  std::vector<int> tok, tgt;
};

Batch make_batch(const ModelConfig& c, int B, int T, uint64_t seed) {
  Rng r(seed);
  Batch b;
  for (int i = 0; i < B * T; ++i) {
    b.tok.push_back(static_cast<int>(r.below(c.vocab_size)));
    b.tgt.push_back(static_cast<int>(r.below(c.vocab_size)));
  }
  b.tgt[3] = -1;  // one ignored position
  return b;
}

// Randomise norm weights/biases too, so their gradients are exercised away from the trivial init.
void perturb(GPT& m, uint64_t seed) {
  Rng r(seed);
  for (auto& info : m.params().infos()) {
    if (info.shape.size() != 1) continue;
    float* w = m.params().param(info.name).f32();
    for (size_t i = 0; i < info.numel; ++i) w[i] += 0.3f * r.normal();
  }
}

struct Case {
  std::string style, block;
  int window;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.style << "/" << c.block << "/w" << c.window; }

class GptVsNaive : public ::testing::TestWithParam<Case> {};

TEST_P(GptVsNaive, LossAndGradientsMatchNaiveDoubleModel) {
  const Case& k = GetParam();
  ModelConfig c = tiny(k.style);
  c.block = k.block;
  c.window = k.window;
  auto ops = make_cpu_ops();
  GPT m(c, *ops);
  m.init_weights(11);
  perturb(m, 12);
  const int B = 2, T = 7;
  Batch b = make_batch(c, B, T, 5);
  m.params().zero_grads();
  float loss = m.forward(b.tok.data(), b.tgt.data(), B, T, true);
  m.backward();

  Params p = to_double(m.params());
  Naive naive{c, p};
  double ref = naive.loss(b.tok, b.tgt, B, T);
  EXPECT_NEAR(loss, ref, 1e-5 * std::abs(ref));

  // Finite differences of the double model, for a sample of entries of every tensor.
  Rng pick(99);
  for (auto& info : m.params().infos()) {
    const float* g = m.params().grad(info.name).f32();
    double num = 0, den = 0;
    size_t samples = std::min<size_t>(info.numel, 12);
    for (size_t s = 0; s < samples; ++s) {
      size_t i = samples == info.numel ? s : pick.below(info.numel);
      if ((info.name == "wte.weight" || info.name == "lm_head.weight") && i >= size_t(c.vocab_size) * c.d_model) {
        EXPECT_EQ(g[i], 0.0f) << info.name << " padded row got a gradient";
        continue;
      }
      Vec& w = p[info.name];
      double orig = w[i], h = 1e-5;
      w[i] = orig + h;
      double lp = naive.loss(b.tok, b.tgt, B, T);
      w[i] = orig - h;
      double lm = naive.loss(b.tok, b.tgt, B, T);
      w[i] = orig;
      double fd = (lp - lm) / (2 * h);
      num += (g[i] - fd) * (g[i] - fd);
      den += fd * fd;
    }
    if (den > 0) {
      EXPECT_LT(std::sqrt(num / den), 2e-3) << info.name << " gradient differs from finite differences";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, GptVsNaive,
                         ::testing::Values(Case{"gpt2", "sequential", 0}, Case{"gpt2", "parallel", 0},
                                           Case{"gpt2", "sequential", 3}, Case{"gpt2", "parallel", 2},
                                           Case{"llama", "sequential", 0}, Case{"llama", "parallel", 3}),
                         [](const auto& info) {
                           return info.param.style + "_" + info.param.block + "_w" + std::to_string(info.param.window);
                         });

TEST(Gpt, RecomputationGivesIdenticalGradients) {
  for (std::string style : {"gpt2", "llama"}) {
    ModelConfig c = tiny(style);
    auto ops = make_cpu_ops();
    GPT a(c, *ops);
    c.recompute = {true, false};
    GPT r(c, *ops);
    a.init_weights(3);
    r.init_weights(3);
    Batch b = make_batch(c, 2, 8, 4);
    a.params().zero_grads();
    r.params().zero_grads();
    float la = a.forward(b.tok.data(), b.tgt.data(), 2, 8, true);
    a.backward();
    float lr = r.forward(b.tok.data(), b.tgt.data(), 2, 8, true);
    r.backward();
    EXPECT_EQ(la, lr);
    ASSERT_EQ(a.params().total_floats(), r.params().total_floats());
    for (size_t i = 0; i < a.params().total_floats(); ++i)
      ASSERT_EQ(a.params().grads_data()[i], r.params().grads_data()[i]) << style << " grad float " << i;
  }
}

TEST(Gpt, RejectsTokensOutsideVocabulary) {
  ModelConfig c = tiny("gpt2");
  auto ops = make_cpu_ops();
  GPT m(c, *ops);
  std::vector<int> tok(8, 0), tgt(8, 0);
  tok[2] = c.vocab_size;
  EXPECT_THROW(m.forward(tok.data(), tgt.data(), 1, 8, false), Error);
  tok[2] = 0;
  EXPECT_THROW(m.forward(tok.data(), tgt.data(), 1, 9, false), Error);  // longer than max_seq_len
}

TEST(Optim, AdamWStepMatchesFormula) {
  ModelConfig c = tiny("gpt2");
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
  ModelConfig c = tiny("gpt2");
  auto ops = make_cpu_ops();
  GPT m(c, *ops);
  m.init_weights(1);
  OptimConfig oc;
  oc.name = "lamb";
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
  ModelConfig c = tiny("gpt2");
  auto ops = make_cpu_ops();
  GPT a(c, *ops), b(c, *ops);
  a.init_weights(1);
  b.init_weights(1);
  OptimConfig oc;
  oc.name = "lamb";
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
  c.schedule = "linear";
  EXPECT_NEAR(lr_at(c, 55, 100), 0.55f, 1e-6);
  EXPECT_NEAR(lr_at(c, 28, 100), 0.82f, 1e-6);
}

}  // namespace
