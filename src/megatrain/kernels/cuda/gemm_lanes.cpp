#include "megatrain/kernels/cuda/gemm_lanes.h"

#include "megatrain/kernels/cuda/launch.h"

namespace mt {

GemmLanes::GemmLanes(int lanes, int tuning) {
  try {
    cuda::check(cudaEventCreateWithFlags(&forked_, cudaEventDisableTiming), "GemmLanes: cudaEventCreate");
    side_.resize(static_cast<size_t>(lanes > 1 ? lanes - 1 : 0));
    for (Side& s : side_) {
      cuda::check(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "GemmLanes: cudaStreamCreate");
      cuda::check(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming), "GemmLanes: cudaEventCreate");
      s.gemm = std::make_unique<LtGemm>();
      s.gemm->set_tuning(tuning);
    }
  } catch (...) {
    release();  // no destructor runs for a constructor that throws
    throw;
  }
}

GemmLanes::~GemmLanes() { release(); }

void GemmLanes::release() {
  for (Side& s : side_) {
    s.gemm.reset();  // frees its workspace (cudaFree waits for the device)
    if (s.done) cudaEventDestroy(s.done);
    if (s.stream) cudaStreamDestroy(s.stream);
  }
  side_.clear();
  if (forked_) cudaEventDestroy(forked_);
  forked_ = nullptr;
}

void GemmLanes::set_tuning(int candidates) {
  for (Side& s : side_) s.gemm->set_tuning(candidates);
}

void GemmLanes::fork(cudaStream_t main) {
  cuda::check(cudaEventRecord(forked_, main), "GemmLanes::fork: cudaEventRecord");
  for (Side& s : side_) cuda::check(cudaStreamWaitEvent(s.stream, forked_, 0), "GemmLanes::fork: cudaStreamWaitEvent");
}

void GemmLanes::join(cudaStream_t main) {
  for (Side& s : side_) {
    cuda::check(cudaEventRecord(s.done, s.stream), "GemmLanes::join: cudaEventRecord");
    cuda::check(cudaStreamWaitEvent(main, s.done, 0), "GemmLanes::join: cudaStreamWaitEvent");
  }
}

}  // namespace mt
