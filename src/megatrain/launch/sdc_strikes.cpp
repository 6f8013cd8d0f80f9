#include "megatrain/launch/sdc_strikes.h"

#include <fmt/format.h>

namespace mt::launch {

std::map<int, std::string> SdcStrikes::named(int attempt, const std::set<int>& nodes) {
  std::map<int, std::string> evict;
  for (int node : nodes) {
    const auto [it, first_time] = first_.emplace(node, attempt);
    if (!first_time && it->second != attempt)
      evict[node] = fmt::format(
          "a silent data corruption was found on its ranks in attempt {} and again in attempt {}: persistent",
          it->second, attempt);
  }
  return evict;
}

bool names_sdc_culprit(const std::string& event, bool no_majority) { return event == "sdc" && !no_majority; }

}  // namespace mt::launch
