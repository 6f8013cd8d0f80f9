// Each rank's clock against global rank 0's, for the timeline (obs/): spans recorded on different hosts are put on
// one clock before they are merged. Measured as NTP does, over the host mesh's groups (there is no world group,
// comm/mesh.h): a member sends the group's rank 0 a ping at t1 on its clock, rank 0 answers with its clock's t0,
// the answer arrives at t2. Then rank 0's clock reads t0 at some instant within [t1, t2], so
//     offset = t0 - (t1 + t2) / 2   is off by at most   (t2 - t1) / 2,
// and of several exchanges the one with the shortest round trip gives the tightest bound. Offsets to the group
// leaders along tp, dp and pp compose to the offset to rank 0 (tp leader (p,d,0) <- dp leader (p,0,t) <- pp leader
// (0,d,t)), and so do their bounds. Run on every rank at once; it costs `rounds` round trips per member and group.
#pragma once
#include "megatrain/comm/mesh.h"
#include "megatrain/comm/process_group.h"

namespace mt {

struct ClockOffset {
  double offset_s = 0;  // add to this rank's trace clock to read rank 0's
  double error_s = 0;   // |true offset - offset_s| <= error_s
};

// This member's offset to the group's rank 0 (on rank 0 itself: {0, 0}). Every member must call it.
ClockOffset clock_offset_to_group_leader(ProcessGroup& g, int rounds = 8);

// This rank's offset to the mesh's global rank 0. Every rank of the mesh must call it.
ClockOffset clock_offset_to_rank0(DeviceMesh& host_mesh, int rounds = 8);

}  // namespace mt
