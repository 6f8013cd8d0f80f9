// What the job driver does with a silent data corruption (train/sdc_check.h, train/sdc_rerun.h): restart, or evict
// the node. A rank is *named* when an `sdc` event of its own says it is the culprit: the odd replica of a majority
// (no_majority false), or the rank whose gradients a spiking step's rerun did not reproduce (transient true). Not
// counted: the two suspects of a pair without a majority, and `sdc_culprit`, which settles a pair's corruption of
// an earlier attempt (counting it would name that one fault twice). So a corruption that recurs in a dp = 2 pair is
// restarted until --max-restarts, never evicted: the gap this leaves.
//
// One naming cannot tell a transient fault (a cosmic ray, a marginal voltage once) from a persistent one (a GPU that
// computes wrong again and again): the job restarts from the newest agreed checkpoint, where the node stays. A node
// named again in a later attempt is persistent: it is evicted (the driver's ordinary eviction: a spare takes its
// slot, or the job shrinks, or it gives up as with any lost node). Why two attempts and not one: evicting on the
// first sight would take a node out for every transient flip, which at Llama 3's rate (6 in 54 days on 16k GPUs)
// loses more nodes than faults warrant; the rerun that follows a restart is the second look.
//
// Pure: the driver feeds it the nodes of each attempt's named ranks; tested without processes.
#pragma once
#include <map>
#include <set>
#include <string>

namespace mt::launch {

class SdcStrikes {
 public:
  // The nodes (agent ids) whose ranks were named in attempt `attempt`; returns those named in an earlier attempt
  // too, each with the line that says why it goes.
  std::map<int, std::string> named(int attempt, const std::set<int>& nodes);

 private:
  std::map<int, int> first_;  // node -> the first attempt it was named in
};

// Whether a rank's heartbeat event names that rank as the culprit of a new silent data corruption (above).
bool names_sdc_culprit(const std::string& event, bool no_majority);

}  // namespace mt::launch
