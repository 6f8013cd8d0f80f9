#include "megatrain/comm/flight_recorder.h"

#include <fmt/format.h>

#include <algorithm>

#include "megatrain/obs/timeline.h"

namespace mt {

namespace {

// The trace clock (unix seconds), so that the entries and the timeline's spans share one clock.
double unix_now() { return obs::trace_clock(); }

// A completed op as a timeline span: collectives on their group's track (they run in issue order), transfers on a
// track per direction and peer (they overlap).
void record_span(const std::string& group, const std::vector<int>& ranks, const FlightEntry& e) {
  obs::Span s;
  s.name = e.op;
  s.cat = "comm";
  s.track = e.p2p() ? fmt::format("{} {} {}", group, e.op == "send" ? "send to" : "recv from", e.peer) : group;
  s.t0 = e.t_started > 0 ? e.t_started : e.t_posted;
  s.t1 = e.t_ended;
  s.args = {{"group", group}, {"seq", e.seq}, {"queued_ms", (s.t0 - e.t_posted) * 1e3}};
  if (e.p2p())
    s.args["peer"] = e.peer;
  else
    s.args["members"] = ranks.size();
  if (!e.error.empty()) s.args["error"] = e.error;
  obs::timeline().add(std::move(s));
}

}  // namespace

const char* op_state_name(OpState s) {
  switch (s) {
    case OpState::Posted: return "posted";
    case OpState::Started: return "started";
    case OpState::Done: return "done";
    case OpState::Failed: return "failed";
  }
  return "?";
}

nlohmann::json to_json(const FlightEntry& e) {
  nlohmann::json j = {{"op", e.op}, {"seq", e.seq}, {"state", op_state_name(e.state)}, {"t_posted", e.t_posted}};
  if (e.p2p()) j["peer"] = e.peer;
  if (e.t_started > 0) j["t_started"] = e.t_started;
  if (e.t_ended > 0) j["t_ended"] = e.t_ended;
  if (!e.error.empty()) j["error"] = e.error;
  return j;
}

nlohmann::json to_json(const GroupFlight& g) {
  nlohmann::json j = {{"group", g.group}, {"rank", g.rank}, {"ranks", g.ranks}, {"collectives", g.collectives}};
  j["last"] = g.last ? to_json(*g.last) : nlohmann::json();
  j["oldest_pending"] = g.oldest_pending ? to_json(*g.oldest_pending) : nlohmann::json();
  return j;
}

GroupRecord::GroupRecord(std::string name, std::vector<int> ranks, int rank)
    : name_(std::move(name)), ranks_(std::move(ranks)), rank_(rank) {}

uint64_t GroupRecord::add(FlightEntry e) {
  poll(/*all=*/false);
  e.t_posted = unix_now();
  const uint64_t id = next_id_++;
  entries_.emplace(id, std::move(e));
  return id;
}

uint64_t GroupRecord::post_collective(const char* op) {
  std::lock_guard<std::mutex> lock(mu_);
  FlightEntry e;
  e.op = op;
  e.seq = next_seq_++;
  return add(std::move(e));
}

uint64_t GroupRecord::post_p2p(const char* op, int peer_global_rank) {
  std::lock_guard<std::mutex> lock(mu_);
  FlightEntry e;
  e.op = op;
  e.peer = peer_global_rank;
  e.seq = p2p_seq_[{std::string_view(op) == "send", peer_global_rank}]++;
  return add(std::move(e));
}

void GroupRecord::enter(uint64_t id) {
  FlightEntry copy;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) return;
    copy = it->second;
  }
  flight_recorder().run_enter_hook(name_, copy);  // outside the lock: it may block for good
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.completed()) return;
  it->second.state = OpState::Started;
  it->second.t_started = unix_now();
}

void GroupRecord::finish(uint64_t id, const std::string* error) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.completed()) return;
  it->second.state = error ? OpState::Failed : OpState::Done;
  it->second.t_ended = unix_now();
  if (error) it->second.error = *error;
  if (obs::timeline().on()) record_span(name_, ranks_, it->second);
  ++done_count_;
  trim();
}

void GroupRecord::track(uint64_t id, std::function<OpState()> probe) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.completed()) return;
  probes_[id] = std::move(probe);
}

void GroupRecord::poll(bool all) const {
  if (probes_.empty()) return;
  const double now = unix_now();
  for (auto it = probes_.begin(); it != probes_.end();) {
    auto e = entries_.find(it->first);
    if (e == entries_.end()) {
      it = probes_.erase(it);
      continue;
    }
    const OpState s = it->second();
    FlightEntry& f = e->second;
    if (s != OpState::Posted && f.t_started == 0) f.t_started = now;  // seen running (or over) no later than now
    f.state = s;
    if (f.completed()) {
      f.t_ended = now;
      if (s == OpState::Failed) f.error = "the device reported the op failed (see the group's error)";
      ++done_count_;
      it = probes_.erase(it);
    } else if (!all) {
      break;
    } else {
      ++it;
    }
  }
  trim();
}

// Drops the oldest completed entries beyond kDoneKept; entries still in flight stay whatever their age.
void GroupRecord::trim() const {
  for (auto it = entries_.begin(); done_count_ > kDoneKept && it != entries_.end();) {
    if (it->second.completed()) {
      it = entries_.erase(it);
      --done_count_;
    } else {
      ++it;
    }
  }
}

GroupFlight GroupRecord::flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  poll(/*all=*/true);
  GroupFlight g;
  g.group = name_;
  g.rank = rank_;
  g.ranks = ranks_;
  g.collectives = next_seq_;
  if (!entries_.empty()) g.last = entries_.rbegin()->second;
  for (const auto& [id, e] : entries_) {
    if (!e.completed()) {
      g.oldest_pending = e;
      break;
    }
  }
  return g;
}

std::vector<FlightEntry> GroupRecord::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  poll(/*all=*/true);
  std::vector<FlightEntry> out;
  out.reserve(entries_.size());
  for (const auto& [id, e] : entries_) out.push_back(e);
  return out;
}

std::shared_ptr<GroupRecord> FlightRecorder::open(const std::string& name, const std::vector<int>& ranks, int rank) {
  auto g = std::make_shared<GroupRecord>(name, ranks, rank);
  std::lock_guard<std::mutex> lock(mu_);
  groups_.push_back(g);
  return g;
}

void FlightRecorder::close(const std::shared_ptr<GroupRecord>& g) {
  std::lock_guard<std::mutex> lock(mu_);
  groups_.erase(std::remove(groups_.begin(), groups_.end(), g), groups_.end());
}

std::vector<GroupFlight> FlightRecorder::snapshot() const {
  std::vector<std::shared_ptr<GroupRecord>> groups;
  {
    std::lock_guard<std::mutex> lock(mu_);
    groups = groups_;
  }
  std::vector<GroupFlight> out;
  out.reserve(groups.size());
  for (const auto& g : groups) out.push_back(g->flight());
  return out;
}

nlohmann::json FlightRecorder::json() const {
  nlohmann::json groups = nlohmann::json::array();
  for (const GroupFlight& g : snapshot()) groups.push_back(to_json(g));
  return {{"groups", groups}};
}

std::vector<FlightEntry> FlightRecorder::entries(const std::string& group) const {
  std::shared_ptr<GroupRecord> g;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& x : groups_)
      if (x->name() == group) {
        g = x;
        break;
      }
  }
  return g ? g->entries() : std::vector<FlightEntry>{};
}

void FlightRecorder::set_enter_hook(EnterHook hook) {
  std::lock_guard<std::mutex> lock(mu_);
  hook_ = hook ? std::make_shared<const EnterHook>(std::move(hook)) : nullptr;
}

void FlightRecorder::run_enter_hook(const std::string& group, const FlightEntry& e) const {
  std::shared_ptr<const EnterHook> hook;
  {
    std::lock_guard<std::mutex> lock(mu_);
    hook = hook_;
  }
  if (hook) (*hook)(group, e);
}

FlightRecorder& flight_recorder() {
  static FlightRecorder* r = new FlightRecorder;  // never destroyed: groups may outlive static destruction order
  return *r;
}

}  // namespace mt
