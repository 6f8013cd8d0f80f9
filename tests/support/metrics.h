// Reading what a run writes as JSON lines: its metrics.jsonl (one object a line, each with a "kind": "train" per
// logged step, "val", "val_source", "sample", "checkpoint", "checkpoint_event", "run", ...) and the launcher's event
// log (--events).
#pragma once
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mt::test {

// Every line of a JSON-lines file, parsed, in order ([] when there is no file). A line that does not parse throws
// (failing the test), unless `tolerant`: then it is skipped, as the line a running job is writing (read next time).
inline std::vector<nlohmann::json> jsonl_lines(const std::filesystem::path& p, bool tolerant = false) {
  std::vector<nlohmann::json> out;
  std::ifstream f(p);
  for (std::string line; std::getline(f, line);) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/!tolerant);
    if (!j.is_discarded()) out.push_back(std::move(j));
  }
  return out;
}

// The lines of a JSON-lines file that a job may still be writing (the launcher's event log, a live metrics file).
inline std::vector<nlohmann::json> events_of(const std::filesystem::path& p) {
  return jsonl_lines(p, /*tolerant=*/true);
}

// The lines of one kind of a metrics.jsonl, in order.
inline std::vector<nlohmann::json> metrics_of(const std::filesystem::path& metrics, const std::string& kind,
                                              bool tolerant = false) {
  std::vector<nlohmann::json> out;
  for (nlohmann::json& j : jsonl_lines(metrics, tolerant))
    if (j["kind"] == kind) out.push_back(std::move(j));
  return out;
}

// `field` of every line of `kind` of a metrics.jsonl: the per-step "loss" or "grad_norm" of "train" lines, the
// "val_loss" of "val" lines.
inline std::vector<double> metric_series(const std::filesystem::path& metrics, const std::string& field,
                                         const std::string& kind = "train") {
  std::vector<double> v;
  for (nlohmann::json& j : metrics_of(metrics, kind)) v.push_back(j[field].get<double>());
  return v;
}

// "step:loss_exact" of every train line of a metrics.jsonl: two runs are bit-identical when these are equal.
inline std::vector<std::string> step_losses(const std::filesystem::path& metrics) {
  std::vector<std::string> out;
  for (nlohmann::json& j : metrics_of(metrics, "train"))
    out.push_back(std::to_string(j["step"].get<int>()) + ":" + j["loss_exact"].get<std::string>());
  return out;
}

// The newest step in a metrics file a job may still be writing (0 when none yet).
inline int last_step(const std::filesystem::path& metrics) {
  int s = 0;
  for (const nlohmann::json& j : events_of(metrics))
    if (j.value("kind", "") == "train") s = std::max(s, j.value("step", 0));
  return s;
}

}  // namespace mt::test
