// The run's position in a checkpoint: what a checkpoint records besides its tensors (the model and optimizer, the
// step, the data position and the order it counts in, the parallel layout), and how a restored run takes it up.
//
// Protocol: a save records checkpoint_extra in the manifest's "extra"; a restore reads the position back with
// saved_position (every field type-checked), carries it over to this run's data sources (position_for_this_run)
// and says when the window order changed under it (warn_if_order_changed). Nothing here communicates: every rank
// computes the same from the same manifest, and only the main rank (say = true) prints.
//
// Invariants:
//  * a position is (epoch, cursor) into one window order, or a blend's rows taken per source; a field of the wrong
//    type is an error naming the manifest and the key, never a bare json type_error;
//  * a one-source run resumed as one source gets the saved position unchanged (bit-identical resumes);
//  * a changed order or blend is allowed but never silent: the main rank says what changed.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "megatrain/data/loader.h"
#include "megatrain/train/run_config.h"

namespace mt {

class CheckpointReader;

// What a save knows besides the config and the data position.
struct SaveFacts {
  uint64_t windows = 0;  // the windows in an epoch of the training data (0: not known, not recorded)
  // The last check that the data-parallel replicas hold the same parameters (train/sdc_check.h) that agreed: its
  // step (-1: none) and this rank's parameter hash there. A save of that step records them as extra.sdc =
  // {"step": S, "hash": "<16 hex digits>", "dp": N}: the hash every replica of this rank's slice agreed on.
  int agreed_step = -1;
  uint64_t agreed_hash = 0;
};

// What a checkpoint records besides the tensors: the model and optimizer, the position of the run, the layout, the
// replicas' agreed parameter hash (facts).
nlohmann::json checkpoint_extra(const RunConfig& cfg, int step, const LoaderState& data, const SaveFacts& facts);

// The run's position a checkpoint records (extra.step, extra.data.epoch/cursor), each type-checked: a wrong type
// is an error naming the manifest and the key, never a bare json type_error.
struct SavedPosition {
  int step = 0;
  LoaderState data;
};

// extra[key] (or extra.data[key] when data) of checkpoint ck: present and satisfying ok, else an error naming it.
const nlohmann::json& extra_field(const CheckpointReader& ck, const char* key, bool data,
                                  bool (*ok)(const nlohmann::json&), const char* expected);
// Checks for extra_field.
bool is_json_count(const nlohmann::json& v);  // a non-negative integer
bool is_json_step(const nlohmann::json& v);   // a step number (0 .. 2^31-1)
bool is_json_string(const nlohmann::json& v);
bool is_json_object(const nlohmann::json& v);

// extra.step and extra.data.epoch/cursor of checkpoint ck, type-checked.
SavedPosition saved_position(const CheckpointReader& ck);

// The data position a checkpoint saved, carried over to this run's sources (windows: this run's windows per epoch;
// say: print what changed, on the main rank).
LoaderState position_for_this_run(const RunConfig& cfg, const CheckpointReader& ck, const LoaderState& saved,
                                  uint64_t windows, bool say);

// Warns (stderr) when checkpoint ck saved its one-source position in another window order than this run's.
void warn_if_order_changed(const RunConfig& cfg, uint64_t windows, const CheckpointReader& ck, const LoaderState& data);

}  // namespace mt
