// The model judged on measurements: every published point (perf/calibration.h) predicted with the cluster's
// calibrated constants, the calibration set and the held-out set apart, and the figures the targets are stated in
// (docs/perf-model.md, "Validation"):
//   * Table 2, held-out rows: mean and worst |MFU error| in points (targets 1.5 and 3);
//   * Table 3: each step's MFU change has the paper's sign, and the steps rank in the paper's order;
//   * Korthikanti points, leave-one-out: each predicted by constants fitted on the calibration set without it
//     (targets: mean 3.65%, worst 8.87%, Calculon's in-sample figures);
//   * our own measured runs (perf/measured_runs.h), each predicted on the cluster file it ran on: a run is in the
//     calibration set when its cluster's [calibration] was fitted on a set naming it, else held out; a run that
//     states a target (e.g. the CPU layouts 10%, the H100 1.3B run 5%) is met or MISSED.
// Pure: the caller loads the clusters, the sets, the model and turns our runs into jobs.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "megatrain/perf/calibration.h"

namespace mt::perf {

struct PointResult {
  MeasuredPoint point;
  bool calibration = false;  // in the calibration set (else held out)
  Prediction prediction;
  double error = 0;       // predicted / measured step time - 1
  double mfu_points = 0;  // predicted - measured MFU, in points (MFU sources only)
  std::string cluster;    // our own runs: the name of the cluster it was predicted on
};

// One of our own runs, the cluster it is predicted on (its file's constants, calibrated or not) and whether the fit of
// that cluster saw it.
struct OwnRunInput {
  MeasuredPoint point;
  Cluster cluster;
  bool calibration = false;
};

struct LeaveOneOut {
  std::string id;
  double error = 0;  // predicted / measured - 1 with constants fitted without this point
};

struct ValidationTargets {
  double table2_mean_points = 1.5, table2_worst_points = 3.0;
  double korthikanti_mean = 0.0365, korthikanti_worst = 0.0887;
};

struct Validation {
  std::string set_path;
  std::vector<std::string> fit;  // the set's constants
  std::vector<PointResult> points;
  std::vector<LeaveOneOut> leave_one_out;
  double table2_held_out_mean_points = 0, table2_held_out_worst_points = 0;
  int table2_held_out = 0;
  int table3_steps = 0,
      table3_signs_right = 0;                // steps after the baseline; those whose MFU change has the paper's sign
  bool table3_order_right = false;           // the steps rank by predicted MFU as by the paper's
  double loo_mean = 0, loo_worst = 0;        // |error| over leave_one_out
  std::vector<PointResult> own_runs;         // our own runs, in their files' order
  int own_targets = 0, own_targets_met = 0;  // own runs that state a target; those within it
  ValidationTargets targets;
};

// Predicts every point of `all` on `calibrated` (whose [calibration] the caller has fitted on `set`), marks the set's
// points, and refits without each Korthikanti point of the set for the leave-one-out errors; predicts each of `own`
// on its own cluster. Every id the set names must be a point of `all` or `own`.
Validation validate(const Cluster& calibrated, const CalibrationSet& set, const std::vector<MeasuredPoint>& all,
                    const std::vector<OwnRunInput>& own = {});

std::string format_validation(const Validation& v, const Cluster& c);
nlohmann::json to_json(const Validation& v, const Cluster& c);
std::string format_fit(const CalibrationFit& f);

}  // namespace mt::perf
