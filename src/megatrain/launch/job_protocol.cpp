#include "megatrain/launch/job_protocol.h"

#include <fmt/format.h>

#include <algorithm>

namespace mt::launch::proto {

std::string agent_key(int a) { return fmt::format("job/agent/{}", a); }
std::string alive_key(int a) { return fmt::format("job/agent/{}/alive", a); }
std::string evicted_key(int a) { return fmt::format("job/agent/{}/evicted", a); }
std::string plan_key(int n) { return fmt::format("job/attempt/{}/plan", n); }
std::string status_key(int n, int a) { return fmt::format("job/attempt/{}/status/{}", n, a); }
std::string stop_key(int n) { return fmt::format("job/attempt/{}/stop", n); }
std::string end_key(int n, int a) { return fmt::format("job/attempt/{}/end/{}", n, a); }
std::string diagnose_key(int n) { return fmt::format("job/attempt/{}/diagnose", n); }
std::string diag_key(int n, int a) { return fmt::format("job/attempt/{}/diag/{}", n, a); }
std::string done_ack_key(int a) { return fmt::format("job/done_ack/{}", a); }

nlohmann::json AgentHello::to_json() const {
  return {{"agent", agent}, {"host", host}, {"nproc", nproc}, {"diagnosis", diagnosis}};
}

AgentHello AgentHello::from_json(const nlohmann::json& j) {
  AgentHello h;
  h.agent = j.at("agent").get<int>();
  h.host = j.value("host", "");
  h.nproc = j.at("nproc").get<int>();
  h.diagnosis = j.value("diagnosis", nlohmann::json::object());
  return h;
}

int AttemptPlan::slot_of(int agent) const {
  auto it = std::find(nodes.begin(), nodes.end(), agent);
  return it == nodes.end() ? -1 : int(it - nodes.begin());
}

nlohmann::json AttemptPlan::to_json() const {
  return {{"attempt", attempt}, {"nodes", nodes}, {"nproc", nproc}, {"extra_args", extra_args}, {"why", why}};
}

AttemptPlan AttemptPlan::from_json(const nlohmann::json& j) {
  AttemptPlan p;
  p.attempt = j.at("attempt").get<int>();
  p.nodes = j.at("nodes").get<std::vector<int>>();
  p.nproc = j.at("nproc").get<int>();
  p.extra_args = j.value("extra_args", std::vector<std::string>{});
  p.why = j.value("why", "");
  return p;
}

nlohmann::json AgentEnd::to_json() const {
  return {{"code", code},           {"user_stop", user_stop},
          {"best_step", best_step}, {"nonfinite_step", nonfinite_step},
          {"detected", detected},   {"sdc_ranks", sdc_ranks}};
}

AgentEnd AgentEnd::from_json(const nlohmann::json& j) {
  AgentEnd e;
  e.code = j.at("code").get<int>();
  e.user_stop = j.value("user_stop", false);
  e.best_step = j.value("best_step", 0);
  e.nonfinite_step = j.value("nonfinite_step", -1);
  e.detected = j.value("detected", "");
  e.sdc_ranks = j.value("sdc_ranks", std::vector<int>{});
  return e;
}

nlohmann::json status_to_json(const RankStatus& s, bool running, double now) {
  nlohmann::json colls = nlohmann::json::array();
  for (const auto& c : s.colls) colls.push_back({{"group", c.group}, {"op", c.op}, {"seq", c.seq}, {"state", c.state}});
  nlohmann::json j = {{"rank", s.rank}, {"coord", s.coord}, {"heard", s.heard}, {"age", now - s.last_heard},
                      {"step", s.step}, {"phase", s.phase}, {"colls", colls},   {"running", running}};
  if (s.start_step >= 0) j["start_step"] = s.start_step;
  if (s.dp > 0) j["layout"] = {{"dp", s.dp}, {"pp", s.pp}, {"tp", s.tp}, {"grad_accum", s.grad_accum}};
  if (s.step_time) j["step_time"] = *s.step_time;
  if (s.compute_time) j["compute_time"] = *s.compute_time;
  if (s.loss) j["loss"] = *s.loss;
  if (s.tokens_per_s) j["tokens_per_s"] = *s.tokens_per_s;
  if (s.mfu) j["mfu"] = *s.mfu;
  if (s.rss) j["rss"] = *s.rss;
  if (s.coord_dp >= 0) j["xyz"] = {s.coord_dp, s.coord_pp, s.coord_tp};
  nlohmann::json recent = nlohmann::json::array();  // [step, loss|null, step_time, age, compute|null], oldest first
  auto or_null = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(); };
  for (const StepRecord& r : s.recent)
    if (r.heard >= now - RankStatus::kRecentSeconds)
      recent.push_back({r.step, or_null(r.loss), r.step_time, now - r.heard, or_null(r.compute_time)});
  if (!recent.empty()) j["recent"] = std::move(recent);
  if (s.moe.step >= 0) j["moe"] = obs::moe_load_to_wire(s.moe);
  return j;
}

RankStatus status_from_json(const nlohmann::json& j, double now, bool* running) {
  RankStatus s;
  s.rank = j.at("rank").get<int>();
  s.coord = j.value("coord", "");
  s.heard = j.value("heard", false);
  s.last_heard = now - j.value("age", 0.0);
  s.step = j.value("step", 0);
  s.phase = j.value("phase", "");
  s.start_step = j.value("start_step", -1);
  if (j.contains("layout")) {
    const auto& l = j["layout"];
    s.dp = l.at("dp").get<int>();
    s.pp = l.at("pp").get<int>();
    s.tp = l.at("tp").get<int>();
    s.grad_accum = l.at("grad_accum").get<int>();
  }
  if (j.contains("step_time")) s.step_time = j["step_time"].get<double>();
  if (j.contains("compute_time")) s.compute_time = j["compute_time"].get<double>();
  for (auto [key, field] :
       {std::pair{"loss", &s.loss}, {"tokens_per_s", &s.tokens_per_s}, {"mfu", &s.mfu}, {"rss", &s.rss}})
    if (j.contains(key)) *field = j[key].get<double>();
  if (j.contains("xyz")) {
    const auto& c = j["xyz"];
    s.coord_dp = c.at(0).get<int>();
    s.coord_pp = c.at(1).get<int>();
    s.coord_tp = c.at(2).get<int>();
  }
  for (const auto& c : j.value("colls", nlohmann::json::array()))
    s.colls.push_back({c.value("group", ""), c.value("op", ""), c.value("seq", -1L), c.value("state", "")});
  auto number_or_null = [](const nlohmann::json& v) {
    return v.is_null() ? std::nullopt : std::optional(v.get<double>());
  };
  for (const auto& r : j.value("recent", nlohmann::json::array()))
    s.recent.push_back({r.at(0).get<int>(), number_or_null(r.at(1)), r.at(2).get<double>(), now - r.at(3).get<double>(),
                        r.size() > 4 ? number_or_null(r.at(4)) : std::nullopt});
  s.trim_recent(now);
  if (j.contains("moe")) s.moe = obs::moe_load_from_wire(j["moe"]);
  if (running) *running = j.value("running", true);
  return s;
}

}  // namespace mt::launch::proto
