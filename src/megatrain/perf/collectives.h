// Costs of collectives and point-to-point transfers by algorithm, on the link class the group actually uses.
// The alpha-beta model: a message of S bytes over a link costs alpha + S / B. A ring of n members moves
// (n-1)/n of the data per member per phase in n-1 steps; a (double binary) tree moves the data in a pipeline
// whose depth is log2(n); a hierarchical all-reduce reduces inside the node over NVLink first, so only 1/k of the
// data crosses the network (k GPUs of the group per node).
#pragma once
#include <string>

#include "megatrain/perf/cluster.h"

namespace mt::perf {

struct Link {
  std::string name;        // "nvlink", "network", "loopback"
  double bytes_per_s = 0;  // per member, one direction
  double latency_s = 0;    // alpha: one step of the algorithm
};

// The link a group of `size` members uses when consecutive members are `stride` devices apart in the global rank
// order (tensor parallel: stride 1; pipeline: tp; data parallel: tp * pp). A group that fits inside one node talks
// over NVLink; otherwise its slowest hop is the network (each member's share of the node's NICs).
Link group_link(const Cluster& c, int size, int stride);
// How many members of such a group share one node (1 when every member is on its own node).
int members_per_node(const Cluster& c, int size, int stride);

double p2p_seconds(double bytes, const Link& l);
double ring_allreduce_seconds(int n, double bytes, const Link& l);       // 2(n-1)/n S/B + 2(n-1) alpha
double ring_reduce_scatter_seconds(int n, double bytes, const Link& l);  // (n-1)/n S/B + (n-1) alpha; S = full size
double ring_all_gather_seconds(int n, double bytes, const Link& l);      // same cost as reduce-scatter
double tree_allreduce_seconds(int n, double bytes, const Link& l);       // 2 S/B + 2 ceil(log2 n) alpha
// All-to-all (pairwise exchange): each member holds S bytes, 1/n of them for each member (itself included), and
// sends the (n-1)/n that are others' in n-1 steps: (n-1)/n S/B + (n-1) alpha, at the group's slowest link.
double all_to_all_seconds(int n, double bytes, const Link& l);
// Reduce-scatter inside each node (k members, NVLink), all-reduce of S/k across the n/k nodes (ring or tree,
// whichever is cheaper), all-gather inside the node.
double hierarchical_allreduce_seconds(const Cluster& c, int n, int k, double bytes);
// What NCCL would pick: the cheapest of ring, tree and (for groups spanning nodes with k > 1) hierarchical.
double allreduce_seconds(const Cluster& c, int size, int stride, double bytes);

}  // namespace mt::perf
