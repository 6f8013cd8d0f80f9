#include "megatrain/perf/measured_runs.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"

namespace mt::perf {

const std::vector<std::string>& simulate_flags() {
  static const std::vector<std::string> k = {"ptb",        "swa",       "tp-overlap", "pp-overlap",
                                             "dp-overlap", "fused-ops", "misc",       "megascale"};
  return k;
}

namespace {

using nlohmann::json;

// Reads the fields of one run, each checked; `where` is "FILE: runs[i] (ID)".
struct RunReader {
  const json& j;
  std::string where;

  std::string string(const char* f, bool required = true, const std::string& fallback = "") const {
    if (!j.contains(f)) {
      MT_CHECK(!required, "{}: '{}' is missing", where, f);
      return fallback;
    }
    MT_CHECK(j[f].is_string() && !j[f].get<std::string>().empty(), "{}: '{}' must be a non-empty string", where, f);
    return j[f].get<std::string>();
  }
  std::vector<std::string> strings(const char* f) const {
    std::vector<std::string> out;
    if (!j.contains(f)) return out;
    MT_CHECK(j[f].is_array(), "{}: '{}' must be an array of strings", where, f);
    for (size_t i = 0; i < j[f].size(); ++i) {
      MT_CHECK(j[f][i].is_string(), "{}: {}[{}] must be a string", where, f, i);
      out.push_back(j[f][i].get<std::string>());
    }
    return out;
  }
  int count(const char* f) const {
    if (!j.contains(f)) return 0;
    MT_CHECK(j[f].is_number_integer() && j[f].get<int>() >= 0, "{}: '{}' must be a whole number >= 0 (0: not given)",
             where, f);
    return j[f].get<int>();
  }
  double positive(const char* f, bool required) const {
    if (!j.contains(f)) {
      MT_CHECK(!required, "{}: '{}' is missing", where, f);
      return 0;
    }
    MT_CHECK(j[f].is_number() && j[f].get<double>() > 0, "{}: '{}' must be a number > 0", where, f);
    return j[f].get<double>();
  }
};

MeasuredRun read_run(const json& j, const std::string& where) {
  MT_CHECK(j.is_object(), "{}: a run must be a JSON object", where);
  static const std::set<std::string> known = {
      "id",     "config", "overrides", "cluster", "gpus", "batch", "recompute", "flags", "measured_step_seconds",
      "target", "source"};
  for (auto& [k, _] : j.items())
    MT_CHECK(known.count(k), "{}: unknown field '{}' (allowed: {})", where, k, fmt::join(known, ", "));
  const RunReader r{j, where};
  MeasuredRun run;
  run.id = r.string("id");
  const size_t slash = run.id.find('/');
  MT_CHECK(slash != std::string::npos && slash > 0 && slash + 1 < run.id.size(),
           "{}: id '{}' must be '<group>/<name>' (e.g. cpu/dp2, h100/gpt-1.3b B4)", where, run.id);
  run.group = run.id.substr(0, slash);
  const std::string at = fmt::format("{} ({})", where, run.id);
  const RunReader q{j, at};
  run.spec.config = q.string("config");
  run.spec.cluster = q.string("cluster");
  run.spec.overrides = q.strings("overrides");
  static const std::regex override_form(R"([A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*=.+)");
  for (const std::string& o : run.spec.overrides)
    MT_CHECK(std::regex_match(o, override_form), "{}: override '{}' must be section.key=value (no leading dashes)", at,
             o);
  run.spec.gpus = q.count("gpus");
  run.spec.batch = q.count("batch");
  run.spec.recompute = q.string("recompute", false, "none");
  MT_CHECK(run.spec.recompute == "none" || run.spec.recompute == "selective" || run.spec.recompute == "full",
           "{}: recompute must be none, selective or full (got '{}')", at, run.spec.recompute);
  run.spec.flags = q.strings("flags");
  for (const std::string& f : run.spec.flags)
    MT_CHECK(std::find(simulate_flags().begin(), simulate_flags().end(), f) != simulate_flags().end(),
             "{}: unknown flag '{}' (known: {})", at, f, fmt::join(simulate_flags(), ", "));
  run.seconds = q.positive("measured_step_seconds", true);
  run.target = q.positive("target", false);
  MT_CHECK(run.target < 1, "{}: 'target' is a relative error (0.05 = 5%), below 1", at);
  run.source = q.string("source");
  return run;
}

}  // namespace

MeasuredRuns parse_measured_runs(const std::string& text, const std::string& path) {
  try {
    json j;
    try {
      j = json::parse(text);
    } catch (const json::exception& e) {
      fail("{}: not valid JSON: {}", path, e.what());
    }
    MT_CHECK(j.is_object(), "{}: a measured-runs file must be a JSON object", path);
    for (auto& [k, _] : j.items())
      MT_CHECK(k == "description" || k == "runs", "{}: unknown field '{}' (allowed: description, runs)", path, k);
    MeasuredRuns out;
    out.path = path;
    MT_CHECK(j.contains("description") && j["description"].is_string(), "{}: 'description' must be a string", path);
    out.description = j["description"].get<std::string>();
    MT_CHECK(j.contains("runs") && j["runs"].is_array() && !j["runs"].empty(),
             "{}: 'runs' must be a non-empty array of runs", path);
    std::set<std::string> seen;
    for (size_t i = 0; i < j["runs"].size(); ++i) {
      MeasuredRun r = read_run(j["runs"][i], fmt::format("{}: runs[{}]", path, i));
      MT_CHECK(seen.insert(r.id).second, "{}: runs[{}]: id '{}' is named twice", path, i, r.id);
      out.runs.push_back(std::move(r));
    }
    return out;
  } catch (const Error& e) {
    throw Error(e.what(), ErrorKind::Config);
  }
}

MeasuredRuns load_measured_runs(const std::string& path) {
  if (!file_exists(path))
    fail_as(ErrorKind::Config, "measured-runs file {} does not exist (see configs/measured/)", path);
  return parse_measured_runs(read_text_file(path), path);
}

}  // namespace mt::perf
