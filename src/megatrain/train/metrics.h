// Training metrics: one JSON object per line in <out_dir>/metrics.jsonl and a human progress line on stdout.
#pragma once
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace mt {

struct StepStats {
  int step = 0, total_steps = 0;
  double loss = 0, lr = 0, grad_norm = 0;
  double step_seconds = 0, tokens_per_second = 0, model_flops_per_second = 0, mfu = 0;
};

class MetricsLog {
 public:
  MetricsLog() = default;
  // append = true keeps earlier lines (resumed runs).
  void open(const std::string& path, bool append);
  ~MetricsLog();
  void write(const nlohmann::json& j);  // one line, flushed
  static std::string progress_line(const StepStats& s);
  static nlohmann::json to_json(const StepStats& s);

 private:
  std::FILE* f_ = nullptr;
};

}  // namespace mt
