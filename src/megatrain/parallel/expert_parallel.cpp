#include "megatrain/parallel/expert_parallel.h"

#include <fmt/format.h>

#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"
#include "megatrain/obs/timeline.h"

namespace mt {

void ProcessGroupEpComm::wait(const WorkPtr& w) {
  const double t0 = now_seconds();
  w->wait();
  comm_time_.exposed_seconds += now_seconds() - t0;
  comm_time_.busy_seconds += w->exec_seconds();
}

void ProcessGroupEpComm::exchange_counts(std::vector<int32_t>& recv, const std::vector<int32_t>& send, int n) {
  MT_CHECK(send.size() == static_cast<size_t>(size()) * n,
           "expert parallelism: {} counts to send over {} ranks of {} each", send.size(), size(), n);
  recv.assign(send.size(), 0);
  const std::vector<int64_t> counts(size(), n);
  obs::ScopedSpan span("ep", "ep counts");
  wait(group_.all_to_all_v(Tensor(recv.data(), {static_cast<int64_t>(recv.size())}, DType::I32, Device::CPU),
                           Tensor(const_cast<int32_t*>(send.data()), {static_cast<int64_t>(send.size())}, DType::I32,
                                  Device::CPU),
                           counts, counts));
}

void ProcessGroupEpComm::exchange_rows(Tensor out, Tensor in, const std::vector<int64_t>& recv_rows,
                                       const std::vector<int64_t>& send_rows,
                                       const std::function<void()>& while_in_flight) {
  const int64_t C = in.ndim > 1 ? in.size(1) : out.size(1);
  std::vector<int64_t> rc(recv_rows), sc(send_rows);
  for (int64_t& c : rc) c *= C;
  for (int64_t& c : sc) c *= C;
  obs::ScopedSpan span("ep", [&] {
    return obs::SpanInfo{"ep all-to-all", {{"sent_rows", in.size(0)}, {"received_rows", out.size(0)}}};
  });
  Tensor o(out.ptr, {out.numel()}, out.dtype, out.device), i(in.ptr, {in.numel()}, in.dtype, in.device);
  WorkPtr w = group_.all_to_all_v(o, i, rc, sc);
  if (!overlap_) wait(w);
  if (while_in_flight) while_in_flight();
  if (overlap_) wait(w);
}

}  // namespace mt
