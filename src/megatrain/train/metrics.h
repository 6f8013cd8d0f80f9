// Training metrics: one JSON object per line in <out_dir>/metrics.jsonl (the first observer), and the progress
// printer that writes the human lines on stdout.
#pragma once
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "megatrain/train/observer.h"

namespace mt {

class MetricsLog final : public TrainObserver {
 public:
  MetricsLog() = default;
  // A fresh run (resumed_step = 0) starts the file anew. A run resumed from step S keeps the earlier lines up to
  // step S and drops those past it: steps a failed attempt ran after its last checkpoint are run again, and the
  // file must read as one history (one `train` line per step), as an undisturbed run's would. Lines without a step
  // (none today) are kept. The rewrite is atomic: a crash during it leaves the old file.
  void open(const std::string& path, int resumed_step);
  ~MetricsLog() override;
  void write(const nlohmann::json& j);  // one line, flushed
  static nlohmann::json to_json(const StepReport& r);

  void on_run_start(const RunStart& r) override;
  void on_step(const StepReport& r) override { write(to_json(r)); }
  void on_eval(int step, double val_loss) override;
  void on_eval_sources(int step, const std::vector<SourceLoss>& losses) override;
  void on_checkpoint(int step, const std::string& dir, const std::string& why) override;
  void on_checkpoint_event(const CheckpointEvent& e) override;
  void on_sample(int step, const std::string& text, const std::vector<int32_t>& tokens) override;
  void on_error(int step, ErrorKind kind, const std::string& what) override;

 private:
  std::FILE* f_ = nullptr;
};

// Progress lines on stdout: every log_every steps (and the first and last), validation losses, the final error.
class ProgressPrinter final : public TrainObserver {
 public:
  explicit ProgressPrinter(int log_every) : log_every_(log_every) {}
  static std::string progress_line(const StepReport& r);
  void on_run_start(const RunStart& r) override;
  void on_step(const StepReport& r) override;
  void on_eval(int step, double val_loss) override;
  void on_eval_sources(int step, const std::vector<SourceLoss>& losses) override;
  void on_sample(int step, const std::string& text, const std::vector<int32_t>& tokens) override;

 private:
  int log_every_, first_ = 1;
};

}  // namespace mt
