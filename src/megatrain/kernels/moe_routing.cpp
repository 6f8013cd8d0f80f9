#include "megatrain/kernels/moe_routing.h"

#include <algorithm>

#include "megatrain/core/error.h"
#include "megatrain/kernels/cpu/moe.h"

namespace mt {

void MoeRoutingBuffers::allocate(Ops& ops, int64_t max_tokens, int k) {
  MT_CHECK(max_tokens >= 0 && k >= 1, "MoeRoutingBuffers: {} tokens of top-{}", max_tokens, k);
  max_assignments_ = max_tokens * k;
  if (ops.device() == Device::CPU) return;
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(max_assignments_, 1)) * 4;  // I32 and F32 alike
  row_ = ops.alloc(bytes);
  token_ = ops.alloc(bytes);
  gate_ = ops.alloc(bytes);
}

MoeDeviceRouting MoeRoutingBuffers::upload(Ops& ops, const MoeRouting& r) const {
  const int64_t Nk = r.N * r.k, A = r.rows();
  MT_CHECK(Nk <= max_assignments_, "MoeRoutingBuffers: {} tokens of top-{} exceed the {} assignments allocated", r.N,
           r.k, max_assignments_);
  MoeDeviceRouting d;
  d.host = &r;
  const Device dev = ops.device();
  if (dev == Device::CPU) {  // the host vectors themselves (const only in the view's type: the ops do not write them)
    d.row = Tensor(const_cast<int*>(r.row.data()), {r.N, r.k}, DType::I32);
    d.token = Tensor(const_cast<int*>(r.token.data()), {A}, DType::I32);
    d.gate = Tensor(const_cast<float*>(r.gate.data()), {r.N, r.k}, DType::F32);
    return d;
  }
  d.row = row_.view({r.N, r.k}, DType::I32);
  d.token = token_.view({A}, DType::I32);
  d.gate = gate_.view({r.N, r.k}, DType::F32);
  ops.to_device(d.row, r.row.data());
  ops.to_device(d.token, r.token.data());
  ops.to_device(d.gate, r.gate.data());
  return d;
}

}  // namespace mt
