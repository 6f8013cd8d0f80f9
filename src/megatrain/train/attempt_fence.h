// Whether the job has gone on without this rank's attempt: the last check before a failing rank writes into the
// job's shared directories (its survivor snapshots).
//
// A rank can outlive its attempt: its host froze (or lost the network) long enough for the job driver to declare
// the node lost and start the next attempt elsewhere, and then thawed. Its collectives fail at once (the peers it
// waited for are gone), and a failing rank writes the in-memory snapshots it holds for the restart - into the
// checkpoint directory the new attempt is using. The node's agent kills such ranks as soon as it sees its lease
// lapse (launch/node_lease.h), but on a thawing host the ranks may run first. So the agent names the store keys
// whose existence means "the job went on without you" (MEGATRAIN_FENCE_KEYS: the next attempt's plan, this node's
// eviction, the job's end), and the rank asks the store before it writes.
#pragma once
#include <string>

namespace mt {

// Empty when this rank's attempt is still the job's current one, or when nobody can say: no MEGATRAIN_FENCE_KEYS
// (not under the job driver), or the store does not answer within a few seconds - then the snapshots may be all a
// requeued job has, so they are written. Otherwise the reason the attempt is over, naming the key found.
std::string attempt_superseded();

}  // namespace mt
