// What every process-group backend shares.
#include "megatrain/comm/process_group.h"

#include <algorithm>

#include "megatrain/core/error.h"

namespace mt {

void check_group_args(const char* maker, const std::string& name, const std::vector<int>& ranks, int my_global_rank,
                      const GroupOptions& opt) {
  MT_CHECK(!name.empty(), "{}: empty group name", maker);
  MT_CHECK(!ranks.empty(), "group {}: no ranks", name);
  for (size_t i = 0; i < ranks.size(); ++i) {
    MT_CHECK(ranks[i] >= 0, "group {}: negative rank {}", name, ranks[i]);
    MT_CHECK(i == 0 || ranks[i - 1] < ranks[i], "group {}: ranks must be sorted and distinct ({} after {})", name,
             ranks[i], ranks[i - 1]);
  }
  MT_CHECK(std::find(ranks.begin(), ranks.end(), my_global_rank) != ranks.end(), "group {}: rank {} is not a member",
           name, my_global_rank);
  MT_CHECK(opt.timeout.count() > 0, "group {}: timeout must be positive", name);
}

void check_all_to_all_v(const ProcessGroup& g, const Tensor& out, const Tensor& in,
                        const std::vector<int64_t>& recv_counts, const std::vector<int64_t>& send_counts) {
  const size_t n = static_cast<size_t>(g.size());
  MT_CHECK(recv_counts.size() == n && send_counts.size() == n,
           "group {}: all_to_all_v takes one count per rank ({}), got {} receive and {} send counts", g.name(), n,
           recv_counts.size(), send_counts.size());
  MT_CHECK(out.dtype == in.dtype, "group {}: all_to_all_v of {} input into {} output", g.name(), dtype_name(in.dtype),
           dtype_name(out.dtype));
  MT_CHECK(in.dtype == DType::F32 || in.dtype == DType::I32 || in.dtype == DType::BF16,
           "group {}: all_to_all_v of {} tensors is not supported", g.name(), dtype_name(in.dtype));
  int64_t sent = 0, received = 0;
  for (size_t r = 0; r < n; ++r) {
    MT_CHECK(send_counts[r] >= 0 && recv_counts[r] >= 0, "group {}: all_to_all_v with a negative count for rank {}",
             g.name(), r);
    sent += send_counts[r], received += recv_counts[r];
  }
  MT_CHECK(sent == in.numel() && received == out.numel(),
           "group {}: all_to_all_v counts sum to {} sent and {} received elements, the tensors hold {} and {}",
           g.name(), sent, received, in.numel(), out.numel());
}

}  // namespace mt
