// The MFU denominator: the peak FLOP/s a rank's device could do.
#pragma once
#include <string>

#include "megatrain/kernels/ops.h"

namespace mt {

// Measured matmul throughput of a backend (FLOP/s), the median of a few GEMMs of transformer-like shape. Used as
// the MFU denominator of a CPU run when no peak is configured: a CPU has no single datasheet number that means much.
// 256 rows (1.2 GFLOP a GEMM) already runs the BLAS's large-matrix kernels, and costs every rank of every attempt
// ~0.1 s at start-up on one core (1024 rows cost over half a second, paid again on each restart).
double measure_matmul_flops(Ops& ops, int rows = 256, int in = 768, int out = 3072, int reps = 5);

// The dense bf16 tensor-core peak of a GPU from its product name (H100 SXM/PCIe/NVL, H200, GH200, A100), or 0 when
// the name is not in the table (then train.peak_tflops must be set).
double datasheet_peak_flops(const std::string& device_name);

struct PeakFlops {
  double flops = 0;    // per rank
  std::string source;  // what it is, for the log: "configured", "NVIDIA H100 80GB HBM3 datasheet, dense bf16", ...
};
// train.peak_tflops when set (> 0); else the datasheet peak of a GPU, or the measured matmul peak of a CPU.
// Throws an mt::Error of kind Config for a GPU not in the table without train.peak_tflops.
PeakFlops peak_flops(double configured_tflops, Ops& ops);

}  // namespace mt
