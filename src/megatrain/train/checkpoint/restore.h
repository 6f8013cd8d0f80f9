// The restore: a checkpoint of any layout (sharded or gathered, any dp/tp/pp) read into this rank's parameters and
// optimizer moments, model.init_from's weights-only read, and resume = auto's choice of the newest checkpoint that
// reads back whole.
//
// Protocol (collective over every rank), in three phases:
//   A. local reads, which may fail: each rank reads exactly the boxes it holds (shard_layout.h: read_box); with
//      ckpt.one_reader only dp rank 0 reads the replicated state;
//   B. agreement: every rank learns which ranks failed (Agreement::which_ranks), so all fail, or fall back to an
//      older checkpoint, together;
//   C. no file access: dp rank 0 broadcasts the replicated state over its dp group (one_reader), the ZeRO slices
//      are committed, and a barrier marks the whole mesh restored.
// Before anything is read the checkpoint is checked to fit the run (check_fits: model config, optimizer, global
// batch); a misfit throws on every rank alike (every rank reads the same manifest).
//
// Invariants: nothing a rank holds is read twice; a failed read on any rank fails every rank, naming it; a
// checkpoint of another run (check_fits) stops the run, while a corrupt or partial one is skipped by resume = auto
// with a warning naming the file.
#pragma once
#include <cstdint>
#include <string>

#include "megatrain/comm/agreement.h"
#include "megatrain/data/loader.h"
#include "megatrain/train/checkpoint/shard_layout.h"

namespace mt {

class CheckpointReader;

// Throws unless the checkpoint continues this run: same model, optimizer and global batch.
void check_fits(const RunConfig& cfg, const CheckpointReader& ck);

// A restored checkpoint: its step (-1: none), the path it was found at, and its directory.
struct Restored {
  int step = -1;
  std::string from;
  std::string dir;
};

// Loads the checkpoint at path (checked by check_fits) into this rank's tensors; sets data to its loader position
// carried over to this run (windows: the data's windows per epoch). Throws when it cannot be read.
Restored restore_checkpoint(const RankHoldings& h, Agreement& agreement, uint64_t windows, const std::string& path,
                            LoaderState& data);

// resume = auto: the newest readable checkpoint under ckpt.dir. With peer_snapshots (two-stage saves in a parallel
// run), survivors' peer snapshots newer than the latest checkpoint are committed first (rank 0, then a barrier); a
// checkpoint that is corrupt or partial is skipped with a warning naming it, and the one before it tried. Step -1
// when there is none at all; throws when there are some and none is readable.
Restored restore_newest(const RankHoldings& h, Agreement& agreement, uint64_t windows, bool peer_snapshots,
                        LoaderState& data);

// model.init_from under any layout, from a megatrain checkpoint or an HF GPT-2 or Llama model: this rank's slices of
// the parameters only, after checking that the source holds this run's model and no tensor it lacks. A read that
// fails on any rank fails on every rank, naming it.
void init_params(const RankHoldings& h, Agreement& agreement, const std::string& path);

}  // namespace mt
