// Dtype and device checks of the CUDA ops (the shape checks, shared with the CPU backend, are in op_shapes.h): each
// names the op and the argument, as the CPU backend's do.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "megatrain/core/tensor.h"
#include "megatrain/kernels/op_shapes.h"

namespace mt::cuda_args {

// A required device tensor of dtype dt.
inline void* arg(const Tensor& t, DType dt, const char* op, const char* name) {
  MT_CHECK(t.defined(), "{}: {} is required but undefined", op, name);
  MT_CHECK(t.device == Device::CUDA, "{}: {} must be a CUDA tensor", op, name);
  MT_CHECK(t.dtype == dt, "{}: {} must be {} (got {})", op, name, dtype_name(dt), dtype_name(t.dtype));
  return t.ptr;
}
inline void* opt(const Tensor& t, DType dt, const char* op, const char* name) {
  return t.defined() ? arg(t, dt, op, name) : nullptr;
}

inline __nv_bfloat16* bf16_arg(const Tensor& t, const char* op, const char* name) {
  return static_cast<__nv_bfloat16*>(arg(t, DType::BF16, op, name));
}
inline __nv_bfloat16* bf16_opt(const Tensor& t, const char* op, const char* name) {
  return static_cast<__nv_bfloat16*>(opt(t, DType::BF16, op, name));
}
inline float* f32_arg(const Tensor& t, const char* op, const char* name) {
  return static_cast<float*>(arg(t, DType::F32, op, name));
}
inline float* f32_opt(const Tensor& t, const char* op, const char* name) {
  return static_cast<float*>(opt(t, DType::F32, op, name));
}
inline const int32_t* i32_arg(const Tensor& t, const char* op, const char* name) {
  return static_cast<const int32_t*>(arg(t, DType::I32, op, name));
}

// A tensor whose dtype is F32 or BF16 (the elementwise ops take either); returns whether it is BF16.
inline bool float_like(const Tensor& t, const char* op, const char* name) {
  MT_CHECK(t.defined(), "{}: {} is required but undefined", op, name);
  MT_CHECK(t.device == Device::CUDA, "{}: {} must be a CUDA tensor", op, name);
  MT_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16, "{}: {} must be F32 or BF16 (got {})", op, name,
           dtype_name(t.dtype));
  return t.dtype == DType::BF16;
}

}  // namespace mt::cuda_args
