#include "megatrain/core/buffer.h"

#include <sys/mman.h>

#include <algorithm>

#include "megatrain/core/error.h"

namespace mt {

namespace {

// Host memory for tensors. A buffer of 2 MiB or more is aligned to 2 MiB and asked to be backed by transparent huge
// pages: a step's arena and the model's state are written whole at start-up, and with 4 KiB pages that first touch
// is one page fault per 4 KiB (a 100 MB arena: 25,000 faults, over half a second of a small job's start-up on a
// virtual machine, paid again by every restarted attempt); later, fewer TLB misses on the large GEMM operands.
// The advice is only a hint (THP off, or no huge page free, and the kernel keeps small pages).
void* host_alloc(size_t bytes, size_t align, size_t& rounded) {
  constexpr size_t kHuge = size_t(2) << 20;
  const bool huge = bytes >= kHuge;
  if (huge) align = std::max(align, kHuge);
  rounded = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded);
  MT_CHECK(p != nullptr, "out of host memory allocating {} bytes", bytes);
  if (huge) ::madvise(p, rounded, MADV_HUGEPAGE);
  return p;
}

}  // namespace

void HostBuffer::resize(size_t bytes, bool zero) {
  std::free(p_);
  p_ = nullptr;
  n_ = 0;
  if (bytes == 0) return;
  size_t rounded = 0;
  p_ = host_alloc(bytes, 64, rounded);
  n_ = bytes;
  if (zero) std::memset(p_, 0, rounded);
}

Buffer host_buffer(size_t bytes, size_t align) {
  if (bytes == 0) return {};
  size_t rounded = 0;
  void* p = host_alloc(bytes, align, rounded);
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
