// What the CPU benchmarks share: a filled host buffer and a median timer.
#pragma once
#include <algorithm>
#include <functional>
#include <initializer_list>
#include <vector>

#include "megatrain/core/buffer.h"
#include "megatrain/core/clock.h"
#include "megatrain/core/rng.h"
#include "megatrain/core/tensor.h"

namespace mt::bench {

// A host fp32 buffer of `count` values, uniform in [-scale, scale) (a fixed seed: runs compare like for like).
struct Buf {
  HostBuffer mem;
  int64_t n;
  explicit Buf(int64_t count, float scale = 0.02f, uint64_t seed = 1) : mem(count * 4, false), n(count) {
    Rng rng(seed);
    float* p = mem.f32();
    for (int64_t i = 0; i < count; ++i) p[i] = scale * (rng.uniform() * 2 - 1);
  }
  float* p() const { return mem.f32(); }
  Tensor t(std::initializer_list<int64_t> shape) const { return f32_view(mem.f32(), shape); }
};

// Median seconds of fn over reps runs, after one warm-up: the median shrugs off a run a neighbour disturbed.
inline double time_median(const std::function<void()>& fn, int reps) {
  fn();
  std::vector<double> ts;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_seconds();
    fn();
    ts.push_back(now_seconds() - t0);
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

}  // namespace mt::bench
