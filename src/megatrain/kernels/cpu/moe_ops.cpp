// The MoE entry points of the CPU backend: the argument checks both backends share (op_shapes.h), then the reference
// functions of cpu/moe.h on the host routing, so the Ops and the reference agree bit for bit by construction.
#include "megatrain/kernels/cpu/cpu_ops.h"
#include "megatrain/kernels/cpu/cpu_util.h"
#include "megatrain/kernels/cpu/moe.h"
#include "megatrain/kernels/op_shapes.h"

namespace mt {

using namespace cpu;

namespace {

// A permuted tensor: required (F32, on the CPU) unless the batch has no rows.
void rows_arg(const Tensor& t, int64_t rows, const char* op, const char* name) {
  if (rows > 0 || t.defined()) f32_arg(t, op, name);
}

}  // namespace

void CpuOps::moe_permute(Tensor xp, Tensor x, const MoeDeviceRouting& r) {
  const char* op = "moe_permute";
  f32_arg(x, op, "x");
  const MoeDims d = moe_dims(op, r, x, "x", xp, "xp");
  rows_arg(xp, d.A, op, "xp");
  mt::moe_permute(xp, x, *r.host);
}

void CpuOps::moe_permute_backward(Tensor dx, Tensor dxp, const MoeDeviceRouting& r) {
  const char* op = "moe_permute_backward";
  f32_arg(dx, op, "dx");
  const MoeDims d = moe_dims(op, r, dx, "dx", dxp, "dxp");
  rows_arg(dxp, d.A, op, "dxp");
  mt::moe_permute_backward(dx, dxp, *r.host);
}

void CpuOps::moe_grouped_matmul_forward(Tensor out, Tensor in, Tensor w, const std::vector<int64_t>& offsets) {
  const char* op = "moe_grouped_matmul_forward";
  f32_arg(w, op, "w");
  const GroupedDims d = grouped_dims(op, out, in, w, offsets);
  rows_arg(out, d.A, op, "out");
  rows_arg(in, d.A, op, "in");
  moe_grouped_forward(*this, out, in, w, offsets);
}

void CpuOps::moe_grouped_matmul_backward(Tensor din, Tensor dw, Tensor dout, Tensor in, Tensor w,
                                         const std::vector<int64_t>& offsets, bool accumulate_dw) {
  const char* op = "moe_grouped_matmul_backward";
  f32_arg(w, op, "w");
  f32_arg(dw, op, "dw");
  const GroupedDims d = grouped_dims(op, dout, in, w, offsets);
  check_numel(dw, d.E * d.O * d.I, op, "dw");
  if (din.defined()) {
    f32_arg(din, op, "din");
    check_numel(din, d.A * d.I, op, "din");
  }
  rows_arg(dout, d.A, op, "dout");
  rows_arg(in, d.A, op, "in");
  moe_grouped_backward(*this, din, dw, dout, in, w, offsets, accumulate_dw);
}

void CpuOps::moe_combine(Tensor y, Tensor yp, const MoeDeviceRouting& r) {
  const char* op = "moe_combine";
  f32_arg(y, op, "y");
  const MoeDims d = moe_dims(op, r, y, "y", yp, "yp");
  rows_arg(yp, d.A, op, "yp");
  mt::moe_combine(y, yp, *r.host);
}

void CpuOps::moe_combine_backward(Tensor dyp, Tensor dgate, Tensor dy, Tensor yp, const MoeDeviceRouting& r) {
  const char* op = "moe_combine_backward";
  f32_arg(dy, op, "dy");
  float* dg = f32_arg(dgate, op, "dgate");
  const MoeDims d = moe_dims(op, r, dy, "dy", yp, "yp");
  check_numel(dgate, d.N * d.k, op, "dgate");
  if (dyp.defined() || d.A > 0) check_numel(dyp, d.A * d.C, op, "dyp");
  rows_arg(dyp, d.A, op, "dyp");
  rows_arg(yp, d.A, op, "yp");
  mt::moe_combine_backward(dyp, dg, dy, yp, *r.host);
}

}  // namespace mt
