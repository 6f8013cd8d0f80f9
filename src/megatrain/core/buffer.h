// Owned memory. HostBuffer: 64-byte aligned host memory (data, checkpoints, staging). Buffer: memory on the device
// of an Ops backend (Ops::alloc), so a model plans its memory without knowing where it lives. Ops see Tensor views.
#pragma once
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <utility>

#include "megatrain/core/tensor.h"

namespace mt {

class HostBuffer {
 public:
  HostBuffer() = default;
  explicit HostBuffer(size_t bytes, bool zero = true) { resize(bytes, zero); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  HostBuffer(HostBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  HostBuffer& operator=(HostBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~HostBuffer() { std::free(p_); }

  void resize(size_t bytes, bool zero = true);  // discards old contents
  void* data() const { return p_; }
  float* f32() const { return static_cast<float*>(p_); }
  size_t size() const { return n_; }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

// Memory on a device, released by the function of the allocator that made it. Move-only.
class Buffer {
 public:
  using Release = void (*)(void* ptr);
  Buffer() = default;
  Buffer(void* p, size_t bytes, Device dev, Release release) : p_(p), n_(bytes), dev_(dev), release_(release) {}
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept { swap(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    swap(o);
    return *this;
  }
  ~Buffer() {
    if (p_ && release_) release_(p_);
  }

  void* data() const { return p_; }
  size_t size() const { return n_; }
  Device device() const { return dev_; }
  bool empty() const { return p_ == nullptr; }
  // A view of the memory from byte `offset`, with the given shape and dtype (checked against the size).
  Tensor view(std::initializer_list<int64_t> shape, DType dt, size_t offset = 0) const;

 private:
  void swap(Buffer& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    std::swap(dev_, o.dev_);
    std::swap(release_, o.release_);
  }
  void* p_ = nullptr;
  size_t n_ = 0;
  Device dev_ = Device::CPU;
  Release release_ = nullptr;
};

// Zero-filled host memory as a Buffer (aligned to `align` bytes, a power of two >= 64).
Buffer host_buffer(size_t bytes, size_t align = 64);

}  // namespace mt
