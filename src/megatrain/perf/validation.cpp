#include "megatrain/perf/validation.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "megatrain/core/error.h"

namespace mt::perf {

namespace {

void summarise_table2(Validation& v) {
  for (const PointResult& r : v.points)
    if (r.point.group == "table2" && !r.calibration) {
      ++v.table2_held_out;
      v.table2_held_out_mean_points += std::abs(r.mfu_points);
      v.table2_held_out_worst_points = std::max(v.table2_held_out_worst_points, std::abs(r.mfu_points));
    }
  if (v.table2_held_out > 0) v.table2_held_out_mean_points /= v.table2_held_out;
}

void summarise_table3(Validation& v) {
  std::vector<const PointResult*> steps;
  for (const PointResult& r : v.points)
    if (r.point.group == "table3") steps.push_back(&r);
  for (size_t i = 1; i < steps.size(); ++i) {
    ++v.table3_steps;
    const double paper = steps[i]->point.mfu - steps[i - 1]->point.mfu;
    const double pred = steps[i]->prediction.mfu - steps[i - 1]->prediction.mfu;
    if ((paper > 0) == (pred > 0) && pred != 0) ++v.table3_signs_right;
  }
  // The cumulative order: ranking the steps by predicted MFU gives the paper's ranking.
  std::vector<size_t> by_pred(steps.size()), by_paper(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) by_pred[i] = by_paper[i] = i;
  std::stable_sort(by_pred.begin(), by_pred.end(),
                   [&](size_t a, size_t b) { return steps[a]->prediction.mfu < steps[b]->prediction.mfu; });
  std::stable_sort(by_paper.begin(), by_paper.end(),
                   [&](size_t a, size_t b) { return steps[a]->point.mfu < steps[b]->point.mfu; });
  v.table3_order_right = !steps.empty() && by_pred == by_paper;
}

void leave_one_out(Validation& v, const Cluster& c, const CalibrationSet& set, const std::vector<MeasuredPoint>& all) {
  std::vector<MeasuredPoint> cal = select_points(all, set.calibrate, set.path);
  // Our own runs ran on other clusters; a set that names them is not the paper cluster's, and has no Korthikanti
  // point to leave out.
  cal.erase(std::remove_if(cal.begin(), cal.end(), [](const MeasuredPoint& p) { return !p.cluster.empty(); }),
            cal.end());
  for (size_t i = 0; i < cal.size(); ++i) {
    if (cal[i].group != "korthikanti") continue;
    std::vector<MeasuredPoint> rest = cal;
    rest.erase(rest.begin() + static_cast<std::ptrdiff_t>(i));
    const CalibrationFit f = fit_calibration(c, rest, set.fit);
    const Cluster refit = with_calibration(c, f, set.path + " without " + cal[i].id);
    const double e = std::expm1(log_error(cal[i], refit));
    v.leave_one_out.push_back({cal[i].id, e});
    v.loo_mean += std::abs(e);
    v.loo_worst = std::max(v.loo_worst, std::abs(e));
  }
  if (!v.leave_one_out.empty()) v.loo_mean /= double(v.leave_one_out.size());
}

std::string pass(bool ok) { return ok ? "met" : "MISSED"; }

void add_own_runs(Validation& v, const std::vector<OwnRunInput>& own) {
  for (const OwnRunInput& in : own) {
    PointResult r;
    r.point = in.point;
    r.calibration = in.calibration;
    r.cluster = in.cluster.name;
    r.prediction = predict(in.point.job, in.cluster);
    r.error = r.prediction.step_seconds / in.point.seconds - 1;
    if (in.point.target > 0) {
      ++v.own_targets;
      v.own_targets_met += std::abs(r.error) <= in.point.target;
    }
    v.own_runs.push_back(std::move(r));
  }
}

std::string format_own_runs(const Validation& v) {
  std::string out;
  for (bool cal : {true, false}) {
    out += cal ? "\nOUR OWN RUNS, CALIBRATION SET (the fit of their cluster file saw these)\n"
               : "\nOUR OWN RUNS, HELD OUT (never used in a fit)\n";
    out += fmt::format("  {:<24} {:<18} {:>10} {:>10} {:>8} {:>7}\n", "point", "cluster", "measured", "predicted",
                       "err %", "target");
    for (const PointResult& r : v.own_runs) {
      if (r.calibration != cal) continue;
      out += fmt::format("  {:<24} {:<18} {:>8.4f} s {:>8.4f} s {:>+8.1f} {:>7}\n", r.point.id, r.cluster,
                         r.point.seconds, r.prediction.step_seconds, 100 * r.error,
                         r.point.target > 0 ? fmt::format("{:g}%", 100 * r.point.target) : "");
    }
  }
  return out;
}

}  // namespace

Validation validate(const Cluster& calibrated, const CalibrationSet& set, const std::vector<MeasuredPoint>& all,
                    const std::vector<OwnRunInput>& own) {
  Validation v;
  v.set_path = set.path;
  v.fit = set.fit;
  std::vector<MeasuredPoint> every = all;
  for (const OwnRunInput& in : own) every.push_back(in.point);
  select_points(every, set.calibrate, set.path);  // every id of the set must name a point
  for (const MeasuredPoint& p : all) {
    PointResult r;
    r.point = p;
    r.calibration = std::find(set.calibrate.begin(), set.calibrate.end(), p.id) != set.calibrate.end();
    r.prediction = predict(p.job, calibrated);
    r.error = r.prediction.step_seconds / measured_seconds(p, calibrated) - 1;
    r.mfu_points = p.mfu > 0 ? 100 * (r.prediction.mfu - p.mfu) : 0;
    v.points.push_back(std::move(r));
  }
  summarise_table2(v);
  summarise_table3(v);
  leave_one_out(v, calibrated, set, every);
  add_own_runs(v, own);
  return v;
}

std::string format_fit(const CalibrationFit& f) {
  std::string out = fmt::format("fitted ({} iterations{}; rms log error {:.4f}):\n", f.iterations,
                                f.converged ? ", converged" : ", NOT converged", f.rms);
  for (size_t i = 0; i < f.fit.size(); ++i) out += fmt::format("  {:<24} {:.6g}\n", f.fit[i], f.values[i]);
  out += "residuals (predicted / measured - 1):\n";
  for (auto& [id, e] : f.residuals) out += fmt::format("  {:<32} {:+6.1f}%\n", id, 100 * e);
  return out;
}

// The published points' tables (calibration set, held out).
std::string format_published(const Validation& v) {
  std::string out;
  for (bool cal : {true, false}) {
    out += cal ? "\nCALIBRATION SET (the fit saw these)\n" : "\nHELD OUT (never used in a fit)\n";
    out += fmt::format("  {:<32} {:>9} {:>9} {:>8} {:>8} {:>8}\n", "point", "measured", "predicted", "err %", "MFU pa",
                       "err pt");
    for (const PointResult& r : v.points) {
      if (r.calibration != cal) continue;
      const bool mfu = r.point.mfu > 0;
      out += fmt::format("  {:<32} {:>9} {:>9} {:>+8.1f} {:>8} {:>8}\n", r.point.id,
                         mfu ? fmt::format("{:.1f}%", 100 * r.point.mfu) : fmt::format("{:.2f} s", r.point.seconds),
                         mfu ? fmt::format("{:.1f}%", 100 * r.prediction.mfu)
                             : fmt::format("{:.2f} s", r.prediction.step_seconds),
                         100 * r.error, mfu ? fmt::format("{:.1f}", 100 * r.point.mfu) : "",
                         mfu ? fmt::format("{:+.1f}", r.mfu_points) : "");
    }
  }
  return out;
}

// The published points' summary lines (Table 2, Table 3, Korthikanti leave-one-out).
std::string format_published_summary(const Validation& v) {
  std::string out;
  const ValidationTargets& t = v.targets;
  out += fmt::format(
      "  Table 2 held out ({} rows): mean |error| {:.2f} MFU points (<= {}; {}), worst {:.2f} (<= {}; {})\n",
      v.table2_held_out, v.table2_held_out_mean_points, t.table2_mean_points,
      pass(v.table2_held_out_mean_points <= t.table2_mean_points), v.table2_held_out_worst_points,
      t.table2_worst_points, pass(v.table2_held_out_worst_points <= t.table2_worst_points));
  out += fmt::format("  Table 3: {} of {} steps with the paper's sign ({}); cumulative order {} ({})\n",
                     v.table3_signs_right, v.table3_steps, pass(v.table3_signs_right == v.table3_steps),
                     v.table3_order_right ? "the paper's" : "NOT the paper's", pass(v.table3_order_right));
  out += fmt::format(
      "  Korthikanti leave-one-out ({} points): mean |error| {:.2f}% (<= {:.2f}%; {}), worst {:.2f}% (<= {:.2f}%; {})\n",
      v.leave_one_out.size(), 100 * v.loo_mean, 100 * t.korthikanti_mean, pass(v.loo_mean <= t.korthikanti_mean),
      100 * v.loo_worst, 100 * t.korthikanti_worst, pass(v.loo_worst <= t.korthikanti_worst));
  return out;
}

std::string format_validation(const Validation& v, const Cluster& c) {
  std::string out = fmt::format("Validation of the performance model on {} ({})\ncalibration set {}\n", c.name, c.path,
                                v.set_path);
  out += "calibrated constants:\n";
  for (const CalibrationConstant& k : calibration_constants()) {
    const Sourced& s = c.*k.member;
    out += fmt::format("  {:<24} {:.6g}{}\n", k.name, s.value, s.source.empty() ? "  (neutral: not calibrated)" : "");
  }
  const bool published = !v.points.empty();
  if (published) out += format_published(v);
  if (!v.own_runs.empty()) out += format_own_runs(v);
  if (published) {
    out += "\nKorthikanti points, leave-one-out (constants fitted on the set without the point):\n";
    for (const LeaveOneOut& l : v.leave_one_out) out += fmt::format("  {:<32} {:+6.1f}%\n", l.id, 100 * l.error);
  }
  out += "\nsummary (target; met or MISSED)\n";
  if (published) out += format_published_summary(v);
  if (v.own_targets > 0)
    out += fmt::format("  our own runs: {} of {} within their targets\n", v.own_targets_met, v.own_targets);
  for (const PointResult& r : v.own_runs)
    if (r.point.target > 0)
      out += fmt::format("    {:<24} {:<11} |error| {:.1f}% (<= {:g}%; {})\n", r.point.id,
                         r.calibration ? "calibration" : "held out", 100 * std::abs(r.error), 100 * r.point.target,
                         pass(std::abs(r.error) <= r.point.target));
  return out;
}

nlohmann::json to_json(const Validation& v, const Cluster& c) {
  using nlohmann::json;
  json constants = json::object();
  for (const CalibrationConstant& k : calibration_constants()) {
    const Sourced& s = c.*k.member;
    constants[k.name] = {{"value", s.value}, {"source", s.source.empty() ? "neutral: not calibrated" : s.source}};
  }
  json cal = json::array(), held = json::array();
  for (const PointResult& r : v.points) {
    json p = {{"id", r.point.id},
              {"group", r.point.group},
              {"step_seconds_predicted", r.prediction.step_seconds},
              {"mfu_predicted", r.prediction.mfu},
              {"error", r.error}};
    if (r.point.mfu > 0) {
      p["mfu_measured"] = r.point.mfu;
      p["mfu_error_points"] = r.mfu_points;
    } else {
      p["step_seconds_measured"] = r.point.seconds;
    }
    (r.calibration ? cal : held).push_back(p);
  }
  json own = json::array(), own_summary = json::array();
  for (const PointResult& r : v.own_runs) {
    json p = {{"id", r.point.id},
              {"group", r.point.group},
              {"cluster", r.cluster},
              {"cluster_path", r.point.cluster},
              {"set", r.calibration ? "calibration" : "held_out"},
              {"step_seconds_measured", r.point.seconds},
              {"step_seconds_predicted", r.prediction.step_seconds},
              {"ratio_predicted_over_measured", r.prediction.step_seconds / r.point.seconds},
              {"error", r.error},
              {"source", r.point.source}};
    if (r.point.target > 0) {
      p["target"] = r.point.target;
      p["met"] = std::abs(r.error) <= r.point.target;
      own_summary.push_back({{"id", r.point.id},
                             {"set", p["set"]},
                             {"abs_error", std::abs(r.error)},
                             {"target", r.point.target},
                             {"met", p["met"]}});
    }
    own.push_back(p);
  }
  json loo = json::array();
  for (const LeaveOneOut& l : v.leave_one_out) loo.push_back({{"id", l.id}, {"error", l.error}});
  const ValidationTargets& t = v.targets;
  return {{"cluster", c.name},
          {"cluster_path", c.path},
          {"calibration_set", v.set_path},
          {"fit", v.fit},
          {"constants", constants},
          {"calibration", cal},
          {"held_out", held},
          {"leave_one_out", loo},
          {"own_runs", own},
          {"summary",
           {{"table2_held_out_rows", v.table2_held_out},
            {"table2_held_out_mean_abs_mfu_points", v.table2_held_out_mean_points},
            {"table2_held_out_worst_abs_mfu_points", v.table2_held_out_worst_points},
            {"table3_steps", v.table3_steps},
            {"table3_signs_right", v.table3_signs_right},
            {"table3_order_right", v.table3_order_right},
            {"korthikanti_leave_one_out_mean_abs_error", v.loo_mean},
            {"korthikanti_leave_one_out_worst_abs_error", v.loo_worst},
            {"table2_mean_met", v.table2_held_out_mean_points <= t.table2_mean_points},
            {"table2_worst_met", v.table2_held_out_worst_points <= t.table2_worst_points},
            {"table3_met", v.table3_signs_right == v.table3_steps && v.table3_order_right},
            {"korthikanti_mean_met", v.loo_mean <= t.korthikanti_mean},
            {"korthikanti_worst_met", v.loo_worst <= t.korthikanti_worst},
            {"own_runs_with_target", v.own_targets},
            {"own_runs_within_target", v.own_targets_met},
            {"own_runs", own_summary}}},
          {"targets",
           {{"table2_mean_points", t.table2_mean_points},
            {"table2_worst_points", t.table2_worst_points},
            {"korthikanti_mean", t.korthikanti_mean},
            {"korthikanti_worst", t.korthikanti_worst}}}};
}

}  // namespace mt::perf
