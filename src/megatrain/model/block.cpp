#include "megatrain/model/block.h"

#include <fmt/format.h>

namespace mt {

Tensor mat(const Buffer& b, int64_t rows, int64_t cols, DType dt) {
  Tensor t(b.data(), {rows, cols}, dt, b.device());
  MT_CHECK(t.nbytes() <= b.size(), "a [{}, {}] {} view exceeds its buffer of {} bytes", rows, cols, dtype_name(dt),
           b.size());
  return t;
}

namespace {

// Memory for n elements of dtype dt from the backend (or the host when there is none).
Buffer make(Ops* ops, int64_t n, DType dt) {
  const size_t bytes = static_cast<size_t>(n) * dtype_size(dt);
  return ops ? ops->alloc(bytes) : host_buffer(bytes);
}

}  // namespace

void BlockActs::allocate(const ModelConfig& cfg, int64_t rows, int tp, Ops* ops) {
  const int64_t C = cfg.d_model, F = cfg.ff_dim() / tp, H = cfg.n_head / tp, hd = cfg.head_dim();
  const int64_t fc_w = cfg.mlp == "swiglu" ? 2 * F : F;
  const int64_t qkv_w = (H + 2 * cfg.kv_heads() / tp) * hd;
  dtype = ops ? ops->compute_dtype() : DType::F32;
  const DType f32 = DType::F32;
  ln1 = make(ops, rows * C, dtype);
  ln1_mean = make(ops, rows, f32);
  ln1_rstd = make(ops, rows, f32);
  qkv = make(ops, rows * qkv_w, dtype);
  att = make(ops, rows * H * hd, dtype);
  lse = make(ops, rows * H, f32);
  fc = make(ops, rows * fc_w, dtype);
  act = make(ops, rows * F, dtype);
  if (cfg.block == "sequential") {
    h = make(ops, rows * C, dtype);
    ln2 = make(ops, rows * C, dtype);
    ln2_mean = make(ops, rows, f32);
    ln2_rstd = make(ops, rows, f32);
  }
}

void BlockScratch::allocate(const ModelConfig& cfg, int64_t rows, int tp, Ops* ops) {
  const int64_t C = cfg.d_model, F = cfg.ff_dim() / tp, H = cfg.n_head / tp, hd = cfg.head_dim();
  const int64_t fc_w = cfg.mlp == "swiglu" ? 2 * F : F;
  const int64_t qkv_w = (H + 2 * cfg.kv_heads() / tp) * hd;
  dtype = ops ? ops->compute_dtype() : DType::F32;
  proj_out = make(ops, rows * C, dtype);
  d_ln = make(ops, rows * C, dtype);
  d_qkv = make(ops, rows * qkv_w, dtype);
  d_att = make(ops, rows * H * hd, dtype);
  d_fc = make(ops, rows * fc_w, dtype);
  d_act = make(ops, rows * F, dtype);
  d_h = make(ops, rows * C, dtype);
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

Block::Views Block::views(BlockActs& a, BlockScratch& s, int B, int T) const {
  Views v;
  v.as = attn_shape(B, T);
  v.N = static_cast<int64_t>(B) * T;
  v.Ns = v.N / tp_size_;
  const int64_t N = v.N, Ns = v.Ns, C = cfg_.d_model, F = cfg_.ff_dim() / tp_size_;
  const int64_t fc_w = cfg_.mlp == "swiglu" ? 2 * F : F, att_w = int64_t(v.as.n_head) * v.as.head_dim;
  const DType dt = a.dtype, st = s.dtype;
  auto stat = [&](const Buffer& b) { return mat(b, Ns, 1).view({Ns}); };
  v.ln1 = mat(a.ln1, N, C, dt), v.mean1 = stat(a.ln1_mean), v.rstd1 = stat(a.ln1_rstd);
  v.qkv = mat(a.qkv, N, v.as.qkv_width(), dt), v.att = mat(a.att, N, att_w, dt);
  v.lse = mat(a.lse, N * v.as.n_head, 1).view({B, v.as.n_head, T});
  v.fc = mat(a.fc, N, fc_w, dt), v.act = mat(a.act, N, F, dt);
  if (cfg_.block == "sequential") {
    v.h = mat(a.h, Ns, C, dt), v.ln2 = mat(a.ln2, N, C, dt);
    v.mean2 = stat(a.ln2_mean), v.rstd2 = stat(a.ln2_rstd);
  }
  v.proj = mat(s.proj_out, Ns, C, st), v.d_ln = mat(s.d_ln, N, C, st), v.d_qkv = mat(s.d_qkv, N, v.as.qkv_width(), st);
  v.d_att = mat(s.d_att, N, att_w, st), v.d_fc = mat(s.d_fc, N, fc_w, st), v.d_act = mat(s.d_act, N, F, st);
  v.d_h = mat(s.d_h, N, C, st);
  return v;
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

// Normalisation of a residual sum: res = a + b, out = norm(res) (fused on backends that fuse it).
void Block::add_norm_forward(Ops& ops, const Norm& n, Tensor res, Tensor out, Tensor mean, Tensor rstd, Tensor a,
                             Tensor b) const {
  const bool rms = cfg_.norm != "layernorm";
  ops.add_layernorm_forward(res, out, rms ? Tensor{} : mean, rstd, a, b, P(n.w), rms ? Tensor{} : P(n.b),
                            cfg_.norm_eps, rms);
}

void Block::mlp_up_forward(Ops& ops, Tensor fc, Tensor act, Tensor in) const {
  if (cfg_.mlp == "swiglu") {
    ops.matmul_forward(fc, in, P(c_fc_.w), P(c_fc_.b));
    ops.swiglu_forward(act, fc);
  } else {
    ops.matmul_gelu_forward(act, fc, in, P(c_fc_.w), P(c_fc_.b));
  }
}

void Block::forward(Ops& ops, Tensor y, Tensor x, BlockActs& a, BlockScratch& s, int B, int T) const {
  if (tp_) return forward_tp(ops, y, x, a, s, B, T);
  const Views v = views(a, s, B, T);

  // Attention branch.
  norm_forward(ops, ln1_, v.ln1, v.mean1, v.rstd1, x);
  ops.matmul_forward(v.qkv, v.ln1, P(c_attn_.w), P(c_attn_.b));
  if (cfg_.pos == "rope") ops.rope_forward(v.qkv, v.as, cfg_.rope_theta);
  ops.attention_forward(v.att, v.lse, v.qkv, v.as);
  ops.matmul_forward(v.proj, v.att, P(attn_proj_.w), P(attn_proj_.b));

  if (cfg_.block == "sequential") {
    add_norm_forward(ops, ln2_, v.h, v.ln2, v.mean2, v.rstd2, x, v.proj);  // h = x + attn; ln2 = LN2(h)
    mlp_up_forward(ops, v.fc, v.act, v.ln2);
    ops.matmul_forward(v.proj, v.act, P(mlp_proj_.w), P(mlp_proj_.b));
    ops.add(y, v.h, v.proj);
  } else {
    mlp_up_forward(ops, v.fc, v.act, v.ln1);
    ops.add(y, x, v.proj);  // y = x + attn
    ops.matmul_forward(v.proj, v.act, P(mlp_proj_.w), P(mlp_proj_.b));
    ops.add(y, y, v.proj);  // y += mlp
  }
}

// MLP down-projection backward into the up-projection's output gradient d_fc (GeLU fused into the GEMM where
// the backend can). dout_rows: the gradient w.r.t. the projection's output; the rows of act/fc/d_fc/d_act match.
void Block::mlp_down_backward(Ops& ops, Tensor d_fc, Tensor d_act, Tensor dout, Tensor act, Tensor fc,
                              Tensor dbias) const {
  if (cfg_.mlp == "swiglu") {
    ops.matmul_backward(d_act, G(mlp_proj_.w), dbias, dout, act, P(mlp_proj_.w), false);
    ops.swiglu_backward(d_fc, fc, d_act);
  } else {
    ops.matmul_backward_gelu(d_fc, G(mlp_proj_.w), dbias, dout, act, P(mlp_proj_.w), fc);
  }
}

void Block::backward(Ops& ops, Tensor dx, Tensor x, BlockActs& a, BlockScratch& s, int B, int T) const {
  if (tp_) return backward_tp(ops, dx, x, a, s, B, T);
  const Views v = views(a, s, B, T);
  const bool seq = cfg_.block == "sequential";
  Tensor mlp_in = seq ? v.ln2 : v.ln1;

  // MLP branch: its output gradient is dx (the gradient w.r.t. y).
  mlp_down_backward(ops, v.d_fc, v.d_act, dx, v.act, v.fc, G(mlp_proj_.b));
  ops.matmul_backward(v.d_ln, G(c_fc_.w), G(c_fc_.b), v.d_fc, mlp_in, P(c_fc_.w), false);
  // dh = dy + LN2'(d_ln); dx holds dy, so LN2 backward accumulates into it: dx becomes dh.
  if (seq) norm_backward(ops, ln2_, dx, v.d_ln, v.h, v.mean2, v.rstd2);
  // Attention branch: its output gradient is dh (sequential) or dy (parallel); both are in dx now.
  ops.matmul_backward(v.d_att, G(attn_proj_.w), G(attn_proj_.b), dx, v.att, P(attn_proj_.w), false);
  ops.attention_backward(v.d_qkv, v.d_att, v.qkv, v.att, v.lse, v.as);
  if (cfg_.pos == "rope") ops.rope_backward(v.d_qkv, v.as, cfg_.rope_theta);
  // Parallel block: LN1's output fed both branches, so the c_attn input gradient adds to the MLP's in d_ln.
  ops.matmul_backward(v.d_ln, G(c_attn_.w), G(c_attn_.b), v.d_qkv, v.ln1, P(c_attn_.w), /*accumulate_dinp=*/!seq);
  norm_backward(ops, ln1_, dx, v.d_ln, x, v.mean1, v.rstd1);
}

// ---- tensor + sequence parallel (Megatron) ------------------------------------------------------------------
// x/y/dx are my row block [Ns = N/tp, C]. Each column-parallel GEMM reads the all-gathered norm output and
// produces my heads / MLP columns for all N rows; each row-parallel GEMM's partial [N, C] is reduce-scattered back
// to row blocks. The replicated row-parallel biases are added by tp rank 0's partial only (so exactly once), and
// their gradient is formed there; the caller all-reduces replicated gradients over tp after backward.

void Block::forward_tp(Ops& ops, Tensor y, Tensor x, BlockActs& a, BlockScratch& s, int B, int T) const {
  const Views v = views(a, s, B, T);
  const int64_t N = v.N;
  const bool seq = cfg_.block == "sequential", first = tp_->rank() == 0;
  Tensor shard = v.proj, tmp = v.d_ln;  // [Ns, C] norm output before the gather; [N, C] partial sums
  auto rows = [](Tensor t, int64_t r0, int64_t n) { return t.slice0(r0, r0 + n); };
  Tensor ab = first ? P(attn_proj_.b) : Tensor{}, mb = first ? P(mlp_proj_.b) : Tensor{};

  norm_forward(ops, ln1_, shard, v.mean1, v.rstd1, x);
  tp_->all_gather_rows(v.ln1, shard, [&](int64_t r0, int64_t n) {
    ops.matmul_forward(rows(v.qkv, r0, n), rows(v.ln1, r0, n), P(c_attn_.w), P(c_attn_.b));
    if (!seq) mlp_up_forward(ops, rows(v.fc, r0, n), rows(v.act, r0, n), rows(v.ln1, r0, n));
  });
  if (cfg_.pos == "rope") ops.rope_forward(v.qkv, v.as, cfg_.rope_theta);
  ops.attention_forward(v.att, v.lse, v.qkv, v.as);
  if (seq) {
    tp_->reduce_scatter_rows(v.h, N, [&](Tensor out, int64_t r0, int64_t n) {
      ops.matmul_forward(out, rows(v.att, r0, n), P(attn_proj_.w), ab);
    });
    add_norm_forward(ops, ln2_, v.h, shard, v.mean2, v.rstd2, x, v.h);  // h = x + attn; shard = LN2(h)
    tp_->all_gather_rows(v.ln2, shard, [&](int64_t r0, int64_t n) {
      mlp_up_forward(ops, rows(v.fc, r0, n), rows(v.act, r0, n), rows(v.ln2, r0, n));
    });
    tp_->reduce_scatter_rows(y, N, [&](Tensor out, int64_t r0, int64_t n) {
      ops.matmul_forward(out, rows(v.act, r0, n), P(mlp_proj_.w), mb);
    });
    ops.add(y, v.h, y);
  } else {
    // Both row-parallel outputs are summed before one reduce-scatter.
    tp_->reduce_scatter_rows(y, N, [&](Tensor out, int64_t r0, int64_t n) {
      ops.matmul_forward(out, rows(v.att, r0, n), P(attn_proj_.w), ab);
      Tensor t = rows(tmp, 0, n);
      ops.matmul_forward(t, rows(v.act, r0, n), P(mlp_proj_.w), mb);
      ops.add(out, out, t);
    });
    ops.add(y, x, y);
  }
}

void Block::backward_tp(Ops& ops, Tensor dx, Tensor x, BlockActs& a, BlockScratch& s, int B, int T) const {
  const Views v = views(a, s, B, T);
  const int64_t N = v.N;
  const bool seq = cfg_.block == "sequential", first = tp_->rank() == 0;
  Tensor d_ln = v.d_ln.slice0(0, v.Ns), dfull = v.d_h;  // my rows of the norm-output gradient; gathered dy
  Tensor mlp_in = seq ? v.ln2 : v.ln1;
  auto rows = [](Tensor t, int64_t r0, int64_t n) { return t.slice0(r0, r0 + n); };
  Tensor gab = first ? G(attn_proj_.b) : Tensor{}, gmb = first ? G(mlp_proj_.b) : Tensor{};

  // Row-parallel MLP projection: gather dy; each arrived block gives its rows of d_fc and its share of dW.
  tp_->all_gather_rows(dfull, dx, [&](int64_t r0, int64_t n) {
    mlp_down_backward(ops, rows(v.d_fc, r0, n), rows(v.d_act, r0, n), rows(dfull, r0, n), rows(v.act, r0, n),
                      rows(v.fc, r0, n), gmb);
    if (!seq)
      ops.matmul_backward(rows(v.d_att, r0, n), G(attn_proj_.w), gab, rows(dfull, r0, n), rows(v.att, r0, n),
                          P(attn_proj_.w), false);
  });
  if (seq) {
    // Column-parallel c_fc: the input gradient is partial over ranks -> reduce-scatter; dW overlaps it.
    tp_->reduce_scatter_rows(
        d_ln, N,
        [&](Tensor out, int64_t r0, int64_t n) {
          ops.matmul_backward(out, Tensor{}, Tensor{}, rows(v.d_fc, r0, n), Tensor{}, P(c_fc_.w), false);
        },
        [&] { ops.matmul_backward(Tensor{}, G(c_fc_.w), G(c_fc_.b), v.d_fc, mlp_in, P(c_fc_.w), false); });
    norm_backward(ops, ln2_, dx, d_ln, v.h, v.mean2, v.rstd2);
    tp_->all_gather_rows(dfull, dx, [&](int64_t r0, int64_t n) {
      ops.matmul_backward(rows(v.d_att, r0, n), G(attn_proj_.w), gab, rows(dfull, r0, n), rows(v.att, r0, n),
                          P(attn_proj_.w), false);
    });
  }
  ops.attention_backward(v.d_qkv, v.d_att, v.qkv, v.att, v.lse, v.as);
  if (cfg_.pos == "rope") ops.rope_backward(v.d_qkv, v.as, cfg_.rope_theta);
  tp_->reduce_scatter_rows(
      d_ln, N,
      [&](Tensor out, int64_t r0, int64_t n) {
        ops.matmul_backward(out, Tensor{}, Tensor{}, rows(v.d_qkv, r0, n), Tensor{}, P(c_attn_.w), false);
        // Parallel block: LN1's output fed both branches, so the input gradients add before one reduce-scatter.
        if (!seq) ops.matmul_backward(out, Tensor{}, Tensor{}, rows(v.d_fc, r0, n), Tensor{}, P(c_fc_.w), true);
      },
      [&] {
        ops.matmul_backward(Tensor{}, G(c_attn_.w), G(c_attn_.b), v.d_qkv, v.ln1, P(c_attn_.w), false);
        if (!seq) ops.matmul_backward(Tensor{}, G(c_fc_.w), G(c_fc_.b), v.d_fc, v.ln1, P(c_fc_.w), false);
      });
  norm_backward(ops, ln1_, dx, d_ln, x, v.mean1, v.rstd1);
}

}  // namespace mt
