#include "megatrain/kernels/cuda/op_timer.h"

#include "megatrain/kernels/cuda/launch.h"
#include "megatrain/obs/timeline.h"

namespace mt {

using cuda::check;

OpTimer::~OpTimer() {
  // Destructors must not throw: errors here (a dead context at exit) are ignored.
  for (Slot& s : ring_) {
    if (s.start) cudaEventDestroy(s.start);
    if (s.stop) cudaEventDestroy(s.stop);
  }
  if (base_) cudaEventDestroy(base_);
}

void OpTimer::set_enabled(bool on) {
  if (on && ring_.empty()) {
    ring_.resize(kCapacity);
    for (Slot& s : ring_) {
      check(cudaEventCreate(&s.start), "set_op_timing: cudaEventCreate");
      check(cudaEventCreate(&s.stop), "set_op_timing: cudaEventCreate");
    }
    check(cudaEventCreate(&base_), "set_op_timing: cudaEventCreate");
  }
  // A new timing session measures start_ms from its own first op (unless old timings are still waiting).
  if (on && !on_ && pending_ == 0) have_base_ = false;
  on_ = on;
}

void OpTimer::begin(const char* name, cudaStream_t s) {
  if (depth_++ != 0 || !on_) return;
  if (pending_ == kCapacity) return;  // ring full: this op goes untimed
  Slot& slot = ring_[(head_ + pending_) % kCapacity];
  slot.name = name;
  if (!have_base_) {
    base_host_s_ = obs::trace_clock();
    check(cudaEventRecord(base_, s), "op timing: cudaEventRecord");
    have_base_ = true;
  }
  check(cudaEventRecord(slot.start, s), "op timing: cudaEventRecord");
  recording_ = true;
}

void OpTimer::end(cudaStream_t s) {
  if (--depth_ != 0 || !recording_) return;
  recording_ = false;
  // Called from a destructor (possibly while an exception unwinds): a failure here cannot be thrown.
  if (cudaEventRecord(ring_[(head_ + pending_) % kCapacity].stop, s) == cudaSuccess) ++pending_;
}

std::vector<OpTiming> OpTimer::take() {
  std::vector<OpTiming> out;
  while (pending_ > 0) {
    Slot& slot = ring_[head_];
    const cudaError_t q = cudaEventQuery(slot.stop);
    if (q == cudaErrorNotReady) break;  // ops finish in stream order: the rest are not done either
    check(q, "take_op_timings: cudaEventQuery");
    float since_base = 0, ms = 0;
    check(cudaEventElapsedTime(&since_base, base_, slot.start), "take_op_timings: cudaEventElapsedTime");
    check(cudaEventElapsedTime(&ms, slot.start, slot.stop), "take_op_timings: cudaEventElapsedTime");
    out.push_back(OpTiming{slot.name, since_base, ms});
    head_ = (head_ + 1) % kCapacity;
    --pending_;
  }
  return out;
}

}  // namespace mt
