#include "megatrain/obs/trace_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>

namespace mt::obs {

namespace {

std::string group_kind(const std::string& group) {
  std::string g = group.substr(0, group.find('['));
  const size_t slash = g.rfind('/');
  return slash == std::string::npos ? g : g.substr(slash + 1);
}

}  // namespace

TraceReport check_trace(const MergedTrace& m) {
  TraceReport rep;
  std::map<int, double> err;
  for (const RankTrace& r : m.ranks) err[r.rank] = m.aligned ? r.clock_error_s : 0;
  // Collectives by (group, seq); transfers by (sender, receiver, group, seq).
  std::map<std::pair<std::string, int64_t>, std::vector<const TraceEvent*>> coll;
  std::map<std::tuple<int, int, std::string, int64_t>, const TraceEvent*> sends, recvs;
  for (const TraceEvent& e : m.events) {
    if (e.cat != "comm" || !e.args.is_object() || !e.args.contains("group") || !e.args.contains("seq")) continue;
    const std::string group = e.args["group"].get<std::string>();
    const int64_t seq = e.args["seq"].get<int64_t>();
    if (e.args.contains("peer")) {
      const int peer = e.args["peer"].get<int>();
      if (e.name == "send")
        sends[{e.rank, peer, group, seq}] = &e;
      else
        recvs[{peer, e.rank, group, seq}] = &e;
    } else {
      coll[{group, seq}].push_back(&e);
    }
  }
  for (const auto& [key, evs] : coll) {
    if (evs.size() < 2) {
      ++rep.unmatched;
      continue;
    }
    Meeting mt;
    mt.group = key.first;
    mt.seq = key.second;
    mt.op = evs.front()->name;
    double max_start = -1e300, min_end = 1e300;
    int at_max = -1, at_min = -1;
    for (const TraceEvent* e : evs) {
      mt.ranks.push_back(e->rank);
      mt.start.push_back(e->t0);
      mt.end.push_back(e->t1);
      if (e->t0 > max_start) max_start = e->t0, at_max = e->rank;
      if (e->t1 < min_end) min_end = e->t1, at_min = e->rank;
    }
    mt.last_in = at_max;
    double waits = 0;
    for (const TraceEvent* e : evs) waits += max_start - e->t0;
    mt.wait_s = waits / static_cast<double>(evs.size() - 1);
    const double bound = err[at_max] + err[at_min];
    rep.max_error_bound_s = std::max(rep.max_error_bound_s, bound);
    if (max_start - min_end > bound)
      rep.violations.push_back(
          {fmt::format("{} #{} of {}: rank {} completed it at {:.6f} s, before rank {} entered it at {:.6f} s", mt.op,
                       mt.seq, mt.group, at_min, min_end, at_max, max_start),
           max_start - min_end - bound});
    const std::string kind = group_kind(mt.group);
    ++rep.last_in[kind][mt.last_in];
    rep.caused_wait_s[kind][mt.last_in] += waits;
    rep.meetings.push_back(std::move(mt));
  }
  for (const auto& [key, send] : sends) {
    auto it = recvs.find(key);
    if (it == recvs.end()) {
      ++rep.unmatched;
      continue;
    }
    const TraceEvent* recv = it->second;
    ++rep.transfers;
    const double bound = err[send->rank] + err[recv->rank];
    rep.max_error_bound_s = std::max(rep.max_error_bound_s, bound);
    if (send->t0 - recv->t1 > bound)
      rep.violations.push_back(
          {fmt::format("transfer #{} of {} from rank {} to rank {}: received at {:.6f} s, before it was sent at "
                       "{:.6f} s",
                       std::get<3>(key), std::get<2>(key), send->rank, recv->rank, recv->t1, send->t0),
           send->t0 - recv->t1 - bound});
  }
  for (const auto& [key, recv] : recvs)
    if (!sends.count(key)) ++rep.unmatched;
  return rep;
}

namespace {

// The part of the step a main-track span counts as, or "" for spans that contain others (forward-backward).
std::string part_of(const TraceEvent& e) {
  if (e.cat == "compute") return "compute";
  if (e.cat == "wait") return "comm wait";
  if (e.cat != "phase") return "";
  if (e.name == "data" || e.name == "gradients" || e.name == "optimizer" || e.name == "eval") return e.name;
  if (e.name.rfind("checkpoint", 0) == 0) return "checkpoint";
  return "";
}

const char* const kParts[] = {"compute", "comm wait", "data", "gradients", "optimizer", "eval", "checkpoint", "other"};

}  // namespace

std::vector<StepBreakdown> step_breakdown(const MergedTrace& m) {
  std::vector<StepBreakdown> out;
  for (const RankTrace& rt : m.ranks) {
    StepBreakdown b;
    b.rank = rt.rank;
    for (const char* p : kParts) b.parts_s[p] = 0;
    std::vector<const TraceEvent*> steps, leaves;
    for (const TraceEvent& e : m.events) {
      if (e.rank != rt.rank || e.track != "main") continue;
      if (e.cat == "step")
        steps.push_back(&e);
      else if (!part_of(e).empty())
        leaves.push_back(&e);
    }
    // Steps do not overlap and come in start order (events are sorted by start), so a span belongs to the last step
    // starting at or before it, if it also ends inside that step: one binary search per span.
    std::vector<double> counted(steps.size(), 0);
    for (const TraceEvent* e : leaves) {
      auto it = std::upper_bound(steps.begin(), steps.end(), e->t0,
                                 [](double t, const TraceEvent* s) { return t < s->t0; });
      if (it == steps.begin()) continue;
      const size_t k = static_cast<size_t>(it - steps.begin()) - 1;
      if (e->t1 > steps[k]->t1) continue;
      b.parts_s[part_of(*e)] += e->t1 - e->t0;
      counted[k] += e->t1 - e->t0;
    }
    for (size_t k = 0; k < steps.size(); ++k) {
      b.step_s += steps[k]->t1 - steps[k]->t0;
      b.parts_s["other"] += std::max(0.0, (steps[k]->t1 - steps[k]->t0) - counted[k]);
    }
    b.steps = static_cast<int>(steps.size());
    if (b.steps > 0) {
      b.step_s /= b.steps;
      for (auto& [k, v] : b.parts_s) v /= b.steps;
    }
    out.push_back(std::move(b));
  }
  return out;
}

std::string format_report(const MergedTrace& m, const TraceReport& r) {
  std::map<int, std::string> label;
  for (const RankTrace& rt : m.ranks) label[rt.rank] = rt.label.empty() ? fmt::format("rank {}", rt.rank) : rt.label;
  std::string out;
  const std::vector<StepBreakdown> steps = step_breakdown(m);
  if (!steps.empty() && steps.front().steps > 0) {
    out += fmt::format("where the steps went (ms, mean of {} traced steps):\n{:<27} {:>9}", steps.front().steps, "rank",
                       "step");
    for (const char* p : kParts) out += fmt::format(" {:>13}", p);
    out += "\n";
    for (const StepBreakdown& b : steps) {
      out += fmt::format("{:<27} {:>9.2f}", label[b.rank], b.step_s * 1e3);
      for (const char* p : kParts) out += fmt::format(" {:>13.2f}", b.parts_s.at(p) * 1e3);
      out += "\n";
    }
  }
  out += fmt::format("causality: {} collectives and {} transfers checked{}: ", r.meetings.size(), r.transfers,
                     m.aligned ? fmt::format(" (clocks aligned to within {:.1f} us a pair)", r.max_error_bound_s * 1e6)
                               : " (clocks not aligned)");
  if (r.violations.empty()) {
    out += "consistent\n";
  } else {
    out += fmt::format("{} violations (a clock offset is wrong, or the files are of different runs)\n",
                       r.violations.size());
    for (size_t i = 0; i < r.violations.size() && i < 5; ++i) out += "  " + r.violations[i].what + "\n";
    if (r.violations.size() > 5) out += fmt::format("  ... and {} more\n", r.violations.size() - 5);
  }
  if (r.unmatched) out += fmt::format("{} ops without their partners in these files (not checked)\n", r.unmatched);
  for (const auto& [kind, counts] : r.last_in) {
    int total = 0;
    for (const auto& [rank, n] : counts) total += n;
    std::vector<std::pair<int, int>> by(counts.begin(), counts.end());
    std::sort(by.begin(), by.end(), [&](auto a, auto b) {
      return r.caused_wait_s.at(kind).at(a.first) > r.caused_wait_s.at(kind).at(b.first);
    });
    out += fmt::format("{} collectives ({}): the others waited most for", kind, total);
    for (size_t i = 0; i < by.size() && i < 3; ++i)
      out += fmt::format("{} {} (last in {} of them, {:.2f} ms of waiting)", i ? ";" : "", label[by[i].first],
                         by[i].second, r.caused_wait_s.at(kind).at(by[i].first) * 1e3);
    out += "\n";
  }
  return out;
}

}  // namespace mt::obs
