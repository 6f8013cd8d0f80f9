#pragma once
#include "megatrain/kernels/ops.h"

namespace mt {

// Measured matmul throughput of a backend (FLOP/s), the median of a few GEMMs of transformer-like shape. Used as
// the MFU denominator when no peak is configured: on a CPU there is no single datasheet number that means much.
double measure_matmul_flops(Ops& ops, int rows = 1024, int in = 768, int out = 3072, int reps = 5);

}  // namespace mt
