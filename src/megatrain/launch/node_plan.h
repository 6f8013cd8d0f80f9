// Which agents run the next attempt of a multi-node job, and with what data-parallel size: a pure decision, so it
// is unit-tested without processes (the driver, driver.h, applies it).
//  - Every node slot keeps its agent while that agent is usable.
//  - A slot whose agent is out (lost, evicted, failed diagnose) goes to the lowest-numbered usable agent that holds
//    no slot (a spare); the layout is unchanged.
//  - With no spare left the job shrinks: the surviving slots close up, and as many nodes are kept as hold whole
//    tp x pp replicas (nodes x nproc divisible by tp x pp); dp = nodes x nproc / (tp x pp), and train.grad_accum grows
//    by the factor dp shrank so the global batch (dp x grad_accum x batch_size) stays: checkpoints carry the data
//    position, which only carries over at the same global batch (and the run stays the same optimisation problem).
//    Refused (no nodes) when shrinking is off, the layout is unknown, or no number of nodes keeps both whole.
#pragma once
#include <string>
#include <vector>

namespace mt::launch {

struct NodePlanInput {
  std::vector<int> prev;     // the last attempt's agents, in slot order
  std::vector<bool> usable;  // per agent id (nnodes + spares of them)
  int nproc = 1;             // ranks per node
  int tp = 0, pp = 0;        // 0: unknown (no rank reported its coordinates)
  int dp = 0;                // the last attempt's data-parallel size
  int grad_accum = 0;        // ... and its train.grad_accum
  bool shrink = true;
};

struct NodePlan {
  std::vector<int> nodes;  // empty: no layout fits (why says why)
  int dp = 0;              // the new data-parallel size when it changed, else 0
  int grad_accum = 0;      // ... and the train.grad_accum that keeps the global batch
  std::string why;         // one line: what changed, and the new layout
};

NodePlan plan_next_nodes(const NodePlanInput& in);

}  // namespace mt::launch
