#include "megatrain/train/peak.h"

#include <algorithm>
#include <vector>

#include "megatrain/core/buffer.h"
#include "megatrain/core/clock.h"
#include "megatrain/core/rng.h"

namespace mt {

double measure_matmul_flops(Ops& ops, int rows, int in, int out, int reps) {
  HostBuffer a(size_t(rows) * in * 4), w(size_t(out) * in * 4), c(size_t(rows) * out * 4);
  Rng r(1);
  for (size_t i = 0; i < size_t(rows) * in; ++i) a.f32()[i] = r.uniform();
  for (size_t i = 0; i < size_t(out) * in; ++i) w.f32()[i] = r.uniform();
  Tensor A = f32_view(a.f32(), {rows, in}), W = f32_view(w.f32(), {out, in}), Cc = f32_view(c.f32(), {rows, out});
  ops.matmul_forward(Cc, A, W, Tensor{});  // warm-up
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    double t0 = now_seconds();
    ops.matmul_forward(Cc, A, W, Tensor{});
    t.push_back(now_seconds() - t0);
  }
  std::sort(t.begin(), t.end());
  return 2.0 * rows * in * out / t[t.size() / 2];
}

}  // namespace mt
