#include "megatrain/train/loss_spike.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace mt {

std::optional<Spike> LossSpikeDetector::observe(double loss) {
  if (rule_.window <= 0) return std::nullopt;
  std::optional<Spike> out;
  const size_t need = static_cast<size_t>(std::min(rule_.window, 10));
  if (window_.size() >= need) {
    Spike s;
    s.samples = static_cast<int>(window_.size());
    double sum = 0;
    for (double v : window_) sum += v;
    s.mean = sum / s.samples;
    double sq = 0;
    for (double v : window_) sq += (v - s.mean) * (v - s.mean);
    s.std = std::sqrt(sq / s.samples);
    std::vector<double> sorted(window_.begin(), window_.end());
    std::sort(sorted.begin(), sorted.end());
    const size_t h = sorted.size() / 2;
    s.median = sorted.size() % 2 ? sorted[h] : 0.5 * (sorted[h - 1] + sorted[h]);
    if (s.std > 0 && loss > s.mean + rule_.sigmas * s.std) {
      s.rule = "sigma";
      s.threshold = s.mean + rule_.sigmas * s.std;
      out = s;
    } else if (rule_.factor > 0 && s.median > 0 && loss > rule_.factor * s.median) {
      s.rule = "factor";
      s.threshold = rule_.factor * s.median;
      out = s;
    }
  }
  window_.push_back(loss);
  if (window_.size() > static_cast<size_t>(rule_.window)) window_.pop_front();
  return out;
}

}  // namespace mt
