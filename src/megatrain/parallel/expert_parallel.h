// Expert parallelism over a ProcessGroup (the mesh's ep group): the EpComm the MoE layer calls (model/ep_comm.h).
//
// Protocol: every ep rank calls exchange_counts then exchange_rows (dispatch), exchange_rows (combine) per MoE
// layer forward, and exchange_rows twice per MoE layer backward, in the same layer order on every rank (the group
// runs collectives in issue order). exchange_rows issues one all_to_all_v and, with overlap (parallel.ep_overlap),
// runs the caller's independent compute before waiting; without it waits first, so the exchange is fully exposed.
// Communication time is its own plane ("ep": busy = the all-to-alls' execution, exposed = the time the layer
// waited for them), and each exchange is a timeline span (category "ep").
#pragma once
#include <utility>
#include <vector>

#include "megatrain/comm/process_group.h"
#include "megatrain/model/ep_comm.h"

namespace mt {

class ProcessGroupEpComm final : public EpComm {
 public:
  ProcessGroupEpComm(ProcessGroup& group, bool overlap) : group_(group), overlap_(overlap) {}
  int size() const override { return group_.size(); }
  int rank() const override { return group_.rank(); }
  void exchange_counts(std::vector<int32_t>& recv, const std::vector<int32_t>& send, int n) override;
  void exchange_rows(Tensor out, Tensor in, const std::vector<int64_t>& recv_rows,
                     const std::vector<int64_t>& send_rows, const std::function<void()>& while_in_flight = {}) override;
  // The ep group's communication time since the last call.
  CommTime take_comm_time() { return std::exchange(comm_time_, CommTime{}); }

 private:
  void wait(const WorkPtr& w);

  ProcessGroup& group_;
  bool overlap_;
  CommTime comm_time_;
};

}  // namespace mt
