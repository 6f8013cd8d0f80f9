#include "megatrain/parallel/straggler_model.h"

#include <fmt/format.h>

#include <algorithm>

#include "megatrain/core/error.h"
#include "megatrain/core/rng.h"

namespace mt {

void validate_bursty_model(const BurstyModel& m, int workers) {
  if (m.B < 1) fail_as(ErrorKind::Config, "parallel.straggler_burst must be >= 1 (got {})", m.B);
  if (m.W <= m.B) {
    fail_as(ErrorKind::Config, "parallel.straggler_window must be greater than parallel.straggler_burst = {} (got {})",
            m.B, m.W);
  }
  if (m.lambda < 1 || m.lambda > workers) {
    fail_as(ErrorKind::Config, "parallel.straggler_lambda must be in 1..{} (the data-parallel replicas; got {})",
            workers, m.lambda);
  }
}

bool inside_per_round_model(const StragglerPattern& p, int s) {
  return std::all_of(p.begin(), p.end(),
                     [s](const std::vector<bool>& row) { return std::count(row.begin(), row.end(), true) <= s; });
}

namespace {

// Why rounds [a, b] break the model, or "" when they conform.
std::string window_violation(const StragglerPattern& p, const BurstyModel& m, int a, int b) {
  const int n = p.empty() ? 0 : static_cast<int>(p[0].size());
  int distinct = 0;
  for (int w = 0; w < n; ++w) {
    int first = -1, last = -1;
    for (int r = a; r <= b; ++r) {
      if (!p[r][w]) continue;
      if (first < 0) first = r;
      last = r;
    }
    if (first < 0) continue;
    ++distinct;
    if (last - first + 1 > m.B) {
      return fmt::format("rounds {}..{}: worker {} straggles in rounds {} and {}, further apart than a burst of B = {}",
                         a, b, w, first, last, m.B);
    }
  }
  if (distinct > m.lambda) {
    return fmt::format("rounds {}..{}: {} distinct stragglers, more than lambda = {}", a, b, distinct, m.lambda);
  }
  return "";
}

}  // namespace

std::string bursty_violation(const StragglerPattern& p, const BurstyModel& m) {
  const int rounds = static_cast<int>(p.size());
  for (int a = 0; a <= std::max(0, rounds - m.W); ++a) {
    if (rounds == 0) break;
    std::string why = window_violation(p, m, a, std::min(a + m.W - 1, rounds - 1));
    if (!why.empty()) return why;
  }
  return "";
}

bool inside_bursty_model(const StragglerPattern& p, const BurstyModel& m) { return bursty_violation(p, m).empty(); }

StragglerPattern bursty_pattern(int workers, int rounds, const BurstyModel& m, double start_probability,
                                uint64_t seed) {
  validate_bursty_model(m, workers);
  if (rounds < 0) fail_as(ErrorKind::Config, "bursty straggler pattern: rounds must be >= 0 (got {})", rounds);
  if (!(start_probability >= 0 && start_probability <= 1)) {
    fail_as(ErrorKind::Config, "bursty straggler pattern: the start probability must be in [0, 1] (got {})",
            start_probability);
  }
  Rng rng(mix_seed(seed, 0x5eed'b125ULL));
  StragglerPattern p(rounds, std::vector<bool>(workers, false));
  std::vector<int> left(workers, 0);  // rounds left in each worker's current burst
  for (int r = 0; r < rounds; ++r) {
    for (int w = 0; w < workers; ++w) {
      // Draw every round for every worker, so one worker's fate does not shift the others' random numbers.
      const bool start = rng.uniform() < static_cast<float>(start_probability);
      const int length = 1 + static_cast<int>(rng.below(static_cast<uint64_t>(m.B)));
      if (left[w] == 0 && start) left[w] = length;
      if (left[w] == 0) continue;
      p[r][w] = true;
      // The widest window that ends at r holds every window through r that the new straggle can break.
      if (!window_violation(p, m, std::max(0, r - m.W + 1), r).empty()) {
        p[r][w] = false;
        left[w] = 0;
        continue;
      }
      --left[w];
    }
  }
  return p;
}

std::string to_string(const StragglerPattern& p) {
  std::string out;
  for (size_t r = 0; r < p.size(); ++r) {
    std::string line;
    for (size_t w = 0; w < p[r].size(); ++w) {
      if (p[r][w]) line += fmt::format(" {}", w);
    }
    if (!line.empty()) out += fmt::format("{}r{}:{}", out.empty() ? "" : "\n", r, line);
  }
  return out.empty() ? "(no stragglers)" : out;
}

}  // namespace mt
