// The shared-directory probe: sharded checkpoints need ckpt.dir to be one directory for every rank (every rank
// writes its own shard files there, and rank 0 commits them), so a run that cannot commit is refused at start.
//
// Protocol (collective over every rank of a parallel run; nothing in a single process): rank 0 writes a probe file
// holding a fresh nonce into ckpt.dir and broadcasts the nonce (Agreement::broadcast); every other rank reads the
// probe back and compares; all agree (Agreement::which_ranks) on who could not, and rank 0 removes the probe.
//
// Invariants: every rank returns, or every rank throws kind Config naming the ranks that do not see the file; a
// probe left over from another run never passes (its nonce differs).
#pragma once
#include "megatrain/comm/agreement.h"
#include "megatrain/comm/mesh.h"
#include "megatrain/train/run_config.h"

namespace mt {

// Throws kind Config on every rank when some rank does not see the ckpt.dir rank 0 sees. mesh: the host mesh (null:
// a single process, nothing to check).
void check_shared_dir(const RunConfig& cfg, DeviceMesh* mesh, Agreement& agreement);

}  // namespace mt
