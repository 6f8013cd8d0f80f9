// Times the CPU backend's ops at GPT-2 124M shapes (C = 768, 12 heads, vocab padded to 50304) for
// N = B*T = 256 (B=4, T=64) and N = 2048 (B=8, T=256), next to the raw OpenBLAS sgemm rate measured in the same
// run, and adds them up into an estimated training step to show where the time goes. Prints JSON.
//   bench_ops [--quick]     (--quick: one shape, fewer repetitions; for smoke runs)
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <vector>

#include "bench_util.h"
#include "megatrain/core/buffer.h"
#include "megatrain/core/clock.h"
#include "megatrain/core/rng.h"
#include "megatrain/kernels/ops.h"
#include "megatrain/model/config.h"

using namespace mt;
using mt::bench::Buf;
using mt::bench::time_median;
using nlohmann::json;

namespace {


double sgemm_gflops(int M, int N, int K, int reps) {
  Buf a(int64_t{M} * K), b(int64_t{N} * K), c(int64_t{M} * N);
  const double t = time_median(
      [&] { cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a.p(), K, b.p(), K, 0.0f, c.p(), N); },
      reps);
  return 2.0 * M * N * K / t * 1e-9;
}

json bench_shape(Ops& ops, const ModelConfig& cfg, int B, int T, int reps) {
  const int64_t N = int64_t{B} * T, C = cfg.d_model, Vp = cfg.padded_vocab(), F = cfg.ff_dim();
  const int H = cfg.n_head, hd = cfg.head_dim();
  json r;
  r["B"] = B, r["T"] = T, r["N"] = N;
  double step = 0;  // estimated seconds of one training step (without the optimizer), built from the parts below

  struct Linear {
    const char* name;
    int64_t in, out;
    bool bias;
    int per_model;  // how many of this linear one forward pass runs
  };
  const Linear linears[] = {{"attn_qkv", C, 3 * C, true, cfg.n_layer},
                            {"attn_proj", C, C, true, cfg.n_layer},
                            {"mlp_fc", C, F, true, cfg.n_layer},
                            {"mlp_proj", F, C, true, cfg.n_layer},
                            {"lm_head", C, Vp, false, 1}};
  json lin = json::object();
  for (const Linear& l : linears) {
    Buf x(N * l.in), w(l.out * l.in), b(l.out), y(N * l.out), dy(N * l.out), dx(N * l.in), dw(l.out * l.in), db(l.out);
    const Tensor bias = l.bias ? b.t({l.out}) : Tensor{}, dbias = l.bias ? db.t({l.out}) : Tensor{};
    const int rr = l.out > 10000 ? std::max(1, reps / 2) : reps;
    const double tf = time_median(
        [&] {
          ops.matmul_forward(y.t({N, l.out}), x.t({N, l.in}), w.t({l.out, l.in}), bias);
        },
        rr);
    const double tb = time_median(
        [&] {
          ops.matmul_backward(dx.t({N, l.in}), dw.t({l.out, l.in}), dbias, dy.t({N, l.out}), x.t({N, l.in}),
                              w.t({l.out, l.in}), false);
        },
        rr);
    const double flops = 2.0 * N * l.in * l.out;
    lin[l.name] = {{"fwd_ms", tf * 1e3},
                   {"bwd_ms", tb * 1e3},
                   {"fwd_gflops", flops / tf * 1e-9},
                   {"bwd_gflops", 2 * flops / tb * 1e-9}};
    step += l.per_model * (tf + tb);
  }
  r["matmul"] = lin;

  {  // attention
    AttnShape s{B, T, H, H, hd, cfg.window};
    Buf qkv(N * s.qkv_width(), 1.0f), out(N * C), lse(int64_t{B} * H * T), dout(N * C), dqkv(N * s.qkv_width());
    const double tf = time_median(
        [&] {
          ops.attention_forward(out.t({N, C}), lse.t({lse.n}), qkv.t({qkv.n}), s);
        },
        reps);
    const double tb = time_median(
        [&] {
          ops.attention_backward(dqkv.t({dqkv.n}), dout.t({N, C}), qkv.t({qkv.n}), out.t({N, C}), lse.t({lse.n}), s);
        },
        reps);
    const double flops = 4.0 * B * H * double(T) * T * hd / 2;  // causal: half of QK^T and PV
    r["attention"] = {{"fwd_ms", tf * 1e3},
                      {"bwd_ms", tb * 1e3},
                      {"fwd_gflops_causal", flops / tf * 1e-9},
                      {"bwd_gflops_causal", 2 * flops / tb * 1e-9}};
    step += cfg.n_layer * (tf + tb);
  }
  {  // layernorm (2 per layer + final)
    Buf x(N * C, 1.0f), w(C), b(C), y(N * C), mean(N), rstd(N), dy(N * C), dx(N * C), dw(C), db(C);
    const double tf = time_median(
        [&] {
          ops.layernorm_forward(y.t({N, C}), mean.t({N}), rstd.t({N}), x.t({N, C}), w.t({C}), b.t({C}), 1e-5f);
        },
        reps);
    const double tb = time_median(
        [&] {
          ops.layernorm_backward(dx.t({N, C}), dw.t({C}), db.t({C}), dy.t({N, C}), x.t({N, C}), w.t({C}), mean.t({N}),
                                 rstd.t({N}));
        },
        reps);
    r["layernorm"] = {{"fwd_ms", tf * 1e3}, {"bwd_ms", tb * 1e3}};
    step += (2 * cfg.n_layer + 1) * (tf + tb);
  }
  {  // gelu
    Buf x(N * F, 1.0f), y(N * F), dy(N * F);
    const double tf = time_median([&] { ops.gelu_forward(y.t({N * F}), x.t({N * F})); }, reps);
    const double tb = time_median([&] { ops.gelu_backward(y.t({N * F}), x.t({N * F}), dy.t({N * F})); }, reps);
    r["gelu"] = {{"fwd_ms", tf * 1e3}, {"bwd_ms", tb * 1e3}};
    step += cfg.n_layer * (tf + tb);
  }
  {  // residual adds (2 per layer forward; backward's are accumulations inside the ops)
    Buf a(N * C), b(N * C), o(N * C);
    const double t = time_median([&] { ops.add(o.t({N * C}), a.t({N * C}), b.t({N * C})); }, reps);
    r["residual_add_ms"] = t * 1e3;
    step += 2 * cfg.n_layer * t;
  }
  {  // cross-entropy with gradient, in place on the logits (refilled each run outside the timing)
    Buf logits(N * Vp, 4.0f), fresh(N * Vp, 4.0f), losses(N);
    std::vector<int32_t> tgt(N);
    for (int64_t i = 0; i < N; ++i) tgt[i] = static_cast<int32_t>((i * 7919) % cfg.vocab_size);
    std::vector<double> ts;
    for (int i = 0; i <= reps; ++i) {
      std::memcpy(logits.p(), fresh.p(), N * Vp * 4);
      const double t0 = now_seconds();
      ops.cross_entropy(losses.t({N}), logits.t({N, Vp}), Tensor(tgt.data(), {N}, DType::I32), cfg.vocab_size, 1.0f / N,
                        true);
      if (i) ts.push_back(now_seconds() - t0);
    }
    std::sort(ts.begin(), ts.end());
    r["cross_entropy_ms"] = ts[ts.size() / 2] * 1e3;
    step += ts[ts.size() / 2];
  }
  r["step_estimate_ms"] = step * 1e3;
  r["step_model_gflop"] = cfg.flops_per_token(T) * N * 1e-9;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  auto ops = make_cpu_ops();
  ModelConfig cfg;  // GPT-2 124M
  const int reps = quick ? 2 : 5;
  json out;
  out["threads"] = omp_get_max_threads();
  const double sg_sq = sgemm_gflops(2048, 2048, 2048, reps);
  const double sg_fc = sgemm_gflops(2048, 3072, 768, reps);
  out["sgemm_gflops"] = {{"2048x2048x2048", sg_sq}, {"fc_2048x3072x768", sg_fc}};
  double optimizer_s = 0;  // grad norm + AdamW, once per step

  {  // AdamW over every parameter of the model, one flat buffer as the optimizer will see it (reads p, g, m, v
     // and writes p, m, v: 28 bytes per parameter)
    const int64_t P = cfg.num_params();
    Buf p(P), g(P), m(P, 0.0f), v(P, 0.0f);
    AdamHParams h;
    h.lr = 6e-4f, h.weight_decay = 0.1f;
    const double t = time_median([&] { ops->adamw_update(p.t({P}), g.t({P}), m.t({P}), v.t({P}), h); }, reps);
    const double tss = time_median([&] { ops->sum_squares(g.t({P})); }, reps);
    out["adamw"] = {{"params", P}, {"ms", t * 1e3}, {"GBps", 28.0 * P / t * 1e-9}};
    out["grad_sum_squares_ms"] = tss * 1e3;
    optimizer_s = t + tss;
  }
  json shapes = json::array();
  std::vector<std::pair<int, int>> bt = {{4, 64}, {8, 256}};
  if (quick) bt.resize(1);
  for (auto [B, T] : bt) {
    json r = bench_shape(*ops, cfg, B, T, reps);
    const double step_s = r["step_estimate_ms"].get<double>() * 1e-3 + optimizer_s;
    r["step_estimate_ms"] = step_s * 1e3;  // now including the optimizer
    r["est_fraction_of_sgemm"] = r["step_model_gflop"].get<double>() / step_s / sg_sq;
    shapes.push_back(r);
  }
  out["shapes"] = shapes;

  std::cout << out.dump(2) << std::endl;
}
