// Memory on the CPU backend: host allocations, copies, and dtype conversion (F32 <-> BF16 lets tests build bf16
// inputs for the CUDA backend and read its results).
#include <cstdlib>
#include <cstring>

#include "megatrain/core/bf16.h"
#include "megatrain/kernels/cpu/cpu_ops.h"

namespace mt {

Buffer CpuOps::alloc(size_t bytes) {
  allocated_.fetch_add(bytes, std::memory_order_relaxed);
  return host_buffer(bytes, 256);
}

void CpuOps::to_device(Tensor dst, const void* host) {
  MT_CHECK(dst.device == Device::CPU, "to_device: a CPU backend writes CPU tensors only");
  if (dst.numel() > 0 && dst.ptr != host) std::memmove(dst.ptr, host, dst.nbytes());
}

void CpuOps::to_host(void* host, Tensor src) {
  MT_CHECK(src.device == Device::CPU, "to_host: a CPU backend reads CPU tensors only");
  if (src.numel() > 0 && src.ptr != host) std::memmove(host, src.ptr, src.nbytes());
}

void CpuOps::convert(Tensor dst, Tensor src) {
  MT_CHECK(dst.device == Device::CPU && src.device == Device::CPU, "convert: tensors must be CPU tensors");
  MT_CHECK(dst.numel() == src.numel(), "convert: {} elements into {}", src.numel(), dst.numel());
  const int64_t n = src.numel();
  if (dst.dtype == src.dtype) return copy(dst, src);
  if (dst.dtype == DType::BF16 && src.dtype == DType::F32) {
    auto* d = static_cast<uint16_t*>(dst.ptr);
    const float* s = src.f32();
    for (int64_t i = 0; i < n; ++i) d[i] = float_to_bf16(s[i]);
  } else if (dst.dtype == DType::F32 && src.dtype == DType::BF16) {
    float* d = dst.f32();
    const auto* s = static_cast<const uint16_t*>(src.ptr);
    for (int64_t i = 0; i < n; ++i) d[i] = bf16_to_float(s[i]);
  } else {
    fail("convert: {} to {} is not supported", dtype_name(src.dtype), dtype_name(dst.dtype));
  }
}

}  // namespace mt
