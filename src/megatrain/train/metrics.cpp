#include "megatrain/train/metrics.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>

#include "megatrain/core/error.h"

namespace mt {

void MetricsLog::open(const std::string& path, bool append) {
  if (f_) std::fclose(f_);
  f_ = std::fopen(path.c_str(), append ? "a" : "w");
  MT_CHECK(f_, "cannot open metrics file {}: {}", path, std::strerror(errno));
}

MetricsLog::~MetricsLog() {
  if (f_) std::fclose(f_);
}

void MetricsLog::write(const nlohmann::json& j) {
  if (!f_) return;
  std::string s = j.dump() + "\n";
  std::fwrite(s.data(), 1, s.size(), f_);
  std::fflush(f_);
}

std::string MetricsLog::progress_line(const StepStats& s) {
  return fmt::format("step {:>6}/{} | loss {:.4f} | lr {:.2e} | gnorm {:.3f} | {:>8.0f} tok/s | {:.3f} TFLOP/s | "
                     "MFU {:.1f}% | {:.0f} ms",
                     s.step, s.total_steps, s.loss, s.lr, s.grad_norm, s.tokens_per_second,
                     s.model_flops_per_second / 1e12, 100.0 * s.mfu, 1000.0 * s.step_seconds);
}

nlohmann::json MetricsLog::to_json(const StepStats& s) {
  // The loss is also written with 9 significant digits (float round-trip) so runs can be compared exactly.
  return {{"kind", "train"},
          {"step", s.step},
          {"loss", s.loss},
          {"loss_exact", fmt::format("{:.9g}", s.loss)},
          {"lr", s.lr},
          {"grad_norm", s.grad_norm},
          {"step_seconds", s.step_seconds},
          {"tokens_per_second", s.tokens_per_second},
          {"model_tflops", s.model_flops_per_second / 1e12},
          {"mfu", s.mfu}};
}

}  // namespace mt
