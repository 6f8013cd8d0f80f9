// What the model's MoE layer needs from expert parallelism, without knowing about processes (implemented over a
// ProcessGroup in parallel/expert_parallel.h). The experts of a layer are sharded over the ep ranks (ep rank r holds
// experts [r*E/ep, (r+1)*E/ep)); each rank routes its own tokens, sends every assignment's row to the rank owning
// its expert (dispatch), and gets the expert's output row back (combine).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "megatrain/core/tensor.h"

namespace mt {

class EpComm {
 public:
  virtual ~EpComm() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;

  // Synchronous exchange of n counts per rank: send[r*n, (r+1)*n) goes to rank r; recv (resized to size()*n)
  // [r*n, (r+1)*n) comes from rank r.
  virtual void exchange_counts(std::vector<int32_t>& recv, const std::vector<int32_t>& send, int n) = 0;

  // The all-to-all of row blocks: in [sum(send_rows), C] is size() consecutive blocks, block r (send_rows[r] rows)
  // for rank r; out [sum(recv_rows), C] receives block r (recv_rows[r] rows) from rank r. while_in_flight (optional)
  // runs between the issue and the wait: compute independent of the exchange (the shared experts), hidden behind
  // it when the implementation overlaps; returns once out is complete and while_in_flight has run.
  virtual void exchange_rows(Tensor out, Tensor in, const std::vector<int64_t>& recv_rows,
                             const std::vector<int64_t>& send_rows,
                             const std::function<void()>& while_in_flight = {}) = 0;
};

}  // namespace mt
