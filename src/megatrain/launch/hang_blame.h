// Who a hung job waits on. Given every rank's last reported collectives (rank_status.h), find the rank the others
// wait for and say so in one line, e.g.
//   rank 3 (dp1,pp0,tp1) never entered all_gather #41 of group dp[1,3]; rank 1 waits in it
// The rules, in order (the first that names someone wins):
//  1. Silence: a rank whose heartbeats stopped (stale_after seconds) while its process lives is stopped or wedged
//     below user space (SIGSTOP, a stuck driver call); nothing it reports is current, so it is blamed as such.
//  2. Lagging: in a group where some members wait in collective #k, a member whose own newest entry is below #k
//     never entered it.
//  3. Not started: all members are at #k, some running it and some only posted it (a rank stuck before its op
//     reached the wire).
// A blocked rank may itself be the victim of another group's hang (it waits in tp #10 because its tp peer never
// came, or only posted it); rule 2 follows such chains to the ranks that are not waiting on anyone.
#pragma once
#include <string>
#include <vector>

#include "megatrain/launch/rank_status.h"

namespace mt::launch {

struct Blame {
  std::vector<int> ranks;  // the blamed ranks (empty: no one could be named)
  std::string line;        // the human sentence, also when no one is named (then it lists what each rank does)
};

Blame blame_hang(const std::vector<RankStatus>& ranks, double now, double stale_after);

}  // namespace mt::launch
