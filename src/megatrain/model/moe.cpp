#include "megatrain/model/moe.h"

#include <fmt/format.h>

#include <algorithm>

#include "megatrain/core/error.h"

namespace mt {

namespace {

Tensor rows_of(const Buffer& b, int64_t rows, int64_t cols) {
  Tensor t(b.data(), {rows, cols});
  MT_CHECK(t.nbytes() <= b.size(), "MoE: a [{}, {}] view exceeds its buffer of {} bytes", rows, cols, b.size());
  return t;
}

}  // namespace

void MoeActs::allocate(const ModelConfig& cfg, int64_t rows) {
  const int64_t C = cfg.d_model, E = cfg.moe_experts, F = cfg.moe_ff_dim(), A = rows * cfg.moe_top_k;
  const int64_t SF = int64_t{cfg.moe_shared_experts} * F;
  auto f = [](int64_t n) { return host_buffer(static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float)); };
  logits = f(rows * E), xp = f(A * C), fc = f(A * 2 * F), act = f(A * F), yp = f(A * C);
  d_yp = f(A * C), d_fc = f(A * 2 * F), d_act = f(A * F), d_xp = f(A * C);
  d_gate = f(A), d_logits = f(rows * E), tmp = f(rows * C);
  if (SF > 0) s_fc = f(rows * 2 * SF), s_act = f(rows * SF), s_dfc = f(rows * 2 * SF), s_dact = f(rows * SF);
}

MoeFfn::MoeFfn(const ModelConfig& cfg, ParamStore& params, int layer, EpComm* ep) : cfg_(cfg), params_(params) {
  if (ep && ep->size() > 1) ep_ = ep;
  const std::string p = fmt::format("h.{}.moe.", layer);
  router_ = params.index(p + "router.weight");
  if (cfg.moe_router == MoeRouter::SigmoidBias) bias_ = params.index(p + "router.bias");
  w13_ = params.index(p + "experts.c_fc.weight");
  w2_ = params.index(p + "experts.c_proj.weight");
  if (cfg.moe_shared_experts > 0) {
    s13_ = params.index(p + "shared.c_fc.weight");
    s2_ = params.index(p + "shared.c_proj.weight");
  }
}

void MoeFfn::forward(Ops& ops, Tensor out, Tensor in, MoeActs& a) const {
  MT_CHECK(ops.device() == Device::CPU, "model.moe_experts: the MoE layer runs on the CPU only for now");
  if (ep_) return forward_ep(ops, out, in, a);
  const int64_t N = in.size(0), C = cfg_.d_model, E = cfg_.moe_experts, F = cfg_.moe_ff_dim();
  const int k = cfg_.moe_top_k;
  Tensor logits = rows_of(a.logits, N, E);
  ops.matmul_forward(logits, in, params_.weight(router_), Tensor{});
  MoeRouting& r = a.routing;
  moe_route(r, logits.f32(), N, static_cast<int>(E), k, cfg_.moe_router,
            bias_ >= 0 ? params_.weight(bias_).f32() : nullptr, cfg_.moe_capacity_factor);
  const int64_t A = r.rows();
  Tensor xp = rows_of(a.xp, A, C), fc = rows_of(a.fc, A, 2 * F), act = rows_of(a.act, A, F);
  Tensor yp = rows_of(a.yp, A, C);
  moe_permute(xp, in, r);
  moe_grouped_forward(ops, fc, xp, params_.weight(w13_), r.offsets);
  if (A > 0) ops.swiglu_forward(act, fc);
  moe_grouped_forward(ops, yp, act, params_.weight(w2_), r.offsets);
  moe_combine(out, yp, r);
  if (s13_ >= 0) {
    const int64_t SF = int64_t{cfg_.moe_shared_experts} * F;
    Tensor s_fc = rows_of(a.s_fc, N, 2 * SF), s_act = rows_of(a.s_act, N, SF);
    ops.matmul_forward(s_fc, in, params_.weight(s13_), Tensor{});
    ops.swiglu_forward(s_act, s_fc);
    ops.matmul_forward_add(out, s_act, params_.weight(s2_), Tensor{}, out, rows_of(a.tmp, N, C));
  }
  if (group_) return share_batch(a, logits.f32());
  a.aux = cfg_.moe_aux_loss > 0 ? moe_aux_loss(r) : 0.0;
  a.z = cfg_.moe_z_loss > 0 ? moe_z_loss(logits.f32(), N, static_cast<int>(E)) : 0.0;
}

void MoeFfn::share_batch(MoeActs& a, const float* logits) const {
  MoeRouting& r = a.routing;
  const int E = r.E;
  // [routed (E) | probability sums (E) | dropped | tokens | z sum]: the counts are exact in fp32 up to 2^24.
  MT_CHECK(r.N * r.k * group_->size() < (int64_t{1} << 24),
           "model.moe_experts: a micro-batch of {} tokens x top-k {} over {} ranks is too large to share its "
           "routing counts (fp32); lower data.batch_size * data.seq_len",
           r.N * group_->size(), r.k, group_->size());
  std::vector<double> P(E);
  moe_prob_sums(r, P.data());
  std::vector<float> v(2 * E + 3);
  for (int e = 0; e < E; ++e) v[e] = static_cast<float>(r.routed[e]), v[E + e] = static_cast<float>(P[e]);
  v[2 * E] = static_cast<float>(r.dropped);
  v[2 * E + 1] = static_cast<float>(r.N);
  v[2 * E + 2] = static_cast<float>(moe_z_loss(logits, r.N, E) * double(r.N));
  group_->allreduce(f32_view(v.data(), {static_cast<int64_t>(v.size())}), TpReduce::Sum);
  for (int e = 0; e < E; ++e) r.batch_routed[e] = static_cast<int64_t>(v[e]), P[e] = v[E + e];
  r.batch_dropped = static_cast<int64_t>(v[2 * E]);
  r.batch_N = static_cast<int64_t>(v[2 * E + 1]);
  a.aux = cfg_.moe_aux_loss > 0 ? moe_aux_from_sums(r, P.data()) : 0.0;
  a.z = cfg_.moe_z_loss > 0 ? double(v[2 * E + 2]) / double(r.batch_N) : 0.0;
}

void MoeFfn::backward(Ops& ops, Tensor din, Tensor dout, Tensor in, MoeActs& a, float loss_scale) const {
  if (ep_) return backward_ep(ops, din, dout, in, a, loss_scale);
  const int64_t C = cfg_.d_model, F = cfg_.moe_ff_dim();
  const MoeRouting& r = a.routing;
  const int64_t A = r.rows();
  Tensor d_yp = rows_of(a.d_yp, A, C), d_act = rows_of(a.d_act, A, F), d_fc = rows_of(a.d_fc, A, 2 * F);
  Tensor d_xp = rows_of(a.d_xp, A, C);
  float* d_gate = static_cast<float*>(a.d_gate.data());
  // Routed experts: combine, down-projection, SwiGLU, up-projection, back to the tokens.
  moe_combine_backward(d_yp, d_gate, dout, rows_of(a.yp, A, C), r);
  moe_grouped_backward(ops, d_act, params_.grad(w2_), d_yp, rows_of(a.act, A, F), params_.weight(w2_), r.offsets,
                       !params_.take_fresh_grad(w2_));
  if (A > 0) ops.swiglu_backward(d_fc, rows_of(a.fc, A, 2 * F), d_act);
  moe_grouped_backward(ops, d_xp, params_.grad(w13_), d_fc, rows_of(a.xp, A, C), params_.weight(w13_), r.offsets,
                       !params_.take_fresh_grad(w13_));
  ops.zero(din);
  moe_permute_backward(din, d_xp, r);
  router_backward(ops, din, in, a, loss_scale);
  shared_backward(ops, din, dout, in, a);
}

// Router: through the gates (d_gate, from the combine's backward), plus the auxiliary losses (scaled as the
// cross-entropy's gradient is); din += its input gradient.
void MoeFfn::router_backward(Ops& ops, Tensor din, Tensor in, MoeActs& a, float loss_scale) const {
  const int64_t N = in.size(0), E = cfg_.moe_experts;
  Tensor d_logits = rows_of(a.d_logits, N, E);
  moe_router_backward(d_logits.f32(), static_cast<const float*>(a.d_gate.data()), rows_of(a.logits, N, E).f32(),
                      a.routing, cfg_.moe_aux_loss * loss_scale, cfg_.moe_z_loss * loss_scale);
  ops.matmul_backward(din, params_.grad(router_), Tensor{}, d_logits, in, params_.weight(router_), true,
                      !params_.take_fresh_grad(router_));
}

// The shared experts (if any): their parameters' gradients, and din += their input gradient.
void MoeFfn::shared_backward(Ops& ops, Tensor din, Tensor dout, Tensor in, MoeActs& a) const {
  if (s13_ < 0) return;
  const int64_t N = in.size(0), SF = int64_t{cfg_.moe_shared_experts} * cfg_.moe_ff_dim();
  Tensor s_dact = rows_of(a.s_dact, N, SF), s_dfc = rows_of(a.s_dfc, N, 2 * SF);
  ops.matmul_backward(s_dact, params_.grad(s2_), Tensor{}, dout, rows_of(a.s_act, N, SF), params_.weight(s2_), false,
                      !params_.take_fresh_grad(s2_));
  ops.swiglu_backward(s_dfc, rows_of(a.s_fc, N, 2 * SF), s_dact);
  ops.matmul_backward(din, params_.grad(s13_), Tensor{}, s_dfc, in, params_.weight(s13_), true,
                      !params_.take_fresh_grad(s13_));
}

void moe_update_bias(float* bias, const std::vector<int64_t>& load, float rate) {
  const int E = static_cast<int>(load.size());
  int64_t total = 0;
  for (int64_t l : load) total += l;
  // Compared as load_e * E against the total, in integers: exact, so an exactly balanced expert stays put.
  for (int e = 0; e < E; ++e) {
    const int64_t diff = total - load[e] * E;  // E * (mean_load - load_e)
    bias[e] += diff > 0 ? rate : diff < 0 ? -rate : 0.0f;
  }
}

}  // namespace mt
