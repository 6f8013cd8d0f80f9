#include "megatrain/train/peak.h"

#include <algorithm>
#include <vector>

#include "megatrain/core/buffer.h"
#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"
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

double datasheet_peak_flops(const std::string& name) {
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  // NVIDIA's datasheets, dense (no sparsity) BF16 tensor-core TFLOP/s. The PCIe and NVL H100 run lower clocks and
  // fewer SMs than the SXM part, so a name must be told apart before the bare "H100" matches.
  struct Row {
    std::vector<const char*> all;  // every substring must be in the name
    double tflops;
  };
  static const std::vector<Row> table = {
      {{"H200"}, 989.4}, {{"GH200"}, 989.4}, {{"H100", "PCIe"}, 756.0}, {{"H100", "NVL"}, 835.5},
      {{"H100"}, 989.4}, {{"A100"}, 312.0},  {{"A800"}, 312.0},         {{"H800"}, 989.4},
  };
  for (const Row& r : table)
    if (std::all_of(r.all.begin(), r.all.end(), has)) return r.tflops * 1e12;
  return 0;
}

PeakFlops peak_flops(double configured_tflops, Ops& ops) {
  if (configured_tflops > 0) return {configured_tflops * 1e12, "configured"};
  if (ops.device() == Device::CPU) return {measure_matmul_flops(ops), "measured matmul peak"};
  const std::string name = ops.device_name();
  const double p = datasheet_peak_flops(name);
  if (p <= 0)
    fail_as(ErrorKind::Config,
            "no datasheet peak is known for the GPU \"{}\": set train.peak_tflops (its dense bf16 "
            "TFLOP/s) so MFU can be computed",
            name);
  return {p, name + " datasheet, dense bf16"};
}

}  // namespace mt
