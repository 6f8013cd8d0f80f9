// Tensor + sequence parallelism over a ProcessGroup (the mesh's tp group): the TpComm the model calls, with the
// all-gather+GEMM and GEMM+reduce-scatter pairs split into row chunks so that communication overlaps compute
// (MegaScale §3.2), plus the helpers that map between full tensors and tp shards (checkpoints, norms).
#pragma once
#include <functional>
#include <vector>

#include "megatrain/core/buffer.h"
#include "megatrain/comm/process_group.h"
#include "megatrain/kernels/ops.h"
#include "megatrain/model/params.h"
#include "megatrain/model/tp_comm.h"

namespace mt {

struct TensorParallelOptions {
  int chunks = 4;       // row chunks of each fused collective+GEMM (parallel.tp_chunks)
  bool overlap = true;  // false: one unchunked collective, then the GEMM (parallel.overlap)
};

// Tensors live in `ops`'s memory (device memory on a GPU run, with a NCCL group): the staging of the chunked
// collectives is allocated through ops and copied by ops, never touched by the host. Activations are in the
// backend's compute dtype; the collectives take F32 or BF16.
class ProcessGroupTpComm final : public TpComm {
 public:
  ProcessGroupTpComm(ProcessGroup& group, Ops& ops, const TensorParallelOptions& opt = {});
  int size() const override { return group_.size(); }
  int rank() const override { return group_.rank(); }
  void allreduce(Tensor t, TpReduce op) override;
  void all_gather_rows(Tensor full, Tensor shard, const Consume& consume = {}) override;
  void reduce_scatter_rows(Tensor shard, int64_t N, const Produce& produce,
                           const std::function<void()>& while_in_flight = {}) override;
  // Sizes the staging of the chunked collectives for activations of up to rows x cols of dtype, so that no step
  // allocates (the model's calls move at most B*T x d_model per micro-batch). Without it the first call grows it.
  void reserve(int64_t rows, int64_t cols, DType dtype);
  // Communication time of the tp group since the last call (busy: the collectives' execution; exposed: the time
  // the model was blocked waiting for them).
  CommTime take_comm_time() { return std::exchange(comm_time_, CommTime{}); }

 private:
  int num_chunks(int64_t rows_per_rank) const;
  char* stage(size_t bytes);  // grows on first use of a size (the first step), then reused
  void wait(const WorkPtr& w);

  ProcessGroup& group_;
  Ops& ops_;
  TensorParallelOptions opt_;
  Buffer stage_;
  CommTime comm_time_;
};

// Weights for squared norms summed over the tp ranks: 1 for a sharded tensor (its shards add up), and for a
// replicated tensor 1 on tp rank 0 only (every rank holds the same values; count them once).
std::vector<float> tp_norm_weights(const ParamStore& params, int tp_rank);

// full (spec.full_shape) = every tp rank's shard assembled; collective over `group` (all tp ranks call it).
void tp_gather_full(ProcessGroup& group, const ShardSpec& spec, const float* local, float* full);

}  // namespace mt
