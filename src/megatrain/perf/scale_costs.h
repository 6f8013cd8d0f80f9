// The costs MegaScale writes about that grow with the job rather than with the step (§3.5, §4.4, §6.3):
// communication-group initialisation through the rendezvous store, checkpoint stall and recovery, and the share
// of wall time that trains at a given mean time between failures.
#pragma once
#include "megatrain/model/config.h"
#include "megatrain/perf/cluster.h"
#include "megatrain/perf/step_model.h"

namespace mt::perf {

struct GroupInitCost {
  double groups = 0;              // process groups a 3D layout creates (tp, pp, dp, embedding)
  double requests_quadratic = 0;  // torch.distributed: every rank joins every new_group and its global barrier
  double requests_linear = 0;     // MegaScale: each rank talks to the store only about its own groups
  double seconds_quadratic = 0;   // on a blocking store (TCPStore)
  double seconds_async = 0;       // the same requests on a non-blocking store (Redis)
  double seconds_linear = 0;      // O(n) requests on the non-blocking store
};
GroupInitCost group_init_cost(const Cluster& c, const Layout& L);

struct CheckpointCost {
  double bytes_per_gpu = 0;           // bf16 weights (one copy per dp group, written by its first rank) + fp32 shard
  double stall_seconds = 0;           // stage 1: device -> pinned host memory; training waits for this
  double persist_seconds = 0;         // stage 2: host -> distributed storage, in the background
  double recovery_naive_seconds = 0;  // every GPU reads its own partition from storage
  double recovery_seconds = 0;        // one reader per dp group, then a broadcast over the dp group (§4.4)
};
CheckpointCost checkpoint_cost(const Cluster& c, const ModelConfig& m, const Layout& L);

struct Availability {
  double job_mtbf_hours = 0;      // node MTBF / nodes
  double interval_seconds = 0;    // checkpoint interval minimising lost time: sqrt(2 * stall * MTBF) (Young 1974)
  double lost_per_failure_s = 0;  // detection + re-initialisation + recovery + half an interval of recomputation
  double effective_fraction = 0;  // training time / wall time
};
Availability availability(const Cluster& c, const CheckpointCost& ck, const GroupInitCost& init, int gpus,
                          double mtbf_hours_override = 0);

}  // namespace mt::perf
