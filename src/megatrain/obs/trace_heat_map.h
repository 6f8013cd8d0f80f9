// The heat map of slow ranks (obs/heat_map.h) of a merged trace, for `megatrain trace merge --heatmap FILE.svg`:
// each rank's traced steps, from the "step" spans of its main track, whose arguments carry the step number and the
// step's compute time ("compute_s": the step less the time the rank was blocked on communication; the trainer
// records it, train/trainer.cpp). A step without it (a skipped batch, or a file of a megatrain that did not record
// it) is left out. Ranks are placed by their files' coordinates; a trace knows no nodes, so every rank is on node 0.
#pragma once
#include <cstddef>

#include "megatrain/obs/chrome_trace.h"
#include "megatrain/obs/heat_map.h"

namespace mt::obs {

// The map of m's ranks over its newest `max_steps` traced steps.
HeatMap trace_heat_map(const MergedTrace& m, size_t max_steps);

}  // namespace mt::obs
