#include "megatrain/launch/rank_status.h"

#include <fmt/format.h>

namespace mt::launch {

bool RankStatus::apply(const nlohmann::json& hb, double now) {
  if (!hb.is_object()) return false;
  if (hb.value("type", "") == "moe") return moe.apply(hb);
  if (hb.value("type", "") != "hb") return false;
  try {
    heard = true;
    last_heard = now;
    if (hb.contains("step") && hb["step"].is_number_integer()) step = std::max(step, hb["step"].get<int>());
    phase = hb.value("phase", phase);
    if (auto c = hb.find("coord"); c != hb.end() && c->is_array() && c->size() == 3) {
      coord_dp = (*c)[0].get<int>();
      coord_pp = (*c)[1].get<int>();
      coord_tp = (*c)[2].get<int>();
      coord = fmt::format("dp{},pp{},tp{}", coord_dp, coord_pp, coord_tp);
    }
    if (auto l = hb.find("layout"); l != hb.end() && l->is_object()) {
      dp = l->value("dp", 0);
      pp = l->value("pp", 0);
      tp = l->value("tp", 0);
      grad_accum = l->value("grad_accum", 0);
    }
    if (hb.contains("start_step") && hb["start_step"].is_number_integer()) start_step = hb["start_step"].get<int>();
    auto num = [&](const char* k) -> std::optional<double> {
      auto it = hb.find(k);
      if (it == hb.end() || !it->is_number()) return std::nullopt;
      return it->get<double>();
    };
    if (auto v = num("step_time")) step_time = v;
    if (auto v = num("compute_time")) compute_time = v;
    if (auto v = num("loss")) loss = v;
    if (auto v = num("tokens_per_s")) tokens_per_s = v;
    if (auto v = num("mfu")) mfu = v;
    if (auto v = num("rss")) rss = v;
    const auto this_step_time = num("step_time");
    if (hb.value("at", "") == "step" && this_step_time && hb.contains("step") && hb["step"].is_number_integer()) {
      recent.push_back({hb["step"].get<int>(), num("loss"), *this_step_time, now, num("compute_time")});
      trim_recent(now);
    }
    if (auto cs = hb.find("colls"); cs != hb.end() && cs->is_array()) {
      colls.clear();
      for (const auto& c : *cs)
        colls.push_back({c.value("group", ""), c.value("op", ""), c.value("seq", -1L), c.value("state", "")});
    }
  } catch (const nlohmann::json::exception&) {
    // A field of the wrong type: keep what was read so far.
  }
  return true;
}

void RankStatus::trim_recent(double now) {
  while (!recent.empty() && (recent.size() > kMaxRecent || recent.front().heard < now - kRecentSeconds))
    recent.pop_front();
}

}  // namespace mt::launch
