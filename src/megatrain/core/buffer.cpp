#include "megatrain/core/buffer.h"

#include "megatrain/core/error.h"

namespace mt {

void HostBuffer::resize(size_t bytes, bool zero) {
  std::free(p_);
  p_ = nullptr;
  n_ = 0;
  if (bytes == 0) return;
  size_t rounded = (bytes + 63) / 64 * 64;
  p_ = std::aligned_alloc(64, rounded);
  MT_CHECK(p_ != nullptr, "out of host memory allocating {} bytes", bytes);
  n_ = bytes;
  if (zero) std::memset(p_, 0, rounded);
}

Buffer host_buffer(size_t bytes, size_t align) {
  if (bytes == 0) return {};
  size_t rounded = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded);
  MT_CHECK(p != nullptr, "out of host memory allocating {} bytes", bytes);
  std::memset(p, 0, rounded);
  return Buffer(p, bytes, Device::CPU, [](void* q) { std::free(q); });
}

Tensor Buffer::view(std::initializer_list<int64_t> shape, DType dt, size_t offset) const {
  Tensor t(static_cast<char*>(p_) + offset, shape, dt, dev_);
  MT_CHECK(offset + t.nbytes() <= n_, "view {} {} at byte {} exceeds a buffer of {} bytes", dtype_name(dt),
           t.shape_str(), offset, n_);
  return t;
}

}  // namespace mt
