// The expert-parallel path of the MoE layer (model/moe.h states the protocol): the counts exchange, the dispatch and
// combine all-to-alls around the local experts' grouped GEMMs, and their mirror in backward.
#include <algorithm>
#include <cstring>

#include "megatrain/core/error.h"
#include "megatrain/model/moe.h"

namespace mt {

namespace {

void ensure_floats(Buffer& b, int64_t n) {
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float);
  if (b.size() < bytes) b = host_buffer(bytes);
}

// (Named apart from moe.cpp's rows_of: both files may be compiled as one unit.)
Tensor ep_rows(const Buffer& b, int64_t rows, int64_t cols) {
  Tensor t(b.data(), {rows, cols});
  MT_CHECK(t.nbytes() <= b.size(), "MoE: a [{}, {}] view exceeds its buffer of {} bytes", rows, cols, b.size());
  return t;
}

// dst[i] = src[order[i]] (gather) or dst[order[i]] = src[i] (scatter), rows of C floats.
void gather_rows(Tensor dst, Tensor src, const std::vector<int64_t>& order) {
  const size_t row = static_cast<size_t>(src.size(1)) * sizeof(float);
  for (size_t i = 0; i < order.size(); ++i)
    std::memcpy(dst.f32() + i * src.size(1), src.f32() + order[i] * src.size(1), row);
}
void scatter_rows(Tensor dst, Tensor src, const std::vector<int64_t>& order) {
  const size_t row = static_cast<size_t>(src.size(1)) * sizeof(float);
  for (size_t i = 0; i < order.size(); ++i)
    std::memcpy(dst.f32() + order[i] * src.size(1), src.f32() + i * src.size(1), row);
}

// From the routing's per-expert offsets: what this rank sends each ep rank, what it receives (after the counts
// exchange), the local experts' offsets and the expert-major order of the received rows.
void plan_exchange(EpComm& ep, const MoeRouting& r, MoeActs& a) {
  const int n = ep.size(), El = r.E / n;
  std::vector<int32_t> send(r.E), recv;
  for (int e = 0; e < r.E; ++e) send[e] = static_cast<int32_t>(r.offsets[e + 1] - r.offsets[e]);
  ep.exchange_counts(recv, send, El);
  a.ep_send.assign(n, 0);
  a.ep_recv.assign(n, 0);
  std::vector<int64_t> src_start(n + 1, 0);
  for (int q = 0; q < n; ++q) {
    a.ep_send[q] = r.offsets[(q + 1) * El] - r.offsets[q * El];
    for (int j = 0; j < El; ++j) a.ep_recv[q] += recv[q * El + j];
    src_start[q + 1] = src_start[q] + a.ep_recv[q];
  }
  a.ep_offsets.assign(El + 1, 0);
  a.ep_order.clear();
  std::vector<int64_t> next(src_start.begin(), src_start.end() - 1);  // per source: its next row of expert j
  for (int j = 0; j < El; ++j) {
    a.ep_offsets[j + 1] = a.ep_offsets[j];
    for (int q = 0; q < n; ++q) {
      for (int i = 0; i < recv[q * El + j]; ++i) a.ep_order.push_back(next[q]++);
      a.ep_offsets[j + 1] += recv[q * El + j];
    }
  }
}

}  // namespace

void MoeFfn::forward_ep(Ops& ops, Tensor out, Tensor in, MoeActs& a,
                        const std::function<void()>& while_dispatch) const {
  const int64_t N = in.size(0), C = cfg_.d_model, E = cfg_.moe_experts, F = cfg_.moe_ff_dim();
  Tensor logits = ep_rows(a.logits, N, E);
  ops.matmul_forward(logits, in, params_.weight(router_), Tensor{});
  MoeRouting& r = a.routing;
  moe_route(r, logits.f32(), N, static_cast<int>(E), cfg_.moe_top_k, cfg_.moe_router,
            bias_ >= 0 ? params_.weight(bias_).f32() : nullptr, cfg_.moe_capacity_factor);
  ensure_floats(a.s_out, N * C);
  Tensor s_out = ep_rows(a.s_out, N, C);
  auto shared = [&] {  // the shared experts (then the caller's work), while the dispatch is in flight
    if (s13_ >= 0) {
      const int64_t SF = int64_t{cfg_.moe_shared_experts} * F;
      Tensor s_fc = ep_rows(a.s_fc, N, 2 * SF), s_act = ep_rows(a.s_act, N, SF);
      ops.matmul_forward(s_fc, in, params_.weight(s13_), Tensor{});
      ops.swiglu_forward(s_act, s_fc);
      ops.matmul_forward(s_out, s_act, params_.weight(s2_), Tensor{});
    }
    if (while_dispatch) while_dispatch();
  };
  auto losses = [&] {    // the auxiliary losses (the rank's own tokens), while the combine is in flight
    if (group_) return;  // shared over the token group below, once the combine is complete
    a.aux = cfg_.moe_aux_loss > 0 ? moe_aux_loss(r) : 0.0;
    a.z = cfg_.moe_z_loss > 0 ? moe_z_loss(logits.f32(), N, static_cast<int>(E)) : 0.0;
  };
  routed_forward_ep(ops, out, in, a, shared, losses);
  // Under tp the micro-batch's tokens are split over the token group as without ep: its counts and losses are the
  // group's (the ep exchange above only moved this rank's rows to the experts' owners and back).
  if (group_) share_batch(a, logits.f32());
  if (s13_ >= 0) {
    float* o = out.f32();
    const float* so = s_out.f32();
    for (int64_t i = 0; i < N * C; ++i) o[i] += so[i];
  }
}

void MoeFfn::routed_forward_ep(Ops& ops, Tensor out, Tensor in, MoeActs& a, const std::function<void()>& while_dispatch,
                               const std::function<void()>& while_combine) const {
  const int64_t C = cfg_.d_model, F = cfg_.moe_ff_dim();
  const MoeRouting& r = a.routing;
  const int64_t A = r.rows();
  Tensor xp = ep_rows(a.xp, A, C);
  moe_permute(xp, in, r);
  plan_exchange(*ep_, r, a);
  const auto R = static_cast<int64_t>(a.ep_order.size());
  ensure_floats(a.xr, R * C), ensure_floats(a.xe, R * C), ensure_floats(a.ye, R * C);
  ensure_floats(a.fce, R * 2 * F), ensure_floats(a.acte, R * F);
  Tensor xr = ep_rows(a.xr, R, C), xe = ep_rows(a.xe, R, C), ye = ep_rows(a.ye, R, C);
  Tensor fce = ep_rows(a.fce, R, 2 * F), acte = ep_rows(a.acte, R, F);
  ep_->exchange_rows(xr, xp, a.ep_recv, a.ep_send, while_dispatch);  // dispatch
  gather_rows(xe, xr, a.ep_order);
  moe_grouped_forward(ops, fce, xe, params_.weight(w13_), a.ep_offsets);
  if (R > 0) ops.swiglu_forward(acte, fce);
  moe_grouped_forward(ops, ye, acte, params_.weight(w2_), a.ep_offsets);
  scatter_rows(xr, ye, a.ep_order);  // back to the source-major order: the outputs to return
  Tensor yp = ep_rows(a.yp, A, C);
  ep_->exchange_rows(yp, xr, a.ep_send, a.ep_recv, while_combine);  // combine
  moe_combine(out, yp, r);
}

void MoeFfn::backward_ep(Ops& ops, Tensor din, Tensor dout, Tensor in, MoeActs& a, float loss_scale) const {
  const int64_t C = cfg_.d_model, A = a.routing.rows();
  moe_combine_backward(ep_rows(a.d_yp, A, C), static_cast<float*>(a.d_gate.data()), dout, ep_rows(a.yp, A, C),
                       a.routing);
  ops.zero(din);
  routed_backward_ep(
      ops, din, dout, a, [&] { shared_backward(ops, din, dout, in, a); },
      [&] { router_backward(ops, din, in, a, loss_scale); });
}

void MoeFfn::routed_backward_ep(Ops& ops, Tensor din, Tensor, MoeActs& a, const std::function<void()>& while_return,
                                const std::function<void()>& while_back) const {
  const int64_t C = cfg_.d_model, F = cfg_.moe_ff_dim();
  const MoeRouting& r = a.routing;
  const int64_t A = r.rows();
  const auto R = static_cast<int64_t>(a.ep_order.size());
  ensure_floats(a.d_r, R * C), ensure_floats(a.d_e, R * C);
  ensure_floats(a.d_fce, R * 2 * F), ensure_floats(a.d_acte, R * F);
  Tensor d_r = ep_rows(a.d_r, R, C), d_e = ep_rows(a.d_e, R, C);
  Tensor d_fce = ep_rows(a.d_fce, R, 2 * F), d_acte = ep_rows(a.d_acte, R, F);
  ep_->exchange_rows(d_r, ep_rows(a.d_yp, A, C), a.ep_recv, a.ep_send, while_return);  // to the experts
  gather_rows(d_e, d_r, a.ep_order);
  moe_grouped_backward(ops, d_acte, params_.grad(w2_), d_e, ep_rows(a.acte, R, F), params_.weight(w2_), a.ep_offsets,
                       !params_.take_fresh_grad(w2_));
  if (R > 0) ops.swiglu_backward(d_fce, ep_rows(a.fce, R, 2 * F), d_acte);
  moe_grouped_backward(ops, d_e, params_.grad(w13_), d_fce, ep_rows(a.xe, R, C), params_.weight(w13_), a.ep_offsets,
                       !params_.take_fresh_grad(w13_));
  scatter_rows(d_r, d_e, a.ep_order);
  Tensor d_xp = ep_rows(a.d_xp, A, C);
  ep_->exchange_rows(d_xp, d_r, a.ep_send, a.ep_recv, while_back);  // back to the tokens
  moe_permute_backward(din, d_xp, r);
}

}  // namespace mt
