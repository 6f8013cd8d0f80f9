#include "megatrain/train/device_plane.h"

#include <fmt/format.h>

#include <cstdlib>

#include "megatrain/core/error.h"
#include "megatrain/core/kind.h"

namespace mt {

DevicePlaneDecision decide_device_plane(DevicePlane asked, int local_rank, int local_world_size, int gpus) {
  if (gpus < 1)
    fail_as(ErrorKind::Config, "train.device = \"cuda\" but no CUDA device is visible (CUDA_VISIBLE_DEVICES={})",
            std::getenv("CUDA_VISIBLE_DEVICES") ? std::getenv("CUDA_VISIBLE_DEVICES") : "unset");
  const bool shared = local_world_size > gpus;
  if (asked == DevicePlane::Nccl && shared)
    fail_as(ErrorKind::Config,
            "parallel.device_plane = \"nccl\" needs a GPU per local rank, but {} local ranks see {} GPU{}: local "
            "rank {} would share GPU 0 with local rank 0, which NCCL refuses; use parallel.device_plane = "
            "\"staged\" (or \"auto\"), or fewer ranks per node",
            local_world_size, gpus, gpus == 1 ? "" : "s", gpus);
  DevicePlaneDecision d;
  d.staged = asked == DevicePlane::Staged || (asked == DevicePlane::Auto && shared);
  d.gpu = d.staged ? local_rank % gpus : local_rank;
  const std::string share = fmt::format("{} local rank{} on {} GPU{}", local_world_size,
                                        local_world_size == 1 ? "" : "s", gpus, gpus == 1 ? "" : "s");
  d.why = d.staged ? fmt::format("staged through host memory over Gloo ({}{})", share,
                                 asked == DevicePlane::Staged ? ", as parallel.device_plane asks" : ": they share")
                   : fmt::format("NCCL ({}{})", share,
                                 asked == DevicePlane::Nccl ? ", as parallel.device_plane asks" : ": a GPU each");
  return d;
}

}  // namespace mt
