#include "megatrain/perf/collectives.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "megatrain/core/error.h"

namespace mt::perf {

namespace {
void check_n(int n, double bytes) {
  MT_CHECK(n >= 1, "collective group size must be >= 1 (got {})", n);
  MT_CHECK(bytes >= 0 && std::isfinite(bytes), "collective size must be >= 0 bytes (got {})", bytes);
}
}  // namespace

int members_per_node(const Cluster& c, int size, int stride) {
  MT_CHECK(size >= 1 && stride >= 1, "group size {} and stride {} must be >= 1", size, stride);
  const int g = c.node_gpus();
  if (stride >= g) return 1;
  return std::max(1, std::min(size, g / stride));
}

Link group_link(const Cluster& c, int size, int stride) {
  const bool in_node = c.topology != "rail-clos" || static_cast<int64_t>(size) * stride <= c.node_gpus();
  if (c.topology == "single-host") return {"loopback", c.network_bytes_per_s(), c.nic_latency_us.value * 1e-6};
  if (in_node) return {"nvlink", c.nvlink_bytes_per_s(), c.nvlink_latency_us.value * 1e-6};
  return {"network", c.network_bytes_per_s(), c.nic_latency_us.value * 1e-6};
}

double p2p_seconds(double bytes, const Link& l) {
  check_n(2, bytes);
  return l.latency_s + bytes / l.bytes_per_s;
}

double ring_allreduce_seconds(int n, double bytes, const Link& l) {
  check_n(n, bytes);
  if (n == 1) return 0;
  return 2.0 * (n - 1) / n * bytes / l.bytes_per_s + 2.0 * (n - 1) * l.latency_s;
}

double ring_reduce_scatter_seconds(int n, double bytes, const Link& l) {
  check_n(n, bytes);
  if (n == 1) return 0;
  return double(n - 1) / n * bytes / l.bytes_per_s + double(n - 1) * l.latency_s;
}

double ring_all_gather_seconds(int n, double bytes, const Link& l) { return ring_reduce_scatter_seconds(n, bytes, l); }

double tree_allreduce_seconds(int n, double bytes, const Link& l) {
  check_n(n, bytes);
  if (n == 1) return 0;
  return 2.0 * bytes / l.bytes_per_s + 2.0 * std::ceil(std::log2(double(n))) * l.latency_s;
}

double all_to_all_seconds(int n, double bytes, const Link& l) {
  check_n(n, bytes);
  if (n == 1) return 0;
  return double(n - 1) / n * bytes / l.bytes_per_s + double(n - 1) * l.latency_s;
}

double hierarchical_allreduce_seconds(const Cluster& c, int n, int k, double bytes) {
  check_n(n, bytes);
  MT_CHECK(k >= 1 && n % k == 0, "hierarchical all-reduce: {} members per node must divide the group size {}", k, n);
  const Link nv{"nvlink", c.nvlink_bytes_per_s(), c.nvlink_latency_us.value * 1e-6};
  const Link net{"network", c.network_bytes_per_s(), c.nic_latency_us.value * 1e-6};
  const int nodes = n / k;
  const double shard = bytes / k;
  const double inter = std::min(ring_allreduce_seconds(nodes, shard, net), tree_allreduce_seconds(nodes, shard, net));
  return ring_reduce_scatter_seconds(k, bytes, nv) + inter + ring_all_gather_seconds(k, bytes, nv);
}

double allreduce_seconds(const Cluster& c, int size, int stride, double bytes) {
  const Link l = group_link(c, size, stride);
  double best = std::min(ring_allreduce_seconds(size, bytes, l), tree_allreduce_seconds(size, bytes, l));
  const int k = members_per_node(c, size, stride);
  if (l.name == "network" && k > 1 && size % k == 0)
    best = std::min(best, hierarchical_allreduce_seconds(c, size, k, bytes));
  return best;
}

}  // namespace mt::perf
