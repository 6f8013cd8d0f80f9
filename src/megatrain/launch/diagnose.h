// `megatrain diagnose`: MegaScale's "stop and check" for one node, run after a fault before the node is trusted
// again. Each check measures one thing the job needs and compares it with what a healthy node of this kind does
// (an expectations file: the saved report of a healthy run, `--save` then `--expect`):
//   local_allreduce   the node's ranks sum a known tensor over Gloo: the result must be exact (correctness), and
//                     its bus bandwidth is measured
//   gemm              the backend's fp32 matmul rate (GFLOP/s)
//   memory_bandwidth  a large copy (GB/s, bytes read + written)
// A check passes when its value is at least `tolerance` x the expected one (and, for the all-reduce, the sum is
// exact). Without an expectation a measured value passes (nothing to compare with) and says so.
//   pairwise_bandwidth  with a neighbouring node (the job driver pairs the nodes of a failed attempt): the two
//                     all-reduce a known tensor over the network through the job store; exact, and its bandwidth
// On a node with GPUs each GPU is checked too (gpu_checks.h: rates against the datasheet and the node's other GPUs,
// a bit-exact self-test, memory errors, clock slowdowns); without one a note says why they were not.
// MEGATRAIN_FAULTS' badnode:node=N fails node N's matmul check (train/faults.h).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mt::launch {

struct DiagnoseOptions {
  int node = 0;            // for the report (and the badnode fault of MEGATRAIN_FAULTS)
  int local_ranks = 2;     // ranks in the local all-reduce
  double tolerance = 0.5;  // a value below tolerance x expected fails
  nlohmann::json expect;   // {"gemm": GFLOP/s, "memory_bandwidth": GB/s, "local_allreduce": GB/s, ...}; may be {}
  // The pairwise check (off when pair_store is empty): the store URL (a tcp store's secret comes from
  // MEGATRAIN_STORE_SECRET), a group name both nodes use, this node's rank in the pair (0 or 1), and the address
  // this node listens on.
  std::string pair_store, pair_group;
  int pair_rank = 0;
  std::string iface = "127.0.0.1";
  double pair_timeout_s = 30;
};

struct CheckResult {
  std::string name, unit;
  double value = 0;
  double expected = 0;  // 0: no expectation
  bool pass = false;
  bool ran = true;
  std::string detail;
};

struct DiagnoseReport {
  int node = 0;
  std::vector<CheckResult> checks;
  std::vector<std::string> notes;  // what was not checked and why (e.g. no GPU), said beside the checks
  bool pass() const;
  nlohmann::json to_json() const;
  // {"gemm": value, ...}: what --save writes and --expect reads.
  nlohmann::json values() const;
};

// Compares a measured value with its expectation (pure; unit-tested).
void judge(CheckResult& c, double tolerance);

DiagnoseReport run_diagnose(const DiagnoseOptions& opt);

}  // namespace mt::launch
