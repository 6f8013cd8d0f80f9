// The directories a run writes to, made and tried before its first step (the main rank's job).
#pragma once
#include "megatrain/train/run_config.h"

namespace mt {

// Makes train.out_dir and, when the run will write checkpoints (ckpt.every > 0 or ckpt.save_final), ckpt.dir, and
// writes and removes a probe file there. A directory that cannot be used is an mt::Error of kind Config naming the
// key. Warns on stderr when ckpt.dir's file system has less room than the checkpoints need at once.
void prepare_output_dirs(const RunConfig& cfg);

}  // namespace mt
