// A modelled cluster for the performance model: the GPU, the links inside a node and between nodes, the
// efficiency curves of the kernels, and the scale-dependent constants (stragglers, store, checkpoint storage).
// It is read from a TOML file (configs/clusters/*.toml) in which every constant is a table
//   key = { value = 312.0, source = "NVIDIA A100 datasheet: ..." }
// so that each number says where it comes from (a specification, a published microbenchmark, our own benchmark).
// A missing constant, an unknown key, a constant without its source or a value out of range is an error that names
// the file and the key.
// The optional [calibration] section holds at most four constants that no datasheet prices, fitted by least squares
// on a declared calibration set (`megatrain simulate --calibrate SET.json`, perf/calibration.h), each with the source
// "fitted on ..., residuals ...". Absent, each is neutral (scales 1, seconds 0): the model is then the datasheet one.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace mt::perf {

struct Sourced {
  double value = 0;
  std::string source;
};

// Efficiency as a function of x, given at points; linear in log(x) between points and flat beyond the ends.
struct Curve {
  std::vector<std::pair<double, double>> points;  // (x, efficiency in (0, 1]), x ascending
  std::string source;
  double at(double x) const;
};

struct Cluster {
  std::string name, path;
  // "rail-clos" (one NIC per GPU, each on its own rail of a Clos fabric; the paper's §3.6), "single-node"
  // (everything on NVLink) or "single-host" (CPU processes on one machine; the links are loopback TCP).
  std::string topology;

  // [gpu] (a "GPU" is one rank's device: on a CPU host, the cores one rank uses)
  Sourced peak_tflops;  // dense peak of the training dtype (bf16 on GPUs, fp32 on CPU), per device
  Sourced hbm_gbps;     // device memory bandwidth, GB/s
  Sourced memory_gib;   // device memory, GiB
  Sourced gpus_per_node;
  Sourced dtype_bytes;  // bytes of one activation / weight element in compute (2: bf16 on GPUs; 4: fp32 on CPU)
  Sourced sm_count;     // streaming multiprocessors (cores on a CPU host): a GEMM runs in waves of this many tiles
  // single-host only: the cores all ranks share. A rank computes at the calibrated rate while no more ranks than
  // this compute at once; with more ranks than cores a step takes at least all ranks' compute / host_cores.
  // 0 (absent) elsewhere: every GPU is its own.
  Sourced host_cores;
  // [intra_node]
  Sourced nvlink_gbps;  // per-GPU unidirectional bandwidth a collective achieves inside a node, GB/s
  Sourced nvlink_latency_us;
  // [network]
  Sourced nic_gbps;  // per NIC, GB/s (200 Gb/s = 25 GB/s)
  Sourced nics_per_node;
  Sourced nic_latency_us;  // one message, end to end across the fabric
  // [efficiency]
  Curve gemm;  // x = FLOPs of one GEMM (2*M*N*K): fraction of peak reached, before wave quantization
  Sourced gemm_tile_m, gemm_tile_n;   // output tile one SM computes (wave quantization; 1 x 1 turns it off)
  Sourced attention;                  // fraction of peak the attention kernel reaches (FlashAttention 1 in Megatron-LM)
  Sourced attention_fused;            // ... with the efficient operators (FlashAttention-2, MegaScale §3.3)
  Sourced memory_bound;               // fraction of hbm_gbps that elementwise kernels reach
  Sourced kernel_launch_us;           // fixed cost per kernel launch (unfused elementwise chains pay it per op)
  Sourced optimizer_bytes_per_param;  // bytes the optimizer step reads and writes per parameter of its shard
  // [stragglers]
  Sourced straggler_node_fraction;  // fraction of nodes that run slower than the rest
  Sourced straggler_slowdown;       // how much slower (0.1 = 10%)
  Sourced gpu_speed_range;          // spread (max - min) of the speed of healthy GPUs of one node, as a fraction
  // [scale]
  Sourced store_op_us;                 // one request served by a blocking single-threaded store (torch TCPStore)
  Sourced store_async_op_us;           // one request served by a non-blocking store (Redis)
  Sourced host_copy_gbps;              // device -> pinned host memory per GPU (checkpoint stage 1)
  Sourced storage_gbps_per_node;       // storage write bandwidth per node (checkpoint stage 2, in the background)
  Sourced storage_read_gbps_per_node;  // storage read bandwidth per node (recovery)
  Sourced failure_detect_s;            // detection + diagnostics before a restart
  Sourced node_mtbf_hours;             // mean time between failures of one node
  // [calibration] (optional; neutral when absent)
  Sourced gemm_efficiency_scale{1, ""};  // sustained GEMM efficiency in a training step / the microbenchmark curve
  Sourced nvlink_efficiency{1, ""};      // collective bandwidth inside a node in a training step / nccl-tests busbw
  Sourced network_efficiency{1, ""};     // collective bandwidth across nodes in a training step / nic_gbps
  Sourced dp_sync_s{0, ""};              // per-step seconds per doubling of dp (step cost that grows with dp)
  Sourced overlap_interference{0, ""};   // of the communication overlapped with compute, the share that still costs
                                         // step time (its kernels take SMs and HBM bandwidth from the GEMMs)

  // Per-GPU share of the node's network bandwidth, bytes/s.
  double network_bytes_per_s() const;
  double nvlink_bytes_per_s() const { return nvlink_gbps.value * 1e9 * nvlink_efficiency.value; }
  // The GEMM efficiency curve at x, scaled by the calibrated gemm_efficiency_scale, at most 1.
  double gemm_efficiency(double flops) const;
  double peak_flops() const { return peak_tflops.value * 1e12; }
  double hbm_bytes_per_s() const { return hbm_gbps.value * 1e9; }
  int node_gpus() const { return static_cast<int>(gpus_per_node.value); }
  // Seconds a step spends on the calibrated dp-dependent cost: dp_sync_s x log2(dp).
  double dp_sync_seconds(int dp) const;
  // Every constant as ("section.key", value, source), in file order, for reports.
  std::vector<std::pair<std::string, Sourced>> constants() const;
};

Cluster parse_cluster(const std::string& toml_text, const std::string& source);
Cluster load_cluster(const std::string& path);
// The TOML text of a cluster (constants with their sources, values to 6 significant digits).
std::string to_toml(const Cluster& c);

}  // namespace mt::perf
