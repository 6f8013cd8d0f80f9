// Loss-spike detection: a warning, not an error (the run goes on; the supervisor logs it). A step's loss is a
// spike when it is above mean + sigmas x std of the previous `window` steps' losses, or above factor x their
// median (the ratio rule also catches a jump out of a window so flat that its std says little). Checked only once
// min(window, 10) losses are known.
#pragma once
#include <deque>
#include <optional>
#include <string>

namespace mt {

struct SpikeRule {
  int window = 50;  // 0: never a spike
  double sigmas = 6;
  double factor = 2;  // 0: no ratio rule
};

struct Spike {
  std::string rule;  // "sigma" or "factor"
  double mean = 0, std = 0, median = 0, threshold = 0;
  int samples = 0;  // losses in the window
};

class LossSpikeDetector {
 public:
  explicit LossSpikeDetector(SpikeRule rule) : rule_(rule) {}
  // Checks `loss` against the window of earlier losses, then adds it to the window.
  std::optional<Spike> observe(double loss);

 private:
  SpikeRule rule_;
  std::deque<double> window_;
};

}  // namespace mt
