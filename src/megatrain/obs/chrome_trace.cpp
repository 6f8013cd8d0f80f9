#include "megatrain/obs/chrome_trace.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>

#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"

namespace mt::obs {

namespace {

constexpr double kUs = 1e6;

nlohmann::json meta_event(const char* what, int pid, int tid, const std::string& name) {
  nlohmann::json e = {{"ph", "M"}, {"name", what}, {"pid", pid}, {"args", {{"name", name}}}};
  if (tid >= 0) e["tid"] = tid;
  return e;
}

// One process's events: metadata (names, sort order), then the spans (Span or TraceEvent: the same fields), with
// their tracks as threads numbered in first-seen order, "main" first.
template <typename S>
void append_process(nlohmann::json& events, const RankTrace& r, const std::vector<const S*>& spans) {
  std::map<std::string, int> ids{{"main", 0}};
  for (const S* s : spans)
    if (!ids.count(s->track)) ids.emplace(s->track, static_cast<int>(ids.size()));
  events.push_back(meta_event("process_name", r.rank, -1, r.label.empty() ? fmt::format("rank {}", r.rank) : r.label));
  events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", r.rank}, {"args", {{"sort_index", r.rank}}}});
  for (const auto& [name, id] : ids) {
    events.push_back(meta_event("thread_name", r.rank, id, name));
    events.push_back(
        {{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", r.rank}, {"tid", id}, {"args", {{"sort_index", id}}}});
  }
  for (const S* s : spans) {
    nlohmann::json e = {{"ph", "X"},
                        {"name", s->name},
                        {"cat", s->cat},
                        {"pid", r.rank},
                        {"tid", ids.at(s->track)},
                        {"ts", s->t0 * kUs},
                        {"dur", std::max(0.0, s->t1 - s->t0) * kUs}};
    if (!s->args.is_null()) e["args"] = s->args;
    events.push_back(std::move(e));
  }
}

nlohmann::json info_json(const RankTrace& r) {
  return {{"rank", r.rank},
          {"world", r.world},
          {"label", r.label},
          {"coord", {r.dp, r.pp, r.tp}},
          {"clock_offset_s", r.clock_offset_s},
          {"clock_error_s", r.clock_error_s},
          {"dropped", r.dropped},
          {"first_step", r.first_step},
          {"last_step", r.last_step}};
}

RankTrace info_from(const nlohmann::json& m, const std::string& path) {
  RankTrace r;
  try {
    r.rank = m.at("rank").get<int>();
    r.world = m.at("world").get<int>();
    r.label = m.value("label", "");
    if (m.contains("coord")) {
      const auto c = m.at("coord").get<std::vector<int>>();
      if (c.size() != 3)
        fail_as(ErrorKind::Data, "{}: \"coord\" must be [dp, pp, tp], not {}", path, m["coord"].dump());
      r.dp = c[0], r.pp = c[1], r.tp = c[2];
    }
    r.clock_offset_s = m.value("clock_offset_s", 0.0);
    r.clock_error_s = m.value("clock_error_s", 0.0);
    r.dropped = m.value("dropped", size_t{0});
    r.first_step = m.value("first_step", 0);
    r.last_step = m.value("last_step", 0);
  } catch (const nlohmann::json::exception& e) {
    fail_as(ErrorKind::Data, "{}: the \"megatrain\" object of this trace is malformed ({})", path, e.what());
  }
  if (r.world < 1 || r.rank < 0 || r.rank >= r.world)
    fail_as(ErrorKind::Data, "{}: rank {} of world {} is not a rank of that world", path, r.rank, r.world);
  return r;
}

std::vector<std::string> expand(const std::vector<std::string>& paths) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  for (const std::string& p : paths) {
    if (!fs::is_directory(p)) {
      files.push_back(p);
      continue;
    }
    std::vector<std::string> found;
    for (const auto& e : fs::directory_iterator(p)) {
      const std::string n = e.path().filename().string();
      if (e.is_regular_file() && n.rfind("rank", 0) == 0 && e.path().extension() == ".json") found.push_back(e.path());
    }
    if (found.empty()) fail_as(ErrorKind::Data, "{}: no rank*.json trace files in this directory", p);
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  if (files.empty()) fail_as(ErrorKind::Config, "no trace files given");
  return files;
}

}  // namespace

nlohmann::json chrome_trace(const RankTrace& info, const std::vector<Span>& spans) {
  std::vector<const Span*> ptrs;
  ptrs.reserve(spans.size());
  for (const Span& s : spans) ptrs.push_back(&s);
  nlohmann::json events = nlohmann::json::array();
  append_process(events, info, ptrs);
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}, {"megatrain", info_json(info)}};
}

void write_rank_trace(const std::string& path, const RankTrace& info, const std::vector<Span>& spans) {
  write_file_atomic(path, chrome_trace(info, spans).dump());
}

MergedTrace merge_rank_traces(const std::vector<std::string>& paths, bool align) {
  MergedTrace m;
  m.aligned = align;
  std::map<int, std::string> file_of;
  for (const std::string& f : expand(paths)) {
    nlohmann::json j = nlohmann::json::parse(read_text_file(f), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) fail_as(ErrorKind::Data, "{}: not JSON (a trace file cut short?)", f);
    if (!j.is_object() || !j.contains("megatrain") || !j.contains("traceEvents") || !j["traceEvents"].is_array())
      fail_as(ErrorKind::Data, "{}: not a megatrain rank trace (no \"megatrain\" object or \"traceEvents\" list)", f);
    RankTrace r = info_from(j["megatrain"], f);
    if (file_of.count(r.rank))
      fail_as(ErrorKind::Data, "{} and {} are both traces of rank {}", file_of[r.rank], f, r.rank);
    if (!m.ranks.empty() && m.ranks.front().world != r.world)
      fail_as(ErrorKind::Data, "{} is rank {} of a world of {}, but {} is of a world of {}: traces of different jobs?",
              f, r.rank, r.world, file_of.begin()->second, m.ranks.front().world);
    file_of[r.rank] = f;
    std::map<int, std::string> track_of;
    for (const auto& e : j["traceEvents"])
      if (e.value("ph", "") == "M" && e.value("name", "") == "thread_name")
        track_of[e.value("tid", 0)] = e["args"].value("name", "");
    const double shift = align ? r.clock_offset_s : 0;
    for (const auto& e : j["traceEvents"]) {
      if (e.value("ph", "") != "X") continue;
      TraceEvent t;
      t.rank = r.rank;
      t.name = e.value("name", "");
      t.cat = e.value("cat", "");
      const int tid = e.value("tid", 0);
      t.track = track_of.count(tid) ? track_of[tid] : fmt::format("track {}", tid);
      t.t0 = e.value("ts", 0.0) / kUs + shift;
      t.t1 = t.t0 + e.value("dur", 0.0) / kUs;
      if (e.contains("args")) t.args = e["args"];
      m.events.push_back(std::move(t));
    }
    m.ranks.push_back(r);
  }
  std::sort(m.ranks.begin(), m.ranks.end(), [](const RankTrace& a, const RankTrace& b) { return a.rank < b.rank; });
  for (int r = 0, i = 0; r < m.ranks.front().world; ++r) {
    if (i < static_cast<int>(m.ranks.size()) && m.ranks[i].rank == r)
      ++i;
    else
      m.missing_ranks.push_back(r);
  }
  double base = std::numeric_limits<double>::infinity();
  for (const TraceEvent& e : m.events) base = std::min(base, e.t0);
  m.base_unix_s = m.events.empty() ? 0 : base;
  for (TraceEvent& e : m.events) {
    e.t0 -= m.base_unix_s;
    e.t1 -= m.base_unix_s;
  }
  std::stable_sort(m.events.begin(), m.events.end(), [](const TraceEvent& a, const TraceEvent& b) {
    return a.rank != b.rank ? a.rank < b.rank : a.t0 < b.t0;
  });
  return m;
}

nlohmann::json to_chrome(const MergedTrace& m) {
  nlohmann::json events = nlohmann::json::array();
  size_t at = 0;
  for (const RankTrace& r : m.ranks) {
    std::vector<const TraceEvent*> mine;
    for (; at < m.events.size() && m.events[at].rank == r.rank; ++at) mine.push_back(&m.events[at]);
    append_process(events, r, mine);
  }
  nlohmann::json ranks = nlohmann::json::array();
  for (const RankTrace& r : m.ranks) ranks.push_back(info_json(r));
  return {
      {"traceEvents", std::move(events)},
      {"displayTimeUnit", "ms"},
      {"megatrain",
       {{"base_unix_s", m.base_unix_s}, {"aligned", m.aligned}, {"ranks", ranks}, {"missing_ranks", m.missing_ranks}}}};
}

}  // namespace mt::obs
