#include "megatrain/perf/calibration.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <set>

#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"
#include "megatrain/perf/least_squares.h"
#include "megatrain/perf/presets.h"

namespace mt::perf {

namespace {
constexpr size_t kMaxConstants = 4;  // the cap: at most four constants no datasheet prices
}  // namespace

std::vector<MeasuredPoint> published_points(const ModelConfig& base) {
  std::vector<MeasuredPoint> out;
  for (const PresetRow& r : korthikanti_table5(base))
    out.push_back({"korthikanti/" + r.label, "korthikanti", r.job, r.paper_seconds, 0, "", 0, ""});
  for (const PresetRow& r : megascale_table2(base))
    out.push_back({fmt::format("table2/{} {}", r.label, r.gpus), "table2", r.job, 0, r.paper_mfu, "", 0, ""});
  for (const PresetRow& r : megascale_table3(base))
    out.push_back({"table3/" + r.label, "table3", r.job, 0, r.paper_mfu, "", 0, ""});
  return out;
}

double measured_seconds(const MeasuredPoint& p, const Cluster& c) {
  if (p.mfu <= 0) return p.seconds;
  const Layout& L = p.job.layout;
  const double flops = p.job.model.flops_per_token(L.seq) * double(L.global_batch()) * L.seq;
  return flops / (p.mfu * L.gpus() * c.peak_flops());
}

double log_error(const MeasuredPoint& p, const Cluster& c) {
  return std::log(predict_step_seconds(p.job, c) / measured_seconds(p, c));
}

const std::vector<CalibrationConstant>& calibration_constants() {
  // Bounds only refuse what cannot be meant: a negative time; a collective in a training step faster than the
  // microbenchmark its bandwidth is taken from (nccl-tests busbw, or line rate x the achieved fraction), so the
  // link efficiencies are at most 1; a GEMM above peak, which Cluster::gemm_efficiency caps per GEMM, so the scale
  // itself may go to 2.
  static const std::vector<CalibrationConstant> k = {
      {"gemm_efficiency_scale", &Cluster::gemm_efficiency_scale, 0.2, 2.0, 1.0},
      {"nvlink_efficiency", &Cluster::nvlink_efficiency, 0.05, 1.0, 1.0},
      {"network_efficiency", &Cluster::network_efficiency, 0.05, 1.0, 1.0},
      {"dp_sync_s", &Cluster::dp_sync_s, 0.0, 100.0, 0.0},
      {"overlap_interference", &Cluster::overlap_interference, 0.0, 1.0, 0.0},
  };
  return k;
}

namespace {

const CalibrationConstant* find_constant(const std::string& name) {
  for (const CalibrationConstant& k : calibration_constants())
    if (name == k.name) return &k;
  return nullptr;
}

std::string constant_names() {
  std::string out;
  for (const CalibrationConstant& k : calibration_constants()) out += (out.empty() ? "" : ", ") + std::string(k.name);
  return out;
}

std::vector<std::string> string_array(const nlohmann::json& j, const char* field, const std::string& path) {
  MT_CHECK(j.contains(field) && j[field].is_array() && !j[field].empty(),
           "{}: '{}' must be a non-empty array of strings", path, field);
  std::vector<std::string> out;
  for (size_t i = 0; i < j[field].size(); ++i) {
    MT_CHECK(j[field][i].is_string(), "{}: {}[{}] must be a string", path, field, i);
    out.push_back(j[field][i].get<std::string>());
  }
  return out;
}

}  // namespace

CalibrationSet parse_calibration_set(const std::string& text, const std::string& path) {
  try {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      fail("{}: not valid JSON: {}", path, e.what());
    }
    MT_CHECK(j.is_object(), "{}: a calibration set must be a JSON object", path);
    for (auto& [k, _] : j.items())
      MT_CHECK(k == "description" || k == "model" || k == "runs" || k == "fit" || k == "calibrate",
               "{}: unknown field '{}' (allowed: description, model, runs, fit, calibrate)", path, k);
    CalibrationSet s;
    s.path = path;
    MT_CHECK(j.contains("description") && j["description"].is_string(), "{}: 'description' must be a string", path);
    s.description = j["description"].get<std::string>();
    if (j.contains("model")) {
      MT_CHECK(j["model"].is_string() && !j["model"].get<std::string>().empty(),
               "{}: 'model' must be the path of the model config the published points start from", path);
      s.model_config = j["model"].get<std::string>();
    }
    if (j.contains("runs")) s.runs = string_array(j, "runs", path);
    s.fit = string_array(j, "fit", path);
    s.calibrate = string_array(j, "calibrate", path);
    MT_CHECK(s.fit.size() <= kMaxConstants, "{}: 'fit' names {} constants; at most {} may be calibrated", path,
             s.fit.size(), kMaxConstants);
    std::set<std::string> seen;
    for (const std::string& f : s.fit) {
      MT_CHECK(find_constant(f), "{}: fit: unknown constant '{}' (known: {})", path, f, constant_names());
      MT_CHECK(seen.insert(f).second, "{}: fit: '{}' is named twice", path, f);
    }
    seen.clear();
    for (const std::string& id : s.calibrate)
      MT_CHECK(seen.insert(id).second, "{}: calibrate: '{}' is named twice", path, id);
    MT_CHECK(s.calibrate.size() >= s.fit.size(), "{}: {} points cannot determine {} constants", path,
             s.calibrate.size(), s.fit.size());
    return s;
  } catch (const Error& e) {
    throw Error(e.what(), ErrorKind::Config);
  }
}

CalibrationSet load_calibration_set(const std::string& path) {
  if (!file_exists(path))
    fail_as(ErrorKind::Config, "calibration set {} does not exist (see configs/calibration/)", path);
  return parse_calibration_set(read_text_file(path), path);
}

std::vector<MeasuredPoint> select_points(const std::vector<MeasuredPoint>& all, const std::vector<std::string>& ids,
                                         const std::string& set_path) {
  std::vector<MeasuredPoint> out;
  for (const std::string& id : ids) {
    auto it = std::find_if(all.begin(), all.end(), [&](const MeasuredPoint& p) { return p.id == id; });
    if (it == all.end()) {
      std::string known;
      for (const MeasuredPoint& p : all) known += (known.empty() ? "" : ", ") + p.id;
      fail_as(ErrorKind::Config, "{}: calibrate: unknown point '{}' (known: {})", set_path, id, known);
    }
    out.push_back(*it);
  }
  return out;
}

std::string fitted_on(const Cluster& c) {
  const std::string lead = "fitted on ";
  for (const CalibrationConstant& k : calibration_constants()) {
    const std::string& s = (c.*k.member).source;
    if (s.rfind(lead, 0) != 0) continue;
    const size_t end = s.find(" (", lead.size());
    return s.substr(lead.size(), end == std::string::npos ? std::string::npos : end - lead.size());
  }
  return "";
}

Cluster without_calibration(Cluster c) {
  for (const CalibrationConstant& k : calibration_constants()) c.*k.member = Sourced{k.neutral, ""};
  return c;
}

CalibrationFit fit_calibration(const Cluster& c, const std::vector<MeasuredPoint>& points,
                               const std::vector<std::string>& fit) {
  MT_CHECK(!points.empty() && points.size() >= fit.size(), "calibration: {} points cannot determine {} constants",
           points.size(), fit.size());
  std::vector<const CalibrationConstant*> ks;
  std::vector<double> x0;
  std::vector<Bounds> bounds;
  for (const std::string& f : fit) {
    const CalibrationConstant* k = find_constant(f);
    MT_CHECK(k, "calibration: unknown constant '{}' (known: {})", f, constant_names());
    ks.push_back(k);
    x0.push_back(k->neutral);
    bounds.push_back({k->lo, k->hi});
  }
  const Cluster neutral = without_calibration(c);
  auto residuals = [&](const std::vector<double>& x) {
    Cluster trial = neutral;
    for (size_t i = 0; i < ks.size(); ++i) (trial.*(ks[i]->member)).value = x[i];
    std::vector<double> r;
    for (const MeasuredPoint& p : points) r.push_back(log_error(p, trial));
    return r;
  };
  const LeastSquaresResult ls = levenberg_marquardt(residuals, x0, bounds, 50, 1e-8);
  CalibrationFit out;
  out.fit = fit;
  out.values = ls.x;
  out.iterations = ls.iterations;
  out.converged = ls.converged;
  out.rms = std::sqrt(ls.sum_squares / double(points.size()));
  for (size_t i = 0; i < points.size(); ++i) out.residuals.emplace_back(points[i].id, std::expm1(ls.residuals[i]));
  return out;
}

Cluster with_calibration(Cluster c, const CalibrationFit& fit, const std::string& set_path) {
  c = without_calibration(std::move(c));
  double mean = 0, worst = 0;
  for (auto& [id, e] : fit.residuals) {
    mean += std::abs(e) / double(fit.residuals.size());
    worst = std::max(worst, std::abs(e));
  }
  std::string each;
  for (auto& [id, e] : fit.residuals) each += fmt::format("{}{} {:+.1f}%", each.empty() ? "" : ", ", id, 100 * e);
  const std::string source = fmt::format(
      "fitted on {} ({} points; with {}) by megatrain simulate --calibrate, least squares of log step time, "
      "rms {:.4f}; residuals (predicted/measured - 1): mean |{:.1f}%|, worst {:.1f}%: {}",
      set_path, fit.residuals.size(), fmt::join(fit.fit, ", "), fit.rms, 100 * mean, 100 * worst, each);
  for (size_t i = 0; i < fit.fit.size(); ++i) {
    const CalibrationConstant* k = find_constant(fit.fit[i]);
    MT_CHECK(k, "calibration: unknown constant '{}'", fit.fit[i]);
    c.*(k->member) = Sourced{fit.values[i], source};
  }
  return c;
}

}  // namespace mt::perf
