// The model judged on measurements: every published point (perf/calibration.h) predicted with the cluster's
// calibrated constants, the calibration set and the held-out set apart, and the figures the targets are stated in
// (docs/perf-model.md, "Validation"):
//   * Table 2, held-out rows: mean and worst |MFU error| in points (targets 1.5 and 3);
//   * Table 3: each step's MFU change has the paper's sign, and the steps rank in the paper's order;
//   * Korthikanti points, leave-one-out: each predicted by constants fitted on the calibration set without it
//     (targets: mean 3.65%, worst 8.87%, Calculon's in-sample figures).
// Pure: the caller loads the cluster, the set and the model.
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
      table3_signs_right = 0;          // steps after the baseline; those whose MFU change has the paper's sign
  bool table3_order_right = false;     // the steps rank by predicted MFU as by the paper's
  double loo_mean = 0, loo_worst = 0;  // |error| over leave_one_out
  ValidationTargets targets;
};

// Predicts every point of `all` on `calibrated` (whose [calibration] the caller has fitted on `set`), marks the set's
// points, and refits without each Korthikanti point of the set for the leave-one-out errors.
Validation validate(const Cluster& calibrated, const CalibrationSet& set, const std::vector<MeasuredPoint>& all);

std::string format_validation(const Validation& v, const Cluster& c);
nlohmann::json to_json(const Validation& v, const Cluster& c);
std::string format_fit(const CalibrationFit& f);

}  // namespace mt::perf
