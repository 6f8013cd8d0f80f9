#include "megatrain/comm/cuda/staged_cuda.h"

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "megatrain/core/error.h"

namespace mt {
namespace {

void check_cuda(cudaError_t e, const char* call) {
  if (e != cudaSuccess)
    fail_as(ErrorKind::Device, "staged device plane: {} failed: {} ({})", call, cudaGetErrorString(e),
            cudaGetErrorName(e));
}
#define MT_STAGED_CUDA(call) check_cuda((call), #call)

// Pinned host buffers by size, reused: a training step moves the same shapes every time.
class PinnedPool : public std::enable_shared_from_this<PinnedPool> {
 public:
  ~PinnedPool() {
    for (auto& [bytes, list] : free_)
      for (void* p : list) cudaFreeHost(p);
  }
  std::shared_ptr<void> get(size_t bytes) {
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& list = free_[bytes];
      if (!list.empty()) p = list.back(), list.pop_back();
    }
    if (!p) MT_STAGED_CUDA(cudaMallocHost(&p, bytes > 0 ? bytes : 1));
    std::weak_ptr<PinnedPool> pool = shared_from_this();
    return std::shared_ptr<void>(p, [pool, bytes](void* q) {
      if (auto s = pool.lock()) {
        std::lock_guard<std::mutex> lock(s->mu_);
        s->free_[bytes].push_back(q);
      } else {
        cudaFreeHost(q);
      }
    });
  }

 private:
  std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;
};

uint16_t bf16_of(float f) {  // round to nearest even (NaN stays a NaN)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float f32_of(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

class CudaStagingDevice : public StagingDevice {
 public:
  explicit CudaStagingDevice(cudaStream_t compute) : compute_(compute), pool_(std::make_shared<PinnedPool>()) {
    MT_STAGED_CUDA(cudaGetDevice(&device_));
  }
  ~CudaStagingDevice() override {
    for (cudaStream_t s : streams_) cudaStreamDestroy(s);
  }

  Mark mark() override {
    MT_STAGED_CUDA(cudaSetDevice(device_));
    cudaEvent_t e = nullptr;
    MT_STAGED_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    MT_STAGED_CUDA(cudaEventRecord(e, compute_));
    return Mark(static_cast<void*>(e), [](void* p) { cudaEventDestroy(static_cast<cudaEvent_t>(p)); });
  }
  void wait(const Mark& m) override {
    MT_STAGED_CUDA(cudaSetDevice(device_));
    MT_STAGED_CUDA(cudaEventSynchronize(static_cast<cudaEvent_t>(m.get())));
  }
  void to_host(void* host, const Tensor& src) override {
    if (src.dtype != DType::BF16) return copy(host, src.ptr, src.nbytes(), cudaMemcpyDeviceToHost);
    auto bounce = pool_->get(src.nbytes());
    copy(bounce.get(), src.ptr, src.nbytes(), cudaMemcpyDeviceToHost);
    const auto* b = static_cast<const uint16_t*>(bounce.get());
    float* f = static_cast<float*>(host);
    for (int64_t i = 0; i < src.numel(); ++i) f[i] = f32_of(b[i]);
  }
  void to_device(const Tensor& dst, const void* host) override {
    if (dst.dtype != DType::BF16) return copy(dst.ptr, host, dst.nbytes(), cudaMemcpyHostToDevice);
    auto bounce = pool_->get(dst.nbytes());
    auto* b = static_cast<uint16_t*>(bounce.get());
    const float* f = static_cast<const float*>(host);
    for (int64_t i = 0; i < dst.numel(); ++i) b[i] = bf16_of(f[i]);
    copy(dst.ptr, bounce.get(), dst.nbytes(), cudaMemcpyHostToDevice);
  }
  std::shared_ptr<void> host_buffer(size_t bytes) override { return pool_->get(bytes); }

 private:
  // One copy on a stream of the pool's, waited for by the calling thread only.
  void copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    MT_STAGED_CUDA(cudaSetDevice(device_));
    cudaStream_t s = take_stream();
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    give_stream(s);
    check_cuda(e, kind == cudaMemcpyDeviceToHost ? "cudaMemcpyAsync (device to host)"
                                                 : "cudaMemcpyAsync (host to device)");
  }
  cudaStream_t take_stream() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!idle_.empty()) {
        cudaStream_t s = idle_.back();
        idle_.pop_back();
        return s;
      }
    }
    cudaStream_t s = nullptr;
    MT_STAGED_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::lock_guard<std::mutex> lock(mu_);
    streams_.push_back(s);
    return s;
  }
  void give_stream(cudaStream_t s) {
    std::lock_guard<std::mutex> lock(mu_);
    idle_.push_back(s);
  }

  cudaStream_t compute_;
  int device_ = 0;
  std::shared_ptr<PinnedPool> pool_;
  std::mutex mu_;
  std::vector<cudaStream_t> streams_, idle_;
};

}  // namespace

std::shared_ptr<StagingDevice> cuda_staging_device(cudaStream_t compute_stream) {
  return std::make_shared<CudaStagingDevice>(compute_stream);
}

GroupFactory staged_mesh_groups(cudaStream_t compute_stream) {
  // Made on first use, on the thread (and current device) that builds the groups; shared by copies of the factory.
  auto device = std::make_shared<std::shared_ptr<StagingDevice>>();
  return [compute_stream, device](Store& store, GroupRole, const std::string& name, const std::vector<int>& ranks,
                                  int my_global_rank, const GroupOptions& opt) {
    if (!*device) *device = cuda_staging_device(compute_stream);
    auto host = ranks.size() == 1 ? make_local_group(my_global_rank, name)
                                  : make_gloo_group(store, name, ranks, my_global_rank, opt);
    return make_staged_group(std::move(host), *device);
  };
}

}  // namespace mt
