// Every rank of a job must train the same effective config: a rank started with another model.n_layer fails deep
// inside a collective, and one with another optim.lr or data.seq_len trains silently to a wrong result. At
// start-up the ranks compare their effective configs (RunConfig::effective, every key after defaults and
// overrides) through the store, before any group is built.
//
// Store traffic is O(world) in total, like a barrier: rank 0 publishes its config; every other rank reads it,
// compares, and publishes its verdict (the keys it differs on); rank 0 reads the verdicts and publishes the job's.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "megatrain/comm/store.h"

namespace mt {

using ConfigEntries = std::vector<std::pair<std::string, std::string>>;

// The keys on which `mine` differs from `reference` (a key present in one only counts), as
// "key (rank 0: a, rank r: b)" items joined by "; ", or "" when they agree. Exposed for tests.
std::string config_differences(const ConfigEntries& reference, const ConfigEntries& mine, int rank);

// Collective over the `world` ranks of the job (through the store): returns when every rank's config equals rank
// 0's; otherwise every rank throws an mt::Error of kind Config naming the differing ranks and keys.
void agree_on_config(Store& store, int rank, int world, const ConfigEntries& mine, Millis timeout);

}  // namespace mt
