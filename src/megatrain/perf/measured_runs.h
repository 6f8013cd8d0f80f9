// Our own measured runs as points the performance model can be calibrated on or judged against: a JSON file
// (configs/measured/) in which each run says how `megatrain simulate` is asked to predict it (the model config, its
// overrides, the cluster file, the flags) and what was measured, with its source:
//   { "description": "...",
//     "runs": [ { "id": "cpu/dp2",                         // "<group>/<name>"; the group is what comes before '/'
//                 "config": "configs/tiny.toml",           // model TOML, relative to the project root
//                 "overrides": ["parallel.dp=2"],          // section.key=value, as simulate's --section.key=value
//                 "cluster": "configs/clusters/cpu-epyc-2core.toml",
//                 "gpus": 2, "batch": 0,                   // simulate's --gpus and --batch (0: not given)
//                 "recompute": "none",                     // none | selective | full
//                 "flags": ["tp-overlap", "dp-overlap"],   // simulate's switches, without the dashes
//                 "measured_step_seconds": 1.23,
//                 "target": 0.10,                          // optional: |predicted / measured - 1| to stay within
//                 "source": "bench/results/....json, machine, date" } ] }
// A calibration set (perf/calibration.h) lists such files under "runs" and may name their points in "calibrate";
// every point it does not name is held out. Turning a run into a Job needs the training config loader, which the
// CLI owns (cli/cmd_simulate.cpp); this file only reads and checks the declarations.
#pragma once
#include <string>
#include <vector>

namespace mt::perf {

struct RunSpec {
  std::string config;                  // model TOML, as written in the file
  std::vector<std::string> overrides;  // "section.key=value"
  std::string cluster;                 // cluster TOML the run is predicted on, as written in the file
  int gpus = 0, batch = 0;             // 0: not given
  std::string recompute = "none";
  std::vector<std::string> flags;  // from simulate_flags()
};

struct MeasuredRun {
  std::string id, group;
  RunSpec spec;
  double seconds = 0;  // measured step seconds
  double target = 0;   // |predicted / measured - 1| the model should stay within; 0: none stated
  std::string source;
};

struct MeasuredRuns {
  std::string path, description;
  std::vector<MeasuredRun> runs;
};

// The switches a run may name: simulate's flags without their dashes.
const std::vector<std::string>& simulate_flags();

// Throws mt::Error (Config) naming the file, the run and the field: not JSON, an unknown or missing field, a field of
// the wrong type, an id without its group or named twice, an override not of the form section.key=value, an unknown
// flag or recompute mode, a step time or target that is not positive.
MeasuredRuns parse_measured_runs(const std::string& json_text, const std::string& path);
MeasuredRuns load_measured_runs(const std::string& path);

}  // namespace mt::perf
