#include "megatrain/train/start.h"

#include <fmt/format.h>

#include "megatrain/ckpt/checkpoint.h"
#include "megatrain/ckpt/model_weights.h"
#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"

namespace mt {

StartPoint resume_or_init(const RunConfig& cfg, GPT& model, TrainCheckpointer& ckpt, HostMirror* mirror,
                          DataLoader& loader, bool main_rank) {
  StartPoint at;
  LoaderState pos;
  int restored = -1;
  const double t0 = now_seconds();
  if (cfg.ckpt.resume.mode == ResumeMode::Auto) {
    restored = with_kind(ErrorKind::Checkpoint, [&] { return ckpt.restore_auto(pos, at.resumed_from); });
  } else if (cfg.ckpt.resume.mode == ResumeMode::Path) {
    at.resumed_from = cfg.ckpt.resume.path;
    restored = with_kind(ErrorKind::Checkpoint, [&] { return ckpt.restore(at.resumed_from, pos); });
  }
  if (restored >= 0) {
    at.step = restored;
    if (mirror) mirror->push();
    loader.restore(pos);
    if (main_rank)
      fmt::print("resumed from {} at step {} (restored in {:.3f} s, {})\n", at.resumed_from, at.step,
                 now_seconds() - t0,
                 cfg.ckpt.one_reader && cfg.parallel.dp > 1 ? "one reader per dp group" : "every rank reads");
  } else if (!cfg.init_from.empty() && (cfg.parallel.tp > 1 || cfg.parallel.pp > 1 || cfg.parallel.ep > 1)) {
    // Each rank holds a slice of the model (its tp slices, its stage's layers, its ep shard of the experts) and
    // reads only that slice, never the whole model.
    with_kind(ErrorKind::Checkpoint, [&] { ckpt.init_params(cfg.init_from); });
    if (mirror) mirror->push();
    if (main_rank) fmt::print("initialised weights from {} (each rank read its slices)\n", cfg.init_from);
  } else if (!cfg.init_from.empty()) {
    GPT& target = mirror ? mirror->model() : model;
    target.init_weights(cfg.train.seed);
    with_kind(ErrorKind::Checkpoint, [&] { load_model_weights(cfg.init_from, cfg.model, target.params()); });
    if (mirror) mirror->push();
    if (main_rank) fmt::print("initialised weights from {}\n", cfg.init_from);
  } else {
    model.init_weights(cfg.train.seed);
  }
  return at;
}

}  // namespace mt
