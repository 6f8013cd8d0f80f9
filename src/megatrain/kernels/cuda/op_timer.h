// Device time of every op, from CUDA event pairs recorded on the op stream around the op's launches, without ever
// synchronising: a preallocated pool of event pairs is used as a ring, and take() collects the pairs whose end
// event has completed (cudaEventQuery), oldest first. When the ring is full (nobody called take() for 4096 ops),
// further ops go untimed until take() frees slots.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "megatrain/kernels/ops.h"

namespace mt {

class OpTimer {
 public:
  static constexpr size_t kCapacity = 4096;

  OpTimer() = default;
  ~OpTimer();
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

  // Turning timing on creates the event pool on first use (never inside an op).
  void set_enabled(bool on);
  std::vector<OpTiming> take();
  double base_host_seconds() const { return base_host_s_; }  // obs::trace_clock() as the base event was recorded

  // RAII: records the start event when constructed and the end event when destroyed, for the outermost op only
  // (an op implemented with another op's entry point is timed once, under the outer name).
  class [[nodiscard]] Scope {
   public:
    Scope(OpTimer& t, const char* name, cudaStream_t s) : t_(t), s_(s) { t_.begin(name, s_); }
    ~Scope() { t_.end(s_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    OpTimer& t_;
    cudaStream_t s_;
  };

 private:
  struct Slot {
    const char* name = "";
    cudaEvent_t start = nullptr, stop = nullptr;
  };
  void begin(const char* name, cudaStream_t s);
  void end(cudaStream_t s);

  std::vector<Slot> ring_;  // kCapacity slots once enabled
  size_t head_ = 0;         // oldest pending slot
  size_t pending_ = 0;      // slots recorded and not yet taken
  int depth_ = 0;           // nesting of Scopes
  bool on_ = false;
  bool recording_ = false;      // the current outermost op holds slot (head_ + pending_) % kCapacity
  cudaEvent_t base_ = nullptr;  // recorded before the first timed op: start_ms is measured from it
  bool have_base_ = false;
  double base_host_s_ = 0;
};

}  // namespace mt
