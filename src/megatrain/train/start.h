// Resume or initialise: where a run starts from.
#pragma once
#include <string>

#include "megatrain/data/loader.h"
#include "megatrain/model/gpt.h"
#include "megatrain/train/checkpointing.h"
#include "megatrain/train/host_mirror.h"
#include "megatrain/train/run_config.h"

namespace mt {

struct StartPoint {
  int step = 0;              // the last completed step: 0 for a fresh start
  std::string resumed_from;  // the checkpoint directory, or ""
};

// ckpt.resume = "auto": the newest readable checkpoint under ckpt.dir if there is one (or the survivors' peer
// snapshots, when newer; see TrainCheckpointer::restore_auto); "none": never; else a checkpoint
// path. Without a checkpoint: model.init_from's weights, or fresh weights from train.seed (the same seed on every
// rank: replicas start identical). A restore also restores the loader's position. mirror: the host copy of a
// device model (nullptr on the CPU). Collective when it restores (the checkpointer's reads). Errors reading the
// checkpoint are of kind Checkpoint.
StartPoint resume_or_init(const RunConfig& cfg, GPT& model, TrainCheckpointer& ckpt, HostMirror* mirror,
                          DataLoader& loader, bool main_rank);

}  // namespace mt
