#include "megatrain/launch/gpu_probe.h"

#include <fmt/format.h>

#include "megatrain/kernels/ops.h"

namespace mt::launch {

std::vector<GpuHealth> probe_gpus(std::string* why_none) {
  const int n = cuda_device_count();
  if (n == 0)
    *why_none = cuda_versions().rfind("not built", 0) == 0 ? "this megatrain was built without CUDA"
                                                           : "no GPU is visible";
  else
    *why_none = fmt::format("{} GPU{} visible, but this build cannot measure them yet", n, n == 1 ? "" : "s");
  return {};
}

}  // namespace mt::launch
