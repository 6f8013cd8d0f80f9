// megatrain simulate: the performance model (src/megatrain/perf). Argument parsing only.
//   megatrain simulate [--config MODEL.toml] [--cluster CLUSTER.toml] [--section.key=value ...] [--batch N]
//                      [--ptb] [--swa] [--tp-overlap] [--pp-overlap] [--dp-overlap] [--fused-ops] [--misc]
//                      [--megascale] [--recompute none|selective|full] [--gpus N] [--json]
//   megatrain simulate --preset megascale-table2|megascale-table3|validation [--calibration-set SET.json] [--json]
//   megatrain simulate --calibrate SET.json [--cluster CLUSTER.toml] [--json]  (fits [calibration], rewrites the file)
//   (a set's points: published ones, and our own measured runs from the configs/measured/ files it lists)
//   megatrain simulate --search --gpus N --batch N [--mem-limit GiB] [--top K] [--json]
//   megatrain simulate --scale ...      (group init, checkpoint and failure costs of the layout)
//   megatrain simulate --constants      (every constant of the cluster file with its source)
//   megatrain simulate --straggler-coding [--gpus N] [--batch N] [--straggler-rate R] [--straggler-duration D]
//                      [--straggler-slowdown S] [--json]   (when gradient coding beats waiting for slow replicas)
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "megatrain/cli/commands.h"
#include "megatrain/core/error.h"
#include "megatrain/core/resources.h"
#include "megatrain/core/fs.h"
#include "megatrain/perf/calibration.h"
#include "megatrain/perf/coding_at_scale.h"
#include "megatrain/perf/coding_report.h"
#include "megatrain/perf/measured_runs.h"
#include "megatrain/perf/presets.h"
#include "megatrain/perf/report.h"
#include "megatrain/perf/validation.h"
#include "megatrain/train/run_config.h"

namespace mt::cli {

namespace {

// Every option of megatrain simulate, with its default.
struct SimulateArgs {
  std::string config = resource_path("configs/megascale-175b.toml");
  std::string cluster_path = resource_path("configs/clusters/megascale-a100.toml");
  std::string calibration_set = resource_path("configs/calibration/megascale-a100.json");
  std::string preset, recompute = "selective", calibrate;
  int batch = 0, gpus = 0, top = 10;
  double mem_limit_gib = 0, mtbf_hours = 0;
  double straggler_rate = 0, straggler_duration = 0, straggler_slowdown = 0;
  bool straggler_coding = false, rate_given = false, slowdown_given = false, duration_given = false;
  bool ptb = false, swa = false, tp_overlap = false, pp_overlap = false, dp_overlap = false, fused = false;
  bool misc = false, megascale = false, json_out = false, search = false, scale = false, constants = false;
  bool balance = false;
};

void add_simulate_options(CLI::App& app, SimulateArgs& a) {
  app.add_option("--config", a.config, "model TOML (the training config format; default configs/megascale-175b.toml)");
  app.add_option("--cluster", a.cluster_path, "cluster TOML (default configs/clusters/megascale-a100.toml)");
  app.add_option("--batch", a.batch,
                 "global batch in sequences (sets parallel.microbatches = batch / (dp * data.batch_size))")
      ->check(CLI::PositiveNumber);
  app.add_option("--gpus", a.gpus, "GPU count: checked against dp * pp * tp, or the count --search lays out")
      ->check(CLI::PositiveNumber);
  app.add_flag("--ptb", a.ptb, "parallel transformer block (model.block = parallel)");
  app.add_flag("--swa", a.swa, "sliding-window attention (model.window, or seq/2 when the config has none)");
  app.add_flag("--tp-overlap", a.tp_overlap, "overlap tensor-parallel collectives with GEMMs");
  app.add_flag("--pp-overlap", a.pp_overlap, "asynchronous, decoupled pipeline send/receive");
  app.add_flag("--dp-overlap", a.dp_overlap, "per-chunk data-parallel all-gather / reduce-scatter behind compute");
  app.add_flag("--fused-ops", a.fused, "flash attention and fused norm / GeLU kernels");
  app.add_flag("--misc", a.misc, "data pipeline and straggler eviction (drops the straggler term)");
  app.add_flag("--megascale", a.megascale, "all of the above");
  app.add_option("--recompute", a.recompute, "activation recomputation: none | selective | full");
  app.add_option("--preset", a.preset,
                 "megascale-table2 | megascale-table3: the paper's experiments beside predictions; validation: every "
                 "published point and our own measured runs (configs/measured/), the calibration set and the "
                 "held-out set apart, with each error");
  app.add_option("--calibrate", a.calibrate,
                 "fit the cluster's [calibration] constants by least squares on this calibration set (JSON, "
                 "configs/calibration/) and write them into --cluster with their source");
  app.add_option("--calibration-set", a.calibration_set,
                 "the calibration set --preset validation reports against (default "
                 "configs/calibration/megascale-a100.json)");
  app.add_flag("--balance", a.balance,
               "find the layer counts of the pipeline stages that give the shortest step "
               "(parallel.stage_layers: the first stage also computes the embedding, the last the head and loss); "
               "where n_layer has no even split, give any valid parallel.stage_layers for the config to load");
  app.add_flag("--search", a.search, "find the fastest layout for --gpus and --batch within --mem-limit");
  app.add_option("--mem-limit", a.mem_limit_gib, "GiB per GPU for --search (default: the cluster's memory)")
      ->check(CLI::PositiveNumber);
  app.add_option("--top", a.top, "layouts --search lists")->check(CLI::PositiveNumber);
  app.add_flag("--scale", a.scale, "also print group-init, checkpoint and failure costs");
  app.add_option("--mtbf-hours", a.mtbf_hours, "node MTBF for --scale (default: the cluster file's)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--constants", a.constants, "print the cluster's constants with their sources");
  app.add_flag("--straggler-coding", a.straggler_coding,
               "when gradient coding (GC, SR-SGC, M-SGC) beats waiting for slow replicas, at 1,024-12,288 GPUs (or "
               "--gpus) with the config's tp x pp replicas and --batch (default 6144)");
  app.add_option("--straggler-rate", a.straggler_rate,
                 "for --straggler-coding: probability that a replica is slow in a micro-batch round (default: the "
                 "cluster's slow-node fraction per replica)");
  app.add_option("--straggler-duration", a.straggler_duration,
                 "for --straggler-coding: mean rounds a straggler burst lasts (default 0: persistent)");
  app.add_option("--straggler-slowdown", a.straggler_slowdown,
                 "for --straggler-coding: how much slower a slow replica runs, 0.1 = 10% (default: the cluster's)");
  app.add_flag("--json", a.json_out, "JSON instead of tables");
  app.allow_extras();
}

// The arguments CLI11 left over must be config overrides: --section.key=value or --section.key value.
std::vector<std::string> simulate_overrides(const std::vector<std::string>& extras) {
  std::vector<std::string> overrides;
  for (size_t i = 0; i < extras.size(); ++i) {
    std::string a = extras[i];
    if (a.rfind("--", 0) != 0 || a.find('.') == std::string::npos)
      fail_as(ErrorKind::Config, "unexpected argument '{}' (see megatrain simulate --help)", a);
    if (a.find('=') == std::string::npos) {
      if (i + 1 >= extras.size()) fail_as(ErrorKind::Config, "override {} needs a value", a);
      a.append("=").append(extras[++i]);
    }
    overrides.push_back(a.substr(2));
  }
  return overrides;
}

// --preset: the paper's table of experiments beside the model's predictions.
void print_preset(const SimulateArgs& a, const RunConfig& cfg, const perf::Cluster& cluster) {
  using namespace mt::perf;
  std::vector<PresetRow> rows;
  if (a.preset == "megascale-table2")
    rows = megascale_table2(cfg.model);
  else if (a.preset == "megascale-table3")
    rows = megascale_table3(cfg.model);
  else
    fail_as(ErrorKind::Config, "--preset must be megascale-table2, megascale-table3 or validation (got '{}')",
            a.preset);
  std::vector<Prediction> preds;
  for (const PresetRow& r : rows) preds.push_back(predict(r.job, cluster));
  const bool t2 = a.preset == "megascale-table2";
  if (a.json_out)
    fmt::print("{}\n", (t2 ? table2_json(rows, preds) : table3_json(rows, preds)).dump(2));
  else
    fmt::print("{}", t2 ? format_table2(rows, preds) : format_table3(rows, preds));
}

// The config's model with the techniques the flags switch on (the layout is not set yet).
perf::Job simulated_job(const SimulateArgs& a, const RunConfig& cfg) {
  using namespace mt::perf;
  Job job;
  job.model = cfg.model;
  if (a.ptb || a.megascale) job.model.block = BlockKind::Parallel;
  if ((a.swa || a.megascale) && job.model.window == 0) job.model.window = cfg.data.seq_len / 2;
  job.tech.tp_overlap = a.tp_overlap || a.megascale;
  job.tech.pp_overlap = a.pp_overlap || a.megascale;
  job.tech.dp_overlap = a.dp_overlap || a.megascale;
  job.tech.fused_ops = a.fused || a.megascale;
  job.tech.misc = a.misc || a.megascale;
  job.tech.recompute = parse_recompute(a.recompute);
  job.tech.tp_chunks = cfg.parallel.tp_chunks;  // megatrain's pieces per tp collective (matter on a saturated CPU host)
  job.tech.ep_overlap = cfg.parallel.ep_overlap;  // MoE: the all-to-alls run while the layer's independent compute does
  return job;
}

// --search: the fastest layouts of job's model on --gpus for --batch.
void print_search(const SimulateArgs& a, const RunConfig& cfg, const perf::Job& job, const perf::Cluster& cluster) {
  using namespace mt::perf;
  if (a.gpus <= 0 || a.batch <= 0) fail_as(ErrorKind::Config, "--search needs --gpus N and --batch N");
  SearchOptions o;
  o.gpus = a.gpus;
  o.global_batch = a.batch;
  o.seq = cfg.data.seq_len;
  o.memory_limit = a.mem_limit_gib * double(1 << 30);
  o.tech = job.tech;
  const SearchResult r = search_layouts(job.model, cluster, o);
  if (a.json_out)
    fmt::print("{}\n", to_json(r, a.top).dump(2));
  else
    fmt::print("{}", format_search(r, cluster, a.top));
}

// The config's layout, with the micro-batch count --batch implies.
perf::Layout simulated_layout(const SimulateArgs& a, const RunConfig& cfg, const std::vector<std::string>& overrides) {
  perf::Layout L;
  L.dp = cfg.parallel.dp;
  L.pp = cfg.parallel.pp;
  L.tp = cfg.parallel.tp;
  L.ep = cfg.parallel.ep;
  L.virtual_stages = cfg.parallel.virtual_stages;
  L.stage_layers = cfg.parallel.stage_layers;
  L.micro_batch = cfg.data.batch_size;
  L.seq = cfg.data.seq_len;
  L.microbatches = cfg.parallel.pp > 1 ? cfg.pipeline_microbatches() : cfg.train.grad_accum;
  if (a.batch > 0) {
    const int per = L.dp * L.micro_batch;
    if (a.batch % per != 0)
      fail_as(ErrorKind::Config, "--batch {} is not a multiple of parallel.dp * data.batch_size = {} * {}", a.batch,
              L.dp, L.micro_batch);
    bool explicit_m = false;
    for (auto& o : overrides) explicit_m = explicit_m || o.rfind("parallel.microbatches=", 0) == 0;
    if (explicit_m && L.microbatches != a.batch / per)
      fail_as(ErrorKind::Config, "--batch {} needs parallel.microbatches = {} (batch / (dp * data.batch_size)), not {}",
              a.batch, a.batch / per, L.microbatches);
    L.microbatches = a.batch / per;
  }
  return L;
}

// A path as written in a calibration set: as given when it exists from here, else relative to the project root.
std::string set_relative(const std::string& path) { return file_exists(path) ? path : resource_path(path); }

// The published points, when the set says which model they start from.
std::vector<perf::MeasuredPoint> set_published_points(const perf::CalibrationSet& set) {
  if (set.model_config.empty()) return {};
  const RunConfig cfg = with_kind(ErrorKind::Config, [&] {
    return load_run_config(set_relative(set.model_config), {}, ConfigUse::Simulate);
  });
  return perf::published_points(cfg.model);
}

// One of our own measured runs as a point: its job built exactly as `megatrain simulate` builds it from the same
// config, overrides and flags, and checked against the cluster it ran on.
perf::MeasuredPoint own_point(const perf::MeasuredRun& r, const std::string& runs_path) {
  using namespace mt::perf;
  SimulateArgs a;
  a.config = set_relative(r.spec.config);
  a.batch = r.spec.batch;
  a.gpus = r.spec.gpus;
  a.recompute = r.spec.recompute;
  for (const std::string& f : r.spec.flags) {
    bool* flag = f == "ptb"          ? &a.ptb
                 : f == "swa"        ? &a.swa
                 : f == "tp-overlap" ? &a.tp_overlap
                 : f == "pp-overlap" ? &a.pp_overlap
                 : f == "dp-overlap" ? &a.dp_overlap
                 : f == "fused-ops"  ? &a.fused
                 : f == "misc"       ? &a.misc
                                     : &a.megascale;
    *flag = true;
  }
  try {
    const RunConfig cfg = with_kind(ErrorKind::Config,
                                    [&] { return load_run_config(a.config, r.spec.overrides, ConfigUse::Simulate); });
    Job job = simulated_job(a, cfg);
    job.layout = simulated_layout(a, cfg, r.spec.overrides);
    validate_job(job, load_cluster(set_relative(r.spec.cluster)), a.gpus);
    return MeasuredPoint{r.id, r.group, job, r.seconds, 0, r.spec.cluster, r.target, r.source};
  } catch (const Error& e) {
    fail_as(ErrorKind::Config, "{}: run '{}': {}", runs_path, r.id, e.what());
  }
}

std::vector<perf::MeasuredPoint> set_own_points(const perf::CalibrationSet& set) {
  std::vector<perf::MeasuredPoint> out;
  for (const std::string& path : set.runs) {
    const perf::MeasuredRuns runs = perf::load_measured_runs(set_relative(path));
    for (const perf::MeasuredRun& r : runs.runs) out.push_back(own_point(r, path));
  }
  return out;
}

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  return std::filesystem::equivalent(set_relative(a), set_relative(b), ec);
}

// Whether `id` is a point the calibration set at `path` (as a cluster's [calibration] source names it) fits on.
bool set_names(const std::string& path, const std::string& id) {
  if (path.empty() || !file_exists(set_relative(path))) return false;
  const perf::CalibrationSet s = perf::load_calibration_set(set_relative(path));
  return std::find(s.calibrate.begin(), s.calibrate.end(), id) != s.calibrate.end();
}

// --preset validation: every published point predicted with the cluster's calibrated constants, and our own runs
// the set lists, each on its cluster file.
void print_validation(const SimulateArgs& a, const perf::Cluster& cluster) {
  using namespace mt::perf;
  const CalibrationSet set = load_calibration_set(a.calibration_set);
  std::vector<OwnRunInput> own;
  std::map<std::string, Cluster> clusters;
  for (MeasuredPoint& p : set_own_points(set)) {
    auto it = clusters.find(p.cluster);
    if (it == clusters.end()) it = clusters.emplace(p.cluster, load_cluster(set_relative(p.cluster))).first;
    const bool named = std::find(set.calibrate.begin(), set.calibrate.end(), p.id) != set.calibrate.end();
    const bool calibration = (named && same_file(p.cluster, a.cluster_path)) || set_names(fitted_on(it->second), p.id);
    own.push_back({std::move(p), it->second, calibration});
  }
  const Validation v = validate(cluster, set, set_published_points(set), own);
  if (a.json_out)
    fmt::print("{}\n", to_json(v, cluster).dump(2));
  else
    fmt::print("{}", format_validation(v, cluster));
}

// --calibrate: fits the set's constants and rewrites the cluster file with them and their source.
void run_calibration(const SimulateArgs& a, const perf::Cluster& cluster) {
  using namespace mt::perf;
  const CalibrationSet set = load_calibration_set(a.calibrate);
  std::vector<MeasuredPoint> all = set_published_points(set);
  for (MeasuredPoint& p : set_own_points(set)) all.push_back(std::move(p));
  const std::vector<MeasuredPoint> points = select_points(all, set.calibrate, set.path);
  for (const MeasuredPoint& p : points)
    if (!p.cluster.empty() && !same_file(p.cluster, a.cluster_path))
      fail_as(ErrorKind::Config, "{}: calibrate: '{}' ran on {}, not on {} (the cluster being calibrated)", set.path,
              p.id, p.cluster, a.cluster_path);
  const CalibrationFit fit = fit_calibration(cluster, points, set.fit);
  const Cluster out = with_calibration(cluster, fit, set.path);
  // Keep the file's leading comment block; the rest is the cluster as TOML.
  std::string header, line;
  std::istringstream in(read_text_file(a.cluster_path));
  while (std::getline(in, line) && line.rfind("#", 0) == 0) header += line + "\n";
  write_file_atomic(a.cluster_path, header + to_toml(out));
  if (a.json_out) {
    nlohmann::json j = {{"cluster", a.cluster_path},
                        {"calibration_set", set.path},
                        {"iterations", fit.iterations},
                        {"converged", fit.converged},
                        {"rms_log_error", fit.rms}};
    for (size_t i = 0; i < fit.fit.size(); ++i) j["constants"][fit.fit[i]] = fit.values[i];
    for (auto& [id, e] : fit.residuals) j["residuals"][id] = e;
    fmt::print("{}\n", j.dump(2));
  } else {
    fmt::print("{}wrote {}\n", format_fit(fit), a.cluster_path);
  }
}

// Validates job (with --balance, first replacing its stage split by one it can be checked with), then with
// --balance sets the fastest split and returns the line that reports it.
std::string validate_and_balance(bool balance, int gpus, perf::Job& job, const perf::Cluster& cluster) {
  using namespace mt::perf;
  Layout& L = job.layout;
  const int stages = L.pp * L.virtual_stages;
  const bool even_possible = stages > 0 && job.model.n_layer % stages == 0;
  if (balance) {
    MT_CHECK(L.pp > 1, "--balance needs parallel.pp > 1");
    // A given split only lets the config load where no even split exists; the balanced one replaces it.
    L.stage_layers.clear();
    if (!even_possible) L.stage_layers = balanced_stage_layers(job, cluster);  // a valid split to check the job with
  }
  validate_job(job, cluster, gpus);
  if (!balance) return "";
  const std::string even = even_possible
                               ? fmt::format("the even split: {:.4f} s a step", predict(job, cluster).step_seconds)
                               : fmt::format("no even split of {} layers", job.model.n_layer);
  const std::vector<int> k = best_stage_layers(job, cluster);
  if (even_possible && k == std::vector<int>(stages, job.model.n_layer / stages))
    return "balanced: the even split is already the fastest (no parallel.stage_layers needed)\n";
  L.stage_layers = k;
  return fmt::format("balanced: --parallel.stage_layers=[{}] ({})\n", fmt::join(k, ","), even);
}

// The prediction for job, as a table or JSON, with --scale's costs.
void print_prediction(const SimulateArgs& a, const perf::Job& job, const perf::Cluster& cluster,
                      const std::string& balanced_note) {
  using namespace mt::perf;
  const Layout& L = job.layout;
  const Prediction p = predict(job, cluster);
  nlohmann::json j = to_json(p);
  j["layout"] = to_json(job);
  j["cluster"] = cluster.name;
  std::string text = balanced_note + format_prediction(job, p, cluster);
  if (a.scale) {
    const GroupInitCost g = group_init_cost(cluster, L);
    const CheckpointCost k = checkpoint_cost(cluster, job.model, L);
    const Availability av = availability(cluster, k, g, L.gpus(), a.mtbf_hours);
    j["scale"] = to_json(g, k, av, cluster);
    text += "\n" + format_scale(g, k, av, L, cluster);
  }
  if (a.json_out)
    fmt::print("{}\n", j.dump(2));
  else
    fmt::print("{}", text);
}

// --straggler-coding: the coding schemes' expected steps at each GPU count, where they pay, and the verdict.
void print_coding(const SimulateArgs& a, const RunConfig& cfg, const std::vector<std::string>& overrides, perf::Job job,
                  const perf::Cluster& cluster) {
  using namespace mt::perf;
  SimulateArgs layout_args = a;
  layout_args.batch = 0;  // the batch is split per GPU count, not over the config's dp
  job.layout = simulated_layout(layout_args, cfg, overrides);
  CodingOptions o;
  if (a.gpus > 0) o.gpus = {a.gpus};
  if (a.batch > 0) o.global_batch = a.batch;
  if (a.rate_given) o.rate = a.straggler_rate;  // coding_study refuses values out of range, naming the flag
  if (a.slowdown_given) o.slowdown = a.straggler_slowdown;
  o.duration = a.straggler_duration;
  const CodingStudy s = coding_study(job, cluster, o);
  if (a.json_out)
    fmt::print("{}\n", to_json(s, job, cluster).dump(2));
  else
    fmt::print("{}", format_coding(s, job, cluster));
}

}  // namespace

int cmd_simulate(int argc, char** argv) {
  CLI::App app{"Predict step time, MFU, a breakdown and memory per GPU of a 3D-parallel job on a modelled cluster",
               "simulate"};
  SimulateArgs a;
  add_simulate_options(app, a);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (a.balance && (a.search || !a.preset.empty()))
    fail_as(ErrorKind::Config, "--balance chooses the split of one layout: it does not apply to --{}",
            a.search ? "search" : "preset");
  const std::vector<std::string> overrides = simulate_overrides(app.remaining());
  a.rate_given = app.count("--straggler-rate") > 0;
  a.slowdown_given = app.count("--straggler-slowdown") > 0;
  a.duration_given = app.count("--straggler-duration") > 0;
  if ((a.rate_given || a.slowdown_given || a.duration_given) && !a.straggler_coding)
    fail_as(ErrorKind::Config,
            "--straggler-rate, --straggler-duration and --straggler-slowdown need --straggler-coding");
  if (a.straggler_coding && (a.search || a.balance || a.scale || !a.preset.empty() || !a.calibrate.empty()))
    fail_as(ErrorKind::Config, "--straggler-coding does not combine with --search, --balance, --scale, --preset or "
                               "--calibrate");

  using namespace mt::perf;
  const Cluster cluster = load_cluster(a.cluster_path);
  if (!a.calibrate.empty()) {
    run_calibration(a, cluster);
    return 0;
  }
  if (a.preset == "validation") {
    print_validation(a, cluster);
    return 0;
  }
  if (a.constants) {
    fmt::print("{}", format_constants(cluster));
    return 0;
  }
  RunConfig cfg = with_kind(ErrorKind::Config,
                            [&] { return load_run_config(a.config, overrides, ConfigUse::Simulate); });
  if (!a.preset.empty()) {
    print_preset(a, cfg, cluster);
    return 0;
  }
  Job job = simulated_job(a, cfg);
  if (a.straggler_coding) {
    print_coding(a, cfg, overrides, job, cluster);
    return 0;
  }
  if (a.search) {
    print_search(a, cfg, job, cluster);
    return 0;
  }
  job.layout = simulated_layout(a, cfg, overrides);
  const std::string balanced_note = validate_and_balance(a.balance, a.gpus, job, cluster);
  print_prediction(a, job, cluster, balanced_note);
  return 0;
}

}  // namespace mt::cli
