// The MFU denominator: the peak FLOP/s a rank's device could do.
#pragma once
#include <string>

#include "megatrain/kernels/ops.h"

namespace mt {

// The MFU denominator of a CPU rank must bound what the rank can do, also when the node's ranks share its cores
// (`make train`: 4 ranks of 1 thread on a 2-core machine printed MFU from 74% to 156% when each rank's peak was
// its own wall-clock sgemm rate, measured while the other ranks measured too: a rank that measured a half or a
// third of a core then trained on a whole core while its peers waited in collectives). So the peak is built from
// two facts, each measured or read without depending on what the other ranks do at that moment:
//  * the sgemm rate of one CPU: FLOPs per CPU-second of this process (CLOCK_PROCESS_CPUTIME_ID), the best of a few
//    GEMMs. A core shared with other ranks gives this process fewer seconds, not slower ones, so the rate is the
//    core's own (less what sharing a core's caches costs, which only lowers it a little);
//  * the CPUs a rank can run on at once: its threads, and no more than its share of the CPUs the node's ranks
//    share, min(threads, cpus / local ranks) (cpus: this process's affinity mask, sched_getaffinity).
// The node's ranks together then have at most cpus x rate, whatever the layout and whoever waits: a step's model
// FLOPs over its time, summed over the ranks, cannot exceed it, so logged MFU stays at or below 100% (up to the
// rate's noise and a GEMM of the step faster than the measured shape). Hyper-threads count as CPUs: a rate measured
// on a core whose sibling idles overstates a hyper-thread, which errs towards a lower MFU, never above 100%.
// Not chosen: measuring wall-clock rates with all local ranks running together (their start-ups are seconds apart,
// so how much of the measurement overlapped is unknown), or dividing each rank's wall-clock rate by the ranks per
// CPU (a rate measured while the peers measured too is already a share: dividing again halves it twice). Nodes
// simulated on one host (several agents) see only their own LOCAL_WORLD_SIZE: their peak is overstated, so their
// MFU is understated, never above 100%.

// Measured sgemm throughput of the CPU backend per CPU-second (FLOP/s of one CPU): the best of a few GEMMs of
// transformer-like shape. 256 rows (1.2 GFLOP a GEMM) already runs the BLAS's large-matrix kernels, and costs every
// rank of every attempt ~0.1 s at start-up on one core (1024 rows cost over half a second, paid again on each
// restart).
double measure_cpu_matmul_flops(Ops& ops, int rows = 256, int in = 768, int out = 3072, int reps = 5);

// How the CPUs of a rank's node are shared: its OpenMP threads, the ranks on the node (LOCAL_WORLD_SIZE) and the
// CPUs they may run on.
struct CpuShare {
  int threads = 1, local_ranks = 1, cpus = 1;
};
// The peak of one rank: per_cpu_flops x min(threads, cpus / local_ranks). Throws mt::Error (Config) for a share
// that is not positive.
double cpu_peak_per_rank(double per_cpu_flops, const CpuShare& share);
// This process's CPUs (sched_getaffinity), for CpuShare::cpus.
int affinity_cpus();

// The dense bf16 tensor-core peak of a GPU from its product name (H100 SXM/PCIe/NVL, H200, GH200, A100), or 0 when
// the name is not in the table (then train.peak_tflops must be set).
double datasheet_peak_flops(const std::string& device_name);

struct PeakFlops {
  double flops = 0;    // per rank
  std::string source;  // what it is, for the log: "configured", "NVIDIA H100 80GB HBM3 datasheet, dense bf16",
                       // "peak 24.0 GFLOP/s a rank: sgemm 48.0 GFLOP/s per CPU, 2 CPUs shared by 4 ranks of 1 thread"
};
// train.peak_tflops when set (> 0); else the datasheet peak of a GPU, or cpu_peak_per_rank of a CPU with its
// measured rate. Throws an mt::Error of kind Config for a GPU not in the table without train.peak_tflops.
PeakFlops peak_flops(double configured_tflops, Ops& ops, const CpuShare& share);

}  // namespace mt
