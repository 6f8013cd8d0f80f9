// Device tensors for the GPU op tests: host vectors uploaded to a backend (BF16 ones rounded in place first, so the
// CPU oracle sees the numbers the device holds), zeroed tensors, and tensors read back as floats (BF16 widened
// exactly). Owns the buffers until it is destroyed.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <vector>

#include <gtest/gtest.h>

#include "megatrain/core/bf16.h"
#include "megatrain/core/buffer.h"
#include "megatrain/kernels/ops.h"
#include "kernels_testutil.h"

namespace mt::test {

// Rounds every element to bf16 in place (the values both backends then see).
inline VecF& rounded_bf16(VecF& v) {
  for (float& x : v) x = round_bf16(x);
  return v;
}

class DeviceTensors {
 public:
  explicit DeviceTensors(Ops& ops) : ops_(ops) {}

  // A device tensor of dtype dt (BF16 or F32) holding v; offset_bytes places it off the allocation's alignment.
  Tensor upload(VecF& v, std::initializer_list<int64_t> shape, DType dt = DType::BF16, size_t offset_bytes = 0) {
    EXPECT_EQ(static_cast<int64_t>(v.size()), numel(shape));
    Tensor t = fresh(v.size() * dtype_size(dt) + offset_bytes, shape, dt, offset_bytes);
    if (dt == DType::BF16) {
      rounded_bf16(v);
      std::vector<uint16_t> bits(v.size());
      for (size_t i = 0; i < v.size(); ++i) bits[i] = float_to_bf16(v[i]);
      ops_.to_device(t, bits.data());
    } else {
      EXPECT_EQ(dt, DType::F32);
      ops_.to_device(t, v.data());
    }
    return t;
  }
  Tensor upload_i32(std::vector<int32_t>& v, std::initializer_list<int64_t> shape) {
    Tensor t = fresh(v.size() * 4, shape, DType::I32, 0);
    ops_.to_device(t, v.data());
    return t;
  }
  // A zeroed device tensor (Ops::alloc zeroes).
  Tensor zeros(std::initializer_list<int64_t> shape, DType dt = DType::BF16) {
    return fresh(static_cast<size_t>(numel(shape)) * dtype_size(dt), shape, dt, 0);
  }
  VecF host(const Tensor& t) {
    VecF out(static_cast<size_t>(t.numel()));
    if (t.dtype == DType::BF16) {
      std::vector<uint16_t> bits(out.size());
      ops_.to_host(bits.data(), t);
      for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_float(bits[i]);
    } else {
      ops_.to_host(out.data(), t);
    }
    return out;
  }

 private:
  static int64_t numel(std::initializer_list<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  Tensor fresh(size_t bytes, std::initializer_list<int64_t> shape, DType dt, size_t offset_bytes) {
    Buffer b = ops_.alloc(bytes + 16);
    Tensor t = b.view(shape, dt, offset_bytes);
    bufs_.push_back(std::move(b));
    return t;
  }

  Ops& ops_;
  std::vector<Buffer> bufs_;
};

}  // namespace mt::test
