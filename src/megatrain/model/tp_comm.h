// What the model needs from tensor parallelism, without knowing about processes (implemented over a
// ProcessGroup in parallel/tensor_parallel.h). Activations in the sequence-parallel regions are row blocks:
// rank r holds rows [r*N/tp, (r+1)*N/tp) of the [N, C] residual stream.
#pragma once
#include <cstdint>
#include <functional>

#include "megatrain/core/tensor.h"

namespace mt {

enum class TpReduce { Sum, Max };

class TpComm {
 public:
  virtual ~TpComm() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;

  // In-place synchronous all-reduce over the tensor-parallel ranks.
  virtual void allreduce(Tensor t, TpReduce op) = 0;

  // full[N, C] = every rank's shard[N/tp, C] in rank order. consume(r0, n) runs for each block of rows
  // [r0, r0 + n) of full as soon as it has arrived (chunk by chunk when overlapping), so the GEMM on those rows
  // overlaps the rest of the gather. Every row is consumed exactly once.
  using Consume = std::function<void(int64_t r0, int64_t n)>;
  virtual void all_gather_rows(Tensor full, Tensor shard, const Consume& consume = {}) = 0;

  // shard[N/tp, C] = sum over the ranks of row block rank() of each rank's partial[N, C], where the partial is
  // never stored whole: produce(out, r0, n) writes its rows [r0, r0 + n) into out [n, C], chunk by chunk, and
  // each chunk's reduce-scatter overlaps the next chunk's GEMM. while_in_flight (optional) runs after the last
  // chunk has been issued and before waiting (e.g. a weight-gradient GEMM).
  using Produce = std::function<void(Tensor out, int64_t r0, int64_t n)>;
  virtual void reduce_scatter_rows(Tensor shard, int64_t N, const Produce& produce,
                                   const std::function<void()>& while_in_flight = {}) = 0;
};

}  // namespace mt
