// The whole GPT against an independent oracle: a naive double-precision GPT written here with plain loops.
//  * forward loss matches the naive formula (sequential and parallel block, full and sliding-window attention,
//    GPT-2 style and Llama style with RMSNorm/SwiGLU/RoPE/GQA);
//  * every parameter gradient matches central finite differences of the naive double model;
//  * activation recomputation gives bit-identical gradients.
// (The optimizers' tests are in optim_optimizer_test.cpp.)
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "megatrain/core/rng.h"
#include "megatrain/model/gpt.h"
#include "support/model_testutil.h"
#include "support/test_util.h"

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
      if (c.norm == NormKind::LayerNorm) {
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
    if (c.pos == PosKind::Rope)
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
        if (c.mlp == MlpKind::SwiGlu) {
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
          x[t][i] = P("wte.weight")[tok[b * T + t] * C + i] +
                    (c.pos == PosKind::Learned ? P("wpe.weight")[t * C + i] : 0);
      for (int l = 0; l < c.n_layer; ++l) {
        std::string pre = "h." + std::to_string(l) + ".";
        auto n1 = norm(x, pre + "ln_1");
        auto a = linear(attention(linear(n1, pre + "attn.c_attn")), pre + "attn.c_proj");
        if (c.block == BlockKind::Sequential) {
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

ModelConfig tiny(const std::string& style) { return mt::test::tiny_model(style); }

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
  std::string style;
  BlockKind block;
  int window;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.style << "/" << kind_name(c.block) << "/w" << c.window; }

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

constexpr BlockKind kSeq = BlockKind::Sequential, kPar = BlockKind::Parallel;
INSTANTIATE_TEST_SUITE_P(Layouts, GptVsNaive,
                         ::testing::Values(Case{"gpt2", kSeq, 0}, Case{"gpt2", kPar, 0}, Case{"gpt2", kSeq, 3},
                                           Case{"gpt2", kPar, 2}, Case{"llama", kSeq, 0}, Case{"llama", kPar, 3}),
                         [](const auto& info) {
                           const Case& k = info.param;
                           return k.style + "_" + kind_name(k.block) + "_w" + std::to_string(k.window);
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

// Two models from the same start: initialised with one seed, their norms perturbed alike.
void same_start(GPT& a, GPT& b, uint64_t seed, uint64_t perturb_seed) {
  a.init_weights(seed);
  b.init_weights(seed);
  perturb(a, perturb_seed);
  perturb(b, perturb_seed);
}

// Two models that differ only in what they keep for backward: the same weights and batches give the same losses and
// the same gradient bits. Two steps: after a step the scratch holds the last layer's rebuilt values.
void expect_identical_training(const ModelConfig& keep_cfg, const ModelConfig& rebuild_cfg) {
  auto ops = make_cpu_ops();
  GPT a(keep_cfg, *ops), r(rebuild_cfg, *ops);
  same_start(a, r, 3, 11);
  for (int step = 0; step < 2; ++step) {
    Batch b = make_batch(keep_cfg, 2, 8, 4 + step);
    a.params().zero_grads();
    r.params().zero_grads();
    const float la = a.forward(b.tok.data(), b.tgt.data(), 2, 8, true);
    a.backward();
    const float lr = r.forward(b.tok.data(), b.tgt.data(), 2, 8, true);
    r.backward();
    EXPECT_EQ(la, lr);
    ASSERT_EQ(a.params().total_floats(), r.params().total_floats());
    for (size_t i = 0; i < a.params().total_floats(); ++i)
      ASSERT_EQ(a.params().grads_data()[i], r.params().grads_data()[i]) << "step " << step << ", grad float " << i;
  }
}

size_t kept_bytes(const BlockActs& x) {
  size_t n = 0;
  for (const Buffer* b : {&x.ln1, &x.ln1_mean, &x.ln1_rstd, &x.qkv, &x.att, &x.lse, &x.h, &x.ln2, &x.ln2_mean,
                          &x.ln2_rstd, &x.fc, &x.act})
    n += b->size();
  return n;
}

// model.recompute_act: the GeLU output is rebuilt from the saved pre-activation in backward. On the CPU the forward's
// GeLU and the recomputation are the same function, so losses and gradients are the same bits as keeping it, for
// both blocks and together with layer recomputation; each layer then saves rows x ff_dim values fewer.
TEST(Gpt, RecomputingTheGeluOutputGivesIdenticalGradientsAndSavesItsMemory) {
  for (BlockKind block : {BlockKind::Sequential, BlockKind::Parallel}) {
    for (bool layer_recompute : {false, true}) {
      SCOPED_TRACE(std::string(kind_name(block)) + (layer_recompute ? ", layer 0 recomputed" : ""));
      ModelConfig c = tiny("gpt2");
      c.block = block;
      if (layer_recompute) c.recompute = {true, false};
      ModelConfig r = c;
      r.recompute_act = true;
      expect_identical_training(c, r);
    }
  }
  // The saving, counted from the buffers a layer keeps: exactly its GeLU output, rows x ff_dim floats.
  ModelConfig c = tiny("gpt2");
  const int64_t rows = 16;
  BlockActs keep, rebuild;
  keep.allocate(c, rows);
  c.recompute_act = true;
  rebuild.allocate(c, rows);
  EXPECT_TRUE(rebuild.act.empty());
  EXPECT_EQ(kept_bytes(keep) - kept_bytes(rebuild), size_t(rows) * c.ff_dim() * sizeof(float));
  // The SwiGLU MLP keeps its activation (its backward needs the scratch for the activation's gradient).
  ModelConfig l = tiny("llama");
  l.recompute_act = true;
  BlockActs swiglu;
  swiglu.allocate(l, rows);
  EXPECT_FALSE(swiglu.act.empty());
}

// model.recompute_norm: each norm's output is rebuilt from its saved input in backward (the statistics are kept).
// The rebuild is the forward's arithmetic on the same input, so on the CPU the gradients are the same bits as
// keeping the outputs: LayerNorm and RMSNorm, both blocks, with the GeLU rebuilt too and with layer recomputation.
// A layer then keeps rows x d_model values fewer per norm, and the scratch grows by one such buffer for all layers.
TEST(Gpt, RecomputingTheNormOutputsGivesIdenticalGradientsAndSavesTheirMemory) {
  for (const char* style : {"gpt2", "llama"}) {
    for (BlockKind block : {BlockKind::Sequential, BlockKind::Parallel}) {
      for (int variant = 0; variant < 3; ++variant) {  // alone; with recompute_act; with layer 1 recomputed
        SCOPED_TRACE(fmt::format("{}, {}, variant {}", style, kind_name(block), variant));
        ModelConfig c = tiny(style);
        c.block = block;
        if (variant == 1) c.recompute_act = true;
        if (variant == 2) c.recompute = {false, true};
        ModelConfig r = c;
        r.recompute_norm = true;
        expect_identical_training(c, r);
      }
    }
  }
  const int64_t rows = 16;
  for (BlockKind block : {BlockKind::Sequential, BlockKind::Parallel}) {
    ModelConfig c = tiny("gpt2");
    c.block = block;
    BlockActs keep, rebuild;
    BlockScratch keep_s, rebuild_s;
    keep.allocate(c, rows);
    keep_s.allocate(c, rows);
    c.recompute_norm = true;
    rebuild.allocate(c, rows);
    rebuild_s.allocate(c, rows);
    const size_t norm_out = size_t(rows) * c.d_model * sizeof(float);
    const size_t norms = block == BlockKind::Sequential ? 2 : 1;
    EXPECT_TRUE(rebuild.ln1.empty());
    EXPECT_TRUE(rebuild.ln2.empty());
    EXPECT_EQ(kept_bytes(keep) - kept_bytes(rebuild), norms * norm_out) << kind_name(block);
    EXPECT_TRUE(keep_s.ln.empty());
    EXPECT_EQ(rebuild_s.ln.size(), norm_out);
  }
}

// ParamStore's lazy zeroing: after begin_grads each tensor's first writer is told to overwrite (once), settle_grads
// zeroes exactly the tensors nobody wrote, and zero_grads leaves nothing pending.
TEST(ParamStore, LazyZeroingTellsTheFirstWriterAndSettlesTheRest) {
  ParamStore ps;
  const int a = ps.add("a", {3}, false), b = ps.add("b", {5}, false), c = ps.add("c", {2}, false);
  ps.allocate();
  std::fill(ps.grads_data(), ps.grads_data() + ps.total_floats(), 7.0f);  // a previous step's gradients
  EXPECT_FALSE(ps.take_fresh_grad(a));                                    // nothing begun: accumulate
  ps.begin_grads();
  EXPECT_EQ(ps.grad(a).f32()[0], 7.0f);  // nothing written yet
  EXPECT_TRUE(ps.take_fresh_grad(a));
  EXPECT_FALSE(ps.take_fresh_grad(a));
  ps.grad(a).f32()[0] = 1.0f;  // what the first writer overwrote
  ps.settle_grads(0, 2);       // b was not written: zeroed; a was: kept
  EXPECT_EQ(ps.grad(a).f32()[0], 1.0f);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(ps.grad(b).f32()[i], 0.0f);
  EXPECT_FALSE(ps.take_fresh_grad(b));   // settled: later writers accumulate onto the zeros
  EXPECT_EQ(ps.grad(c).f32()[1], 7.0f);  // outside the range: still pending
  EXPECT_TRUE(ps.take_fresh_grad(c));
  ps.begin_grads();
  EXPECT_TRUE(ps.take_fresh_grad(b, c));  // a weight and its bias, first written together
  ps.begin_grads();
  ps.take_fresh_grad(a);
  const std::string both = mt::test::error_of([&] { ps.take_fresh_grad(c, a); });  // c fresh, a already written
  EXPECT_NE(both.find("not first written together"), std::string::npos) << both;
  ps.begin_grads();
  ps.zero_grads();  // eager zeroing leaves nothing pending
  EXPECT_FALSE(ps.take_fresh_grad(a));
  const std::string e = mt::test::error_of([&] { ps.settle_grads(0, 4); });
  EXPECT_NE(e.find("outside the 3 parameters"), std::string::npos) << e;
}

// A training step's gradients zeroed lazily (begin_grads: the first write of each tensor overwrites, the model settles
// what nobody wrote) are the bits of zeroing them first, over two accumulated micro-batches, whatever the previous
// contents: LayerNorm and RMSNorm, both blocks, tied and untied embeddings, with the rebuild switches and with layer
// recomputation. The stale contents are huge, so any tensor whose first write accumulated would show.
TEST(Gpt, LazilyZeroedGradientsAreTheBitsOfZeroedOnes) {
  for (const char* style : {"gpt2", "llama"}) {
    for (int variant = 0; variant < 4; ++variant) {
      SCOPED_TRACE(fmt::format("{}, variant {}", style, variant));
      ModelConfig c = tiny(style);
      if (variant == 1) c.block = BlockKind::Parallel;
      if (variant == 2) c.tied_embeddings = !c.tied_embeddings, c.recompute_norm = c.recompute_act = true;
      if (variant == 3) c.recompute = {true, false};
      auto ops = make_cpu_ops();
      GPT eager(c, *ops), lazy(c, *ops);
      same_start(eager, lazy, 5, 12);
      for (int step = 0; step < 2; ++step) {
        float* g = lazy.params().grads_data();
        for (size_t i = 0; i < lazy.params().total_floats(); ++i) g[i] = 1e30f;
        eager.params().zero_grads();
        lazy.params().begin_grads();
        for (int mb = 0; mb < 2; ++mb) {
          Batch b = make_batch(c, 2, 8, 20 + 2 * step + mb);
          EXPECT_EQ(eager.forward(b.tok.data(), b.tgt.data(), 2, 8, true, 0.5f),
                    lazy.forward(b.tok.data(), b.tgt.data(), 2, 8, true, 0.5f));
          eager.backward();
          lazy.backward();
        }
        for (const ParamInfo& info : eager.params().infos()) {
          const float* ge = eager.params().grad(info.name).f32();
          const float* gl = lazy.params().grad(info.name).f32();
          for (size_t i = 0; i < info.numel; ++i)
            ASSERT_EQ(ge[i], gl[i]) << info.name << "[" << i << "], step " << step;
        }
      }
    }
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

}  // namespace
