#include "megatrain/perf/straggler_coding_sim.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "megatrain/core/error.h"

namespace mt::perf {

namespace {

// Whether the round's stragglers keep the pattern within what the scheme tolerates, given the rounds each replica
// was recorded straggling in (pruned here to the window of W rounds ending at r).
bool tolerated(CodingScheme s, const CodingParams& q, const std::vector<char>& slow,
               std::vector<std::vector<int>>& recorded, int r) {
  const int n = static_cast<int>(slow.size());
  int count = 0;
  for (char x : slow) count += x;
  if (s == CodingScheme::None) return count == 0;
  if (s == CodingScheme::GC) return count <= q.s;
  int distinct = 0;
  bool ok = true;
  for (int i = 0; i < n; ++i) {
    std::vector<int>& rec = recorded[i];
    rec.erase(rec.begin(), std::find_if(rec.begin(), rec.end(), [&](int t) { return t >= r - q.W + 1; }));
    distinct += slow[i] || !rec.empty();
    if (slow[i] && !rec.empty() && rec.front() <= r - q.B) ok = false;  // slow earlier than its burst allows
  }
  return ok && distinct <= q.lambda;
}

}  // namespace

SimulatedShare simulate_waited_share(CodingScheme s, const CodingParams& q, const StragglerProcess& p, int n, int m,
                                     int steps, std::uint64_t seed) {
  MT_CHECK(n > 0 && m > 0 && steps > 0, "simulate_waited_share: n {}, m {}, steps {}", n, m, steps);
  std::mt19937_64 rng(seed);
  auto uniform = [&] { return double(rng() >> 11) * 0x1.0p-53; };
  const double a = p.start(), b = p.end();
  std::vector<char> slow(n);
  std::vector<std::vector<int>> recorded(n);
  std::vector<int> waited(n);
  double sum = 0, sum2 = 0;
  long fallbacks = 0;
  for (int step = 0; step < steps; ++step) {
    for (int i = 0; i < n; ++i) {
      slow[i] = uniform() < p.rate;
      recorded[i].clear();
      waited[i] = 0;
    }
    for (int r = 0; r < m; ++r) {
      if (r > 0)
        for (int i = 0; i < n; ++i) slow[i] = slow[i] ? uniform() >= b : uniform() < a;
      const bool ok = tolerated(s, q, slow, recorded, r);
      fallbacks += !ok;
      for (int i = 0; i < n; ++i)
        if (slow[i]) ok ? recorded[i].push_back(r) : void(++waited[i]);
    }
    const double x = double(*std::max_element(waited.begin(), waited.end())) / m;
    sum += x;
    sum2 += x * x;
  }
  SimulatedShare out;
  out.mean = sum / steps;
  out.std_error = std::sqrt(std::max(0.0, sum2 / steps - out.mean * out.mean) / steps);
  out.fallback = double(fallbacks) / (double(steps) * m);
  return out;
}

}  // namespace mt::perf
