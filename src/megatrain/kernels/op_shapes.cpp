#include "megatrain/kernels/op_shapes.h"

#include <cmath>
#include <vector>

#include "megatrain/core/bits_hash.h"
#include "megatrain/kernels/cpu/moe.h"

namespace mt {

Tensor segment(const Tensor& flat, const AdamSegment& s) {
  MT_CHECK(s.offset >= 0 && s.numel >= 0 && s.offset + s.numel <= flat.numel(),
           "segment [{}, {}) is outside a flat tensor of {} elements", s.offset, s.offset + s.numel, flat.numel());
  Tensor t = flat;
  t.ptr = static_cast<char*>(flat.ptr) + static_cast<size_t>(s.offset) * dtype_size(flat.dtype);
  t.ndim = 1;
  t.dims = {};
  t.dims[0] = s.numel;
  return t;
}

void check_numel(const Tensor& t, int64_t n, const char* op, const char* name) {
  MT_CHECK(t.numel() == n, "{}: {} {} has {} elements, expected {}", op, name, t.shape_str(), t.numel(), n);
}

// ---- mixture of experts --------------------------------------------------------------------------------------

MoeDims moe_dims(const char* op, const MoeDeviceRouting& r, const Tensor& tokens, const char* tokens_name,
                 const Tensor& permuted, const char* permuted_name) {
  MT_CHECK(r.host, "{}: the routing has no host routing (MoeDeviceRouting::host)", op);
  const MoeRouting& h = *r.host;
  const int64_t N = h.N, A = h.rows();
  MT_CHECK(int64_t(h.row.size()) == N * h.k && int64_t(h.token.size()) == A && int64_t(h.gate.size()) == N * h.k,
           "{}: the host routing is incomplete (route it with moe_route)", op);
  if (r.row.defined()) check_numel(r.row, N * h.k, op, "routing row");
  if (r.gate.defined()) check_numel(r.gate, N * h.k, op, "routing gate");
  if (r.token.defined()) check_numel(r.token, A, op, "routing token");
  MT_CHECK(tokens.defined() && tokens.ndim >= 1, "{}: {} is required", op, tokens_name);
  const int64_t C = tokens.size(-1);
  check_numel(tokens, N * C, op, tokens_name);
  if (permuted.defined() || A > 0) check_numel(permuted, A * C, op, permuted_name);
  return {N, A, C, h.k};
}

GroupedDims grouped_dims(const char* op, const Tensor& out, const Tensor& in, const Tensor& w,
                         const std::vector<int64_t>& offsets) {
  MT_CHECK(w.ndim == 3, "{}: w must be 3-D [E, O, I] (got {})", op, w.shape_str());
  const int64_t E = w.size(0), O = w.size(1), I = w.size(2);
  MT_CHECK(int64_t(offsets.size()) == E + 1 && offsets[0] == 0, "{}: offsets must be [E + 1] = [{}] from 0", op, E + 1);
  for (int64_t e = 0; e < E; ++e)
    MT_CHECK(offsets[e] <= offsets[e + 1], "{}: offsets decrease at expert {} ({} > {})", op, e, offsets[e],
             offsets[e + 1]);
  const int64_t A = offsets[E];
  if (in.defined()) check_numel(in, A * I, op, "in");
  if (out.defined()) check_numel(out, A * O, op, "out");
  return {E, O, I, A};
}

// ---- embedding -----------------------------------------------------------------------------------------------

int64_t seq_len(const Tensor& tokens) { return tokens.ndim >= 2 ? tokens.size(-1) : tokens.numel(); }

namespace {

// table [V, C] (named tname), rows [N, C] (rname), positions [max_T, C] (pname, may be undefined).
EmbeddingDims embedding_shapes(const char* op, const Tensor& rows, const char* rname, const Tensor& tokens,
                               const Tensor& table, const char* tname, const Tensor& pos, const char* pname) {
  MT_CHECK(table.ndim == 2, "{}: {} must be 2-D [V, C] (got {})", op, tname, table.shape_str());
  const int64_t C = table.size(1), N = tokens.numel(), T = seq_len(tokens);
  check_numel(rows, N * C, op, rname);
  if (pos.defined()) {
    MT_CHECK(pos.ndim == 2 && pos.size(1) == C, "{}: {} {} must be [max_T, {}]", op, pname, pos.shape_str(), C);
    MT_CHECK(T <= pos.size(0), "{}: sequence length {} exceeds the {} positions of {}", op, T, pos.size(0), pname);
  }
  return {N, T, C, table.size(0)};
}

}  // namespace

EmbeddingDims embedding_dims(const char* op, const Tensor& out, const Tensor& tokens, const Tensor& wte,
                             const Tensor& wpe) {
  return embedding_shapes(op, out, "out", tokens, wte, "wte", wpe, "wpe");
}

EmbeddingDims embedding_backward_dims(const char* op, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                      const Tensor& tokens) {
  return embedding_shapes(op, dout, "dout", tokens, dwte, "dwte", dwpe, "dwpe");
}

// ---- linear --------------------------------------------------------------------------------------------------

LinearDims weight_dims(const char* op, const Tensor& w) {
  MT_CHECK(w.ndim == 2, "{}: weight must be 2-D [OC, C] (got {})", op, w.shape_str());
  return {0, w.size(1), w.size(0)};
}

int64_t linear_rows(const char* op, const Tensor& inp, const Tensor& w, int64_t C) {
  MT_CHECK(inp.ndim >= 1 && inp.size(-1) == C, "{}: input {} does not end in C = {} (weight {})", op, inp.shape_str(),
           C, w.shape_str());
  return C > 0 ? inp.numel() / C : 0;
}

// ---- normalisation -------------------------------------------------------------------------------------------

NormDims norm_dims(const char* op, const Tensor& inp, const Tensor& w) {
  MT_CHECK(inp.ndim >= 1, "{}: input must have at least one dimension", op);
  const int64_t C = inp.size(-1);
  MT_CHECK(C > 0, "{}: input {} has an empty last dimension", op, inp.shape_str());
  check_numel(w, C, op, "w");
  return {inp.numel() / C, C};
}

NormDims layernorm_dims(const char* op, const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                        const Tensor& w, const Tensor& b) {
  const NormDims d = norm_dims(op, inp, w);
  check_numel(out, d.N * d.C, op, "out");
  if (mean.defined()) check_numel(mean, d.N, op, "mean");
  if (rstd.defined()) check_numel(rstd, d.N, op, "rstd");
  if (b.defined()) check_numel(b, d.C, op, "b");
  return d;
}

NormDims rmsnorm_dims(const char* op, const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& w) {
  return layernorm_dims(op, out, Tensor{}, rstd, inp, w, Tensor{});
}

NormDims layernorm_backward_dims(const char* op, const Tensor& dinp, const Tensor& dw, const Tensor& db,
                                 const Tensor& dout, const Tensor& inp, const Tensor& w, const Tensor& mean,
                                 const Tensor& rstd) {
  const NormDims d = norm_dims(op, inp, w);
  check_numel(dinp, d.N * d.C, op, "dinp");
  check_numel(dout, d.N * d.C, op, "dout");
  check_numel(dw, d.C, op, "dw");
  if (db.defined()) check_numel(db, d.C, op, "db");
  if (mean.defined()) check_numel(mean, d.N, op, "mean");  // undefined only for RMSNorm (LayerNorm callers require it)
  check_numel(rstd, d.N, op, "rstd");
  return d;
}

NormDims rmsnorm_backward_dims(const char* op, const Tensor& dinp, const Tensor& dw, const Tensor& dout,
                               const Tensor& inp, const Tensor& w, const Tensor& rstd) {
  return layernorm_backward_dims(op, dinp, dw, Tensor{}, dout, inp, w, Tensor{}, rstd);
}

// ---- attention -----------------------------------------------------------------------------------------------

void check_attn_shape(const char* op, const AttnShape& s) {
  MT_CHECK(s.B > 0 && s.T > 0, "{}: B ({}) and T ({}) must be positive", op, s.B, s.T);
  MT_CHECK(s.n_head > 0 && s.n_kv_head > 0 && s.head_dim > 0,
           "{}: n_head ({}), n_kv_head ({}) and head_dim ({}) must be positive", op, s.n_head, s.n_kv_head, s.head_dim);
  MT_CHECK(s.n_head % s.n_kv_head == 0, "{}: n_head ({}) must be a multiple of n_kv_head ({})", op, s.n_head,
           s.n_kv_head);
  MT_CHECK(s.window >= 0, "{}: window must be >= 0 (got {})", op, s.window);
}

void check_attention_forward(const char* op, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                             const AttnShape& s) {
  check_numel(qkv, int64_t{s.B} * s.T * s.qkv_width(), op, "qkv");
  check_numel(out, int64_t{s.B} * s.T * s.n_head * s.head_dim, op, "out");
  check_numel(lse, int64_t{s.B} * s.n_head * s.T, op, "lse");
}

void check_rope(const char* op, const Tensor& qkv, const AttnShape& s, const RopeFreqs& f) {
  MT_CHECK(s.B > 0 && s.T > 0 && s.n_head > 0 && s.n_kv_head > 0, "{}: bad attention shape", op);
  MT_CHECK(s.head_dim > 0 && s.head_dim % 2 == 0, "{}: head_dim must be even and positive (got {})", op, s.head_dim);
  MT_CHECK(f.theta > 0, "{}: theta must be positive (got {})", op, f.theta);
  MT_CHECK(f.scaling == 0 ||
               (f.scaling > 0 && f.low_freq_factor > 0 && f.high_freq_factor > f.low_freq_factor && f.original_len > 0),
           "{}: RoPE scaling {} needs 0 < low_freq_factor ({}) < high_freq_factor ({}) and original_len ({}) > 0", op,
           f.scaling, f.low_freq_factor, f.high_freq_factor, f.original_len);
  check_numel(qkv, int64_t{s.B} * s.T * s.qkv_width(), op, "qkv");
}

// ---- activations ---------------------------------------------------------------------------------------------

int64_t gelu_numel(const char* op, const Tensor& out, const Tensor& inp) {
  const int64_t n = inp.numel();
  check_numel(out, n, op, "out");
  return n;
}

int64_t gelu_backward_numel(const char* op, const Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  const int64_t n = inp.numel();
  check_numel(dinp, n, op, "dinp");
  check_numel(dout, n, op, "dout");
  return n;
}

namespace {

SwigluDims swiglu_inp(const char* op, const Tensor& inp) {
  MT_CHECK(inp.ndim >= 1 && inp.size(-1) % 2 == 0 && inp.size(-1) > 0,
           "{}: input {} must end in an even width 2F = [gate | up]", op, inp.shape_str());
  const int64_t F = inp.size(-1) / 2;
  return {inp.numel() / (2 * F), F};
}

}  // namespace

SwigluDims swiglu_dims(const char* op, const Tensor& out, const Tensor& inp) {
  const SwigluDims d = swiglu_inp(op, inp);
  check_numel(out, d.N * d.F, op, "out");
  return d;
}

SwigluDims swiglu_backward_dims(const char* op, const Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  const SwigluDims d = swiglu_inp(op, inp);
  check_numel(dinp, d.N * 2 * d.F, op, "dinp");
  check_numel(dout, d.N * d.F, op, "dout");
  return d;
}

// ---- loss ----------------------------------------------------------------------------------------------------

CeDims cross_entropy_dims(const char* op, const Tensor& losses, const Tensor& logits, const Tensor& targets, int V) {
  MT_CHECK(logits.ndim >= 1 && logits.size(-1) > 0, "{}: logits {} need a vocabulary dimension", op,
           logits.shape_str());
  const int64_t Vp = logits.size(-1), N = logits.numel() / Vp;
  MT_CHECK(V > 0 && V <= Vp, "{}: real vocabulary V = {} must be in [1, {}] (the logits' padded width)", op, V, Vp);
  check_numel(targets, N, op, "targets");
  check_numel(losses, N, op, "losses");
  return {N, Vp};
}

VpDims vp_ce_dims(const char* op, const Tensor& stats, const Tensor& logits, int n_real) {
  MT_CHECK(logits.ndim >= 1 && logits.size(-1) > 0, "{}: logits {} need a vocabulary dimension", op,
           logits.shape_str());
  const int64_t Vl = logits.size(-1), N = logits.numel() / Vl;
  MT_CHECK(n_real >= 0 && n_real <= Vl, "{}: n_real = {} must be in [0, {}] (the local logits' width)", op, n_real, Vl);
  check_numel(stats, 3 * N, op, "stats");
  return {N, Vl};
}

// ---- optimizers ----------------------------------------------------------------------------------------------

AdamConsts adam_consts(const char* op, const AdamHParams& h) {
  MT_CHECK(h.step >= 1, "{}: step must be >= 1 (1-based, for bias correction; got {})", op, h.step);
  MT_CHECK(h.beta1 >= 0 && h.beta1 < 1 && h.beta2 >= 0 && h.beta2 < 1,
           "{}: beta1 ({}) and beta2 ({}) must be in [0, 1)", op, h.beta1, h.beta2);
  const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), h.step);
  const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), h.step);
  return {h.beta1,
          h.beta2,
          1.0f - h.beta1,
          1.0f - h.beta2,
          static_cast<float>(1.0 / bc1),
          static_cast<float>(1.0 / bc2),
          h.eps,
          h.weight_decay,
          h.grad_scale};
}

int64_t optimizer_numel(const char* op, const Tensor& param, const Tensor& m, const Tensor& v) {
  const int64_t n = param.numel();
  check_numel(m, n, op, "m");
  check_numel(v, n, op, "v");
  return n;
}

void lamb_multi_check(const char* op, const Tensor& norms, const std::vector<AdamSegment>& segs, int64_t n,
                      Device device) {
  auto where = [](Device d) { return d == Device::CPU ? "host" : "device"; };
  if (segs.empty() && !norms.defined()) return;  // nothing to do, nothing to write
  MT_CHECK(norms.defined(), "{}: norms is undefined (F32 [2 * {} segments] expected)", op, segs.size());
  MT_CHECK(norms.dtype == DType::F32, "{}: norms must be F32 (got {})", op, dtype_name(norms.dtype));
  MT_CHECK(norms.device == device, "{}: norms must be in {} memory (got {} memory)", op, where(device),
           where(norms.device));
  check_numel(norms, 2 * static_cast<int64_t>(segs.size()), op, "norms (2 per segment)");
  for (const AdamSegment& s : segs)
    MT_CHECK(s.offset >= 0 && s.numel >= 0 && s.offset + s.numel <= n,
             "{}: segment [{}, {}) is outside the flat buffers of {} elements", op, s.offset, s.offset + s.numel, n);
}

// ---- the Ops defaults of the multi-tensor LAMB: the per-tensor ops, segment by segment --------------------------

uint64_t Ops::bits_hash(Tensor t) {
  MT_CHECK(t.dtype == DType::F32 || t.dtype == DType::I32, "bits_hash: F32 or I32, not {}", dtype_name(t.dtype));
  if (device() == Device::CPU) return mt::bits_hash(t.ptr, size_t(t.numel()));
  std::vector<uint32_t> host(size_t(t.numel()));
  to_host(host.data(), t);
  return mt::bits_hash(host.data(), host.size());
}

void Ops::lamb_moments_multi(Tensor param, Tensor grad, Tensor m, Tensor v, const std::vector<AdamSegment>& segs,
                             const AdamHParams& h, Tensor norms) {
  const char* op = "lamb_moments_multi";
  check_numel(grad, optimizer_numel(op, param, m, v), op, "grad");
  lamb_multi_check(op, norms, segs, param.numel(), device());
  if (segs.empty()) return;
  std::vector<float> host(2 * segs.size());
  for (size_t k = 0; k < segs.size(); ++k) {
    const AdamSegment& s = segs[k];
    AdamHParams hs = h;
    hs.weight_decay = s.weight_decay;
    const Tensor p = segment(param, s);
    host[2 * k + 1] = static_cast<float>(lamb_moments(p, segment(grad, s), segment(m, s), segment(v, s), hs));
    host[2 * k] = static_cast<float>(sum_squares(p));
  }
  to_device(norms, host.data());
}

void Ops::lamb_apply_multi(Tensor param, Tensor m, Tensor v, const std::vector<AdamSegment>& segs, const AdamHParams& h,
                           Tensor norms) {
  const char* op = "lamb_apply_multi";
  optimizer_numel(op, param, m, v);
  lamb_multi_check(op, norms, segs, param.numel(), device());
  if (segs.empty()) return;
  std::vector<float> host(2 * segs.size());
  to_host(host.data(), norms);
  for (size_t k = 0; k < segs.size(); ++k) {
    const AdamSegment& s = segs[k];
    AdamHParams hs = h;
    hs.weight_decay = s.weight_decay;
    lamb_apply(segment(param, s), segment(m, s), segment(v, s), hs, lamb_trust(host[2 * k], host[2 * k + 1]));
  }
}

}  // namespace mt
