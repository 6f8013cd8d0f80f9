#include "megatrain/launch/node_plan.h"

#include <fmt/format.h>

#include <set>

#include "megatrain/launch/process_util.h"

namespace mt::launch {

NodePlan plan_next_nodes(const NodePlanInput& in) {
  auto usable = [&](int a) { return a >= 0 && a < int(in.usable.size()) && in.usable[size_t(a)]; };
  NodePlan p;
  std::set<int> taken;
  for (int a : in.prev)
    if (usable(a)) taken.insert(a);
  std::vector<int> out;
  std::vector<std::string> changes;
  for (int a : in.prev) {
    if (usable(a)) {
      p.nodes.push_back(a);
      continue;
    }
    out.push_back(a);
    int spare = -1;
    for (int b = 0; b < int(in.usable.size()) && spare < 0; ++b)
      if (!taken.count(b) && usable(b)) spare = b;
    if (spare < 0) continue;
    taken.insert(spare);
    p.nodes.push_back(spare);
    changes.push_back(fmt::format("node {} replaces node {} in slot {}", spare, a, p.nodes.size() - 1));
  }
  if (out.empty()) {
    p.why = "the same nodes";
    return p;
  }
  if (p.nodes.size() == in.prev.size()) {
    p.why = fmt::format("{}; the layout is unchanged", fmt::join(changes, ", "));
    return p;
  }
  const std::string lost = fmt::format("node(s) {} out and no spare left", fmt::join(out, ","));
  auto refuse = [&](const std::string& why) {
    p.nodes.clear();
    p.why = lost + why;
    return p;
  };
  if (!in.shrink) return refuse(" (--no-shrink)");
  if (in.tp <= 0 || in.pp <= 0 || in.dp <= 0 || in.grad_accum <= 0)
    return refuse(", and the job's layout is unknown (no rank reported it), so it cannot shrink");
  const int replica = in.tp * in.pp;
  const int batches = in.dp * in.grad_accum;  // micro-batches per optimizer step, over all replicas
  auto fits = [&](size_t nodes) {
    const int world = int(nodes) * in.nproc;
    return world % replica == 0 && batches % (world / replica) == 0;
  };
  while (!p.nodes.empty() && !fits(p.nodes.size())) p.nodes.pop_back();
  if (p.nodes.empty())
    return refuse(fmt::format(", and no smaller number of nodes ({} ranks each) holds whole tp {} x pp {} replicas "
                              "that split the {} micro-batches of a step evenly",
                              in.nproc, in.tp, in.pp, batches));
  p.dp = int(p.nodes.size()) * in.nproc / replica;
  p.grad_accum = batches / p.dp;
  p.why = fmt::format("{}; {}shrinking to {}: dp {} -> {} (tp {}, pp {}), world {} -> {}, grad_accum {} -> {} (the "
                      "global batch stays)",
                      lost, changes.empty() ? std::string() : fmt::format("{}; ", fmt::join(changes, ", ")),
                      plural(int(p.nodes.size()), "node"), in.dp, p.dp, in.tp, in.pp, int(in.prev.size()) * in.nproc,
                      int(p.nodes.size()) * in.nproc, in.grad_accum, p.grad_accum);
  return p;
}

}  // namespace mt::launch
