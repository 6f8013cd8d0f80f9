#include "megatrain/perf/coding_report.h"

#include <fmt/format.h>

#include <cmath>
#include <functional>

namespace mt::perf {

namespace {

using json = nlohmann::json;

std::string scheme_label(const SchemeOutcome& o) {
  if (o.scheme == CodingScheme::GC) return fmt::format("GC(s={})", o.params.s);
  return scheme_name(o.scheme);
}

std::string params_text(const SchemeOutcome& o) {
  const CodingParams& q = o.params;
  switch (o.scheme) {
    case CodingScheme::None: return "";
    case CodingScheme::GC: return fmt::format("s={}", q.s);
    case CodingScheme::SRSGC: return fmt::format("B={} W={} lambda={} s={}", q.B, q.W, q.lambda, q.s);
    case CodingScheme::MSGC: return fmt::format("B={} W={} lambda={}", q.B, q.W, q.lambda);
  }
  return "";
}

std::string duration_text(double d) {
  return d <= 0 ? "persistent" : fmt::format("{:g} round{}", d, d == 1 ? "" : "s");
}

std::string stragglers_text(double d) {
  return d <= 0 ? "persistent stragglers" : fmt::format("bursts of {} on average", duration_text(d));
}

std::string process_text(const CodingStudy& s) {
  const StragglerProcess& p = s.process;
  if (s.megascale)
    return fmt::format(
        "MegaScale's slow nodes (cluster [stragglers]: {:.2g}% of nodes {:.0f}% slower, persistent until evicted): "
        "a replica is slow with probability {:.4g} (rate), in every round",
        100 * s.node_fraction, 100 * p.slowdown, p.rate);
  return fmt::format("rate {:.4g} per replica per round, {}, slowdown {:.0f}%", p.rate, stragglers_text(p.duration),
                     100 * p.slowdown);
}

// The least paying rate over rows and schemes, and the least paying slowdown, with where.
std::string least_crossovers(const CodingStudy& s) {
  std::string rate_where, slow_where;
  double rate = 2, slow = 1e300;
  for (const CodingRow& r : s.rows)
    for (const SchemeRow& x : r.schemes) {
      if (x.paying_rates && x.paying_rates->from < rate) {
        rate = x.paying_rates->from;
        rate_where = fmt::format("{} at {} GPUs", scheme_label(x.outcome), r.gpus);
      }
      if (x.paying_slowdown && *x.paying_slowdown < slow) {
        slow = *x.paying_slowdown;
        slow_where = fmt::format("{} at {} GPUs", scheme_label(x.outcome), r.gpus);
      }
    }
  std::string out;
  if (rate <= 1)
    out += fmt::format(" The least rate at which a scheme would pay ({}, slowdown {:.0f}%): {:.3g} ({}).",
                       stragglers_text(s.process.duration), 100 * s.process.slowdown, rate, rate_where);
  else
    out += fmt::format(" No rate makes any scheme pay with {} and a {:.0f}% slowdown.",
                       stragglers_text(s.process.duration), 100 * s.process.slowdown);
  if (slow < 1e300)
    out += fmt::format(" The least slowdown at which one would (rate {:.4g}): {:.3g}x, i.e. {:.0f}% slower ({}).",
                       s.process.rate, 1 + slow, 100 * slow, slow_where);
  else
    out += fmt::format(" No slowdown makes any scheme pay at rate {:.4g}.", s.process.rate);
  return out;
}

json rates_json(const std::optional<RateInterval>& r) {
  if (!r) return nullptr;
  return {{"from", r->from}, {"to", r->to}, {"best_rate", r->best_rate}, {"best_gain", r->best_gain}};
}

json opt_json(const std::optional<double>& x) { return x ? json(*x) : json(nullptr); }

json slowdown_json(const std::optional<SlowdownPoint>& x) {
  if (!x) return nullptr;
  return {{"slowdown", x->slowdown},
          {"rate", x->rate},
          {"load", x->load},
          {"params", {{"s", x->params.s}, {"B", x->params.B}, {"W", x->params.W}, {"lambda", x->params.lambda}}}};
}

std::string format_row(const CodingRow& r) {
  std::string out = fmt::format(
      "{} GPUs: dp {} replicas of {} nodes, {} micro-batch rounds a step; healthy step {:.3f} s ({:.3f} s of it "
      "grows with the load); {:.3g} slow replicas in a round on average\n"
      "  (fallback: P(a round is not tolerated; none: has a straggler); waits: the rounds of slowdown the step pays, "
      "per round; a coded step's time is its upper bound, 'sim' with the waiting simulated instead)\n",
      r.gpus, r.dp, r.replica_nodes, r.microbatches, r.healthy.at(1), r.healthy.per_load, r.expected_slow);
  out += fmt::format("  {:<9} {:<24} {:>6} {:>5} {:>9} {:>7} {:>9} {:>10} {:>7} {:>7} | {:<24} {}\n", "scheme",
                     "parameters", "load", "delay", "fallback", "waits", "step s", "tokens/s", "vs none", "sim",
                     "pays at rates", "pays from slowdown");
  const double none = r.schemes[0].outcome.step_seconds;
  for (const SchemeRow& x : r.schemes) {
    const SchemeOutcome& o = x.outcome;
    const bool coded = o.scheme != CodingScheme::None;
    out += fmt::format(
        "  {:<9} {:<24} {:>6.3f} {:>5} {:>8.2f}% {:>6.2f}% {:>9.3f} {:>10.4g} {:>+6.1f}% {:>+6.1f}% | {:<24} {}\n",
        scheme_label(o), params_text(o), o.load, o.delay, 100 * o.p_fallback, 100 * o.waited_share, o.step_seconds,
        x.tokens_per_second, 100 * (none / o.step_seconds - 1), 100 * (none / x.simulated_step_seconds - 1),
        coded ? format_rates(x.paying_rates) : "",
        !coded              ? ""
        : x.paying_slowdown ? fmt::format("{:.0f}%", 100 * *x.paying_slowdown)
                            : "never");
  }
  return out;
}

// "upper% (simulated%) at rate": the least paying slowdown on the coded step's upper bound, the rate where it is
// least, and the slowdown from which the same parameters pay with the simulated waiting.
std::string slowdown_cell(const std::optional<SlowdownPoint>& upper, const std::optional<double>& simulated) {
  if (!upper) return "never";
  const std::string sim = simulated ? fmt::format("{:.0f}%", 100 * *simulated) : "never";
  return fmt::format("{:.0f}% ({}) at {:.2g}", 100 * upper->slowdown, sim, upper->rate);
}

// One table of the sweep: a row per burst duration, a column per GPU count.
std::string sweep_table(const CodingStudy& s, const std::function<std::string(const CodingRow&, size_t)>& cell) {
  std::string out = fmt::format("  {:<12}", "mean burst");
  for (const CodingRow& r : s.rows) out += fmt::format(" {:>27}", fmt::format("{} GPUs", r.gpus));
  out += "\n";
  for (size_t d = 0; d < s.sweep_durations.size(); ++d) {
    out += fmt::format("  {:<12}", duration_text(s.sweep_durations[d]));
    for (const CodingRow& r : s.rows) out += fmt::format(" {:>27}", cell(r, d));
    out += "\n";
  }
  return out;
}

std::string format_sweep(const CodingStudy& s) {
  if (s.sweep_durations.empty()) return "";
  bool msgc_pays = false, gc_pays = false;
  for (const CodingRow& r : s.rows)
    for (size_t d = 0; d < s.sweep_durations.size(); ++d) {
      msgc_pays = msgc_pays || r.sweep_msgc[d].has_value();
      gc_pays = gc_pays || r.sweep_gc1[d].has_value();
    }
  const double pct = 100 * s.process.slowdown;
  std::string out = fmt::format("\ntransient stragglers (rate: per replica per round; M-SGC with its best parameters "
                                "at each rate)\n");
  if (msgc_pays)
    out += fmt::format("M-SGC beats none at a {:.0f}% slowdown at these rates (in parentheses: its most gain):\n",
                       pct) +
           sweep_table(s, [](const CodingRow& r, size_t d) { return format_rates(r.sweep_msgc[d]); });
  else
    out += fmt::format("At a {:.0f}% slowdown M-SGC beats none at no rate, for no burst length, at no scale.\n", pct);
  if (gc_pays)
    out += fmt::format("GC(s=1) beats none at a {:.0f}% slowdown at these rates:\n", pct) +
           sweep_table(s, [](const CodingRow& r, size_t d) { return format_rates(r.sweep_gc1[d]); });
  else
    out += fmt::format("At a {:.0f}% slowdown GC(s=1) beats none at no rate, for no burst length, at no scale.\n", pct);
  out += "The least slowdown at which M-SGC would beat none, at the rate where that is least (in parentheses: with "
         "the waiting simulated instead of bounded, same rate and parameters):\n" +
         sweep_table(s, [](const CodingRow& r, size_t d) {
           return slowdown_cell(r.sweep_msgc_slowdown[d], r.sweep_msgc_simulated[d]);
         });
  out += "The same for GC(s=1):\n" + sweep_table(s, [](const CodingRow& r, size_t d) {
           return slowdown_cell(r.sweep_gc1_slowdown[d], r.sweep_gc1_simulated[d]);
         });
  return out;
}

}  // namespace

std::string format_rates(const std::optional<RateInterval>& r) {
  if (!r) return "never";
  return fmt::format("{:.2g}..{:.2g} ({:+.1f}%)", r->from, r->to, 100 * r->best_gain);
}

std::string coding_verdict(const CodingStudy& s) {
  const std::string who = s.megascale ? "under MegaScale's straggler numbers" : "under this straggler process";
  if (!s.coding_pays() && !s.coding_pays_simulated())
    return fmt::format("Coding never pays {}: no scheme beats waiting for the slow replicas at any of these scales, "
                       "on the bound or simulated.",
                       who) +
           least_crossovers(s);
  std::string out = s.coding_pays() ? fmt::format("Coding pays {}:", who)
                                    : fmt::format("Coding pays {} only in the simulation (not on the bound):", who);
  for (const CodingRow& r : s.rows) {
    const SchemeRow* best = &r.schemes[0];
    for (const SchemeRow& x : r.schemes)
      if (x.simulated_step_seconds < best->simulated_step_seconds) best = &x;
    if (best->outcome.scheme != CodingScheme::None)
      out += fmt::format(" {} GPUs: {} {:+.1f}% on the bound, {:+.1f}% simulated;", r.gpus, scheme_label(best->outcome),
                         100 * (r.schemes[0].outcome.step_seconds / best->outcome.step_seconds - 1),
                         100 * (r.schemes[0].outcome.step_seconds / best->simulated_step_seconds - 1));
  }
  return out;
}

std::string format_coding(const CodingStudy& s, const Job& job, const Cluster& c) {
  const Layout& L = job.layout;
  std::string out = fmt::format(
      "Gradient coding at scale: tp {} pp {} (v {}) replicas, micro-batch {} x {} tokens, global batch {}; cluster "
      "{}\nstragglers: {}\nmodel: none = H(1) (1 + slowdown x E[slow rounds of the slowest replica] / m); coded <= "
      "H(load) (1 + slowdown x min(P(a round falls back), that share)); a round falls back when its stragglers "
      "exceed what the scheme tolerates\n\n",
      L.tp, L.pp, L.virtual_stages, L.micro_batch, L.seq,
      s.rows.empty() ? 0L : static_cast<long>(s.rows[0].tokens_per_step / L.seq), c.name, process_text(s));
  for (const CodingRow& r : s.rows) out += format_row(r) + "\n";
  out += format_sweep(s);
  out += "\n" + coding_verdict(s) + "\n";
  if (s.megascale)
    out += "MegaScale evicts these persistent slow nodes (§6.3); what a coding scheme could catch is the transient "
           "stragglers left after eviction, whose rate and length the paper does not give: the tables above say "
           "which would make a scheme pay.\n";
  return out;
}

json to_json(const CodingStudy& s, const Job& job, const Cluster& c) {
  const Layout& L = job.layout;
  const StragglerProcess& p = s.process;
  auto dur = [](double d) -> json { return d <= 0 ? json(nullptr) : json(d); };
  json out = {{"cluster", c.name},
              {"layout",
               {{"tp", L.tp},
                {"pp", L.pp},
                {"virtual_stages", L.virtual_stages},
                {"micro_batch", L.micro_batch},
                {"seq", L.seq},
                {"global_batch", s.rows.empty() ? 0 : static_cast<long>(s.rows[0].tokens_per_step / L.seq)}}},
              {"process",
               {{"rate", p.rate},
                {"duration", dur(p.duration)},
                {"slowdown", p.slowdown},
                {"node_fraction", s.node_fraction},
                {"megascale", s.megascale}}},
              {"rows", json::array()},
              {"coding_pays", s.coding_pays()},
              {"coding_pays_simulated", s.coding_pays_simulated()},
              {"verdict", coding_verdict(s)}};
  for (const CodingRow& r : s.rows) {
    json row = {{"gpus", r.gpus},
                {"dp", r.dp},
                {"microbatches", r.microbatches},
                {"replica_nodes", r.replica_nodes},
                {"rate", r.rate},
                {"expected_slow_replicas", r.expected_slow},
                {"healthy_step_seconds", r.healthy.at(1)},
                {"healthy_seconds_per_load", r.healthy.per_load},
                {"schemes", json::array()},
                {"transient", json::array()}};
    for (const SchemeRow& x : r.schemes) {
      const SchemeOutcome& o = x.outcome;
      const CodingParams& q = o.params;
      json params = json::object();
      if (o.scheme == CodingScheme::GC) params = {{"s", q.s}};
      if (o.scheme == CodingScheme::SRSGC) params = {{"B", q.B}, {"W", q.W}, {"lambda", q.lambda}, {"s", q.s}};
      if (o.scheme == CodingScheme::MSGC) params = {{"B", q.B}, {"W", q.W}, {"lambda", q.lambda}};
      row["schemes"].push_back({{"scheme", scheme_name(o.scheme)},
                                {"params", params},
                                {"load", o.load},
                                {"delay", o.delay},
                                {"p_fallback", o.p_fallback},
                                {"step_seconds", o.step_seconds},
                                {"simulated_step_seconds", x.simulated_step_seconds},
                                {"waited_share", o.waited_share},
                                {"tokens_per_second", x.tokens_per_second},
                                {"beats_none", o.step_seconds < r.schemes[0].outcome.step_seconds},
                                {"paying_rates", rates_json(x.paying_rates)},
                                {"paying_slowdown", x.paying_slowdown ? json(*x.paying_slowdown) : json(nullptr)}});
    }
    for (size_t d = 0; d < s.sweep_durations.size(); ++d)
      row["transient"].push_back({{"duration", dur(s.sweep_durations[d])},
                                  {"msgc_paying_rates", rates_json(r.sweep_msgc[d])},
                                  {"gc1_paying_rates", rates_json(r.sweep_gc1[d])},
                                  {"msgc_least_slowdown", slowdown_json(r.sweep_msgc_slowdown[d])},
                                  {"gc1_least_slowdown", slowdown_json(r.sweep_gc1_slowdown[d])},
                                  {"msgc_simulated_slowdown", opt_json(r.sweep_msgc_simulated[d])},
                                  {"gc1_simulated_slowdown", opt_json(r.sweep_gc1_simulated[d])}});
    out["rows"].push_back(row);
  }
  return out;
}

}  // namespace mt::perf
