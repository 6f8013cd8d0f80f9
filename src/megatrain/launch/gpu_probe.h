// Measures each GPU of this node for `megatrain diagnose` (the judgement is gpu_checks.h), through the CUDA backend
// (kernels/ops.h): the bf16 GEMM rate at 8192^3 (cuBLASLt; the median of five batches of 20), a 1 GiB device copy,
// pinned host-to-device and device-to-host copies (256 MiB), and a GEMM whose exact result is known; then NVML's
// memory errors, clock events and temperature (nvml_reader.h; when NVML cannot be read those checks say why and
// pass). Empty, with the reason in `why_none`, in a build without CUDA or with no GPU visible.
#pragma once
#include <string>
#include <vector>

#include "megatrain/launch/gpu_checks.h"

namespace mt::launch {

std::vector<GpuHealth> probe_gpus(std::string* why_none);

}  // namespace mt::launch
