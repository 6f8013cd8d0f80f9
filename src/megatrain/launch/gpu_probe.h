// Measures each GPU of this node for `megatrain diagnose` (the judgement is gpu_checks.h). Empty, with the reason in
// `why_none`, when there is nothing to measure: a build without CUDA, no GPU visible, or (for now) a CUDA build,
// whose measurements (cuBLASLt's bf16 GEMM, device and pinned copies, a bit-exact self-test, NVML's memory errors,
// clock events and temperature) are not written yet: they need a GPU to be tested on.
#pragma once
#include <string>
#include <vector>

#include "megatrain/launch/gpu_checks.h"

namespace mt::launch {

std::vector<GpuHealth> probe_gpus(std::string* why_none);

}  // namespace mt::launch
