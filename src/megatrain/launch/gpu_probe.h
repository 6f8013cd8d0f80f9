// Measures each GPU of this node for `megatrain diagnose` (the judgement is gpu_checks.h), through the CUDA backend
// (kernels/ops.h): the bf16 GEMM rate at 8192^3 (cuBLASLt), a 1 GiB device copy, and a GEMM whose exact result is
// known. Not measured yet (left 0, so their checks say "not measured"): pinned host copies and NVML's memory errors,
// clock events and temperature (NVML's header is not in this project's toolkit image). Empty, with the reason in
// `why_none`, in a build without CUDA or with no GPU visible. Not yet run on a GPU.
#pragma once
#include <string>
#include <vector>

#include "megatrain/launch/gpu_checks.h"

namespace mt::launch {

std::vector<GpuHealth> probe_gpus(std::string* why_none);

}  // namespace mt::launch
