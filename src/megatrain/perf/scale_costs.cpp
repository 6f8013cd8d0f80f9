#include "megatrain/perf/scale_costs.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "megatrain/perf/collectives.h"
#include "megatrain/perf/memory.h"

namespace mt::perf {

GroupInitCost group_init_cost(const Cluster& c, const Layout& L) {
  GroupInitCost g;
  const double n = L.gpus();
  // One group per tp slice, per pp column, per dp row, and one embedding group per pipeline (first + last stage).
  g.groups = double(L.dp) * L.pp + double(L.dp) * L.tp + double(L.pp) * L.tp + (L.pp > 1 ? double(L.dp) * L.tp : 0);
  // torch.distributed.new_group must be called by every rank for every group, and each call ends in a barrier
  // over the whole world: n requests per group.
  g.requests_quadratic = n * g.groups;
  // MegaScale orders the creations so that a rank only takes part in its own groups, each a set of its id and a
  // get of the root's: two requests per membership. Every rank is in one tp, one pp and one dp group; the ranks of
  // the first and the last stage (2 dp tp of them) are in an embedding group too.
  const double memberships = 3 * n + (L.pp > 1 ? 2.0 * L.dp * L.tp : 0);
  g.requests_linear = 2 * memberships;
  g.seconds_quadratic = g.requests_quadratic * c.store_op_us.value * 1e-6;
  g.seconds_async = g.requests_quadratic * c.store_async_op_us.value * 1e-6;
  g.seconds_linear = g.requests_linear * c.store_async_op_us.value * 1e-6;
  return g;
}

CheckpointCost checkpoint_cost(const Cluster& c, const ModelConfig& m, const Layout& L) {
  CheckpointCost k;
  // The fullest GPU's bf16 weights and its fp32 optimizer shard (a MoE model: its experts over ep, their state over
  // dp / ep; memory.h).
  double weights = 0, state = 0;
  if (m.moe()) {
    for (int r = 0; r < L.pp; ++r) {
      const MemoryBreakdown b = memory_per_gpu(m, Shape{L.tp, L.micro_batch, L.seq}, Techniques{}, L.dp, L.pp,
                                               L.virtual_stages, 1, L.stage_layers, L.ep, r);
      if (b.params + b.optimizer > weights + state) weights = b.params, state = b.optimizer;
    }
  } else {
    double p = 0;
    for (int r = 0; r < L.pp; ++r) p = std::max(p, params_per_gpu(m, L.tp, L.pp, r, L.virtual_stages, L.stage_layers));
    weights = 2 * p;
    state = 12 * p / L.dp;
  }
  k.bytes_per_gpu = weights + state;
  k.stall_seconds = k.bytes_per_gpu / (c.host_copy_gbps.value * 1e9);
  const double per_node = k.bytes_per_gpu * std::min(L.gpus(), c.node_gpus());
  k.persist_seconds = per_node / (c.storage_gbps_per_node.value * 1e9);
  // Recovery: every GPU needs its bf16 weights (shared by its dp group) and its own fp32 shard.
  const double need = weights + state;
  const double read_bps = c.storage_read_gbps_per_node.value * 1e9;
  k.recovery_naive_seconds = need * std::min(L.gpus(), c.node_gpus()) / read_bps;
  // One reader per dp group reads the shared weights once; the nodes of a dp group read in parallel, so a node
  // reads its GPUs' shards plus 1/dp of the shared weights; then the weights are broadcast over the dp group.
  const double node_read = (state + weights / L.dp) * std::min(L.gpus(), c.node_gpus());
  const Link dl = group_link(c, L.dp, L.tp * L.pp);
  k.recovery_seconds = node_read / read_bps + (L.dp > 1 ? ring_all_gather_seconds(L.dp, weights, dl) : 0);
  return k;
}

Availability availability(const Cluster& c, const CheckpointCost& ck, const GroupInitCost& init, int gpus,
                          double mtbf_hours_override) {
  Availability a;
  const double nodes = std::ceil(double(gpus) / c.node_gpus());
  const double node_mtbf = mtbf_hours_override > 0 ? mtbf_hours_override : c.node_mtbf_hours.value;
  a.job_mtbf_hours = node_mtbf / nodes;
  const double M = a.job_mtbf_hours * 3600;
  a.interval_seconds = std::sqrt(2 * ck.stall_seconds * M);
  a.lost_per_failure_s = c.failure_detect_s.value + init.seconds_linear + ck.recovery_seconds + a.interval_seconds / 2;
  a.effective_fraction = std::max(0.0, 1 - ck.stall_seconds / a.interval_seconds - a.lost_per_failure_s / M);
  return a;
}

ConstantOrigin constant_origin(const Sourced& s) {
  if (s.source.rfind("measured by bench_", 0) == 0) return ConstantOrigin::Measured;
  if (s.source.rfind("paper", 0) == 0) return ConstantOrigin::Paper;
  return ConstantOrigin::Datasheet;
}

namespace {

// The start of a source, up to its first ": ", "; " or " (`" (the rest is detail: commands, arithmetic).
std::string lead(const std::string& source) {
  size_t end = source.size();
  for (const char* stop : {": ", "; ", " (`"}) end = std::min(end, source.find(stop));
  return source.substr(0, end);
}

FigureBasis basis(const std::string& figure, const std::vector<std::pair<std::string, const Sourced*>>& inputs) {
  FigureBasis b{figure, true, ""};
  std::vector<std::string> parts;
  for (const auto& [key, s] : inputs) {
    const ConstantOrigin o = constant_origin(*s);
    if (o == ConstantOrigin::Paper) b.prediction = false;
    parts.push_back(o == ConstantOrigin::Measured ? fmt::format("{} {}", key, lead(s->source))
                    : o == ConstantOrigin::Paper
                        ? fmt::format("{} taken from the paper ({})", key, lead(s->source))
                        : fmt::format("{} from a datasheet or assumption ({})", key, lead(s->source)));
  }
  std::string joined;
  for (size_t i = 0; i < parts.size(); ++i) joined += (i ? "; " : "") + parts[i];
  b.note = (b.prediction ? "prediction, not fitted to the paper: "
                         : "from the paper's own figures, not an independent check: ") +
           joined;
  return b;
}

}  // namespace

std::vector<FigureBasis> figure_bases(const Cluster& c) {
  return {basis("group_init", {{"store_op_us", &c.store_op_us}, {"store_async_op_us", &c.store_async_op_us}}),
          basis("checkpoint_stall", {{"host_copy_gbps", &c.host_copy_gbps}}),
          basis("checkpoint_persist", {{"storage_gbps_per_node", &c.storage_gbps_per_node}}),
          basis("recovery", {{"storage_read_gbps_per_node", &c.storage_read_gbps_per_node}}),
          basis("availability", {{"node_mtbf_hours", &c.node_mtbf_hours}, {"failure_detect_s", &c.failure_detect_s}})};
}

}  // namespace mt::perf
