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

}  // namespace mt
