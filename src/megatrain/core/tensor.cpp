#include "megatrain/core/tensor.h"

#include <fmt/format.h>

namespace mt {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U16: return 2;
    case DType::U8: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U16: return "U16";
    case DType::U8: return "U8";
  }
  return "?";
}

DType dtype_from_name(const std::string& n) {
  if (n == "F32") return DType::F32;
  if (n == "BF16") return DType::BF16;
  if (n == "F16") return DType::F16;
  if (n == "I32") return DType::I32;
  if (n == "I64") return DType::I64;
  if (n == "U16") return DType::U16;
  if (n == "U8") return DType::U8;
  fail("unknown dtype '{}'", n);
}

Tensor::Tensor(void* p, std::initializer_list<int64_t> shape, DType dt, Device dev) : ptr(p), dtype(dt), device(dev) {
  MT_CHECK(shape.size() <= kMaxDims, "tensor rank {} exceeds {}", shape.size(), kMaxDims);
  for (int64_t d : shape) dims[ndim++] = d;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= dims[i];
  return n;
}

std::string Tensor::shape_str() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += fmt::format("{}{}", i ? ", " : "", dims[i]);
  return s + "]";
}

float* Tensor::f32() const {
  MT_CHECK(dtype == DType::F32, "expected an F32 tensor, got {}", dtype_name(dtype));
  return static_cast<float*>(ptr);
}

int32_t* Tensor::i32() const {
  MT_CHECK(dtype == DType::I32, "expected an I32 tensor, got {}", dtype_name(dtype));
  return static_cast<int32_t*>(ptr);
}

Tensor Tensor::view(std::initializer_list<int64_t> shape) const {
  Tensor t(ptr, shape, dtype, device);
  MT_CHECK(t.numel() == numel(), "cannot view {} as {}", shape_str(), t.shape_str());
  return t;
}

Tensor Tensor::slice0(int64_t begin, int64_t end) const {
  MT_CHECK(ndim >= 1 && 0 <= begin && begin <= end && end <= dims[0], "bad slice [{}, {}) of {}", begin, end,
           shape_str());
  Tensor t = *this;
  t.dims[0] = end - begin;
  t.ptr = static_cast<char*>(ptr) + static_cast<size_t>(begin) * (nbytes() / (dims[0] ? dims[0] : 1));
  return t;
}

}  // namespace mt
