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

}  // namespace mt
