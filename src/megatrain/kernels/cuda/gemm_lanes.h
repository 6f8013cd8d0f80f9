// Side streams for independent GEMMs that are each too small to fill the GPU (the experts of a grouped GEMM): they
// fork from the op stream, run concurrently, and join back to it, so to everything else the group is one op in
// stream order.
//
// Each side lane has its own cuBLASLt handle and workspace (LtGemm): two GEMMs in flight on one workspace would
// overwrite each other's scratch. The lanes' LtGemms make the same algorithm choices as the op stream's for the same
// problem (cuBLASLt's heuristic depends on the problem and the workspace size, which are equal), so a GEMM's result
// does not depend on the lane it ran on. Not so under GEMM tuning (LtGemm::set_tuning), which is by timings and per
// LtGemm: each lane then tunes the problems it runs, may choose differently from another lane, and its choices are
// not in CudaOps::gemm_tuning_report().
#pragma once
#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "megatrain/kernels/cuda/gemm.h"

namespace mt {

class GemmLanes {
 public:
  // `lanes` - 1 side streams (lane 0 is the caller's stream and LtGemm); tuning as LtGemm::set_tuning.
  GemmLanes(int lanes, int tuning);
  ~GemmLanes();
  GemmLanes(const GemmLanes&) = delete;
  GemmLanes& operator=(const GemmLanes&) = delete;

  int lanes() const { return static_cast<int>(side_.size()) + 1; }
  void set_tuning(int candidates);
  // Every side stream waits for what `main` has issued so far.
  void fork(cudaStream_t main);
  // `main` waits for everything issued on the side streams.
  void join(cudaStream_t main);
  // Lane i's stream and GEMM handle: lane 0 is (main, main_gemm).
  cudaStream_t stream(int lane, cudaStream_t main) const { return lane == 0 ? main : side_[lane - 1].stream; }
  LtGemm& gemm(int lane, LtGemm& main_gemm) const { return lane == 0 ? main_gemm : *side_[lane - 1].gemm; }

 private:
  struct Side {
    cudaStream_t stream = nullptr;
    cudaEvent_t done = nullptr;  // recorded at join, waited for by the main stream
    std::unique_ptr<LtGemm> gemm;
  };
  void release();  // destroys what was made (the destructor, or a constructor that failed half-way)
  std::vector<Side> side_;
  cudaEvent_t forked_ = nullptr;  // recorded on the main stream at fork
};

}  // namespace mt
