#include "megatrain/model/block.h"

#include <fmt/format.h>

namespace mt {

namespace {

// A [rows, cols] view of a buffer.
Tensor mat(const HostBuffer& b, int64_t rows, int64_t cols) { return f32_view(b.f32(), {rows, cols}); }

}  // namespace

void BlockActs::allocate(const ModelConfig& cfg, int64_t rows, int tp) {
  const int64_t C = cfg.d_model, F = cfg.ff_dim() / tp, H = cfg.n_head / tp, hd = cfg.head_dim();
  const int64_t fc_w = cfg.mlp == "swiglu" ? 2 * F : F;
  const int64_t qkv_w = (H + 2 * cfg.kv_heads() / tp) * hd;
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

void BlockScratch::allocate(const ModelConfig& cfg, int64_t rows, int tp) {
  const int64_t C = cfg.d_model, F = cfg.ff_dim() / tp, H = cfg.n_head / tp, hd = cfg.head_dim();
  const int64_t fc_w = cfg.mlp == "swiglu" ? 2 * F : F;
  const int64_t qkv_w = (H + 2 * cfg.kv_heads() / tp) * hd;
  const size_t f = sizeof(float);
  proj_out.resize(rows * C * f, false);
  d_ln.resize(rows * C * f, false);
  d_qkv.resize(rows * qkv_w * f, false);
  d_att.resize(rows * H * hd * f, false);
  d_fc.resize(rows * fc_w * f, false);
  d_act.resize(rows * F * f, false);
  d_h.resize(rows * C * f, false);
}

Block::Block(const ModelConfig& cfg, const ParamStore& params, int layer, TpComm* tp) : cfg_(cfg), params_(params) {
  if (tp && tp->size() > 1) {
    tp_ = tp;
    tp_size_ = tp->size();
  }
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
  s.n_head = cfg_.n_head / tp_size_;
  s.n_kv_head = cfg_.kv_heads() / tp_size_;
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
  if (tp_) return forward_tp(ops, y, x, a, s, B, T);
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
  if (tp_) return backward_tp(ops, dx, x, a, s, B, T);
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

// ---- tensor + sequence parallel (Megatron) ------------------------------------------------------------------
// x/y/dx are my row block [Ns = N/tp, C]. Each column-parallel GEMM reads the all-gathered norm output and
// produces my heads / MLP columns for all N rows; each row-parallel GEMM's partial [N, C] is reduce-scattered back
// to row blocks. The replicated row-parallel biases are added by tp rank 0's partial only (so exactly once), and
// their gradient is formed there; the caller all-reduces replicated gradients over tp after backward.

void Block::forward_tp(Ops& ops, Tensor y, Tensor x, BlockActs& a, BlockScratch& s, int B, int T) const {
  const int64_t N = static_cast<int64_t>(B) * T, Ns = N / tp_size_, C = cfg_.d_model, F = cfg_.ff_dim() / tp_size_;
  const AttnShape as = attn_shape(B, T);
  const int64_t fc_w = cfg_.mlp == "swiglu" ? 2 * F : F, att_w = static_cast<int64_t>(as.n_head) * as.head_dim;
  const bool seq = cfg_.block == "sequential", first = tp_->rank() == 0;
  Tensor ln1 = mat(a.ln1, N, C), mean1 = mat(a.ln1_mean, Ns, 1).view({Ns}), rstd1 = mat(a.ln1_rstd, Ns, 1).view({Ns});
  Tensor qkv = mat(a.qkv, N, as.qkv_width()), att = mat(a.att, N, att_w);
  Tensor lse = mat(a.lse, N * as.n_head, 1).view({B, as.n_head, T});
  Tensor fc = mat(a.fc, N, fc_w), act = mat(a.act, N, F);
  Tensor shard = mat(s.proj_out, Ns, C), tmp = mat(s.d_ln, N, C);
  auto rows = [](Tensor t, int64_t r0, int64_t n) { return t.slice0(r0, r0 + n); };
  Tensor ab = first ? P(attn_proj_.b) : Tensor{}, mb = first ? P(mlp_proj_.b) : Tensor{};

  norm_forward(ops, ln1_, shard, mean1, rstd1, x);
  tp_->all_gather_rows(ln1, shard, [&](int64_t r0, int64_t n) {
    ops.matmul_forward(rows(qkv, r0, n), rows(ln1, r0, n), P(c_attn_.w), P(c_attn_.b));
    if (!seq) ops.matmul_forward(rows(fc, r0, n), rows(ln1, r0, n), P(c_fc_.w), P(c_fc_.b));
  });
  if (cfg_.pos == "rope") ops.rope_forward(qkv, as, cfg_.rope_theta);
  ops.attention_forward(att, lse, qkv, as);
  if (seq) {
    Tensor h = mat(a.h, Ns, C), ln2 = mat(a.ln2, N, C);
    tp_->reduce_scatter_rows(h, N, [&](Tensor out, int64_t r0, int64_t n) {
      ops.matmul_forward(out, rows(att, r0, n), P(attn_proj_.w), ab);
    });
    ops.add(h, x, h);
    norm_forward(ops, ln2_, shard, mat(a.ln2_mean, Ns, 1).view({Ns}), mat(a.ln2_rstd, Ns, 1).view({Ns}), h);
    tp_->all_gather_rows(ln2, shard, [&](int64_t r0, int64_t n) {
      ops.matmul_forward(rows(fc, r0, n), rows(ln2, r0, n), P(c_fc_.w), P(c_fc_.b));
    });
  }
  if (cfg_.mlp == "swiglu")
    ops.swiglu_forward(act, fc);
  else
    ops.gelu_forward(act, fc);
  if (seq) {
    tp_->reduce_scatter_rows(y, N, [&](Tensor out, int64_t r0, int64_t n) {
      ops.matmul_forward(out, rows(act, r0, n), P(mlp_proj_.w), mb);
    });
    ops.add(y, mat(a.h, Ns, C), y);
  } else {
    // Both row-parallel outputs are summed before one reduce-scatter.
    tp_->reduce_scatter_rows(y, N, [&](Tensor out, int64_t r0, int64_t n) {
      ops.matmul_forward(out, rows(att, r0, n), P(attn_proj_.w), ab);
      Tensor t = rows(tmp, 0, n);
      ops.matmul_forward(t, rows(act, r0, n), P(mlp_proj_.w), mb);
      ops.add(out, out, t);
    });
    ops.add(y, x, y);
  }
}

void Block::backward_tp(Ops& ops, Tensor dx, Tensor x, BlockActs& a, BlockScratch& s, int B, int T) const {
  const int64_t N = static_cast<int64_t>(B) * T, Ns = N / tp_size_, C = cfg_.d_model, F = cfg_.ff_dim() / tp_size_;
  const AttnShape as = attn_shape(B, T);
  const int64_t fc_w = cfg_.mlp == "swiglu" ? 2 * F : F, att_w = static_cast<int64_t>(as.n_head) * as.head_dim;
  const bool seq = cfg_.block == "sequential", first = tp_->rank() == 0;
  Tensor ln1 = mat(a.ln1, N, C), mean1 = mat(a.ln1_mean, Ns, 1).view({Ns}), rstd1 = mat(a.ln1_rstd, Ns, 1).view({Ns});
  Tensor qkv = mat(a.qkv, N, as.qkv_width()), att = mat(a.att, N, att_w);
  Tensor lse = mat(a.lse, N * as.n_head, 1).view({B, as.n_head, T});
  Tensor fc = mat(a.fc, N, fc_w), act = mat(a.act, N, F);
  Tensor d_ln = mat(s.d_ln, Ns, C), d_qkv = mat(s.d_qkv, N, as.qkv_width()), d_att = mat(s.d_att, N, att_w);
  Tensor d_fc = mat(s.d_fc, N, fc_w), d_act = mat(s.d_act, N, F), dfull = mat(s.d_h, N, C);
  Tensor mlp_in = seq ? mat(a.ln2, N, C) : ln1;
  auto rows = [](Tensor t, int64_t r0, int64_t n) { return t.slice0(r0, r0 + n); };
  Tensor gab = first ? G(attn_proj_.b) : Tensor{}, gmb = first ? G(mlp_proj_.b) : Tensor{};

  // Row-parallel MLP projection: gather dy; each arrived block gives its rows of d_act and its share of dW.
  tp_->all_gather_rows(dfull, dx, [&](int64_t r0, int64_t n) {
    ops.matmul_backward(rows(d_act, r0, n), G(mlp_proj_.w), gmb, rows(dfull, r0, n), rows(act, r0, n),
                        P(mlp_proj_.w), false);
    if (!seq)
      ops.matmul_backward(rows(d_att, r0, n), G(attn_proj_.w), gab, rows(dfull, r0, n), rows(att, r0, n),
                          P(attn_proj_.w), false);
  });
  if (cfg_.mlp == "swiglu")
    ops.swiglu_backward(d_fc, fc, d_act);
  else
    ops.gelu_backward(d_fc, fc, d_act);
  if (seq) {
    // Column-parallel c_fc: the input gradient is partial over ranks -> reduce-scatter; dW overlaps it.
    tp_->reduce_scatter_rows(
        d_ln, N,
        [&](Tensor out, int64_t r0, int64_t n) {
          ops.matmul_backward(out, Tensor{}, Tensor{}, rows(d_fc, r0, n), Tensor{}, P(c_fc_.w), false);
        },
        [&] { ops.matmul_backward(Tensor{}, G(c_fc_.w), G(c_fc_.b), d_fc, mlp_in, P(c_fc_.w), false); });
    Tensor h = mat(a.h, Ns, C);
    norm_backward(ops, ln2_, dx, d_ln, h, mat(a.ln2_mean, Ns, 1).view({Ns}), mat(a.ln2_rstd, Ns, 1).view({Ns}));
    tp_->all_gather_rows(dfull, dx, [&](int64_t r0, int64_t n) {
      ops.matmul_backward(rows(d_att, r0, n), G(attn_proj_.w), gab, rows(dfull, r0, n), rows(att, r0, n),
                          P(attn_proj_.w), false);
    });
  }
  ops.attention_backward(d_qkv, d_att, qkv, att, lse, as);
  if (cfg_.pos == "rope") ops.rope_backward(d_qkv, as, cfg_.rope_theta);
  tp_->reduce_scatter_rows(
      d_ln, N,
      [&](Tensor out, int64_t r0, int64_t n) {
        ops.matmul_backward(out, Tensor{}, Tensor{}, rows(d_qkv, r0, n), Tensor{}, P(c_attn_.w), false);
        // Parallel block: LN1's output fed both branches, so the input gradients add before one reduce-scatter.
        if (!seq) ops.matmul_backward(out, Tensor{}, Tensor{}, rows(d_fc, r0, n), Tensor{}, P(c_fc_.w), true);
      },
      [&] {
        ops.matmul_backward(Tensor{}, G(c_attn_.w), G(c_attn_.b), d_qkv, ln1, P(c_attn_.w), false);
        if (!seq) ops.matmul_backward(Tensor{}, G(c_fc_.w), G(c_fc_.b), d_fc, ln1, P(c_fc_.w), false);
      });
  norm_backward(ops, ln1_, dx, d_ln, x, mean1, rstd1);
}

}  // namespace mt
