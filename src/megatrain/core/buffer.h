// Owned, 64-byte aligned host memory. Layers and arenas hold these; ops see Tensor views of them.
#pragma once
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <utility>

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

}  // namespace mt
