#include "megatrain/launch/driver.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"
#include "megatrain/launch/dashboard.h"
#include "megatrain/launch/sdc_strikes.h"
#include "megatrain/launch/notifier.h"
#include "megatrain/launch/job_protocol.h"
#include "megatrain/launch/job_watch.h"
#include "megatrain/launch/node_plan.h"
#include "megatrain/launch/process_util.h"
#include "megatrain/launch/restart_policy.h"
#include "megatrain/launch/useful_time.h"

namespace mt::launch {
namespace {

using nlohmann::json;

constexpr double kPollSeconds = 0.5;
// How long the driver keeps the store up after the job's end for the agents to read it (they poll every 0.2 s).
constexpr double kDoneAckSeconds = 5.0;

// The job's layout as the ranks report it (0 until some rank has); a shrink changes dp and grad_accum.
struct Layout {
  int dp = 0, pp = 0, tp = 0, grad_accum = 0;
  void learn(const RankStatus& s) {
    if (s.dp > 0) *this = Layout{s.dp, s.pp, s.tp, s.grad_accum};
  }
  bool known() const { return dp > 0; }
};

struct AgentState {
  std::optional<proto::AgentHello> hello;
  int64_t alive = -1;        // the last value of its liveness counter
  double alive_changed = 0;  // when it last changed (driver clock)
  bool lost = false;
  std::string evicted;  // non-empty: the reason it is out
  bool usable() const {
    return hello && !lost && evicted.empty() && (!hello->diagnosis.is_object() || hello->diagnosis.value("pass", true));
  }
};

class Driver {
 public:
  Driver(const LaunchOptions& o, Store& s, EventLog& e, Dashboard* d)
      : opt_(o), store_(s), events_(e), dashboard_(d), tracker_(restart_policy(o)), watch_(watch_options(o)),
        agents_(size_t(o.nnodes + o.spares)), is_train_(o.trains()), several_(o.several_agents()) {}

  int run() {
    // The dashboard's certificate notices go to the job's event log, the driver's (which --notify watches), from
    // this thread, the one that publishes to the dashboard.
    if (dashboard_)
      dashboard_->on_notice([this](const std::string& reason, const std::string& text) {
        say(fmt::format("driver: {}", text));
        events_.write("warning", {{"by", "driver"}, {"reason", reason}, {"line", text}});
      });
    try {
      return finish(drive());
    } catch (const std::exception& e) {
      say(fmt::format("driver: {}", e.what()));
      events_.write("gave_up", {{"by", "driver"}, {"exit_code", 1}, {"reason", e.what()}});
      return finish(1);
    }
  }

 private:
  int finish(int code) {
    try {
      store_.set(proto::kDoneKey, std::to_string(code));
      wait_for_done_acks();
    } catch (const std::exception& e) {
      say(fmt::format("driver: cannot tell the agents the job ended: {}", e.what()));
    }
    return code;
  }

  // The agents learn of the end by polling, and the store lives in node 0's process: returning at once could take
  // it away before an agent's next poll, and that agent would report a lost store (exit 22) for a job that ended
  // (CI saw it once: the spare that finished the job polled for a diagnosis request just as node 0 exited). So
  // wait, a bounded while, until every live agent says it has read the end.
  void wait_for_done_acks() {
    const double until = now_seconds() + kDoneAckSeconds;
    for (int a = 1; a < int(agents_.size()); ++a) {
      const AgentState& s = agents_[size_t(a)];
      if (!s.hello || s.lost || !s.evicted.empty()) continue;  // gone, or told to leave: nothing will read it
      while (!store_.check(proto::done_ack_key(a))) {
        if (now_seconds() > until) {
          say(fmt::format("driver: agent {} has not read the job's end within {} s; ending anyway", a,
                          kDoneAckSeconds));
          return;
        }
        std::this_thread::sleep_for(std::chrono::duration<double>(0.05));
      }
    }
  }

  int drive() {
    wait_for_agents();
    std::vector<int> nodes;
    for (int a = 0; a < opt_.nnodes; ++a) nodes.push_back(a);
    std::string why = "the first attempt";
    for (int attempt = 0;; ++attempt) {
      events_.set_attempt(attempt);
      proto::AttemptPlan plan;
      plan.attempt = attempt;
      plan.nodes = nodes;
      plan.nproc = opt_.nproc;
      plan.why = why;
      plan.extra_args = extra_args(int(nodes.size()));
      store_.set(proto::plan_key(attempt), plan.to_json().dump());
      if (several_) {  // (one agent has one plan; its "started" says the rest)
        say(fmt::format("driver: attempt {} on {} (agents {}), {} ranks: {}", attempt,
                        plural(int(nodes.size()), "node"), fmt::join(nodes, ","), plan.world(), why));
        events_.write("planned", {{"by", "driver"},
                                  {"nodes", nodes},
                                  {"world", plan.world()},
                                  {"extra_args", plan.extra_args},
                                  {"why", why}});
      }

      Outcome out = watch_attempt(plan);
      if (out.user_stop) {
        show("failed", "an agent was signalled");
        end_job("gave_up", {{"by", "driver"}, {"exit_code", out.code}, {"reason", "an agent was signalled"}});
        return out.code;
      }
      if (out.code == 0) {
        tracker_.after_attempt(0, out.best_step, -1);  // (the best step, for the end's event)
        show("done", "every rank finished");
        end_job("done", {{"by", "driver"},
                         {"exit_code", 0},
                         {"best_step", tracker_.best_step()},
                         {"restarts", tracker_.restarts()},
                         {"reason", "every rank finished"}});
        return 0;
      }
      std::string note;
      const int before = tracker_.restarts();
      RestartDecision d = tracker_.after_attempt(out.code, out.best_step, out.nonfinite_step, &note);
      if (!d.restart) {
        show("failed", d.reason);
        say(fmt::format("driver: giving up: {}", d.reason));
        end_job("gave_up", {{"by", "driver"},
                            {"exit_code", d.exit_code},
                            {"failure_code", out.code},
                            {"reason", d.reason},
                            {"best_step", tracker_.best_step()},
                            {"restarts", before}});
        return d.exit_code;
      }
      if (!note.empty()) say("driver: " + note);
      // A node named again for a silent data corruption is persistent: out (sdc_strikes.h). With one agent there
      // is nowhere else to go: said, and restarted where it is.
      for (const auto& [a, why] : sdc_strikes_.named(attempt, out.sdc_nodes)) {
        if (several_)
          to_evict_[a] = why;
        else
          say(fmt::format("driver: node {}: {}; restarting where it is (no other node)", a, why));
      }
      evict_marked();
      auto next = plan_nodes(nodes, &why);
      if (!next) {
        end_job("gave_up",
                {{"by", "driver"}, {"exit_code", kNoNodesExit}, {"failure_code", out.code}, {"reason", why}});
        say("driver: giving up: " + why);
        show("failed", why);
        return kNoNodesExit;
      }
      nodes = *next;
      say(fmt::format("driver: attempt {} failed (code {}); {}, in {:.1f} s", attempt, out.code, d.reason, d.delay_s));
      show("restarting", fmt::format("attempt {} failed (code {}); {}; next on nodes {}", attempt, out.code, d.reason,
                                     fmt::join(nodes, ",")));
      events_.write("restarting",
                    {{"by", "driver"},
                     {"delay_s", d.delay_s},
                     {"failure_code", out.code},
                     {"reason", d.reason},
                     {"attempt_best_step", out.best_step},
                     {"skip_steps", std::vector<int>(tracker_.skip_steps().begin(), tracker_.skip_steps().end())},
                     {"nodes", nodes},
                     {"why", why}});
      if (std::optional<int> code = user_stop_during(d.delay_s)) {
        show("failed", "an agent was signalled");
        end_job("gave_up", {{"by", "driver"}, {"exit_code", *code}, {"reason", "an agent was signalled"}});
        return *code;
      }
    }
  }

  // Waits `seconds` (a restart's backoff); the code an agent was signalled with, when one was meanwhile
  // (proto::kUserStopKey), or nullopt.
  std::optional<int> user_stop_during(double seconds) {
    for (const double until = now_seconds() + seconds;;) {
      if (store_.check(proto::kUserStopKey)) return std::atoi(store_.get(proto::kUserStopKey, Millis(5000)).c_str());
      if (now_seconds() >= until) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::duration<double>(std::min(0.1, until - now_seconds())));
    }
  }

  // ---- agents ---------------------------------------------------------------------------------------------------
  void wait_for_agents() {
    const double deadline = now_seconds() + opt_.startup_timeout_s;
    for (;;) {
      poll_agents(now_seconds());
      int ready = 0;
      for (int a = 0; a < opt_.nnodes; ++a) ready += agents_[size_t(a)].hello.has_value();
      if (ready == opt_.nnodes) return;
      if (now_seconds() > deadline) {
        std::vector<int> missing;
        for (int a = 0; a < opt_.nnodes; ++a)
          if (!agents_[size_t(a)].hello) missing.push_back(a);
        fail_as(ErrorKind::PeerLost, "the agents of node(s) {} never registered within --startup-timeout {} s",
                fmt::join(missing, ","), opt_.startup_timeout_s);
      }
      std::this_thread::sleep_for(std::chrono::duration<double>(kPollSeconds));
    }
  }

  // Registrations and liveness of every agent. Returns the agents found lost just now.
  std::vector<int> poll_agents(double now) {
    std::vector<int> lost_now;
    for (int a = 0; a < int(agents_.size()); ++a) {
      AgentState& s = agents_[size_t(a)];
      if (s.lost || !s.evicted.empty()) continue;
      if (!s.hello) {
        if (!store_.check(proto::agent_key(a))) continue;
        json j = json::parse(store_.get(proto::agent_key(a), Millis(5000)), nullptr, false);
        if (j.is_discarded()) continue;
        try {
          s.hello = proto::AgentHello::from_json(j);
        } catch (const json::exception&) {
          continue;
        }
        s.alive_changed = now;
        const bool ok = s.usable();
        if (several_)
          events_.write("registered", {{"by", "driver"},
                                       {"node", a},
                                       {"host", s.hello->host},
                                       {"spare", a >= opt_.nnodes},
                                       {"healthy", ok},
                                       {"diagnosis", s.hello->diagnosis}});
        if (!ok) evict(a, "it failed diagnose when it registered");
        continue;
      }
      // Node 0's agent runs in this very process: while the driver runs, it does. (Its liveness thread might only
      // be starved of the CPU, and a job of one agent must not lose its only node to that.)
      if (a == 0) continue;
      const int64_t v = store_.add(proto::alive_key(a), 0);
      if (v != s.alive) {
        s.alive = v;
        s.alive_changed = now;
      } else if (now - s.alive_changed > opt_.node_timeout_s) {
        s.lost = true;
        lost_now.push_back(a);
      }
    }
    return lost_now;
  }

  void evict(int a, const std::string& reason) {
    AgentState& s = agents_[size_t(a)];
    if (!s.evicted.empty()) return;
    s.evicted = reason;
    say(fmt::format("driver: evicting node {}: {}", a, reason));
    events_.write("evicted", {{"by", "driver"}, {"node", a}, {"reason", reason}});
    try {
      store_.set(proto::evicted_key(a), reason);
    } catch (const std::exception&) {
      // A lost node's agent will not read it anyway.
    }
  }

  // Evictions decided during the attempt (blamed ranks, failed diagnosis), carried out once it is over.
  void evict_marked() {
    for (auto& [a, reason] : to_evict_) evict(a, reason);
    to_evict_.clear();
  }

  // The next attempt's nodes (node_plan.h); nullopt (with `why`) when no layout fits.
  std::optional<std::vector<int>> plan_nodes(const std::vector<int>& prev, std::string* why) {
    NodePlanInput in;
    in.prev = prev;
    for (const auto& a : agents_) in.usable.push_back(a.usable());
    in.nproc = opt_.nproc;
    if (is_train_ && layout_.known()) {
      in.tp = layout_.tp;
      in.pp = layout_.pp;
      in.dp = layout_.dp;
      in.grad_accum = layout_.grad_accum;
    }
    in.shrink = opt_.shrink;
    NodePlan p = plan_next_nodes(in);
    *why = p.why;
    if (p.nodes.empty()) return std::nullopt;
    if (p.dp > 0) {
      override_.dp = p.dp;
      override_.grad_accum = p.grad_accum;
    }
    return p.nodes;
  }

  std::vector<std::string> extra_args(int /*nodes*/) const {
    std::vector<std::string> a;
    if (!is_train_) return a;
    if (override_.dp > 0) {
      a.push_back(fmt::format("--parallel.dp={}", override_.dp));
      a.push_back(fmt::format("--train.grad_accum={}", override_.grad_accum));
    }
    if (!tracker_.skip_steps().empty())
      a.push_back(fmt::format("--train.skip_steps=[{}]", fmt::join(tracker_.skip_steps(), ",")));
    return a;
  }

  // ---- one attempt ----------------------------------------------------------------------------------------------
  struct Outcome {
    int code = 0;
    bool user_stop = false;
    int best_step = 0;
    int nonfinite_step = -1;
    std::set<int> sdc_nodes;  // agents whose ranks were named as a silent data corruption's culprit
  };

  // kill_now: global ranks the agents kill without a grace period (ranks blamed for a hang; agent.cpp, begin_stop).
  // abandon: the attempt failed (a node is lost, a rank hangs), so the ranks still waiting in collectives give up
  // at once and write their snapshots (agent.cpp's begin_stop); a straggler's eviction stops at a step boundary.
  void request_stop(int attempt, int code, const std::string& reason, const std::vector<int>& kill_now = {},
                    bool abandon = true) {
    if (stop_code_ != 0) return;
    stop_code_ = code;
    store_.set(proto::stop_key(attempt),
               json{{"by", "driver"}, {"code", code}, {"reason", reason}, {"kill_now", kill_now}, {"abandon", abandon}}
                   .dump());
  }

  Outcome watch_attempt(const proto::AttemptPlan& plan) {
    const int attempt = plan.attempt;
    std::vector<int> ranks(size_t(plan.world()));
    for (int r = 0; r < plan.world(); ++r) ranks[size_t(r)] = r;
    watch_.reset(ranks, now_seconds(), tracker_.best_step());
    std::vector<bool> running(ranks.size(), true);
    std::map<int, proto::AgentEnd> ends;
    stop_code_ = 0;
    plan_ = plan;
    running_ = running;
    show();
    const double started = now_seconds();
    double detected_at = -1;
    auto waiting_on = [&] {
      int n = 0;
      for (int a : plan.nodes) n += !ends.count(a) && !agents_[size_t(a)].lost;
      return n;
    };
    while (waiting_on() > 0) {
      std::this_thread::sleep_for(std::chrono::duration<double>(kPollSeconds));
      const double now = now_seconds();
      for (int a : poll_agents(now)) {
        const bool in_plan = plan.slot_of(a) >= 0 && !ends.count(a);
        const std::string line = fmt::format("node {} is lost: its agent's liveness counter stood still for {:.0f} s",
                                             a, now - agents_[size_t(a)].alive_changed);
        say("driver: " + line);
        if (in_plan) detail_ = line;
        events_.write(in_plan ? "detected" : "warning",
                      {{"by", "driver"}, {"node", a}, {"reason", "node_lost"}, {"line", line}});
        if (in_plan) {
          for (int r = plan.slot_of(a) * plan.nproc; r < (plan.slot_of(a) + 1) * plan.nproc; ++r)
            running[size_t(r)] = false;  // its ranks went with it (no status of theirs will say so)
          if (detected_at < 0) detected_at = now;
          request_stop(attempt, kNodeLostExit, line);
        }
        to_evict_[a] = "its agent stopped answering (node lost)";
      }
      for (int a : plan.nodes) {
        if (ends.count(a) || agents_[size_t(a)].lost) continue;
        read_statuses(attempt, a, plan, running, now, started);
        if (store_.check(proto::end_key(attempt, a))) {
          json j = json::parse(store_.get(proto::end_key(attempt, a), Millis(5000)), nullptr, false);
          try {
            ends[a] = proto::AgentEnd::from_json(j);
          } catch (const json::exception&) {
            ends[a] = proto::AgentEnd{};
            ends[a].code = 1;
          }
        }
      }
      if (stop_code_ == 0 && store_.check(proto::stop_key(attempt))) {
        json j = json::parse(store_.get(proto::stop_key(attempt), Millis(5000)), nullptr, false);
        stop_code_ = j.is_object() ? j.value("code", 1) : 1;  // an agent saw a rank fail (its event says which)
        if (detected_at < 0) detected_at = now;
      }
      if (stop_code_ == 0) check_hang(plan, running, now, &detected_at);
      running_ = running;
      show();
    }
    if (detected_at > 0) events_.write("stopped", {{"by", "driver"}, {"seconds", now_seconds() - detected_at}});

    Outcome out;
    out.best_step = watch_.best_step();
    bool all_ok = stop_code_ == 0;
    int first_code = 0;
    for (int a : plan.nodes) {
      auto it = ends.find(a);
      if (it == ends.end()) {
        all_ok = false;
        continue;
      }
      const proto::AgentEnd& e = it->second;
      out.best_step = std::max(out.best_step, e.best_step);
      out.nonfinite_step = std::max(out.nonfinite_step, e.nonfinite_step);
      for (int r : e.sdc_ranks)
        if (plan.nproc > 0 && r / plan.nproc < int(plan.nodes.size()))
          out.sdc_nodes.insert(plan.nodes[size_t(r / plan.nproc)]);
      if (e.user_stop) {
        out.user_stop = true;
        out.code = e.code;
      }
      if (e.code != 0) {
        all_ok = false;
        if (first_code == 0) first_code = e.code;
      }
    }
    if (out.user_stop) return out;
    out.code = all_ok ? 0 : stop_code_ != 0 ? stop_code_ : first_code != 0 ? first_code : kNodeLostExit;
    // (One agent: no other node to run on if it failed, and no pair for the network check.)
    if (out.code != 0 && opt_.diagnose && several_) diagnose(plan, ends);
    return out;
  }

  // MegaScale's stop-and-check: every node of the failed attempt that is still there runs `megatrain diagnose`,
  // consecutive nodes (by slot) paired for the pairwise check over the network. A node whose check fails is evicted;
  // a failed pairwise check cannot say which end of the link is bad, so both nodes go. A node that does not report
  // within the deadline is lost (its liveness decides), never judged from silence alone.
  void diagnose(const proto::AttemptPlan& plan, const std::map<int, proto::AgentEnd>& ends) {
    std::vector<int> alive;
    for (int a : plan.nodes)
      if (ends.count(a) && !agents_[size_t(a)].lost) alive.push_back(a);
    json pairs = json::object();
    for (size_t i = 0; i + 1 < alive.size(); i += 2)
      for (int k = 0; k < 2; ++k)
        pairs[std::to_string(alive[i + size_t(k)])] = {
            {"group", fmt::format("diag/attempt-{}/pair-{}", plan.attempt, i / 2)}, {"rank", k}};
    store_.set(proto::diagnose_key(plan.attempt), json{{"nodes", alive}, {"pairs", pairs}}.dump());
    const double deadline = now_seconds() + 120;  // the checks take seconds; a pair waits at most 30 s for its peer
    std::set<int> pending(alive.begin(), alive.end());
    while (!pending.empty() && now_seconds() < deadline) {
      std::this_thread::sleep_for(std::chrono::duration<double>(kPollSeconds));
      for (int a : poll_agents(now_seconds())) pending.erase(a), to_evict_[a] = "its agent stopped answering";
      for (auto it = pending.begin(); it != pending.end();) {
        if (!store_.check(proto::diag_key(plan.attempt, *it))) {
          ++it;
          continue;
        }
        const int a = *it;
        json r = json::parse(store_.get(proto::diag_key(plan.attempt, a), Millis(5000)), nullptr, false);
        const bool pass = r.is_object() && r.value("pass", false);
        events_.write("diagnosed", {{"by", "driver"}, {"node", a}, {"pass", pass}, {"report", r}});
        if (!pass) {
          to_evict_[a] = "it failed diagnose after the fault: " + failed_checks(r);
          for (const auto& c : r.is_object() ? r.value("checks", json::array()) : json::array())
            if (c.value("name", "") == "pairwise_bandwidth" && c.value("ran", false) && !c.value("pass", true))
              for (const auto& [b, p] : pairs.items())  // the other end of the failed link
                if (b != std::to_string(a) && p["group"] == pairs[std::to_string(a)]["group"])
                  to_evict_[std::stoi(b)] = fmt::format("its pairwise check with node {} failed", a);
        }
        it = pending.erase(it);
      }
    }
    for (int a : pending) say(fmt::format("driver: node {} did not report its diagnosis within 120 s", a));
  }

  static std::string failed_checks(const json& report) {
    std::vector<std::string> names;
    for (const auto& c : report.value("checks", json::array()))
      if (c.is_object() && c.value("ran", true) && !c.value("pass", true))
        names.push_back(c.value("name", "?") + " (" + c.value("detail", "") + ")");
    return names.empty() ? "a check failed" : fmt::format("{}", fmt::join(names, "; "));
  }

  void read_statuses(int attempt, int a, const proto::AttemptPlan& plan, std::vector<bool>& running, double now,
                     double started) {
    if (!store_.check(proto::status_key(attempt, a))) return;
    json j = json::parse(store_.get(proto::status_key(attempt, a), Millis(5000)), nullptr, false);
    if (!j.is_object() || !j.contains("ranks") || !j["ranks"].is_array()) return;
    for (const auto& r : j["ranks"]) {
      bool alive = true;
      RankStatus s;
      try {
        s = proto::status_from_json(r, now, &alive);
      } catch (const json::exception&) {
        continue;
      }
      if (s.rank < 0 || s.rank >= plan.world()) continue;
      running[size_t(s.rank)] = alive;
      layout_.learn(s);
      WatchUpdate u = watch_.apply_status(size_t(s.rank), s, now);
      if (u.first_step && attempt > 0)
        events_.write("resumed", {{"by", "driver"},
                                  {"rank", s.rank},
                                  {"step", s.step},
                                  {"from", watch_.start_step()},
                                  {"seconds", now - started}});
      if (u.caught_up)
        events_.write("caught_up", {{"by", "driver"}, {"step", watch_.min_step()}, {"seconds", now - started}});
      // (The straggler is whichever rank the step judged now names: not necessarily s.)
      const int slow_node = u.straggler_rank >= 0 ? plan.nodes[size_t(u.straggler_rank / plan.nproc)] : -1;
      if (!u.straggler.empty()) {
        say("driver: " + u.straggler);
        events_.write("warning", {{"by", "driver"},
                                  {"rank", u.straggler_rank},
                                  {"node", slow_node},
                                  {"reason", "straggler"},
                                  {"ratio", u.straggler_ratio},
                                  {"line", u.straggler}});
      }
      if (u.evict_straggler && stop_code_ == 0 && several_) {  // (one agent: nowhere else to go; a warning only)
        const std::string line = fmt::format("rank {} ({}) on node {} stayed a straggler ({:.2f}x) for {} steps",
                                             u.straggler_rank, watch_.status()[size_t(u.straggler_rank)].coord,
                                             slow_node, u.straggler_ratio, opt_.straggler_evict_steps);
        say("driver: " + line + "; stopping the attempt to evict its node");
        events_.write("detected", {{"by", "driver"},
                                   {"reason", "straggler"},
                                   {"rank", u.straggler_rank},
                                   {"node", slow_node},
                                   {"line", line}});
        to_evict_[slow_node] = line;
        request_stop(attempt, kHangExit, line, {}, /*abandon=*/false);
      }
    }
  }

  void check_hang(const proto::AttemptPlan& plan, const std::vector<bool>& running, double now, double* detected_at) {
    auto h = watch_.check_hang(now, running);
    if (!h) return;
    say(fmt::format("driver: hang detected: {}: {}", h->why, h->blame.line));
    detail_ = fmt::format("hang: {}: {}", h->why, h->blame.line);
    std::vector<int> nodes;
    for (int r : h->blame.ranks) {
      const int a = plan.nodes[size_t(r / plan.nproc)];
      if (std::find(nodes.begin(), nodes.end(), a) == nodes.end()) nodes.push_back(a);
      // (One agent: restarted where it is, as nothing could replace its node.)
      if (several_) to_evict_[a] = fmt::format("it held rank {}, blamed for a hang: {}", r, h->blame.line);
    }
    *detected_at = now;
    events_.write("detected", {{"by", "driver"},
                               {"reason", "hang"},
                               {"why", h->why},
                               {"blame", h->blame.line},
                               {"ranks", h->blame.ranks},
                               {"nodes", nodes},
                               {"seconds_since_progress", h->since_progress_s}});
    request_stop(plan.attempt, kHangExit, "hang: " + h->blame.line, h->blame.ranks);
  }

  // The job's last event; a training job's carries its effective training time (useful_time.h), also said.
  void end_job(const std::string& event, json fields) {
    write_job_end(events_, event, std::move(fields), is_train_ ? &watch_.useful() : nullptr, now_seconds() - started_,
                  "driver: ");
  }

  // Publishes the driver's view of every rank of the attempt (plan_, running_). state: "" while an attempt runs
  // (starting, running or stopping then follows from the ranks), else restarting, done or failed.
  void show(const std::string& state = "", const std::string& detail = "") {
    if (!dashboard_) return;
    if (!detail.empty()) detail_ = detail;
    JobView v;
    v.attempt = plan_.attempt;
    v.restarts = tracker_.restarts();
    v.max_restarts = opt_.max_restarts;
    v.nodes = int(plan_.nodes.size());
    v.world = plan_.world();
    v.now = now_seconds();
    v.started = started_;
    v.useful_s = watch_.useful().seconds();
    v.detail = detail_;
    set_ranks(
        v, watch_.status(), running_,
        [this](size_t r) {
          const size_t slot = r / size_t(std::max(1, plan_.nproc));
          return slot < plan_.nodes.size() ? plan_.nodes[slot] : -1;
        },
        stop_code_ != 0);
    if (!state.empty()) v.state = state;
    dashboard_->publish(v);
  }

  const LaunchOptions& opt_;
  Store& store_;
  EventLog& events_;
  Dashboard* dashboard_ = nullptr;
  RestartTracker tracker_;
  JobWatch watch_;
  proto::AttemptPlan plan_;    // the attempt being watched (for the dashboard)
  std::vector<bool> running_;  // ... and which of its ranks live
  std::string detail_;
  const double started_ = now_seconds();
  std::vector<AgentState> agents_;
  std::map<int, std::string> to_evict_;
  SdcStrikes sdc_strikes_;
  Layout layout_;        // as the ranks of the last attempt reported it
  Layout override_;      // what the driver set after a shrink (dp, grad_accum), passed on to every later attempt
  const bool is_train_;  // the command is `train`, whose layout and batches the driver may change
  const bool several_;   // more than one agent: plans, evictions and diagnoses (LaunchOptions::several_agents)
  int stop_code_ = 0;
};

}  // namespace

int run_driver(const LaunchOptions& opt, Store& store, EventLog& events, Dashboard* dashboard, Notifier* notifier) {
  if (dashboard) events.add_observer([dashboard](const nlohmann::json& e) { dashboard->event(e); });
  if (notifier) events.add_observer([notifier](const nlohmann::json& e) { notifier->event(e); });
  return Driver(opt, store, events, dashboard).run();
}

}  // namespace mt::launch
