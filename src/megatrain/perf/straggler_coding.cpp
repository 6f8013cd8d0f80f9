#include "megatrain/perf/straggler_coding.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "megatrain/core/error.h"

namespace mt::perf {

namespace {

// log C(n, j)
double log_choose(int n, int j) { return std::lgamma(n + 1.0) - std::lgamma(j + 1.0) - std::lgamma(n - j + 1.0); }

// C(n, j) u^j c^(n - j), with 0^0 = 1.
double term(int n, int j, double u, double c) {
  if ((j > 0 && u <= 0) || (j < n && c <= 0)) return 0;
  double log_t = log_choose(n, j);
  if (j > 0) log_t += j * std::log(u);
  if (j < n) log_t += (n - j) * std::log(c);
  return std::exp(log_t);
}

// 1, 2, ..., 48, then a geometric ladder (x 1.25) up to cap, and cap itself.
std::vector<int> ladder(int cap, int dense) {
  std::vector<int> v;
  for (int x = 1; x <= std::min(cap, dense); ++x) v.push_back(x);
  for (double x = dense * 1.25; x < cap; x *= 1.25) v.push_back(static_cast<int>(x));
  if (cap > dense) v.push_back(cap);
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

// Calls f(params, load, P(tolerated)) for every SR-SGC or M-SGC parameter set with lambda >= 1, W <= m and
// delay <= m - 1.
void for_each_sgc(CodingScheme s, const StragglerProcess& p, int n, int m,
                  const std::function<void(const CodingParams&, double, double)>& f) {
  if (m < 2 || n < 2) return;
  for (int W : ladder(m, 48)) {
    if (W < 2) continue;
    for (int B : ladder(W - 1, 16)) {
      CodingParams q;
      q.B = B;
      q.W = W;
      if (s == CodingScheme::SRSGC && (W - 1) % B != 0) continue;
      q.lambda = 1;
      if (coding_delay(s, q) > m - 1) continue;
      const double c = clean_probability(p, W);
      const double u = std::max(0.0, 1 - c - burst_violation_probability(p, B, W));
      double tolerated = term(n, 0, u, c);
      for (int lambda = 1; lambda <= n; ++lambda) {
        tolerated += term(n, lambda, u, c);
        q.lambda = lambda;
        q.s = s == CodingScheme::SRSGC ? srsgc_s(B, W, lambda) : 0;
        if (s == CodingScheme::SRSGC && q.s >= n) break;
        f(q, coding_load(s, n, q), std::min(1.0, tolerated));
      }
    }
  }
}

double none_fallback(const StragglerProcess& p, int n) { return 1 - std::pow(1 - p.rate, n); }

// The share of rounds of slowdown a coded step waits, at most (module comment): min(P_fallback, E[max S] / m).
double waited_share(double p_fallback, double max_share) { return std::min(p_fallback, max_share); }

// The scheme's expected step at process p: fixed parameters for GC, the best ones for SR-SGC and M-SGC.
std::optional<SchemeOutcome> outcome(CodingScheme s, const CodingParams& gc, const StragglerProcess& p, int n, int m,
                                     const HealthyStep& h) {
  if (s == CodingScheme::SRSGC || s == CodingScheme::MSGC) return best_sgc(s, p, n, m, h);
  return evaluate_scheme(s, gc, p, n, m, h);
}

}  // namespace

double StragglerProcess::start() const {
  if (persistent() || rate <= 0) return 0;
  return rate / (duration * (1 - rate));
}

double StragglerProcess::max_rate() const { return persistent() ? 1.0 : duration / (duration + 1); }

void validate_process(const StragglerProcess& p) {
  if (!(p.duration == 0 || p.duration >= 1))
    fail_as(ErrorKind::Config, "--straggler-duration must be at least 1 round, or 0 for persistent (got {})",
            p.duration);
  if (!(p.rate >= 0 && p.rate <= p.max_rate()))
    fail_as(ErrorKind::Config,
            "--straggler-rate must be in [0, {:.4g}] (bursts of {:g} rounds on average cannot be slow more often; "
            "got {})",
            p.max_rate(), p.duration, p.rate);
  if (!(p.slowdown >= 0)) fail_as(ErrorKind::Config, "--straggler-slowdown must be >= 0 (got {})", p.slowdown);
}

double replica_rate(double node_fraction, int replica_nodes) { return 1 - std::pow(1 - node_fraction, replica_nodes); }

double clean_probability(const StragglerProcess& p, int W) { return (1 - p.rate) * std::pow(1 - p.start(), W - 1); }

double burst_violation_probability(const StragglerProcess& p, int B, int W) {
  if (W <= B) return 0;
  const double q = 1 - p.start() - p.end();
  const double healthy_after = (1 - p.rate) * (1 - std::pow(q, B)) * std::pow(1 - p.start(), W - 1 - B);
  return p.rate * (1 - healthy_after);
}

std::vector<double> slow_rounds_distribution(const StragglerProcess& p, int m) {
  const double a = p.start(), b = p.end();
  // healthy[k], slow[k]: P(k slow rounds so far and healthy / slow in the last round)
  std::vector<double> healthy(m + 1, 0), slow(m + 1, 0);
  healthy[0] = 1 - p.rate;
  slow[1] = p.rate;
  for (int t = 1; t < m; ++t) {
    std::vector<double> h2(m + 1, 0), s2(m + 1, 0);
    for (int k = 0; k <= t; ++k) {
      h2[k] += healthy[k] * (1 - a) + slow[k] * b;
      if (k + 1 <= m) s2[k + 1] += healthy[k] * a + slow[k] * (1 - b);
    }
    healthy.swap(h2);
    slow.swap(s2);
  }
  std::vector<double> out(m + 1);
  for (int k = 0; k <= m; ++k) out[k] = healthy[k] + slow[k];
  return out;
}

double expected_max_slow_rounds(const StragglerProcess& p, int n, int m) {
  const std::vector<double> dist = slow_rounds_distribution(p, m);
  double below = 0, sum = 0;  // below: P(S <= k)
  for (int k = 0; k < m; ++k) {
    below += dist[k];
    sum += 1 - std::pow(std::min(1.0, below), n);
  }
  return sum;
}

double tolerated_probability(const StragglerProcess& p, int n, int B, int W, int lambda) {
  const double c = clean_probability(p, W);
  const double u = std::max(0.0, 1 - c - burst_violation_probability(p, B, W));
  double sum = 0;
  for (int j = 0; j <= std::min(lambda, n); ++j) sum += term(n, j, u, c);
  return std::min(1.0, sum);
}

std::string scheme_name(CodingScheme s) {
  switch (s) {
    case CodingScheme::None: return "none";
    case CodingScheme::GC: return "GC";
    case CodingScheme::SRSGC: return "SR-SGC";
    case CodingScheme::MSGC: return "M-SGC";
  }
  return "?";
}

int srsgc_s(int B, int W, int lambda) { return (B * lambda + (W - 1 + B) - 1) / (W - 1 + B); }

double coding_load(CodingScheme s, int n, const CodingParams& q) {
  switch (s) {
    case CodingScheme::None: return 1;
    case CodingScheme::GC: return q.s + 1;
    case CodingScheme::SRSGC: return srsgc_s(q.B, q.W, q.lambda) + 1;
    case CodingScheme::MSGC:
      if (q.lambda >= n) return double(q.W - 1 + q.B) / (q.W - 1);
      return double(q.lambda + 1) * (q.W - 1 + q.B) / (q.B + double(q.W - 1) * (q.lambda + 1));
  }
  return 1;
}

int coding_delay(CodingScheme s, const CodingParams& q) {
  if (s == CodingScheme::SRSGC) return q.B;
  if (s == CodingScheme::MSGC) return q.W - 2 + q.B;
  return 0;
}

SchemeOutcome evaluate_scheme(CodingScheme s, const CodingParams& q, const StragglerProcess& p, int n, int m,
                              const HealthyStep& h) {
  const std::string name = scheme_name(s);
  if (s == CodingScheme::GC && (q.s < 0 || q.s >= n))
    fail_as(ErrorKind::Config, "GC(s={}) needs 0 <= s < n = {} replicas", q.s, n);
  if (s == CodingScheme::SRSGC || s == CodingScheme::MSGC) {
    if (q.B < 1 || q.W <= q.B || q.lambda < 0 || q.lambda > n)
      fail_as(ErrorKind::Config, "{}(B={}, W={}, lambda={}) needs 1 <= B < W and 0 <= lambda <= n = {}", name, q.B, q.W,
              q.lambda, n);
    if (s == CodingScheme::SRSGC && (q.W - 1) % q.B != 0)
      fail_as(ErrorKind::Config, "SR-SGC needs B = {} to divide W - 1 = {}", q.B, q.W - 1);
    if (coding_delay(s, q) > m - 1)
      fail_as(ErrorKind::Config, "{}'s delay {} exceeds the step's m - 1 = {} micro-batch rounds", name,
              coding_delay(s, q), m - 1);
  }
  SchemeOutcome o;
  o.scheme = s;
  o.params = q;
  if (s == CodingScheme::SRSGC) o.params.s = srsgc_s(q.B, q.W, q.lambda);
  if (s == CodingScheme::GC) o.params.lambda = q.s;
  o.load = coding_load(s, n, q);
  o.delay = coding_delay(s, q);
  if (s == CodingScheme::None)
    o.p_fallback = none_fallback(p, n);
  else if (s == CodingScheme::GC)
    o.p_fallback = 1 - tolerated_probability(p, n, 1, 1, q.s);
  else
    o.p_fallback = 1 - tolerated_probability(p, n, q.B, q.W, q.lambda);
  o.p_fallback = std::max(0.0, o.p_fallback);
  o.max_slow_share = expected_max_slow_rounds(p, n, m) / m;
  o.waited_share = s == CodingScheme::None ? o.max_slow_share : waited_share(o.p_fallback, o.max_slow_share);
  o.step_seconds = h.at(o.load) * (1 + p.slowdown * o.waited_share);
  return o;
}

std::optional<SchemeOutcome> best_sgc(CodingScheme s, const StragglerProcess& p, int n, int m, const HealthyStep& h) {
  MT_CHECK(s == CodingScheme::SRSGC || s == CodingScheme::MSGC, "best_sgc: {} is not a sequential scheme",
           scheme_name(s));
  std::optional<SchemeOutcome> best;
  const double max_share = expected_max_slow_rounds(p, n, m) / m;
  for_each_sgc(s, p, n, m, [&](const CodingParams& q, double load, double tolerated) {
    const double waited = waited_share(std::max(0.0, 1 - tolerated), max_share);
    const double step = h.at(load) * (1 + p.slowdown * waited);
    if (best && step >= best->step_seconds) return;
    SchemeOutcome o;
    o.scheme = s;
    o.params = q;
    o.load = load;
    o.delay = coding_delay(s, q);
    o.p_fallback = std::max(0.0, 1 - tolerated);
    o.max_slow_share = max_share;
    o.waited_share = waited;
    o.step_seconds = step;
    best = o;
  });
  return best;
}

std::optional<RateInterval> paying_rates(CodingScheme s, const CodingParams& gc, const StragglerProcess& p, int n,
                                         int m, const HealthyStep& h) {
  // none's expected step / the scheme's - 1 (-1 where the scheme cannot be set up)
  auto gain = [&](double r) {
    StragglerProcess x = p;
    x.rate = r;
    const std::optional<SchemeOutcome> o = outcome(s, gc, x, n, m, h);
    if (!o) return -1.0;
    return evaluate_scheme(CodingScheme::None, {}, x, n, m, h).step_seconds / o->step_seconds - 1;
  };
  // The boundary between a rate that does not pay and one that does, either way round: the paying side.
  auto refine = [&](double lo, double hi) {
    const bool lo_pays = gain(lo) > 0;
    while (hi / lo > 1 + 1e-4) {
      const double mid = std::sqrt(lo * hi);
      ((gain(mid) > 0) == lo_pays ? lo : hi) = mid;
    }
    return lo_pays ? lo : hi;
  };
  const double top = p.max_rate(), bottom = 1e-6;
  const int points = 80;
  std::optional<RateInterval> out;
  double prev = bottom;
  bool prev_pays = false;
  for (int i = 0; i <= points; ++i) {
    const double r = bottom * std::pow(top / bottom, double(i) / points);
    const double g = gain(r);
    const bool pays = g > 0;
    if (pays && !out) out = RateInterval{i == 0 ? r : refine(prev, r), r, r, g};
    if (pays) out->to = r;
    if (pays && g > out->best_gain) out->best_rate = r, out->best_gain = g;
    if (!pays && prev_pays) out->to = refine(prev, r);
    prev = r;
    prev_pays = pays;
  }
  return out;
}

namespace {

// The least paying slowdown of the scheme at p, with the parameters and load that give it.
std::optional<SlowdownPoint> slowdown_point(CodingScheme s, const CodingParams& gc, const StragglerProcess& p, int n,
                                            int m, const HealthyStep& h) {
  const double h1 = h.at(1), none_share = expected_max_slow_rounds(p, n, m) / m;
  std::optional<SlowdownPoint> best;
  auto consider = [&](const CodingParams& q, double load, double p_coded) {
    const double denom = h1 * none_share - h.at(load) * waited_share(p_coded, none_share);
    if (denom <= 0) return;
    const double d = std::max(0.0, (h.at(load) - h1) / denom);
    if (!best || d < best->slowdown) best = SlowdownPoint{d, p.rate, q, load};
  };
  if (s == CodingScheme::SRSGC || s == CodingScheme::MSGC)
    for_each_sgc(s, p, n, m, [&](const CodingParams& q, double load, double tol) { consider(q, load, 1 - tol); });
  else
    consider(gc, coding_load(s, n, gc), evaluate_scheme(s, gc, p, n, m, h).p_fallback);
  return best;
}

}  // namespace

std::optional<double> paying_slowdown(CodingScheme s, const CodingParams& gc, const StragglerProcess& p, int n, int m,
                                      const HealthyStep& h) {
  const std::optional<SlowdownPoint> x = slowdown_point(s, gc, p, n, m, h);
  return x ? std::optional<double>(x->slowdown) : std::nullopt;
}

std::optional<SlowdownPoint> least_paying_slowdown(CodingScheme s, const CodingParams& gc, const StragglerProcess& p,
                                                   int n, int m, const HealthyStep& h) {
  const double top = p.max_rate(), bottom = 1e-5;
  const int points = 60;
  std::optional<SlowdownPoint> best;
  for (int i = 0; i <= points; ++i) {
    StragglerProcess x = p;
    x.rate = bottom * std::pow(top / bottom, double(i) / points);
    const std::optional<SlowdownPoint> d = slowdown_point(s, gc, x, n, m, h);
    if (d && (!best || d->slowdown < best->slowdown)) best = d;
  }
  return best;
}

}  // namespace mt::perf
