#include "megatrain/launch/status_text.h"

#include <algorithm>
#include <ctime>
#include <vector>

#include <fmt/format.h>

namespace mt::launch {

using nlohmann::json;

namespace {

bool num(const json& j, const char* k) { return j.contains(k) && j[k].is_number(); }

std::string coord(const json& r) {
  if (!r.contains("coord") || !r["coord"].is_array() || r["coord"].size() != 3) return "";
  return fmt::format(" (dp{},pp{},tp{})", r["coord"][0].get<int>(), r["coord"][1].get<int>(), r["coord"][2].get<int>());
}

// Why a rank is worth a line, or "" when it keeps up.
std::string trouble(const json& r, int newest) {
  std::vector<std::string> why;
  if (!r.value("running", false)) why.push_back("not running");
  if (num(r, "age_s") && r["age_s"].get<double>() > kStaleHeartbeatSeconds)
    why.push_back(fmt::format("silent for {:.0f} s", r["age_s"].get<double>()));
  if (r.value("step", 0) < newest) why.push_back(fmt::format("{} behind", newest - r.value("step", 0)));
  for (const json& c : r.value("in_flight", json::array()))
    why.push_back(fmt::format("in {} {} #{} ({})", c.value("op", ""), c.value("group", ""), c.value("seq", -1),
                              c.value("state", "")));
  if (why.empty()) return "";
  std::string s = fmt::format("  rank {}{} on node {}: step {}, {}", r.value("rank", -1), coord(r), r.value("node", 0),
                              r.value("step", 0), r.value("phase", "").empty() ? "-" : r.value("phase", ""));
  for (const std::string& w : why) s += ", " + w;
  return s + "\n";
}

}  // namespace

std::string status_text(const json& a, int max_ranks, int max_events) {
  const json job = a.value("job", json::object());
  const json ranks = a.value("ranks", json::array());
  std::string out;
  const int restarts = job.value("restarts", 0);
  out += fmt::format("job: {}, attempt {} ({} restart{})", job.value("state", "?"), job.value("attempt", 0), restarts,
                     restarts == 1 ? "" : "s");
  if (job.contains("layout") && job["layout"].is_object()) {
    const json& l = job["layout"];
    out += fmt::format(", dp{} x pp{} x tp{}", l.value("dp", 0), l.value("pp", 0), l.value("tp", 0));
    if (l.value("grad_accum", 1) > 1) out += fmt::format(" (grad_accum {})", l.value("grad_accum", 1));
  }
  const int nodes = job.value("nodes", 1);
  out += fmt::format(", {} ranks on {} node{}, up {:.0f} s\n", job.value("world", 0), nodes, nodes == 1 ? "" : "s",
                     job.value("uptime_s", 0.0));

  // Steps, and the numbers of the newest step: the loss (rank 0's view is every rank's), the fastest and slowest
  // rank's step time, MFU.
  int newest = 0;
  double fastest = 0, slowest = 0;
  bool timed = false;
  const json* lossy = nullptr;
  const json* mfu = nullptr;
  for (const json& r : ranks) newest = std::max(newest, r.value("step", 0));
  for (const json& r : ranks) {
    if (num(r, "step_time")) {
      const double t = r["step_time"].get<double>();
      fastest = timed ? std::min(fastest, t) : t;
      slowest = timed ? std::max(slowest, t) : t;
      timed = true;
    }
    if (!lossy && num(r, "loss")) lossy = &r;
    if (!mfu && num(r, "mfu")) mfu = &r;
  }
  if (job.contains("step") && job["step"].is_object()) {
    const int lo = job["step"].value("min", 0), hi = job["step"].value("max", 0);
    out += lo == hi ? fmt::format("step {}", hi) : fmt::format("steps {}-{}", lo, hi);
    if (lossy) out += fmt::format(", loss {:.4f}", (*lossy)["loss"].get<double>());
    if (timed) out += fmt::format(", step time {:.3f}-{:.3f} s (fastest-slowest rank)", fastest, slowest);
    if (mfu) out += fmt::format(", MFU {:.1f}%", 100.0 * (*mfu)["mfu"].get<double>());
    if (num(job, "effective_training") && job.value("useful_s", 0.0) > 0)
      out += fmt::format(", effective training {:.1f}%", 100.0 * job["effective_training"].get<double>());
    out += "\n";
  }
  if (!job.value("detail", "").empty()) out += "last word: " + job.value("detail", "") + "\n";

  std::string lines;
  int listed = 0, more = 0;
  for (const json& r : ranks) {
    const std::string t = trouble(r, newest);
    if (t.empty()) continue;
    if (listed < max_ranks) {
      lines += t;
      ++listed;
    } else {
      ++more;
    }
  }
  if (ranks.empty())
    out += "no ranks yet\n";
  else if (listed == 0)
    out += fmt::format("all {} ranks at step {}, heard within {:.0f} s, none waiting in a collective\n", ranks.size(),
                       newest, kStaleHeartbeatSeconds);
  else
    out += fmt::format("ranks to look at:\n{}{}", lines, more ? fmt::format("  ... and {} more\n", more) : "");

  const json events = a.value("events", json::array());
  if (!events.empty()) {
    out += "newest events:\n";
    const size_t from = events.size() > size_t(max_events) ? events.size() - size_t(max_events) : 0;
    for (size_t i = from; i < events.size(); ++i) {
      const json& e = events[i];
      json rest = e;
      for (const char* k : {"t", "event", "attempt", "node", "by"}) rest.erase(k);
      const std::time_t t = std::time_t(e.value("t", 0.0));
      std::tm tm{};
      ::gmtime_r(&t, &tm);
      char when[16];
      std::strftime(when, sizeof when, "%H:%M:%S", &tm);
      std::string line = rest.dump(-1, ' ', false, json::error_handler_t::replace);
      if (line.size() > 160) line = line.substr(0, 157) + "...";
      out += fmt::format("  {}Z {} (attempt {}) {}\n", when, e.value("event", "?"), e.value("attempt", 0), line);
    }
  }
  return out;
}

}  // namespace mt::launch
