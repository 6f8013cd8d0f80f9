// The MoE permutation and combine ops (kernels in moe_permute_kernels.cu and moe_combine_kernels.cu): bf16 rows,
// the routing's I32 indices and F32 gates on the device (MoeDeviceRouting), fp32 gate gradients. The shape checks
// are the CPU backend's (op_shapes.h); the grouped GEMMs between them are in moe_grouped_gemm.cpp.
#include "megatrain/kernels/cpu/moe.h"
#include "megatrain/kernels/cuda/cuda_args.h"
#include "megatrain/kernels/cuda/cuda_ops.h"
#include "megatrain/kernels/cuda/launch.h"

namespace mt {

using namespace cuda_args;
using cuda::bf16;

namespace {

// The routing's device arrays, checked: row and gate always (N * k elements), token when there are permuted rows.
struct RoutingArgs {
  const int32_t* row;
  const int32_t* token;
  const float* gate;
};
RoutingArgs routing_args(const char* op, const MoeDeviceRouting& r, const MoeDims& d) {
  RoutingArgs a{nullptr, nullptr, nullptr};
  if (d.N * d.k > 0) {
    a.row = i32_arg(r.row, op, "routing row");
    a.gate = f32_arg(r.gate, op, "routing gate");
  }
  if (d.A > 0) a.token = i32_arg(r.token, op, "routing token");
  return a;
}

// A permuted bf16 tensor: required unless there are no permuted rows.
bf16* rows_arg(const Tensor& t, int64_t rows, const char* op, const char* name) {
  return rows > 0 || t.defined() ? bf16_arg(t, op, name) : nullptr;
}

}  // namespace

void CudaOps::moe_permute(Tensor xp, Tensor x, const MoeDeviceRouting& r) {
  const char* op = "moe_permute";
  auto scope = timed(op);
  const bf16* xs = bf16_arg(x, op, "x");
  const MoeDims d = moe_dims(op, r, x, "x", xp, "xp");
  bf16* xd = rows_arg(xp, d.A, op, "xp");
  const RoutingArgs a = routing_args(op, r, d);
  cuda::moe_permute(stream_, xd, xs, a.token, d.A, d.C);
}

void CudaOps::moe_permute_backward(Tensor dx, Tensor dxp, const MoeDeviceRouting& r) {
  const char* op = "moe_permute_backward";
  auto scope = timed(op);
  bf16* dxd = bf16_arg(dx, op, "dx");
  const MoeDims d = moe_dims(op, r, dx, "dx", dxp, "dxp");
  const bf16* g = rows_arg(dxp, d.A, op, "dxp");
  const RoutingArgs a = routing_args(op, r, d);
  if (d.A == 0) return;  // every assignment dropped: nothing to add
  cuda::moe_permute_backward(stream_, dxd, g, a.row, d.N, d.k, d.C);
}

void CudaOps::moe_combine(Tensor y, Tensor yp, const MoeDeviceRouting& r) {
  const char* op = "moe_combine";
  auto scope = timed(op);
  bf16* yd = bf16_arg(y, op, "y");
  const MoeDims d = moe_dims(op, r, y, "y", yp, "yp");
  const bf16* ys = rows_arg(yp, d.A, op, "yp");
  const RoutingArgs a = routing_args(op, r, d);
  cuda::moe_combine(stream_, yd, ys, a.row, a.gate, d.N, d.k, d.C);
}

void CudaOps::moe_combine_backward(Tensor dyp, Tensor dgate, Tensor dy, Tensor yp, const MoeDeviceRouting& r) {
  const char* op = "moe_combine_backward";
  auto scope = timed(op);
  const bf16* g = bf16_arg(dy, op, "dy");
  float* dg = f32_arg(dgate, op, "dgate");
  const MoeDims d = moe_dims(op, r, dy, "dy", yp, "yp");
  check_numel(dgate, d.N * d.k, op, "dgate");
  if (dyp.defined() || d.A > 0) check_numel(dyp, d.A * d.C, op, "dyp");
  bf16* dd = rows_arg(dyp, d.A, op, "dyp");
  const bf16* ys = rows_arg(yp, d.A, op, "yp");
  const RoutingArgs a = routing_args(op, r, d);
  cuda::moe_combine_backward(stream_, dd, dg, g, ys, a.row, a.gate, d.N, d.k, d.C);
}

}  // namespace mt
