// What `megatrain diagnose` concludes about each GPU of a node (MegaScale §4.3, "stop and check"), from what was
// measured on it (GpuHealth: the bf16 GEMM rate, memory and host-link bandwidth, a bit-exact self-test, and NVML's
// memory errors, clock-event reasons and temperature). Each check is judged against the GPU's datasheet and against
// the node's other GPUs, with these thresholds:
//   gpuN_gemm            cuBLASLt bf16 8192^3: at least 60% of the datasheet's dense bf16 peak (our H100 ran the
//                        training GEMMs at ~760 TFLOP/s, 77% of 989: docs/performance.md), and at least 85% of the
//                        node's median GPU (one part, one clock table: a GPU 15% behind its peers is throttled or
//                        faulty, the straggler a whole job waits for)
//   gpuN_hbm_bandwidth   a device-to-device copy (bytes read + written): at least 60% of the datasheet's bandwidth
//                        (a copy kernel reaches 80-90% of it on a healthy part), and 85% of the node's median
//   gpuN_host_bandwidth  pinned host-to-device and back, the slower: at least 10 GB/s (a PCIe 4.0 x16 link moves
//                        ~25, a link trained down to x8 at 3.0 about 7), and 85% of the node's median
//   gpuN_self_test       a fixed GEMM whose exact result is known (small integers: every sum is exact in bf16
//                        products and fp32 sums): any wrong bit fails (silent corruption)
//   gpuN_memory_errors   NVML: any volatile uncorrectable ECC error, a pending row remap or page retirement, or a
//                        failed remap fails (NVIDIA's memory error management: the GPU needs a reset or service)
//   gpuN_clocks          NVML: an active hardware slowdown, thermal slowdown or power brake fails, as does a
//                        temperature at or above the GPU's slowdown threshold; a software power cap is said only
//   gpus_allreduce       with two or more GPUs, one all-reduce across them all (NCCL, comm/node_gpu_allreduce.h):
//                        exact, and a bus bandwidth of at least 40% of the part's NVLink bandwidth in one
//                        direction (NVIDIA's datasheets: 450 GB/s on H100/H200 SXM, 300 on A100 SXM). A healthy
//                        NVLink node all-reduces at most of that; a GPU whose NVLink is down falls back to PCIe
//                        (under 64 GB/s), far below the floor. Parts without NVLink are judged on exactness only.
// A value that was not measured (0) is no evidence: its check says so and passes. The checks feed the driver's
// eviction exactly as the host checks do (diagnose.h). Pure: unit-tested with made-up measurements.
#pragma once
#include <string>
#include <vector>

#include "megatrain/launch/diagnose.h"

namespace mt::launch {

struct GpuHealth {
  int index = 0;
  std::string name;                   // e.g. "NVIDIA H200"
  double gemm_tflops = 0;             // cuBLASLt bf16 8192^3, best of a few
  double datasheet_tflops = 0;        // dense bf16 (train/peak.cpp's table); 0: not known
  double hbm_gbps = 0;                // device-to-device copy, bytes read + written
  double datasheet_hbm_gbps = 0;      // 0: not known
  double h2d_gbps = 0, d2h_gbps = 0;  // pinned
  bool self_test_ran = false, self_test_exact = false;
  long long ecc_uncorrected_volatile = 0;
  long long retired_pages_pending = 0;
  bool row_remap_pending = false, row_remap_failure = false;
  std::vector<std::string> clock_events;  // NVML's active clock-event reasons: "hw_slowdown", "hw_thermal_slowdown",
                                          // "hw_power_brake", "sw_power_cap", "sw_thermal_slowdown", "idle", ...
  int temperature_c = 0, slowdown_temperature_c = 0;  // 0: not known
  bool nvml_read = false;  // the memory errors, clock events and temperatures above were read (else not measured)
  std::string nvml_why;    // why not, when not
};

// The HBM bandwidth of a GPU by name (NVIDIA's datasheets, GB/s), 0 when not known.
double datasheet_hbm_gbps(const std::string& name);

// The checks of every GPU, in GPU order, each named gpuN_<check> (see above).
std::vector<CheckResult> judge_gpus(const std::vector<GpuHealth>& gpus);

// The NVLink bandwidth of a GPU by name, one direction (GB/s), 0 when it has none or is not known.
double datasheet_nvlink_gbps(const std::string& name);

// What an all-reduce across the node's GPUs measured (node_gpu_allreduce): ran = false with `why` when it could not.
struct NodeAllreduceResult {
  int gpus = 0;
  bool ran = false;
  double busbw_gbps = 0;
  bool exact = false;
  std::string why;
};
// The gpus_allreduce check (see above), for GPUs named `name`.
CheckResult judge_gpu_allreduce(const NodeAllreduceResult& r, const std::string& name);

}  // namespace mt::launch
