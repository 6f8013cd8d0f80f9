// Tensor: a non-owning view (pointer, shape, dtype, device). Memory is owned by arenas or the layers
// that plan it up front; ops take views and never allocate on the hot path.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "megatrain/core/error.h"
#include "megatrain/core/kind.h"

namespace mt {

enum class DType : uint8_t { F32, BF16, F16, I32, I64, U16, U8 };
enum class Device : uint8_t { CPU, CUDA };  // "cpu" | "cuda" (train.device)
inline constexpr std::array<const char*, 2> kDeviceNames = {"cpu", "cuda"};
inline const std::array<const char*, 2>& kind_names(Device) { return kDeviceNames; }

size_t dtype_size(DType t);
const char* dtype_name(DType t);                 // "F32", "BF16", ... (the safetensors spelling)
DType dtype_from_name(const std::string& name);  // throws on an unknown name

struct Tensor {
  static constexpr int kMaxDims = 5;
  void* ptr = nullptr;
  std::array<int64_t, kMaxDims> dims{};
  int ndim = 0;
  DType dtype = DType::F32;
  Device device = Device::CPU;

  Tensor() = default;
  Tensor(void* p, std::initializer_list<int64_t> shape, DType dt = DType::F32, Device dev = Device::CPU);

  bool defined() const { return ptr != nullptr; }
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  int64_t size(int i) const { return dims[i < 0 ? ndim + i : i]; }
  std::string shape_str() const;  // e.g. "[4, 64, 768]"

  // Typed access; throws when the dtype differs.
  float* f32() const;
  int32_t* i32() const;
  // Same memory, new shape (numel must match).
  Tensor view(std::initializer_list<int64_t> shape) const;
  // Rows [begin, end) of the first dimension.
  Tensor slice0(int64_t begin, int64_t end) const;
};

// A view of a float buffer, the common case in the CPU code and tests.
inline Tensor f32_view(float* p, std::initializer_list<int64_t> shape) { return Tensor(p, shape, DType::F32); }

}  // namespace mt
