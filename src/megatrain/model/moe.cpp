#include "megatrain/model/moe.h"

#include <fmt/format.h>

#include <algorithm>

#include "megatrain/core/error.h"

namespace mt {

namespace {

Tensor rows_of(const Buffer& b, int64_t rows, int64_t cols, DType dt = DType::F32) {
  Tensor t(b.data(), {rows, cols}, dt, b.device());
  MT_CHECK(t.nbytes() <= b.size(), "MoE: a [{}, {}] view exceeds its buffer of {} bytes", rows, cols, b.size());
  return t;
}

}  // namespace

void MoeActs::allocate(const ModelConfig& cfg, int64_t rows, Ops* ops) {
  const int64_t C = cfg.d_model, E = cfg.moe_experts, F = cfg.moe_ff_dim(), A = rows * cfg.moe_top_k;
  const int64_t SF = int64_t{cfg.moe_shared_experts} * F;
  dtype = ops ? ops->compute_dtype() : DType::F32;
  auto mem = [&](int64_t n, DType dt) {
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(n, 1)) * dtype_size(dt);
    return ops ? ops->alloc(bytes) : host_buffer(bytes);
  };
  auto f = [&](int64_t n) { return mem(n, dtype); };
  logits = f(rows * E), xp = f(A * C), fc = f(A * 2 * F), act = f(A * F), yp = f(A * C);
  d_yp = f(A * C), d_fc = f(A * 2 * F), d_act = f(A * F), d_xp = f(A * C);
  d_gate = mem(A, DType::F32), d_logits = f(rows * E), tmp = f(rows * C);
  if (SF > 0) s_fc = f(rows * 2 * SF), s_act = f(rows * SF), s_dfc = f(rows * 2 * SF), s_dact = f(rows * SF);
  if (ops && ops->device() != Device::CPU)
    logits_f32 = mem(rows * E, DType::F32), d_logits_f32 = mem(rows * E, DType::F32);
  // Without ops the CPU backend's: its routing view is the host routing itself (allocate only records the size).
  routing_buffers.allocate(ops ? *ops : *make_cpu_ops(), rows, cfg.moe_top_k);
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

const float* MoeFfn::host_logits(Ops& ops, MoeActs& a, Tensor logits) const {
  if (ops.device() == Device::CPU) return logits.f32();
  const int64_t N = logits.size(0), E = logits.size(1);
  Tensor staged = rows_of(a.logits_f32, N, E);
  ops.convert(staged, logits);
  a.logits_host.resize(static_cast<size_t>(N * E));
  ops.to_host(a.logits_host.data(), staged);
  return a.logits_host.data();
}

const float* MoeFfn::host_bias(Ops& ops, MoeActs& a) const {
  if (bias_ < 0) return nullptr;
  if (ops.device() == Device::CPU) return params_.weight(bias_).f32();
  a.bias_host.resize(static_cast<size_t>(cfg_.moe_experts));
  ops.to_host(a.bias_host.data(), params_.param(bias_));
  return a.bias_host.data();
}

void MoeFfn::forward(Ops& ops, Tensor out, Tensor in, MoeActs& a, const std::function<void()>& while_dispatch) const {
  if (ep_) {
    MT_CHECK(ops.device() == Device::CPU, "parallel.ep: the MoE layer's expert parallelism runs on train.device = "
                                          "\"cpu\" only for now");
    return forward_ep(ops, out, in, a, while_dispatch);
  }
  if (while_dispatch) while_dispatch();  // nothing to hide it behind
  MT_CHECK(!group_ || ops.device() == Device::CPU,
           "parallel.tp: the MoE layer under tensor parallelism runs on train.device = \"cpu\" only for now");
  const int64_t N = in.size(0), E = cfg_.moe_experts;
  Tensor logits = rows_of(a.logits, N, E, a.dtype);
  ops.matmul_forward(logits, in, params_.weight(router_), Tensor{});
  const float* lg = host_logits(ops, a, logits);
  MoeRouting& r = a.routing;
  moe_route(r, lg, N, static_cast<int>(E), cfg_.moe_top_k, cfg_.moe_router, host_bias(ops, a),
            cfg_.moe_capacity_factor);
  a.device_routing = a.routing_buffers.upload(ops, r);
  routed_forward(ops, out, in, a);
  shared_forward(ops, out, in, a);
  if (group_) return share_batch(a, lg);
  a.aux = cfg_.moe_aux_loss > 0 ? moe_aux_loss(r) : 0.0;
  a.z = cfg_.moe_z_loss > 0 ? moe_z_loss(lg, N, static_cast<int>(E)) : 0.0;
}

// Permute, the experts' SwiGLUs as two grouped GEMMs, combine.
void MoeFfn::routed_forward(Ops& ops, Tensor out, Tensor in, MoeActs& a) const {
  const int64_t C = cfg_.d_model, F = cfg_.moe_ff_dim(), A = a.routing.rows();
  const DType dt = a.dtype;
  Tensor xp = rows_of(a.xp, A, C, dt), fc = rows_of(a.fc, A, 2 * F, dt), act = rows_of(a.act, A, F, dt);
  Tensor yp = rows_of(a.yp, A, C, dt);
  const std::vector<int64_t>& off = a.routing.offsets;
  ops.moe_permute(xp, in, a.device_routing);
  ops.moe_grouped_matmul_forward(fc, xp, params_.weight(w13_), off);
  if (A > 0) ops.swiglu_forward(act, fc);
  ops.moe_grouped_matmul_forward(yp, act, params_.weight(w2_), off);
  ops.moe_combine(out, yp, a.device_routing);
}

// out += the shared experts' SwiGLU (if any).
void MoeFfn::shared_forward(Ops& ops, Tensor out, Tensor in, MoeActs& a) const {
  if (s13_ < 0) return;
  const int64_t N = in.size(0), C = cfg_.d_model, SF = int64_t{cfg_.moe_shared_experts} * cfg_.moe_ff_dim();
  const DType dt = a.dtype;
  Tensor s_fc = rows_of(a.s_fc, N, 2 * SF, dt), s_act = rows_of(a.s_act, N, SF, dt);
  ops.matmul_forward(s_fc, in, params_.weight(s13_), Tensor{});
  ops.swiglu_forward(s_act, s_fc);
  ops.matmul_forward_add(out, s_act, params_.weight(s2_), Tensor{}, out, rows_of(a.tmp, N, C, dt));
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
  ops.zero(din);
  routed_backward(ops, din, dout, a);
  router_backward(ops, din, in, a, loss_scale);
  shared_backward(ops, din, dout, in, a);
}

// Routed experts: combine, down-projection, SwiGLU, up-projection, back to the tokens (din += their gradient).
void MoeFfn::routed_backward(Ops& ops, Tensor din, Tensor dout, MoeActs& a) const {
  const int64_t C = cfg_.d_model, F = cfg_.moe_ff_dim();
  const MoeRouting& r = a.routing;
  const int64_t A = r.rows();
  const DType dt = a.dtype;
  Tensor d_yp = rows_of(a.d_yp, A, C, dt), d_act = rows_of(a.d_act, A, F, dt), d_fc = rows_of(a.d_fc, A, 2 * F, dt);
  Tensor d_xp = rows_of(a.d_xp, A, C, dt);
  Tensor d_gate = rows_of(a.d_gate, r.N, r.k);
  ops.moe_combine_backward(d_yp, d_gate, dout, rows_of(a.yp, A, C, dt), a.device_routing);
  ops.moe_grouped_matmul_backward(d_act, params_.grad(w2_), d_yp, rows_of(a.act, A, F, dt), params_.weight(w2_),
                                  r.offsets, !params_.take_fresh_grad(w2_));
  if (A > 0) ops.swiglu_backward(d_fc, rows_of(a.fc, A, 2 * F, dt), d_act);
  ops.moe_grouped_matmul_backward(d_xp, params_.grad(w13_), d_fc, rows_of(a.xp, A, C, dt), params_.weight(w13_),
                                  r.offsets, !params_.take_fresh_grad(w13_));
  ops.moe_permute_backward(din, d_xp, a.device_routing);
}

// Router: through the gates (d_gate, from the combine's backward), plus the auxiliary losses (scaled as the
// cross-entropy's gradient is); din += its input gradient. The logits' gradient is host math over [N, E] (the
// routing's own terms): on a device backend the gate gradient comes down and the logits' gradient goes up.
void MoeFfn::router_backward(Ops& ops, Tensor din, Tensor in, MoeActs& a, float loss_scale) const {
  const int64_t N = in.size(0), E = cfg_.moe_experts;
  const float aux = cfg_.moe_aux_loss * loss_scale, z = cfg_.moe_z_loss * loss_scale;
  Tensor d_logits = rows_of(a.d_logits, N, E, a.dtype);
  if (ops.device() == Device::CPU) {
    moe_router_backward(d_logits.f32(), static_cast<const float*>(a.d_gate.data()), rows_of(a.logits, N, E).f32(),
                        a.routing, aux, z);
  } else {
    a.d_gate_host.resize(static_cast<size_t>(N * a.routing.k));
    ops.to_host(a.d_gate_host.data(), rows_of(a.d_gate, N, a.routing.k));
    a.d_logits_host.resize(static_cast<size_t>(N * E));
    moe_router_backward(a.d_logits_host.data(), a.d_gate_host.data(), a.logits_host.data(), a.routing, aux, z);
    Tensor staged = rows_of(a.d_logits_f32, N, E);
    ops.to_device(staged, a.d_logits_host.data());
    ops.convert(d_logits, staged);
  }
  ops.matmul_backward(din, params_.grad(router_), Tensor{}, d_logits, in, params_.weight(router_), true,
                      !params_.take_fresh_grad(router_));
}

// The shared experts (if any): their parameters' gradients, and din += their input gradient.
void MoeFfn::shared_backward(Ops& ops, Tensor din, Tensor dout, Tensor in, MoeActs& a) const {
  if (s13_ < 0) return;
  const int64_t N = in.size(0), SF = int64_t{cfg_.moe_shared_experts} * cfg_.moe_ff_dim();
  const DType dt = a.dtype;
  Tensor s_dact = rows_of(a.s_dact, N, SF, dt), s_dfc = rows_of(a.s_dfc, N, 2 * SF, dt);
  ops.matmul_backward(s_dact, params_.grad(s2_), Tensor{}, dout, rows_of(a.s_act, N, SF, dt), params_.weight(s2_),
                      false, !params_.take_fresh_grad(s2_));
  ops.swiglu_backward(s_dfc, rows_of(a.s_fc, N, 2 * SF, dt), s_dact);
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
