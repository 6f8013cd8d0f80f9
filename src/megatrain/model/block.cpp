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
  const int64_t fc_w = cfg.mlp == MlpKind::SwiGlu ? 2 * F : F;
  const int64_t qkv_w = (H + 2 * cfg.kv_heads() / tp) * hd;
  dtype = ops ? ops->compute_dtype() : DType::F32;
  const DType f32 = DType::F32;
  // With recompute_norm, the norms' outputs live in BlockScratch::ln instead (Block::views).
  if (!cfg.recompute_norm) ln1 = make(ops, rows * C, dtype);
  ln1_mean = make(ops, rows, f32);
  ln1_rstd = make(ops, rows, f32);
  qkv = make(ops, rows * qkv_w, dtype);
  att = make(ops, rows * H * hd, dtype);
  lse = make(ops, rows * H, f32);
  fc = make(ops, rows * fc_w, dtype);
  // With recompute_act (GeLU), the activation lives in BlockScratch::d_act instead (Block::views).
  if (!(cfg.recompute_act && cfg.mlp == MlpKind::Gelu)) act = make(ops, rows * F, dtype);
  if (cfg.block == BlockKind::Sequential) {
    h = make(ops, rows * C, dtype);
    if (!cfg.recompute_norm) ln2 = make(ops, rows * C, dtype);
    ln2_mean = make(ops, rows, f32);
    ln2_rstd = make(ops, rows, f32);
  }
  if (cfg.moe()) moe.allocate(cfg, rows, ops);
}

void BlockScratch::allocate(const ModelConfig& cfg, int64_t rows, int tp, Ops* ops) {
  const int64_t C = cfg.d_model, F = cfg.ff_dim() / tp, H = cfg.n_head / tp, hd = cfg.head_dim();
  const int64_t fc_w = cfg.mlp == MlpKind::SwiGlu ? 2 * F : F;
  const int64_t qkv_w = (H + 2 * cfg.kv_heads() / tp) * hd;
  dtype = ops ? ops->compute_dtype() : DType::F32;
  proj_out = make(ops, rows * C, dtype);
  d_ln = make(ops, rows * C, dtype);
  d_qkv = make(ops, rows * qkv_w, dtype);
  d_att = make(ops, rows * H * hd, dtype);
  d_fc = make(ops, rows * fc_w, dtype);
  d_act = make(ops, rows * F, dtype);
  d_h = make(ops, rows * C, dtype);
  if (cfg.recompute_norm) ln = make(ops, rows * C, dtype);
}

Block::Block(const ModelConfig& cfg, ParamStore& params, int layer, TpComm* tp, EpComm* ep)
    : cfg_(cfg), params_(params) {
  recompute_act_ = cfg.recompute_act && cfg.mlp == MlpKind::Gelu;
  recompute_norm_ = cfg.recompute_norm;
  if (tp && tp->size() > 1) {
    tp_ = tp;
    tp_size_ = tp->size();
    first_ = tp->rank() == 0;
  }
  const std::string p = fmt::format("h.{}.", layer);
  auto idx = [&](const std::string& n) { return params.has(n) ? params.index(n) : -1; };
  auto lin = [&](const std::string& n) { return Lin{params.index(n + ".weight"), idx(n + ".bias")}; };
  auto norm = [&](const std::string& n) { return Norm{params.index(n + ".weight"), idx(n + ".bias")}; };
  ln1_ = norm(p + "ln_1");
  if (cfg.block == BlockKind::Sequential) ln2_ = norm(p + "ln_2");
  c_attn_ = lin(p + "attn.c_attn");
  attn_proj_ = lin(p + "attn.c_proj");
  if (cfg.moe_layer(layer)) {
    moe_.emplace(cfg, params, layer, ep);
    moe_->set_token_group(tp_);  // sequence parallelism: the tp ranks split each micro-batch's tokens
  } else {
    c_fc_ = lin(p + "mlp.c_fc");
    mlp_proj_ = lin(p + "mlp.c_proj");
  }
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
  const int64_t fc_w = cfg_.mlp == MlpKind::SwiGlu ? 2 * F : F, att_w = int64_t(v.as.n_head) * v.as.head_dim;
  const DType dt = a.dtype, st = s.dtype;
  auto stat = [&](const Buffer& b) { return mat(b, Ns, 1).view({Ns}); };
  // recompute_norm: both norms' (gathered) outputs are one [N, C] scratch, live from the norm to the column-parallel
  // GEMMs reading it: LN1's is dead before LN2 writes (forward), and each is rebuilt just before its readers'
  // backward (rebuild_norm).
  v.ln1 = recompute_norm_ ? mat(s.ln, N, C, st) : mat(a.ln1, N, C, dt);
  v.mean1 = stat(a.ln1_mean), v.rstd1 = stat(a.ln1_rstd);
  v.qkv = mat(a.qkv, N, v.as.qkv_width(), dt), v.att = mat(a.att, N, att_w, dt);
  v.lse = mat(a.lse, N * v.as.n_head, 1).view({B, v.as.n_head, T});
  // recompute_act: the GeLU output is a temporary in the scratch d_act (the GeLU backward writes d_fc directly and
  // never uses d_act): written in forward for the down-projection, rewritten from fc in backward before its use.
  v.fc = mat(a.fc, N, fc_w, dt), v.act = recompute_act_ ? mat(s.d_act, N, F, s.dtype) : mat(a.act, N, F, dt);
  if (cfg_.block == BlockKind::Sequential) {
    v.h = mat(a.h, Ns, C, dt), v.ln2 = recompute_norm_ ? mat(s.ln, N, C, st) : mat(a.ln2, N, C, dt);
    v.mean2 = stat(a.ln2_mean), v.rstd2 = stat(a.ln2_rstd);
  }
  v.proj = mat(s.proj_out, Ns, C, st), v.d_ln = mat(s.d_ln, N, C, st), v.d_qkv = mat(s.d_qkv, N, v.as.qkv_width(), st);
  v.d_att = mat(s.d_att, N, att_w, st), v.d_fc = mat(s.d_fc, N, fc_w, st), v.d_act = mat(s.d_act, N, F, st);
  v.d_h = mat(s.d_h, N, C, st);
  v.ln1_out = tp_ ? v.proj : v.ln1;
  v.ln2_out = tp_ ? v.proj : v.ln2;
  v.part = v.d_ln;
  return v;
}

void Block::norm_forward(Ops& ops, const Norm& n, Tensor out, Tensor mean, Tensor rstd, Tensor in) const {
  if (cfg_.norm == NormKind::LayerNorm)
    ops.layernorm_forward(out, mean, rstd, in, P(n.w), P(n.b), cfg_.norm_eps);
  else
    ops.rmsnorm_forward(out, rstd, in, P(n.w), cfg_.norm_eps);
}

void Block::norm_backward(Ops& ops, const Norm& n, Tensor din, Tensor dout, Tensor in, Tensor mean, Tensor rstd) const {
  if (cfg_.norm == NormKind::LayerNorm)
    ops.layernorm_backward(din, G(n.w), G(n.b), dout, in, P(n.w), mean, rstd, accumulates(n.w, n.b));
  else
    ops.rmsnorm_backward(din, G(n.w), dout, in, P(n.w), rstd, accumulates(n.w, -1));
}

// recompute_norm: rebuilds a norm's output `full` [N, C] (the column-parallel GEMMs' input) from its saved input,
// before backward reads it. The saved statistics are left as they are (no mean/rstd out): the backward of the norm
// reads those of the forward. The arithmetic is the forward's (the fused add + norm normalises the stored sum, as
// here), so the rebuilt rows are the forward's bits. With tp, this rank rebuilds its rows into out and the
// all-gather runs again (Megatron's sequence parallelism re-gathers in backward the same way).
void Block::rebuild_norm(Ops& ops, const Norm& n, Tensor full, Tensor out, Tensor in) const {
  if (!recompute_norm_) return;
  norm_forward(ops, n, out, Tensor{}, Tensor{}, in);
  if (tp_) tp_->all_gather_rows(full, out);
}

// Normalisation of a residual sum: res = a + b, out = norm(res) (fused on backends that fuse it).
void Block::add_norm_forward(Ops& ops, const Norm& n, Tensor res, Tensor out, Tensor mean, Tensor rstd, Tensor a,
                             Tensor b) const {
  const bool rms = cfg_.norm != NormKind::LayerNorm;
  ops.add_layernorm_forward(res, out, rms ? Tensor{} : mean, rstd, a, b, P(n.w), rms ? Tensor{} : P(n.b), cfg_.norm_eps,
                            rms);
}

void Block::mlp_up_forward(Ops& ops, Tensor fc, Tensor act, Tensor in) const {
  if (cfg_.mlp == MlpKind::SwiGlu) {
    ops.matmul_forward(fc, in, P(c_fc_.w), P(c_fc_.b));
    ops.swiglu_forward(act, fc);
  } else {
    ops.matmul_gelu_forward(act, fc, in, P(c_fc_.w), P(c_fc_.b));
  }
}

// ---- column- and row-parallel linears ----------------------------------------------------------------------
// With tensor + sequence parallelism (Megatron), x/y/dx are this rank's row block [Ns = N/tp, C]. A column-parallel
// GEMM reads the all-gathered norm output and produces this rank's heads / MLP columns for all N rows; a
// row-parallel GEMM's partial [N, C] product is reduce-scattered back to row blocks. At tp = 1 the same GEMMs run
// once on all rows, with no copy. Each helper keeps the order of the floating-point operations of the code it
// replaced (the separate single-process and tp paths), so losses are bit-identical to it at every tp.

void Block::column_forward(Tensor full, Tensor norm_out, const RowsGemm& gemms) const {
  if (tp_) return tp_->all_gather_rows(full, norm_out, gemms);
  gemms(0, full.size(0));  // the norm wrote full itself
}

void Block::row_forward(Tensor out, int64_t N, const PartGemm& gemm) const {
  if (tp_) return tp_->reduce_scatter_rows(out, N, gemm);
  gemm(out, 0, N);
}

void Block::row_forward_add(Ops& ops, Tensor y, Tensor residual, Tensor tmp, int64_t N,
                            const std::vector<RowLinear>& lins) const {
  if (!tp_) {
    // One process: each product joins the residual stream in turn, y = (residual + p0) + p1, the add fused into
    // the GEMM where the backend can (cuBLASLt reads the residual as its C matrix: no separate pass over y).
    for (size_t k = 0; k < lins.size(); ++k)
      ops.matmul_forward_add(y, lins[k].in, P(lins[k].lin.w), row_bias(lins[k].lin), k == 0 ? residual : y, tmp);
    return;
  }
  // tp > 1: the partial products are summed before one reduce-scatter (one transfer instead of one per product),
  // then join the residual stream: y = residual + (p0 + p1).
  auto product = [&](Tensor out, const RowLinear& l, int64_t r0, int64_t n) {
    ops.matmul_forward(out, l.in.slice0(r0, r0 + n), P(l.lin.w), row_bias(l.lin));
  };
  tp_->reduce_scatter_rows(y, N, [&](Tensor out, int64_t r0, int64_t n) {
    product(out, lins[0], r0, n);
    for (size_t k = 1; k < lins.size(); ++k) {
      Tensor t = tmp.slice0(0, n);
      product(t, lins[k], r0, n);
      ops.add(out, out, t);
    }
  });
  ops.add(y, residual, y);
}

void Block::row_backward(Tensor dy, Tensor gathered, const GradGemm& grads) const {
  if (!tp_) return grads(dy, 0, dy.size(0));
  // Each arrived block of rows gives its rows of the input gradient and its share of dW (overlapping the gather).
  tp_->all_gather_rows(gathered, dy, [&](int64_t r0, int64_t n) { grads(gathered.slice0(r0, r0 + n), r0, n); });
}

void Block::column_backward(Ops& ops, Tensor din, int64_t N, const std::vector<ColumnGrad>& lins) const {
  if (!tp_) {
    // One GEMM call per linear forms its input gradient (the later ones accumulating) and its dW, db.
    for (size_t k = 0; k < lins.size(); ++k) {
      const ColumnGrad& l = lins[k];
      ops.matmul_backward(din, G(l.lin.w), G(l.lin.b), l.dout, l.in, P(l.lin.w), /*accumulate_dinp=*/k > 0,
                          accumulates(l.lin));
    }
    return;
  }
  // tp > 1: the input gradient is a partial sum over the ranks: it is reduce-scattered chunk by chunk, and the
  // weight-gradient GEMMs (which need all rows) run while the last chunk is in flight.
  tp_->reduce_scatter_rows(
      din, N,
      [&](Tensor out, int64_t r0, int64_t n) {
        for (size_t k = 0; k < lins.size(); ++k)
          ops.matmul_backward(out, Tensor{}, Tensor{}, lins[k].dout.slice0(r0, r0 + n), Tensor{}, P(lins[k].lin.w),
                              /*accumulate_dinp=*/k > 0);
      },
      [&] {
        for (const ColumnGrad& l : lins)
          ops.matmul_backward(Tensor{}, G(l.lin.w), G(l.lin.b), l.dout, l.in, P(l.lin.w), false, accumulates(l.lin));
      });
}

// ---- the layer ----------------------------------------------------------------------------------------------

void Block::attention_forward(Ops& ops, Tensor x, const Views& v) const {
  const bool seq = cfg_.block == BlockKind::Sequential;
  auto rows = [](Tensor t, int64_t r0, int64_t n) { return t.slice0(r0, r0 + n); };
  norm_forward(ops, ln1_, v.ln1_out, v.mean1, v.rstd1, x);
  column_forward(v.ln1, v.ln1_out, [&](int64_t r0, int64_t n) {
    ops.matmul_forward(rows(v.qkv, r0, n), rows(v.ln1, r0, n), P(c_attn_.w), P(c_attn_.b));
    if (!seq) mlp_up_forward(ops, rows(v.fc, r0, n), rows(v.act, r0, n), rows(v.ln1, r0, n));
  });
  if (cfg_.pos == PosKind::Rope) ops.rope_forward(v.qkv, v.as, cfg_.rope_freqs());
  ops.attention_forward(v.att, v.lse, v.qkv, v.as);
}

void Block::forward_attention(Ops& ops, Tensor x, BlockActs& a, BlockScratch& s, int B, int T) const {
  MT_CHECK(moe_, "Block::forward_attention: layer is not a MoE layer");
  const Views v = views(a, s, B, T);
  attention_forward(ops, x, v);
  Tensor attn = v.part.slice0(0, v.Ns);
  row_forward(attn, v.N, [&](Tensor out, int64_t r0, int64_t n) {
    ops.matmul_forward(out, v.att.slice0(r0, r0 + n), P(attn_proj_.w), row_bias(attn_proj_));
  });
  // h = x + attn; LN2(h) on this rank's rows (the MoE's input is kept in ln2's first rows): attn is consumed.
  add_norm_forward(ops, ln2_, v.h, moe_input(v), v.mean2, v.rstd2, x, attn);
}

void Block::forward_moe(Ops& ops, Tensor y, BlockActs& a, BlockScratch& s, int B, int T,
                        const std::function<void()>& while_dispatch) const {
  const Views v = views(a, s, B, T);
  Tensor out = v.part.slice0(0, v.Ns);  // written by the combine, after while_dispatch
  moe_->forward(ops, out, moe_input(v), a.moe, while_dispatch);
  ops.add(y, v.h, out);
}

void Block::forward(Ops& ops, Tensor y, Tensor x, BlockActs& a, BlockScratch& s, int B, int T) const {
  if (moe_) {  // h = x + attn; y = h + MoE(LN2 h)
    forward_attention(ops, x, a, s, B, T);
    return forward_moe(ops, y, a, s, B, T, {});
  }
  const Views v = views(a, s, B, T);
  const bool seq = cfg_.block == BlockKind::Sequential;
  auto rows = [](Tensor t, int64_t r0, int64_t n) { return t.slice0(r0, r0 + n); };
  auto attn_proj = [&](Tensor out, int64_t r0, int64_t n) {
    ops.matmul_forward(out, rows(v.att, r0, n), P(attn_proj_.w), row_bias(attn_proj_));
  };
  const RowLinear attn_out{attn_proj_, v.att}, mlp_out{mlp_proj_, v.act};

  attention_forward(ops, x, v);
  if (!seq) return row_forward_add(ops, y, x, v.part, v.N, {attn_out, mlp_out});  // y = x + attn + mlp

  Tensor attn = v.part.slice0(0, v.Ns);
  row_forward(attn, v.N, attn_proj);
  add_norm_forward(ops, ln2_, v.h, v.ln2_out, v.mean2, v.rstd2, x, attn);  // h = x + attn; LN2(h)
  column_forward(v.ln2, v.ln2_out, [&](int64_t r0, int64_t n) {
    mlp_up_forward(ops, rows(v.fc, r0, n), rows(v.act, r0, n), rows(v.ln2, r0, n));
  });
  row_forward_add(ops, y, v.h, v.part, v.N, {mlp_out});  // y = h + mlp
}

// MLP down-projection backward into the up-projection's output gradient d_fc (GeLU fused into the GEMM where
// the backend can). dout_rows: the gradient w.r.t. the projection's output; the rows of act/fc/d_fc/d_act match.
void Block::mlp_down_backward(Ops& ops, Tensor d_fc, Tensor d_act, Tensor dout, Tensor act, Tensor fc,
                              Tensor dbias) const {
  if (cfg_.mlp == MlpKind::SwiGlu) {
    ops.matmul_backward(d_act, G(mlp_proj_.w), dbias, dout, act, P(mlp_proj_.w), false, accumulates_row(mlp_proj_));
    ops.swiglu_backward(d_fc, fc, d_act);
  } else {
    if (recompute_act_) ops.gelu_forward(act, fc);  // act is scratch (views): rebuild this layer's GeLU output
    ops.matmul_backward_gelu(d_fc, G(mlp_proj_.w), dbias, dout, act, P(mlp_proj_.w), fc, accumulates_row(mlp_proj_));
  }
}

void Block::backward(Ops& ops, Tensor dx, Tensor x, BlockActs& a, BlockScratch& s, int B, int T) const {
  const Views v = views(a, s, B, T);
  const bool seq = cfg_.block == BlockKind::Sequential;
  Tensor d_ln = v.d_ln.slice0(0, v.Ns);  // the gradient w.r.t. a norm's output: this rank's rows
  auto rows = [](Tensor t, int64_t r0, int64_t n) { return t.slice0(r0, r0 + n); };
  auto attn_proj = [&](Tensor dy, int64_t r0, int64_t n) {
    ops.matmul_backward(rows(v.d_att, r0, n), G(attn_proj_.w), row_bias_grad(attn_proj_), dy, rows(v.att, r0, n),
                        P(attn_proj_.w), false, accumulates_row(attn_proj_));
  };

  if (moe_) {
    // The MoE layer's branch, as the MLP's below: d_ln = MoE'(dy); dx += LN2'(d_ln); then attention. All on this
    // rank's rows: no gather (the MoE is per token).
    if (recompute_norm_) norm_forward(ops, ln2_, moe_input(v), Tensor{}, Tensor{}, v.h);
    moe_->backward(ops, d_ln, dx, moe_input(v), a.moe, a.moe_loss_scale);
    norm_backward(ops, ln2_, dx, d_ln, v.h, v.mean2, v.rstd2);
    row_backward(dx, v.d_h, attn_proj);
    return attention_backward(ops, dx, x, v);
  }
  // MLP branch: its output gradient is dx (the gradient w.r.t. y); the parallel block's attention projection
  // reads the same dy.
  row_backward(dx, v.d_h, [&](Tensor dy, int64_t r0, int64_t n) {
    mlp_down_backward(ops, rows(v.d_fc, r0, n), rows(v.d_act, r0, n), dy, rows(v.act, r0, n), rows(v.fc, r0, n),
                      row_bias_grad(mlp_proj_));
    if (!seq) attn_proj(dy, r0, n);
  });
  if (seq) {
    rebuild_norm(ops, ln2_, v.ln2, v.ln2_out, v.h);
    column_backward(ops, d_ln, v.N, {{c_fc_, v.d_fc, v.ln2}});
    // dh = dy + LN2'(d_ln); dx holds dy, so LN2 backward accumulates into it: dx becomes dh, the attention
    // branch's output gradient.
    norm_backward(ops, ln2_, dx, d_ln, v.h, v.mean2, v.rstd2);
    row_backward(dx, v.d_h, attn_proj);
  }
  attention_backward(ops, dx, x, v);
}

// The attention branch's backward from v.d_att (its output projection's input gradient) down to dx.
void Block::attention_backward(Ops& ops, Tensor dx, Tensor x, const Views& v) const {
  const bool seq = cfg_.block == BlockKind::Sequential;
  Tensor d_ln = v.d_ln.slice0(0, v.Ns);
  ops.attention_backward(v.d_qkv, v.d_att, v.qkv, v.att, v.lse, v.as);
  if (cfg_.pos == PosKind::Rope) ops.rope_backward(v.d_qkv, v.as, cfg_.rope_freqs());
  // LN1's output fed c_attn and, in the parallel block, c_fc too: their input gradients add. The single-process
  // and tp paths have always added them in opposite orders (c_fc first at tp = 1, c_attn first at tp > 1); each
  // keeps its order so that its losses stay bit-identical.
  std::vector<ColumnGrad> ln1_readers = {{c_attn_, v.d_qkv, v.ln1}};
  if (!seq) ln1_readers.insert(tp_ ? ln1_readers.end() : ln1_readers.begin(), ColumnGrad{c_fc_, v.d_fc, v.ln1});
  rebuild_norm(ops, ln1_, v.ln1, v.ln1_out, x);
  column_backward(ops, d_ln, v.N, ln1_readers);
  norm_backward(ops, ln1_, dx, d_ln, x, v.mean1, v.rstd1);
}

}  // namespace mt
