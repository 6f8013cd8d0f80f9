#include "megatrain/launch/job_view.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>

#include <fmt/format.h>

namespace mt::launch {

namespace {

nlohmann::json number_or_null(const std::optional<double>& v) {
  return v && std::isfinite(*v) ? nlohmann::json(*v) : nlohmann::json();
}

bool has_coord(const RankStatus& s) { return s.coord_dp >= 0; }

// The layout the ranks report (every rank reports the same; the first that did is taken).
const RankStatus* layout_source(const JobView& v) {
  for (const RankView& r : v.ranks)
    if (r.status.dp > 0) return &r.status;
  return nullptr;
}

// A Prometheus label value: backslash, double quote and newline escaped.
std::string label_value(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

// A sample value: Prometheus reads Go's float syntax; {:.17g} round-trips a double.
std::string sample(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "+Inf" : "-Inf";
  return fmt::format("{:.17g}", x);
}

}  // namespace

void set_ranks(JobView& v, const std::vector<RankStatus>& status, const std::vector<bool>& running,
               const std::function<int(size_t)>& node_of, bool stopping) {
  v.ranks.clear();
  bool stepped = false;
  for (size_t i = 0; i < status.size(); ++i) {
    v.ranks.push_back({status[i], i < running.size() && running[i], node_of(i)});
    stepped = stepped || status[i].step_time.has_value();
  }
  v.state = stopping ? "stopping" : stepped ? "running" : "starting";
}

nlohmann::json job_json(const JobView& v) {
  nlohmann::json job = {
      {"state", v.state},
      {"attempt", v.attempt},
      {"restarts", v.restarts},
      {"max_restarts", v.max_restarts},
      {"nodes", v.nodes},
      {"world", v.world},
      {"uptime_s", std::max(0.0, v.now - v.started)},
      {"useful_s", v.useful_s},
      {"effective_training", v.now > v.started ? nlohmann::json(v.useful_s / (v.now - v.started)) : nlohmann::json()},
      {"detail", v.detail}};
  if (const RankStatus* l = layout_source(v))
    job["layout"] = {{"dp", l->dp}, {"pp", l->pp}, {"tp", l->tp}, {"grad_accum", l->grad_accum}};
  else
    job["layout"] = nullptr;
  if (!v.ranks.empty()) {
    int lo = v.ranks.front().status.step, hi = lo;
    for (const RankView& r : v.ranks) lo = std::min(lo, r.status.step), hi = std::max(hi, r.status.step);
    job["step"] = {{"min", lo}, {"max", hi}};
  } else {
    job["step"] = nullptr;
  }
  nlohmann::json ranks = nlohmann::json::array();
  for (const RankView& r : v.ranks) {
    const RankStatus& s = r.status;
    nlohmann::json in_flight = nlohmann::json::array();
    for (const CollectiveState& c : s.colls)
      if (c.in_flight()) in_flight.push_back({{"group", c.group}, {"op", c.op}, {"seq", c.seq}, {"state", c.state}});
    ranks.push_back({{"rank", s.rank},
                     {"node", r.node},
                     {"coord", has_coord(s) ? nlohmann::json({s.coord_dp, s.coord_pp, s.coord_tp}) : nlohmann::json()},
                     {"running", r.running},
                     {"heard", s.heard},
                     {"age_s", s.heard ? nlohmann::json(std::max(0.0, v.now - s.last_heard)) : nlohmann::json()},
                     {"step", s.step},
                     {"phase", s.phase},
                     {"loss", number_or_null(s.loss)},
                     {"step_time", number_or_null(s.step_time)},
                     {"compute_time", number_or_null(s.compute_time)},
                     {"tokens_per_s", number_or_null(s.tokens_per_s)},
                     {"mfu", number_or_null(s.mfu)},
                     {"rss", number_or_null(s.rss)},
                     {"in_flight", in_flight}});
  }
  return {{"job", job}, {"ranks", ranks}};
}

std::string prometheus_text(const JobView& v) {
  std::string out;
  auto header = [&](const char* name, const char* help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} gauge\n", name, help, name);
  };
  auto job_gauge = [&](const char* name, const char* help, double x) {
    header(name, help);
    out += fmt::format("{} {}\n", name, sample(x));
  };
  job_gauge("megatrain_job_attempt", "The attempt now running (0 is the first).", v.attempt);
  job_gauge("megatrain_job_restarts", "Restarts so far.", v.restarts);
  job_gauge("megatrain_job_world_size", "Ranks in the current attempt.", v.world);
  job_gauge("megatrain_job_nodes", "Nodes in the current attempt.", v.nodes);
  job_gauge("megatrain_job_uptime_seconds", "Seconds since the supervisor started the job.",
            std::max(0.0, v.now - v.started));
  job_gauge("megatrain_job_useful_step_seconds",
            "Seconds of the steps the job kept (rank 0's; a step a restart recomputed counts once).", v.useful_s);
  if (v.now > v.started)
    job_gauge("megatrain_job_effective_training_ratio",
              "Effective training time: the kept steps' seconds over the seconds since the job started.",
              v.useful_s / (v.now - v.started));
  header("megatrain_job_state", "1 for the state the job is in, 0 for the others.");
  for (const char* st : {"starting", "running", "stopping", "restarting", "done", "failed"})
    out += fmt::format("megatrain_job_state{{state=\"{}\"}} {}\n", st, v.state == st ? 1 : 0);

  auto labels = [](const RankView& r) {
    const RankStatus& s = r.status;
    std::string l = fmt::format("rank=\"{}\",node=\"{}\"", s.rank, r.node);
    if (has_coord(s)) l += fmt::format(",dp=\"{}\",pp=\"{}\",tp=\"{}\"", s.coord_dp, s.coord_pp, s.coord_tp);
    return l;
  };
  struct RankGauge {
    const char* name;
    const char* help;
    std::function<std::optional<double>(const RankView&)> get;
  };
  const double now = v.now;
  const RankGauge gauges[] = {
      {"megatrain_rank_step", "The last step the rank completed.",
       [](const RankView& r) { return std::optional<double>(r.status.step); }},
      {"megatrain_rank_running", "1 while the rank's process lives.",
       [](const RankView& r) { return std::optional<double>(r.running ? 1 : 0); }},
      {"megatrain_rank_heartbeat_age_seconds", "Seconds since the rank's last heartbeat.",
       [now](const RankView& r) {
         return r.status.heard ? std::optional<double>(std::max(0.0, now - r.status.last_heard)) : std::nullopt;
       }},
      {"megatrain_rank_loss", "The training loss of the rank's last step.",
       [](const RankView& r) { return r.status.loss; }},
      {"megatrain_rank_step_seconds", "Wall time of the rank's last step.",
       [](const RankView& r) { return r.status.step_time; }},
      {"megatrain_rank_compute_seconds",
       "The rank's last step time less the time it was blocked on communication (the straggler measure).",
       [](const RankView& r) { return r.status.compute_time; }},
      {"megatrain_rank_tokens_per_second", "The job's tokens per second as the rank measured its last step.",
       [](const RankView& r) { return r.status.tokens_per_s; }},
      {"megatrain_rank_mfu", "Model FLOPs utilisation of the rank's last step (0..1).",
       [](const RankView& r) { return r.status.mfu; }},
      {"megatrain_rank_resident_bytes", "The rank process's resident memory.",
       [](const RankView& r) { return r.status.rss; }},
      {"megatrain_rank_collectives_in_flight", "Collectives the rank has posted and not completed, over its groups.",
       [](const RankView& r) {
         return std::optional<double>(double(std::count_if(r.status.colls.begin(), r.status.colls.end(),
                                                           [](const CollectiveState& c) { return c.in_flight(); })));
       }},
  };
  for (const RankGauge& g : gauges) {
    header(g.name, g.help);
    for (const RankView& r : v.ranks)
      if (std::optional<double> x = g.get(r)) out += fmt::format("{}{{{}}} {}\n", g.name, labels(r), sample(*x));
  }
  header("megatrain_rank_phase", "1 for what the rank is doing (its heartbeat's phase).");
  for (const RankView& r : v.ranks)
    if (!r.status.phase.empty())
      out += fmt::format("megatrain_rank_phase{{{},phase=\"{}\"}} 1\n", labels(r), label_value(r.status.phase));
  return out;
}

}  // namespace mt::launch
