// NVML's view of one GPU for `megatrain diagnose` (gpu_checks.h judges it): memory errors, the active clock-event
// reasons and the temperature against the GPU's own slowdown threshold.
//
// NVML is the driver's management library (libnvidia-ml.so.1, installed with the driver, not with the toolkit), so
// it is opened at run time: a build machine without a driver still builds, and a GPU machine whose driver lacks a
// call reads the rest. The GPU is found by its PCI bus id (kernels/gpu_identity.h), which CUDA and NVML agree on;
// their device indices need not (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER).
//
// What is read, and what a value NVML does not support means:
//   - uncorrectable ECC errors since the driver loaded (volatile counter): not supported = ECC off, 0 counted;
//   - a pending page retirement (pre-A100 parts) and a pending or failed row remap (A100 and later);
//   - the clock-event reasons now active (NVML's "throttle reasons");
//   - the GPU temperature and its slowdown threshold.
// XID errors are not read: NVML reports them only as events to a process subscribed when they occur (the driver's
// kernel log holds past ones), and diagnose runs after the fact.
#pragma once
#include <string>

#include "megatrain/launch/gpu_checks.h"

namespace mt::launch {

// Fills g's NVML fields and sets g.nvml_read; false with the reason in `why` (no library, no such GPU, a call
// failed), g untouched.
bool read_nvml(const std::string& pci_bus_id, GpuHealth& g, std::string* why);

}  // namespace mt::launch
