// The mixture-of-experts feed-forward (model/moe.h, kernels/cpu/moe.h) against an independent oracle: a naive
// double-precision MoE written here with plain loops (its own softmax/sigmoid, top-k, capacity, SwiGLU experts).
//  * the output matches the naive MoE (top-1, top-2, top-3 with shared experts, dropless and with drops, both routers);
//  * every gradient (input, router, experts, shared experts) matches central finite differences of the naive
//    MoE's loss sum(R * y) + aux_coef * aux + z_coef * z, so the auxiliary losses' gradients are checked too;
//  * the aux and z losses match their formulas; the sigmoid_bias router's choice and its bias update give the
//    answers worked out by hand; the config refuses bad MoE keys naming them;
//  * a micro-batch split over two ranks (sequence parallelism) gives the whole micro-batch's losses, counts and
//    (summed) gradients.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "megatrain/core/rng.h"
#include "megatrain/model/config.h"
#include "megatrain/model/gpt.h"
#include "megatrain/model/moe.h"
#include "support/model_testutil.h"
#include "support/moe_testutil.h"
#include "support/test_util.h"

using namespace mt;

namespace {

using Vec = std::vector<double>;

// The parameters as doubles (copied from the fp32 store, so both sides see the same numbers).
struct Weights {
  Vec router, bias, w13, w2, s13, s2;
};

struct NaiveOut {
  Vec y;  // [N, C]
  double aux = 0, z = 0;
  std::vector<int> chosen;  // [N, k]
  int64_t dropped = 0;
};

// The naive MoE: every formula of docs/moe.md, in double, with no code shared with the implementation.
NaiveOut naive_moe(const ModelConfig& c, const Vec& x, int64_t N, const Weights& w) {
  const int C = c.d_model, E = c.moe_experts, k = c.moe_top_k, F = c.moe_d_ff, S = c.moe_shared_experts;
  const bool sig = c.moe_router == MoeRouter::SigmoidBias;
  NaiveOut o;
  o.y.assign(N * C, 0.0);
  auto swiglu_mlp = [&](const double* xt, const double* w13, const double* w2, int width, double* out) {
    // h_f = silu(gate_f . x) * (up_f . x), gate rows [0, width), up rows [width, 2 width); out += w2 h.
    for (int f = 0; f < width; ++f) {
      double g = 0, u = 0;
      for (int i = 0; i < C; ++i) g += w13[f * C + i] * xt[i], u += w13[(width + f) * C + i] * xt[i];
      const double h = g / (1 + std::exp(-g)) * u;
      for (int o2 = 0; o2 < C; ++o2) out[o2] += w2[o2 * width + f] * h;
    }
  };
  std::vector<int> count(E, 0), kept(E, 0);
  Vec P(E, 0.0);
  const int64_t cap = c.moe_capacity_factor > 0 ? (int64_t)std::ceil(double(c.moe_capacity_factor) * N * k / E) : 0;
  for (int64_t t = 0; t < N; ++t) {
    const double* xt = &x[t * C];
    Vec l(E), p(E);
    for (int e = 0; e < E; ++e)
      for (int i = 0; i < C; ++i) l[e] += w.router[e * C + i] * xt[i];
    double m = *std::max_element(l.begin(), l.end()), se = 0;
    for (int e = 0; e < E; ++e) se += std::exp(l[e] - m);
    const double lse = m + std::log(se);
    o.z += lse * lse / N;
    for (int e = 0; e < E; ++e) p[e] = sig ? 1 / (1 + std::exp(-l[e])) : std::exp(l[e] - lse);
    double psum = 0;
    for (int e = 0; e < E; ++e) psum += p[e];
    for (int e = 0; e < E; ++e) P[e] += (sig ? p[e] / psum : p[e]) / N;
    // Top-k by p (+ bias): repeatedly the best unchosen, the lower index on a tie.
    std::vector<int> ch;
    for (int j = 0; j < k; ++j) {
      int best = -1;
      for (int e = 0; e < E; ++e) {
        if (std::find(ch.begin(), ch.end(), e) != ch.end()) continue;
        const double key = p[e] + (sig ? w.bias[e] : 0.0);
        const double bk = best < 0 ? 0 : p[best] + (sig ? w.bias[best] : 0.0);
        if (best < 0 || key > bk) best = e;
      }
      ch.push_back(best);
    }
    double gs = 0;
    for (int e : ch) gs += p[e];
    for (int j = 0; j < k; ++j) {
      const int e = ch[j];
      ++count[e];
      o.chosen.push_back(e);
      if (cap > 0 && kept[e] >= cap) {
        ++o.dropped;
        continue;
      }
      ++kept[e];
      Vec out(C, 0.0);
      swiglu_mlp(xt, &w.w13[size_t(e) * 2 * F * C], &w.w2[size_t(e) * C * F], F, out.data());
      for (int i = 0; i < C; ++i) o.y[t * C + i] += p[e] / gs * out[i];
    }
    if (S > 0) swiglu_mlp(xt, w.s13.data(), w.s2.data(), S * F, &o.y[t * C]);
  }
  for (int e = 0; e < E; ++e) o.aux += E * (double(count[e]) / (double(N) * k)) * P[e];
  return o;
}

double naive_loss(const ModelConfig& c, const Vec& x, int64_t N, const Weights& w, const Vec& R) {
  const NaiveOut o = naive_moe(c, x, N, w);
  double L = 0;
  for (size_t i = 0; i < R.size(); ++i) L += R[i] * o.y[i];
  return L + c.moe_aux_loss * o.aux + c.moe_z_loss * o.z;
}

Vec to_vec(Tensor t) { return Vec(t.f32(), t.f32() + t.numel()); }

// One MoE layer (layer 0) with its parameters in a ParamStore, random weights, and the naive MoE beside it.
struct Fixture {
  ModelConfig c;
  int64_t N;
  ParamStore ps;
  std::unique_ptr<Ops> ops = make_cpu_ops();
  std::vector<float> x, R;
  MoeActs acts;

  Fixture(ModelConfig cfg, int64_t n, uint64_t seed, float bias_scale = 0) : c(std::move(cfg)), N(n) {
    test::declare_moe_layer0(c, ps);
    ps.allocate();
    Rng rng(seed);
    for (size_t i = 0; i < ps.size(); ++i) {
      Tensor p = ps.param(static_cast<int>(i));
      // Router weights large enough that the router's choice is clear-cut (finite differences stay on one side
      // of every top-k boundary); the bias (sigmoid_bias) bias_scale wide, to change some choices.
      const bool router = ps.info(static_cast<int>(i)).name == "h.0.moe.router.weight";
      const bool bias = ps.info(static_cast<int>(i)).name == "h.0.moe.router.bias";
      for (int64_t j = 0; j < p.numel(); ++j)
        p.f32()[j] = static_cast<float>((bias ? bias_scale : router ? 0.8 : 0.3) * rng.normal());
    }
    const int64_t C = c.d_model;
    x.resize(N * C), R.resize(N * C);
    for (auto& v : x) v = static_cast<float>(rng.normal());
    for (auto& v : R) v = static_cast<float>(rng.normal());
    acts.allocate(c, N);
  }
  Tensor X() { return Tensor(x.data(), {N, int64_t{c.d_model}}); }
  Weights weights() const {
    Weights w;
    auto get = [&](const char* n, Vec& v) {
      if (ps.has(n)) v = to_vec(ps.param(n));
    };
    get("h.0.moe.router.weight", w.router);
    get("h.0.moe.router.bias", w.bias);
    get("h.0.moe.experts.c_fc.weight", w.w13);
    get("h.0.moe.experts.c_proj.weight", w.w2);
    get("h.0.moe.shared.c_fc.weight", w.s13);
    get("h.0.moe.shared.c_proj.weight", w.s2);
    return w;
  }
  std::vector<float> forward() {
    std::vector<float> y(x.size());
    MoeFfn(c, ps, 0).forward(*ops, Tensor(y.data(), {N, int64_t{c.d_model}}), X(), acts);
    return y;
  }
  // din from dout = R, with the parameter gradients written fresh (begin_grads).
  std::vector<float> backward() {
    std::vector<float> din(x.size());
    ps.begin_grads();
    MoeFfn(c, ps, 0).backward(*ops, Tensor(din.data(), {N, int64_t{c.d_model}}),
                              Tensor(R.data(), {N, int64_t{c.d_model}}), X(), acts, 1.0f);
    ps.settle_grads(0, static_cast<int>(ps.size()));
    return din;
  }
};

double max_abs(const Vec& v) {
  double m = 0;
  for (double a : v) m = std::max(m, std::abs(a));
  return m;
}

// |got - want| <= tol * max(1, max|want|) elementwise, with the tensor's name in the message.
void expect_close(const std::string& what, const std::vector<float>& got, const Vec& want, double tol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double bound = tol * std::max(1.0, max_abs(want));
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::abs(got[i] - want[i]) > worst) worst = std::abs(got[i] - want[i]), at = i;
  EXPECT_LE(worst, bound) << what << ": element " << at << " is " << got[at] << ", the oracle says " << want[at];
}

// The fp32 layer vs the double oracle. Each output element is a chain of fp32 dot products of length C = 8 (router,
// up-projection) and F = 6 (down-projection) and a k-term combine, on O(1) values: a few ulps (2^-24) per term. The
// bound is 4 ulps x (C + F + k) ~ 4e-6 of the tensor's largest magnitude; measured: 1.2e-7 (Haswell, Zen, SkylakeX).
constexpr double kFwdTol = 4e-6;
// Gradients: the backward's chains are as long again (2 x (C + F + k) terms, 4 ulps each: ~8e-6), and the central
// differences of the double oracle with h = 1e-4 add a truncation error O(h^2) ~ 1e-8; hence 1e-5 of the tensor's
// largest gradient. Measured: 2.8e-7.
constexpr double kGradTol = 1e-5;
constexpr double kH = 1e-4;

ModelConfig moe_config(int E, int k, int shared, float cf) {
  ModelConfig c;
  c.d_model = 8;
  c.n_head = 2;
  c.n_layer = 1;
  c.moe_experts = E;
  c.moe_top_k = k;
  c.moe_d_ff = 6;
  c.moe_shared_experts = shared;
  c.moe_capacity_factor = cf;
  return c;
}

void check_forward_and_gradients(ModelConfig c, int64_t N, uint64_t seed, bool expect_drops, float bias_scale = 0) {
  Fixture f(std::move(c), N, seed, bias_scale);
  const std::vector<float> y = f.forward();
  const Weights w = f.weights();
  Vec xd(f.x.begin(), f.x.end()), Rd(f.R.begin(), f.R.end());
  const NaiveOut want = naive_moe(f.c, xd, N, w);
  // The same choices (so a difference below is arithmetic, not routing), the same drops.
  EXPECT_EQ(f.acts.routing.expert, want.chosen);
  EXPECT_EQ(f.acts.routing.dropped, want.dropped);
  if (expect_drops) {
    EXPECT_GT(want.dropped, 0) << "the capacity factor should drop assignments here";
  } else {
    EXPECT_EQ(want.dropped, 0);
  }
  expect_close("y", y, want.y, kFwdTol);
  // The losses: O(N * E) sums in double of fp32 probabilities (relative error ~1e-7 each).
  if (f.c.moe_aux_loss > 0) {
    EXPECT_NEAR(f.acts.aux, want.aux, 1e-6 * std::max(1.0, want.aux));
  }
  if (f.c.moe_z_loss > 0) {
    EXPECT_NEAR(f.acts.z, want.z, 1e-6 * std::max(1.0, want.z));
  }

  const std::vector<float> din = f.backward();
  // Input gradient by central differences of the naive loss.
  Vec dx(xd.size());
  for (size_t i = 0; i < xd.size(); ++i) {
    Vec xp = xd, xm = xd;
    xp[i] += kH, xm[i] -= kH;
    dx[i] = (naive_loss(f.c, xp, N, w, Rd) - naive_loss(f.c, xm, N, w, Rd)) / (2 * kH);
  }
  expect_close("d x", din, dx, kGradTol);
  // Every trained parameter's gradient (the sigmoid_bias router's bias gets none: it must stay zero).
  auto member = [](Weights& ww, const std::string& n) -> Vec& {
    if (n == "h.0.moe.router.weight") return ww.router;
    if (n == "h.0.moe.router.bias") return ww.bias;
    if (n == "h.0.moe.experts.c_fc.weight") return ww.w13;
    if (n == "h.0.moe.experts.c_proj.weight") return ww.w2;
    if (n == "h.0.moe.shared.c_fc.weight") return ww.s13;
    return ww.s2;
  };
  for (const ParamInfo& p : f.ps.infos()) {
    const std::vector<float> g(f.ps.grad(p.name).f32(), f.ps.grad(p.name).f32() + p.numel);
    if (p.name == "h.0.moe.router.bias") {
      EXPECT_EQ(max_abs(Vec(g.begin(), g.end())), 0.0) << "the balancing bias is not in the gradient";
      continue;
    }
    Vec fd(p.numel);
    for (size_t i = 0; i < p.numel; ++i) {
      Weights wp = w, wm = w;
      member(wp, p.name)[i] += kH, member(wm, p.name)[i] -= kH;
      fd[i] = (naive_loss(f.c, xd, N, wp, Rd) - naive_loss(f.c, xd, N, wm, Rd)) / (2 * kH);
    }
    expect_close("d " + p.name, g, fd, kGradTol);
  }
}

// Two threads standing for two ranks that split a micro-batch's tokens (sequence parallelism): allreduce sums
// both ranks' tensors; nothing else is called by the MoE layer.
class TwoRankGroup {
 public:
  class Rank final : public TpComm {
   public:
    Rank(TwoRankGroup& g, int r) : g_(g), r_(r) {}
    int size() const override { return 2; }
    int rank() const override { return r_; }
    void allreduce(Tensor t, TpReduce op) override {
      EXPECT_EQ(op, TpReduce::Sum);
      std::unique_lock<std::mutex> lock(g_.m_);
      const int gen = g_.gen_;
      if (g_.arrived_++ == 0) {
        g_.sum_.assign(t.f32(), t.f32() + t.numel());
        g_.cv_.wait(lock, [&] { return g_.gen_ != gen; });
      } else {
        for (int64_t i = 0; i < t.numel(); ++i) g_.sum_[i] += t.f32()[i];
        g_.arrived_ = 0, ++g_.gen_;
        g_.cv_.notify_all();
      }
      std::copy(g_.sum_.begin(), g_.sum_.end(), t.f32());
    }
    void all_gather_rows(Tensor, Tensor, const Consume&) override { ADD_FAILURE() << "MoE layer gathered rows"; }
    void reduce_scatter_rows(Tensor, int64_t, const Produce&, const std::function<void()>&) override {
      ADD_FAILURE() << "MoE layer reduce-scattered rows";
    }

   private:
    TwoRankGroup& g_;
    int r_;
  };

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int arrived_ = 0, gen_ = 0;
  std::vector<float> sum_;
};

std::vector<float> rows(const std::vector<float>& v, int64_t r0, int64_t n, int64_t C) {
  return std::vector<float>(v.begin() + r0 * C, v.begin() + (r0 + n) * C);
}

// A micro-batch's tokens split over two ranks (model/moe.h, the token group): each rank's MoeFfn routes and
// computes its half, sharing the counts and the losses' sums; the whole micro-batch in one MoeFfn is the oracle.
// The outputs and input gradients are per token (the same ops on the same rows: within kFwdTol / kGradTol); the
// losses and counts each rank reports are the whole micro-batch's (fp32 sharing of double sums: 1e-6); the two
// halves' parameter gradients sum to the whole's (kGradTol). Without the sharing, each half's aux loss is its own
// tokens' f_e P_e, which differs from the whole's here (checked, so the comparison can fail).
void check_split_over_two_ranks(ModelConfig c, uint64_t seed) {
  const int64_t N = 12, H = N / 2, C = c.d_model;
  Fixture whole(c, N, seed, 0.5f);
  const std::vector<float> y = whole.forward(), din = whole.backward();
  std::vector<Fixture*> half;
  Fixture h0(c, N, seed, 0.5f), h1(c, N, seed, 0.5f);  // the same weights and batch
  half = {&h0, &h1};
  TwoRankGroup group;
  TwoRankGroup::Rank r0(group, 0), r1(group, 1);
  std::vector<std::vector<float>> hy(2, std::vector<float>(H * C)), hdin(2, std::vector<float>(H * C));
  auto run_half = [&](int r, TpComm* comm) {
    Fixture& f = *half[r];
    std::vector<float> x = rows(f.x, r * H, H, C), R = rows(f.R, r * H, H, C);
    MoeFfn moe(f.c, f.ps, 0);
    moe.set_token_group(comm);
    moe.forward(*f.ops, Tensor(hy[r].data(), {H, C}), Tensor(x.data(), {H, C}), f.acts);
    f.ps.begin_grads();
    moe.backward(*f.ops, Tensor(hdin[r].data(), {H, C}), Tensor(R.data(), {H, C}), Tensor(x.data(), {H, C}), f.acts,
                 1.0f);
    f.ps.settle_grads(0, static_cast<int>(f.ps.size()));
  };
  std::thread t1([&] { run_half(1, &r1); });
  run_half(0, &r0);
  t1.join();
  const MoeRouting& wr = whole.acts.routing;
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const Fixture& f = *half[r];
    expect_close("y", hy[r], Vec(y.begin() + r * H * C, y.begin() + (r + 1) * H * C), kFwdTol);
    expect_close("d x", hdin[r], Vec(din.begin() + r * H * C, din.begin() + (r + 1) * H * C), kGradTol);
    EXPECT_EQ(f.acts.routing.batch_routed, wr.routed);
    EXPECT_EQ(f.acts.routing.batch_N, N);
    EXPECT_NEAR(f.acts.aux, whole.acts.aux, 1e-6 * whole.acts.aux);
    EXPECT_NEAR(f.acts.z, whole.acts.z, 1e-6 * whole.acts.z);
  }
  for (const ParamInfo& p : whole.ps.infos()) {
    const float *a = h0.ps.grad(p.name).f32(), *b = h1.ps.grad(p.name).f32();
    std::vector<float> sum(p.numel);
    for (size_t i = 0; i < p.numel; ++i) sum[i] = a[i] + b[i];
    const float* g = whole.ps.grad(p.name).f32();
    expect_close("d " + p.name, sum, Vec(g, g + p.numel), kGradTol);
  }
  // The oracle can tell: a half alone (no group) has another aux loss.
  run_half(0, nullptr);
  EXPECT_GT(std::abs(h0.acts.aux - whole.acts.aux), 1e-3 * whole.acts.aux) << "the halves route alike: a weak check";
}

}  // namespace

TEST(MoeFfn, TokensSplitOverRanksGiveTheWholeMicroBatchsLossesAndGradients) {
  ModelConfig c = moe_config(4, 2, 1, 0);
  c.moe_aux_loss = 0.7f;
  c.moe_z_loss = 0.3f;
  check_split_over_two_ranks(c, 21);
  c.moe_router = MoeRouter::SigmoidBias;
  check_split_over_two_ranks(c, 22);
}

TEST(MoeFfn, Top1DroplessMatchesNaiveMoeAndFiniteDifferences) {
  check_forward_and_gradients(moe_config(4, 1, 0, 0), 12, 1, false);
}

TEST(MoeFfn, Top2DroplessMatchesNaiveMoeAndFiniteDifferences) {
  check_forward_and_gradients(moe_config(4, 2, 0, 0), 12, 2, false);
}

TEST(MoeFfn, Top3WithSharedExpertsMatchesNaiveMoeAndFiniteDifferences) {
  check_forward_and_gradients(moe_config(5, 3, 2, 0), 10, 3, false);
}

TEST(MoeFfn, CapacityDropsLateAssignmentsAndGradientsFollow) {
  // cf 0.5: each expert keeps ceil(0.5 * 12 * 2 / 4) = 3 of the 6 assignments it would take on average.
  check_forward_and_gradients(moe_config(4, 2, 0, 0.5f), 12, 4, true);
}

TEST(MoeFfn, AuxAndZLossValuesAndGradientsMatchFiniteDifferences) {
  ModelConfig c = moe_config(4, 2, 1, 0);
  c.moe_aux_loss = 0.7f;  // large coefficients so their gradients dominate the check
  c.moe_z_loss = 0.3f;
  check_forward_and_gradients(c, 12, 5, false);
}

TEST(MoeFfn, SigmoidBiasRouterMatchesNaiveMoeWithBiasAuxAndDrops) {
  ModelConfig c = moe_config(4, 2, 1, 0.75f);
  c.moe_router = MoeRouter::SigmoidBias;
  c.moe_aux_loss = 0.5f;
  c.moe_z_loss = 0.1f;
  check_forward_and_gradients(c, 12, 6, true, /*bias_scale=*/0.3f);
}

TEST(MoeRoute, SigmoidBiasChoosesOnScorePlusBiasButGatesOnScores) {
  // Scores sigmoid(logits): expert 0 is best alone; a bias of +0.5 on expert 2 makes it the choice.
  const float logits[3] = {2.0f, 0.0f, 1.0f};
  const float bias[3] = {0.0f, 0.0f, 0.5f};
  MoeRouting r;
  moe_route(r, logits, 1, 3, 1, MoeRouter::SigmoidBias, bias, 0);
  EXPECT_EQ(r.expert[0], 2);   // s = .881, .5, .731: + bias .881, .5, 1.231
  EXPECT_EQ(r.gate[0], 1.0f);  // top-1: the one chosen score normalised
  moe_route(r, logits, 1, 3, 2, MoeRouter::SigmoidBias, bias, 0);
  EXPECT_EQ(r.expert, (std::vector<int>{2, 0}));
  const double s0 = 1 / (1 + std::exp(-2.0)), s2 = 1 / (1 + std::exp(-1.0));
  EXPECT_NEAR(r.gate[0], s2 / (s0 + s2), 1e-7);  // the gates use the scores, not the biased keys
  EXPECT_NEAR(r.gate[1], s0 / (s0 + s2), 1e-7);
  moe_route(r, logits, 1, 3, 1, MoeRouter::SigmoidBias, nullptr, 0);
  EXPECT_EQ(r.expert[0], 0);  // without the bias, the best score
}

TEST(MoeRoute, CapacityKeepsTheFirstAssignmentsInTokenOrder) {
  // 4 tokens all preferring expert 0 of 2, top-1, cf 1: capacity ceil(1 * 4 * 1 / 2) = 2: tokens 0 and 1 kept.
  const float logits[8] = {3, 0, 2, 0, 4, 0, 1, 0};
  MoeRouting r;
  moe_route(r, logits, 4, 2, 1, MoeRouter::Softmax, nullptr, 1.0f);
  EXPECT_EQ(r.capacity, 2);
  EXPECT_EQ(r.dropped, 2);
  EXPECT_EQ(r.routed, (std::vector<int64_t>{4, 0}));
  EXPECT_EQ(r.row, (std::vector<int>{0, 1, -1, -1}));
  EXPECT_EQ(r.offsets, (std::vector<int64_t>{0, 2, 2}));
}

TEST(MoeUpdateBias, StepsTowardsTheMeanLoadBySign) {
  // Loads 5, 3, 4, 0 (mean 3): over-loaded experts step down, the exactly balanced one stays, the idle one up.
  std::vector<float> bias = {0.1f, 0.2f, 0.0f, -0.1f};
  moe_update_bias(bias.data(), {5, 3, 4, 0}, 0.01f);
  EXPECT_FLOAT_EQ(bias[0], 0.1f - 0.01f);
  EXPECT_FLOAT_EQ(bias[1], 0.2f);
  EXPECT_FLOAT_EQ(bias[2], -0.01f);
  EXPECT_FLOAT_EQ(bias[3], -0.1f + 0.01f);
}

TEST(MoeLosses, AuxIsOneForUniformRoutingAndZIsTheMeanSquaredLogsumexp) {
  // Equal logits: every p = 1/E; 4 tokens, top-1 of 2 with ties to the lower index would route all to expert 0,
  // so use logits that alternate the favourite while keeping P uniform on average.
  const float logits[8] = {1, 0, 0, 1, 1, 0, 0, 1};
  MoeRouting r;
  moe_route(r, logits, 4, 2, 1, MoeRouter::Softmax, nullptr, 0);
  // f = (.5, .5), P = (.5, .5): 2 * (.25 + .25); P from fp32 probabilities (1 ulp each: 6e-8).
  EXPECT_NEAR(moe_aux_loss(r), 1.0, 2e-7);
  const double lse = std::log(std::exp(1.0) + 1.0);
  EXPECT_NEAR(moe_z_loss(logits, 4, 2), lse * lse, 1e-12);
}

TEST(MoeConfig, RefusesBadKeysNamingThem) {
  auto err = [](auto set) {
    ModelConfig c = moe_config(4, 2, 0, 0);
    set(c);
    return test::error_of([&] { c.validate(); });
  };
  EXPECT_TRUE(test::has(err([](ModelConfig& c) { c.moe_top_k = 5; }), "model.moe_top_k"));
  EXPECT_TRUE(test::has(err([](ModelConfig& c) { c.moe_d_ff = 0; }), "model.moe_d_ff"));
  EXPECT_TRUE(test::has(err([](ModelConfig& c) { c.moe_every = 0; }), "model.moe_every"));
  EXPECT_TRUE(test::has(err([](ModelConfig& c) { c.moe_first_dense = 1; }), "model.moe_first_dense"));
  EXPECT_TRUE(test::has(err([](ModelConfig& c) { c.moe_capacity_factor = -1; }), "model.moe_capacity_factor"));
  EXPECT_TRUE(test::has(err([](ModelConfig& c) { c.block = BlockKind::Parallel; }), "model.block"));
  // Tensor parallelism is a layout the MoE layer runs under (replicated experts; parallel_tp_test checks it).
  EXPECT_EQ(test::error_of([] { moe_config(4, 2, 0, 0).validate_tp(2); }), "<no error>");
  EXPECT_EQ(err([](ModelConfig&) {}), "<no error>");  // the base config is valid
}

// The layer inside the GPT (Block's forward and backward through LN2, the residual stream, recomputation): one expert
// chosen by every token with gate 1 is the dense SwiGLU MLP, so a MoE GPT with E = k = 1 whose expert holds the dense
// model's MLP weights must train as the dense GPT does: the same loss and gradients (dense ones checked against the
// naive double GPT in model_gpt_test), and zero router gradient (softmax over one expert is constant). The ops run on
// the same rows in the same order, with the combine's 1 * y and 0 + dx exact, so the bits agree.
TEST(MoeGpt, OneExpertOfGateOneTrainsAsTheDenseMlp) {
  for (int variant = 0; variant < 3; ++variant) {  // activations kept; layers recomputed; norm outputs rebuilt
    SCOPED_TRACE(variant == 0 ? "activations kept" : variant == 1 ? "layers recomputed" : "norm outputs rebuilt");
    ModelConfig dense = test::tiny_model("llama");
    if (variant == 1) dense.recompute = {true, true};
    dense.recompute_norm = variant == 2;
    ModelConfig moe = dense;
    moe.moe_experts = 1, moe.moe_top_k = 1, moe.moe_d_ff = dense.ff_dim();
    moe.moe_first_dense = 1;  // layer 0 dense, layer 1 MoE
    moe.moe_aux_loss = 0.5f;  // constant with one expert (f = P = 1): no gradient either
    moe.moe_z_loss = 0;
    auto ops = make_cpu_ops();
    GPT d(dense, *ops), m(moe, *ops);
    d.init_weights(7);
    m.init_weights(7);
    // The config's count (without vocab padding) changes by what the store's does.
    EXPECT_EQ(m.params().num_params() - d.params().num_params(), moe.num_params() - dense.num_params());
    // The dense model's layer-1 MLP becomes the expert; every other tensor is the same by name.
    auto moe_name = [](const std::string& n) {
      if (n == "h.1.mlp.c_fc.weight") return std::string("h.1.moe.experts.c_fc.weight");
      if (n == "h.1.mlp.c_proj.weight") return std::string("h.1.moe.experts.c_proj.weight");
      return n;
    };
    for (const ParamInfo& p : d.params().infos()) {
      Tensor dst = m.params().param(moe_name(p.name));
      ASSERT_EQ(dst.numel(), static_cast<int64_t>(p.numel)) << p.name;
      std::copy_n(d.params().param(p.name).f32(), p.numel, dst.f32());
    }
    const int B = 2, T = 8;
    std::vector<int32_t> tok(B * T), tgt(B * T);
    for (int i = 0; i < B * T; ++i) tok[i] = (i * 7 + 3) % dense.vocab_size, tgt[i] = (i * 5 + 1) % dense.vocab_size;
    d.params().begin_grads();
    m.params().begin_grads();
    const float ld = d.forward(tok.data(), tgt.data(), B, T, true, 0.5f);
    d.backward();
    const float lm = m.forward(tok.data(), tgt.data(), B, T, true, 0.5f);
    m.backward();
    EXPECT_EQ(ld, lm);
    for (const ParamInfo& p : d.params().infos()) {
      const float* gd = d.params().grad(p.name).f32();
      const float* gm = m.params().grad(moe_name(p.name)).f32();
      for (size_t i = 0; i < p.numel; ++i) ASSERT_EQ(gd[i], gm[i]) << p.name << " [" << i << "]";
    }
    const Tensor gr = m.params().grad("h.1.moe.router.weight");
    for (int64_t i = 0; i < gr.numel(); ++i) ASSERT_EQ(gr.f32()[i], 0.0f) << "router grad [" << i << "]";
    // The layer's counts: every one of the B*T tokens to the one expert, none dropped; aux = 1 (f = P = 1).
    const std::vector<MoeLayerStats> st = m.take_moe_stats();
    ASSERT_EQ(st.size(), 1u);
    EXPECT_EQ(st[0].layer, 1);
    EXPECT_EQ(st[0].tokens, (std::vector<int64_t>{B * T}));
    EXPECT_EQ(st[0].dropped, 0);
    EXPECT_EQ(st[0].forwards, 1);
    EXPECT_NEAR(GPT::moe_loss(moe, st), 0.5, 1e-6);
  }
}

// The sigmoid_bias router's balancing step inside the GPT: after a training forward, moe_update_bias moves each MoE
// layer's bias parameter by -rate, 0 or +rate as the layer's loads (the counts the step reported) say, and only then.
TEST(MoeGpt, SigmoidBiasStepsEachLayersBiasFromItsReportedLoads) {
  ModelConfig c = test::tiny_model("llama");
  c.moe_experts = 4, c.moe_top_k = 2, c.moe_d_ff = 8, c.moe_router = MoeRouter::SigmoidBias, c.moe_bias_rate = 0.25f;
  auto ops = make_cpu_ops();
  GPT m(c, *ops);
  m.init_weights(5);
  const int B = 2, T = 8;
  std::vector<int32_t> tok(B * T), tgt(B * T);
  for (int i = 0; i < B * T; ++i) tok[i] = (i * 11 + 2) % c.vocab_size, tgt[i] = (i * 3 + 1) % c.vocab_size;
  m.params().begin_grads();
  m.forward(tok.data(), tgt.data(), B, T, true);
  m.backward();
  const std::vector<MoeLayerStats> st = m.take_moe_stats();
  ASSERT_EQ(st.size(), 2u);  // both layers are MoE
  m.moe_update_bias();
  for (const MoeLayerStats& s : st) {
    const Tensor b = m.params().param("h." + std::to_string(s.layer) + ".moe.router.bias");
    int64_t total = 0;
    for (int64_t n : s.tokens) total += n;
    EXPECT_EQ(total, int64_t{B} * T * c.moe_top_k);
    for (int e = 0; e < c.moe_experts; ++e) {
      const int64_t diff = total - s.tokens[e] * c.moe_experts;  // E * (mean - load)
      EXPECT_EQ(b.f32()[e], diff > 0 ? 0.25f : diff < 0 ? -0.25f : 0.0f) << "layer " << s.layer << " expert " << e;
    }
  }
  m.moe_update_bias();  // no forward since: the loads were consumed, nothing moves
  for (const MoeLayerStats& s : st) {
    const Tensor b = m.params().param("h." + std::to_string(s.layer) + ".moe.router.bias");
    const int64_t total = int64_t{B} * T * c.moe_top_k;
    for (int e = 0; e < c.moe_experts; ++e) {
      const int64_t diff = total - s.tokens[e] * c.moe_experts;
      EXPECT_EQ(b.f32()[e], diff > 0 ? 0.25f : diff < 0 ? -0.25f : 0.0f);
    }
  }
}
