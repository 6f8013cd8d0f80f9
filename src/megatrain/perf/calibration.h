// Calibration of the performance model: at most four constants that no datasheet prices (Cluster's [calibration]
// section), fitted by least squares on a declared set of measured points and written into the cluster file with
// their source ("fitted on ..., residuals ..."), so the numbers are a command anyone can rerun, not typed in.
//
// The points are the published measurements the model can be checked against, each with an id:
//   "korthikanti/<run> <recompute>"  Korthikanti et al. 2022 Table 5 (seconds per iteration; 9 runs)
//   "table2/<system> <gpus>"         MegaScale Table 2 (MFU; 16 rows)
//   "table3/<step>"                  MegaScale Table 3 (MFU; 9 cumulative steps, "table3/baseline" first)
// and our own measured runs, declared in the measured-runs files (perf/measured_runs.h) the set lists under "runs":
//   "cpu/dp2", "h100/gpt-1.3b B4", ...   (seconds; each predicted on the cluster file it names)
// A calibration set (JSON) names the ones to fit on and the constants to fit:
//   { "description": "...", "model": "configs/megascale-175b.toml",
//     "runs": ["configs/measured/gpu.json"],
//     "fit": ["gemm_efficiency_scale", "nvlink_efficiency", "network_efficiency", "dp_sync_s"],
//     "calibrate": ["korthikanti/22B full", ..., "table2/megatron 256", "table3/baseline"] }
// "model" (the config the published points start from) is needed only by a set that names a published point, "runs"
// only by one whose points include our own. Every point not named is held out: the fit never sees it
// (perf/validation.h reports both sets apart). A fit's points must all have run on the cluster it calibrates.
//
// The residual of a point is the log of predicted over measured step time (for an MFU, measured seconds are the
// model FLOPs over MFU x GPUs x peak, so it is log(MFU measured / MFU predicted)): relative errors weigh a 1 s
// run and a 90 s run alike, and log makes too slow and too fast by the same factor symmetric.
#pragma once
#include <string>
#include <vector>

#include "megatrain/perf/cluster.h"
#include "megatrain/perf/step_model.h"

namespace mt::perf {

struct MeasuredPoint {
  std::string id;     // "korthikanti/22B full", "table2/megatron 256", "table3/+ PTB", ...
  std::string group;  // "korthikanti", "table2", "table3"
  Job job;
  double seconds = 0;  // measured step seconds; 0 where the source gives an MFU instead
  double mfu = 0;      // measured MFU (fraction); 0 where the source gives seconds
  // Our own runs only (empty / 0 for a published point, which ran on the paper's cluster):
  std::string cluster;  // the cluster file the run is predicted on, as its measured-runs file writes it
  double target = 0;    // |predicted / measured - 1| the model should stay within; 0: none stated
  std::string source;   // where the measured figure comes from
};

// Every published point, in the tables' order (Korthikanti, then Table 2, then Table 3). `base` is the model the
// presets start from (configs/megascale-175b.toml).
std::vector<MeasuredPoint> published_points(const ModelConfig& base);

// The step seconds the point measured: its seconds, or for an MFU the model FLOPs / (MFU x GPUs x c's peak).
double measured_seconds(const MeasuredPoint& p, const Cluster& c);
// log(predicted / measured step time) of one point on c; positive when the model is too slow. (One simulation:
// predict_step_seconds, which the fit calls thousands of times.)
double log_error(const MeasuredPoint& p, const Cluster& c);

// One calibration constant: its name in [calibration], its bounds and its neutral (uncalibrated) value.
struct CalibrationConstant {
  const char* name;
  Sourced Cluster::*member;
  double lo, hi, neutral;
};
const std::vector<CalibrationConstant>& calibration_constants();

struct CalibrationSet {
  std::string path, description;
  std::string model_config;            // as written in the file (resolved by the caller); "" when absent
  std::vector<std::string> runs;       // measured-runs files (perf/measured_runs.h), as written in the file
  std::vector<std::string> fit;        // names from calibration_constants(), at most four
  std::vector<std::string> calibrate;  // point ids
};
// Throws mt::Error (Config) naming the file and the field: not JSON, a missing or mistyped field, an unknown
// constant or a repeated one, more than four, no points, a "runs" entry that is not a path.
CalibrationSet parse_calibration_set(const std::string& json_text, const std::string& path);
CalibrationSet load_calibration_set(const std::string& path);

// The points `ids` names, from `all`, in the set's order; an unknown id throws naming the set file and the id.
std::vector<MeasuredPoint> select_points(const std::vector<MeasuredPoint>& all, const std::vector<std::string>& ids,
                                         const std::string& set_path);

// The calibration set `c`'s [calibration] was fitted on, as with_calibration wrote it into each constant's source
// ("fitted on SET (..."); "" when the cluster is not calibrated.
std::string fitted_on(const Cluster& c);

// The cluster with every calibration constant back at its neutral value and no source.
Cluster without_calibration(Cluster c);

struct CalibrationFit {
  std::vector<std::string> fit;                           // the constants fitted
  std::vector<double> values;                             // their fitted values, in the same order
  std::vector<std::pair<std::string, double>> residuals;  // (point id, predicted / measured - 1)
  double rms = 0;                                         // root mean square of the log errors
  int iterations = 0;
  bool converged = false;
};

// Fits `fit` on `points`, starting from the neutral values on a neutral copy of `c` (so the result does not depend
// on what the file held before). The other constants stay as `c` has them.
CalibrationFit fit_calibration(const Cluster& c, const std::vector<MeasuredPoint>& points,
                               const std::vector<std::string>& fit);
// `c` with the fitted constants set, each with the source "fitted on <set> (<n> points; ...), residuals ...", and
// every constant the fit did not name back at neutral: a file's [calibration] is always exactly one fit.
Cluster with_calibration(Cluster c, const CalibrationFit& fit, const std::string& set_path);

}  // namespace mt::perf
