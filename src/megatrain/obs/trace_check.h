// What a merged trace says about the job's communication (`megatrain trace merge` prints it):
//  * Causality, a check of the clock alignment: a collective cannot complete on any member before every member
//    entered it, and a receive cannot complete before its send started. On one clock these hold exactly; after
//    alignment they must hold within the two ranks' clock error bounds. A violation means a clock offset is wrong
//    (or a rank file belongs to another run).
//  * Who waits for whom: for each collective, the member that entered it last is the one the others waited for.
//    Counted per rank over a group kind (dp, tp, pp, ...), this names a straggler, or the rank a hung job's
//    collectives wait on, in the mesh's terms.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "megatrain/obs/chrome_trace.h"

namespace mt::obs {

// One collective as every member recorded it (same group, same sequence number).
struct Meeting {
  std::string group, op;
  int64_t seq = 0;
  std::vector<int> ranks;          // members that recorded it
  std::vector<double> start, end;  // per member, merged-trace seconds
  int last_in = -1;                // the member that entered last
  double wait_s = 0;               // mean over the others of how long they had been in when it entered
};

struct Violation {
  std::string what;     // names the op, the ranks and the times
  double excess_s = 0;  // how far past the clocks' error bound
};

struct TraceReport {
  std::vector<Meeting> meetings;  // collectives seen by >= 2 ranks
  size_t transfers = 0;           // send/recv pairs matched
  size_t unmatched = 0;           // collectives seen by only one rank, sends/recvs without their partner in the trace
  std::vector<Violation> violations;
  double max_error_bound_s = 0;  // the largest pair bound used
  // Per group kind (the group name up to '[' and without a "device/" style prefix): rank -> collectives it entered
  // last, and the summed wait it caused (seconds, over the others).
  std::map<std::string, std::map<int, int>> last_in;
  std::map<std::string, std::map<int, double>> caused_wait_s;
};

TraceReport check_trace(const MergedTrace& m);

// Where each rank's steps went: the mean over its traced steps of the step's time and of each kind of span on its
// main track inside the step: compute (forward/backward of micro-batches or pipeline actions), comm waits (for
// pipeline transfers, and for the tied embedding's and the loss's sums after the pipeline),
// data, gradients (data-parallel reduction and norm), optimizer, eval, checkpoint; `other` is the rest of the step
// (observers, bookkeeping, the stop agreement), so the parts sum to the step.
struct StepBreakdown {
  int rank = 0;
  int steps = 0;
  double step_s = 0;
  std::map<std::string, double> parts_s;  // compute, comm wait, data, gradients, optimizer, eval, checkpoint, other
};
std::vector<StepBreakdown> step_breakdown(const MergedTrace& m);
// The report for people: where each rank's steps went, the checks' outcome, and per group kind the ranks others
// waited for most.
std::string format_report(const MergedTrace& m, const TraceReport& r);

}  // namespace mt::obs
