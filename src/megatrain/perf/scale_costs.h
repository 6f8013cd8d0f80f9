// The costs MegaScale writes about that grow with the job rather than with the step (§3.5, §4.4, §6.3):
// communication-group initialisation through the rendezvous store, checkpoint stall and recovery, and the share
// of wall time that trains at a given mean time between failures.
// Each figure is a count from the layout and the model (store requests, checkpoint bytes) times a per-unit cost of
// the cluster file's [scale] section (seconds per store request, bytes per second). Whether a figure checks the
// paper or restates it depends on where those per-unit costs come from; figure_bases() says so from their sources.
#pragma once
#include <string>
#include <vector>

#include "megatrain/model/config.h"
#include "megatrain/perf/cluster.h"
#include "megatrain/perf/step_model.h"

namespace mt::perf {

struct GroupInitCost {
  double groups = 0;              // process groups a 3D layout creates (tp, pp, dp, embedding)
  double requests_quadratic = 0;  // torch.distributed: every rank joins every new_group and its global barrier
  double requests_linear = 0;     // MegaScale: each rank talks to the store only about its own groups (2 per group)
  double seconds_quadratic = 0;   // on a blocking store (TCPStore)
  double seconds_async = 0;       // the same requests on a non-blocking store (Redis)
  double seconds_linear = 0;      // O(n) requests on the non-blocking store
};
GroupInitCost group_init_cost(const Cluster& c, const Layout& L);

struct CheckpointCost {
  double bytes_per_gpu = 0;           // bf16 weights (one copy per dp group, written by its first rank) + fp32 shard
  double stall_seconds = 0;           // stage 1: device -> pinned host memory; training waits for this
  double persist_seconds = 0;         // stage 2: host -> storage (storage_gbps_per_node), in the background
  double recovery_naive_seconds = 0;  // every GPU reads its own partition from storage (storage_read_gbps_per_node)
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

// Where a [scale] constant comes from, read from the start of its source: "measured by bench_..." (our own
// benchmark), "paper ..." (the MegaScale paper's own figures: a figure computed from it and compared with the paper
// restates the paper instead of checking it), anything else a datasheet or a stated assumption. The hardware the
// paper describes (NICs, GPUs) is a specification, not one of its results: recovery's broadcast over the network is
// not counted among its inputs here.
enum class ConstantOrigin { Measured, Paper, Datasheet };
ConstantOrigin constant_origin(const Sourced& s);

// For each scale figure ("group_init", "checkpoint_stall", "checkpoint_persist", "recovery", "availability"):
// whether it is a prediction (no input taken from the paper's figures) and a line naming its inputs' origins, e.g.
// "prediction: store_op_us, store_async_op_us measured by bench_mesh_init (...)".
struct FigureBasis {
  std::string figure;
  bool prediction = true;
  std::string note;
};
std::vector<FigureBasis> figure_bases(const Cluster& c);

}  // namespace mt::perf
