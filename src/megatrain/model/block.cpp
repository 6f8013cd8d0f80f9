#include "megatrain/model/block.h"

#include <fmt/format.h>

namespace mt {

namespace {

// A [rows, cols] view of a buffer.
Tensor mat(const HostBuffer& b, int64_t rows, int64_t cols) { return f32_view(b.f32(), {rows, cols}); }

}  // namespace

void BlockActs::allocate(const ModelConfig& cfg, int64_t rows) {
  const int64_t C = cfg.d_model, F = cfg.ff_dim(), H = cfg.n_head, hd = cfg.head_dim();
  const int64_t fc_w = cfg.mlp == "swiglu" ? 2 * F : F;
  const int64_t qkv_w = (H + 2 * cfg.kv_heads()) * hd;
  const size_t f = sizeof(float);
  ln1.resize(rows * C * f, false);
  ln1_mean.resize(rows * f, false);
  ln1_rstd.resize(rows * f, false);
  qkv.resize(rows * qkv_w * f, false);
  att.resize(rows * H * hd * f, false);
  lse.resize(rows * H * f, false);
  fc.resize(rows * fc_w * f, false);
  act.resize(rows * F * f, false);
  if (cfg.block == "sequential") {
    h.resize(rows * C * f, false);
    ln2.resize(rows * C * f, false);
    ln2_mean.resize(rows * f, false);
    ln2_rstd.resize(rows * f, false);
  }
}

void BlockScratch::allocate(const ModelConfig& cfg, int64_t rows) {
  const int64_t C = cfg.d_model, F = cfg.ff_dim(), H = cfg.n_head, hd = cfg.head_dim();
  const int64_t fc_w = cfg.mlp == "swiglu" ? 2 * F : F;
  const int64_t qkv_w = (H + 2 * cfg.kv_heads()) * hd;
  const size_t f = sizeof(float);
  proj_out.resize(rows * C * f, false);
  d_ln.resize(rows * C * f, false);
  d_qkv.resize(rows * qkv_w * f, false);
  d_att.resize(rows * H * hd * f, false);
  d_fc.resize(rows * fc_w * f, false);
  d_act.resize(rows * F * f, false);
  d_h.resize(rows * C * f, false);
}

Block::Block(const ModelConfig& cfg, const ParamStore& params, int layer) : cfg_(cfg), params_(params) {
  const std::string p = fmt::format("h.{}.", layer);
  auto idx = [&](const std::string& n) { return params.has(n) ? params.index(n) : -1; };
  auto lin = [&](const std::string& n) { return Lin{params.index(n + ".weight"), idx(n + ".bias")}; };
  auto norm = [&](const std::string& n) { return Norm{params.index(n + ".weight"), idx(n + ".bias")}; };
  ln1_ = norm(p + "ln_1");
  if (cfg.block == "sequential") ln2_ = norm(p + "ln_2");
  c_attn_ = lin(p + "attn.c_attn");
  attn_proj_ = lin(p + "attn.c_proj");
  c_fc_ = lin(p + "mlp.c_fc");
  mlp_proj_ = lin(p + "mlp.c_proj");
}

AttnShape Block::attn_shape(int B, int T) const {
  AttnShape s;
  s.B = B;
  s.T = T;
  s.n_head = cfg_.n_head;
  s.n_kv_head = cfg_.kv_heads();
  s.head_dim = cfg_.head_dim();
  s.window = cfg_.window;
  return s;
}

void Block::norm_forward(Ops& ops, const Norm& n, Tensor out, Tensor mean, Tensor rstd, Tensor in) const {
  if (cfg_.norm == "layernorm")
    ops.layernorm_forward(out, mean, rstd, in, P(n.w), P(n.b), cfg_.norm_eps);
  else
    ops.rmsnorm_forward(out, rstd, in, P(n.w), cfg_.norm_eps);
}

void Block::norm_backward(Ops& ops, const Norm& n, Tensor din, Tensor dout, Tensor in, Tensor mean, Tensor rstd) const {
  if (cfg_.norm == "layernorm")
    ops.layernorm_backward(din, G(n.w), G(n.b), dout, in, P(n.w), mean, rstd);
  else
    ops.rmsnorm_backward(din, G(n.w), dout, in, P(n.w), rstd);
}

void Block::forward(Ops& ops, Tensor y, Tensor x, BlockActs& a, BlockScratch& s, int B, int T) const {
  const int64_t N = static_cast<int64_t>(B) * T, C = cfg_.d_model, F = cfg_.ff_dim();
  const int64_t H = cfg_.n_head, hd = cfg_.head_dim();
  const int64_t fc_w = cfg_.mlp == "swiglu" ? 2 * F : F;
  const AttnShape as = attn_shape(B, T);
  Tensor ln1 = mat(a.ln1, N, C), mean1 = mat(a.ln1_mean, N, 1).view({N}), rstd1 = mat(a.ln1_rstd, N, 1).view({N});
  Tensor qkv = mat(a.qkv, N, as.qkv_width()), att = mat(a.att, N, H * hd);
  Tensor lse = mat(a.lse, N * H, 1).view({B, H, T});
  Tensor fc = mat(a.fc, N, fc_w), act = mat(a.act, N, F);
  Tensor proj = mat(s.proj_out, N, C);

  // Attention branch.
  norm_forward(ops, ln1_, ln1, mean1, rstd1, x);
  ops.matmul_forward(qkv, ln1, P(c_attn_.w), P(c_attn_.b));
  if (cfg_.pos == "rope") ops.rope_forward(qkv, as, cfg_.rope_theta);
  ops.attention_forward(att, lse, qkv, as);
  ops.matmul_forward(proj, att, P(attn_proj_.w), P(attn_proj_.b));

  Tensor mlp_in = ln1;
  Tensor h = x;
  if (cfg_.block == "sequential") {
    h = mat(a.h, N, C);
    ops.add(h, x, proj);
    mlp_in = mat(a.ln2, N, C);
    norm_forward(ops, ln2_, mlp_in, mat(a.ln2_mean, N, 1).view({N}), mat(a.ln2_rstd, N, 1).view({N}), h);
  }
  // MLP branch.
  ops.matmul_forward(fc, mlp_in, P(c_fc_.w), P(c_fc_.b));
  if (cfg_.mlp == "swiglu")
    ops.swiglu_forward(act, fc);
  else
    ops.gelu_forward(act, fc);
  if (cfg_.block == "sequential") {
    ops.matmul_forward(proj, act, P(mlp_proj_.w), P(mlp_proj_.b));
    ops.add(y, h, proj);
  } else {
    ops.add(y, x, proj);  // y = x + attn
    ops.matmul_forward(proj, act, P(mlp_proj_.w), P(mlp_proj_.b));
    ops.add(y, y, proj);  // y += mlp
  }
}

void Block::backward(Ops& ops, Tensor dx, Tensor x, BlockActs& a, BlockScratch& s, int B, int T) const {
  const int64_t N = static_cast<int64_t>(B) * T, C = cfg_.d_model, F = cfg_.ff_dim();
  const int64_t H = cfg_.n_head, hd = cfg_.head_dim();
  const int64_t fc_w = cfg_.mlp == "swiglu" ? 2 * F : F;
  const AttnShape as = attn_shape(B, T);
  Tensor ln1 = mat(a.ln1, N, C), mean1 = mat(a.ln1_mean, N, 1).view({N}), rstd1 = mat(a.ln1_rstd, N, 1).view({N});
  Tensor qkv = mat(a.qkv, N, as.qkv_width()), att = mat(a.att, N, H * hd);
  Tensor lse = mat(a.lse, N * H, 1).view({B, H, T});
  Tensor fc = mat(a.fc, N, fc_w), act = mat(a.act, N, F);
  Tensor d_ln = mat(s.d_ln, N, C), d_qkv = mat(s.d_qkv, N, as.qkv_width()), d_att = mat(s.d_att, N, H * hd);
  Tensor d_fc = mat(s.d_fc, N, fc_w), d_act = mat(s.d_act, N, F);
  const bool seq = cfg_.block == "sequential";
  Tensor mlp_in = seq ? mat(a.ln2, N, C) : ln1;

  // MLP branch: its output gradient is dx (the gradient w.r.t. y).
  ops.matmul_backward(d_act, G(mlp_proj_.w), G(mlp_proj_.b), dx, act, P(mlp_proj_.w), false);
  if (cfg_.mlp == "swiglu")
    ops.swiglu_backward(d_fc, fc, d_act);
  else
    ops.gelu_backward(d_fc, fc, d_act);
  ops.matmul_backward(d_ln, G(c_fc_.w), G(c_fc_.b), d_fc, mlp_in, P(c_fc_.w), false);
  if (seq) {
    // dh = dy + LN2'(d_ln); dx currently holds dy, so LN2 backward accumulates into it: dx becomes dh.
    Tensor h = mat(a.h, N, C);
    norm_backward(ops, ln2_, dx, d_ln, h, mat(a.ln2_mean, N, 1).view({N}), mat(a.ln2_rstd, N, 1).view({N}));
  }
  // Attention branch: its output gradient is dh (sequential) or dy (parallel); both are in dx now.
  ops.matmul_backward(d_att, G(attn_proj_.w), G(attn_proj_.b), dx, att, P(attn_proj_.w), false);
  ops.attention_backward(d_qkv, d_att, qkv, att, lse, as);
  if (cfg_.pos == "rope") ops.rope_backward(d_qkv, as, cfg_.rope_theta);
  // Parallel block: LN1's output fed both branches, so the c_attn input gradient adds to the MLP's in d_ln.
  ops.matmul_backward(d_ln, G(c_attn_.w), G(c_attn_.b), d_qkv, ln1, P(c_attn_.w), /*accumulate_dinp=*/!seq);
  norm_backward(ops, ln1_, dx, d_ln, x, mean1, rstd1);
}

}  // namespace mt
