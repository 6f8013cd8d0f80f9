#include "megatrain/launch/agent.h"

#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "megatrain/comm/local_address.h"
#include "megatrain/comm/store.h"
#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"
#include "megatrain/launch/blas_core.h"
#include "megatrain/launch/dashboard.h"
#include "megatrain/launch/notifier.h"
#include "megatrain/launch/stack_dump.h"
#include "megatrain/launch/useful_time.h"
#include "megatrain/launch/driver.h"
#include "megatrain/launch/event_log.h"
#include "megatrain/launch/job_protocol.h"
#include "megatrain/launch/job_store.h"
#include "megatrain/launch/job_watch.h"
#include "megatrain/launch/node_lease.h"
#include "megatrain/launch/process_util.h"
#include "megatrain/launch/rank_process.h"
#include "megatrain/launch/sdc_strikes.h"
#include "megatrain/launch/rank_status.h"

extern char** environ;

namespace mt::launch {
namespace {

// How long a signalled node 0 waits for the driver to end the job (its gave_up event) before it exits anyway.
constexpr double kDriverEndWaitSeconds = 3.0;

// At most this many blamed ranks of one node get their stacks dumped in one stop (a hang blames one rank, or the
// few that never entered a collective).
constexpr int kMaxStackDumps = 4;

// Lines on a rank's stderr worth an event of their own (the rank may die before it can say more).
constexpr const char* kAlerts[] = {"NCCL WARN",          "CUDA error",       "out of memory",
                                   "Segmentation fault", "terminate called", "Bus error"};

// How one attempt ended.
struct AttemptEnd {
  int code = 0;                // 0: every rank exited 0
  bool user_stop = false;      // the agent was signalled: no restart
  int best_step = 0;           // the highest step any rank reported
  int nonfinite_step = -1;     // the step a rank reported a non-finite loss at, if it did
  std::vector<int> sdc_ranks;  // ranks named as a silent data corruption's culprit (sdc_strikes.h)
  std::string detected;        // what this agent saw fail, if anything
};

// Where this attempt's ranks sit in the job: the first global rank, the world, and what the command gets appended.
struct Placement {
  int first = 0, world = 0;
  std::vector<std::string> extra_args;
};

class Agent {
 public:
  explicit Agent(const LaunchOptions& o) : opt_(o), watch_(watch_options(o)) {}

  int run() {
    // Before the signal mask and the threads: the self-tests are children of their own (launch/blas_core.h).
    const BlasCoreDecision blas = opt_.exec || blas_core_decided() ? BlasCoreDecision{} : choose_blas_core();
    setup_signals();
    store_ = open_job_store(opt_);
    events_.open(opt_.events, opt_.node_rank);
    open_notifier();
    open_dashboard();
    base_env_ = inherited_env();
    if (!opt_.exec) give_ranks_blas_core(blas);
    spec_.argv = opt_.args;
    spec_.search_path = opt_.exec;
    spec_.child_mask = old_mask_;
    spec_.heartbeat = true;
    if (!opt_.exec) {  // ARGS are a subcommand of this very binary
      char buf[PATH_MAX];
      ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
      MT_CHECK(n > 0, "cannot resolve /proc/self/exe: {}", std::strerror(errno));
      spec_.argv.insert(spec_.argv.begin(), std::string(buf, size_t(n)));
      // Executed through /proc/self/exe (the forked child's own image, which is the agent's): every attempt runs
      // the very binary the job started with, even after the file was rebuilt or replaced under a running job
      // (then its path reads "... (deleted)" and could not be executed at all).
      spec_.exec_path = "/proc/self/exe";
    }

    return opt_.driven() ? run_driven() : run_unsupervised();
  }

 private:
  bool trains() const { return opt_.trains(); }

  // A multi-node job without the driver (no --max-restarts, no --spares): this node's ranks run once, judged by this
  // agent alone (a crash, a hang of its own ranks), and the first failure ends this node's part of the job.
  int run_unsupervised() {
    Placement where;
    where.first = opt_.node_rank * opt_.nproc;
    where.world = opt_.nnodes * opt_.nproc;
    AttemptEnd end = run_attempt(0, where);
    const std::string reason = end.code == 0          ? "every rank finished"
                               : end.user_stop        ? "the launcher was signalled"
                               : end.detected.empty() ? fmt::format("the attempt failed (code {})", end.code)
                                                      : end.detected;
    write_job_end(events_, end.code == 0 ? "done" : "gave_up",
                  {{"exit_code", end.code}, {"best_step", end.best_step}, {"reason", reason}},
                  trains() ? &watch_.useful() : nullptr, now_seconds() - job_started_, "");
    return end.code;
  }

  // ---- one attempt --------------------------------------------------------------------------------------------
  AttemptEnd run_attempt(int attempt, const Placement& where) {
    attempt_ = attempt;
    stopping_ = killed_ = user_stop_ = false;
    exit_code_ = 0;
    detected_at_ = -1;
    nonfinite_step_ = -1;
    sdc_ranks_.clear();
    detected_.clear();
    ranks_.clear();

    const int first = where.first, world = where.world;
    const std::string prefix = fmt::format("attempt-{}", attempt);
    const bool fresh_prefix = opt_.max_restarts > 0;
    SpawnSpec spec = spec_;
    for (const auto& a : where.extra_args) spec.argv.push_back(a);
    say(fmt::format("{}starting {} (global {}..{} of {}), store {}",
                    attempt > 0 ? fmt::format("attempt {}: ", attempt) : "", plural(opt_.nproc, "rank"), first,
                    first + opt_.nproc - 1, world, store_.url));
    ranks_.resize(size_t(opt_.nproc));
    std::vector<int> globals;
    for (int i = 0; i < opt_.nproc; ++i) globals.push_back(first + i);
    watch_.reset(globals, now_seconds(), 0);  // (progress across attempts is the driver's to judge)
    for (int i = 0; i < opt_.nproc && !stopping_; ++i) {
      std::vector<std::string> env = base_env_;
      for (auto [k, v] : {std::pair<const char*, std::string>{"RANK", std::to_string(first + i)},
                          {"WORLD_SIZE", std::to_string(world)},
                          {"LOCAL_RANK", std::to_string(i)},
                          {"LOCAL_WORLD_SIZE", std::to_string(opt_.nproc)},
                          {"MASTER_ADDR", store_.master_addr},
                          {"MASTER_PORT", std::to_string(store_.master_port)},
                          {"MEGATRAIN_STORE", store_.url},
                          {kStoreSecretEnv, store_.secret},
                          {"MEGATRAIN_ATTEMPT", std::to_string(attempt)},
                          {"MEGATRAIN_NODE_RANK", std::to_string(opt_.node_rank)}})
        env.push_back(fmt::format("{}={}", k, v));
      if (fresh_prefix) env.push_back("MEGATRAIN_STORE_PREFIX=" + prefix);
      // Under the driver: the keys whose existence tells a rank the job went on without its attempt
      // (train/attempt_fence.h): the next attempt's plan, this node's eviction, the job's end.
      if (opt_.driven() && opt_.several_agents())
        env.push_back(fmt::format("MEGATRAIN_FENCE_KEYS={},{},{}", proto::plan_key(attempt + 1),
                                  proto::evicted_key(opt_.node_rank), proto::kDoneKey));
      if (!opt_.iface.empty()) env.push_back(fmt::format("{}={}", kIfaceEnv, opt_.iface));
      RankProcess& r = ranks_[size_t(i)];
      r.global = first + i;
      if (std::string why = r.spawn(spec, env, !opt_.no_prefix); !why.empty()) {
        abort_start(why);
        break;
      }
      {
        std::lock_guard<std::mutex> lock(groups_mu_);
        live_groups_.push_back(r.pid);
      }
      r.hb.set_hook([this, i](const std::string& line) { on_heartbeat(size_t(i), line); });
      r.err.set_hook([this, i](const std::string& line) { on_stderr(size_t(i), line); });
    }
    events_.write("started", {{"ranks", opt_.nproc},
                              {"first_rank", first},
                              {"world", world},
                              {"store_prefix", fresh_prefix ? prefix : ""},
                              {"extra_args", where.extra_args}});
    in_attempt_ = true;
    supervise();
    in_attempt_ = false;
    {
      std::lock_guard<std::mutex> lock(groups_mu_);
      live_groups_.clear();  // every rank was reaped: their group ids may be reused from now on
    }
    // Under the driver, it says when the attempt's ranks on every node are gone.
    if (!opt_.driven() && detected_at_ > 0) events_.write("stopped", {{"seconds", now_seconds() - detected_at_}});
    AttemptEnd end;
    end.code = exit_code_;
    end.user_stop = user_stop_;
    end.best_step = watch_.best_step();
    end.nonfinite_step = nonfinite_step_;
    end.sdc_ranks = sdc_ranks_;
    end.detected = detected_;
    return end;
  }

  // ---- what the ranks say -------------------------------------------------------------------------------------
  void on_heartbeat(size_t i, const std::string& line) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return;  // a torn or foreign line: ignore, the next one comes soon
    try {
      read_heartbeat(i, j);
    } catch (const nlohmann::json::exception&) {
      // A field of the wrong type: whatever a rank writes must not bring down its agent.
    }
  }

  void read_heartbeat(size_t i, const nlohmann::json& j) {
    const double now = now_seconds();
    if (j.value("type", "") == "event") return on_rank_event(i, j);
    WatchUpdate u = watch_.apply_heartbeat(i, j, now);
    // Under the job driver these are the driver's to judge, from every node's ranks (the statuses published here).
    if (opt_.driven()) return;
    if (!u.straggler.empty()) {  // every collective waits for it; warned once per rank per attempt
      say(u.straggler);
      events_.write("warning", {{"rank", u.straggler_rank},
                                {"reason", "straggler"},
                                {"ratio", u.straggler_ratio},
                                {"line", u.straggler}});
    }
  }

  int rank_of(size_t i) const { return ranks_[i].global; }

  void on_rank_event(size_t i, const nlohmann::json& j) {
    const std::string what = j.value("event", "");
    nlohmann::json f = {{"rank", rank_of(i)}, {"reason", what}, {"detail", j}};
    // sdc: a rank whose parameters differ from its data-parallel replicas' (train/sdc_check.h) names itself, the
    // step and the first differing tensor; the error that follows on every rank restarts the job. sdc_culprit: the
    // rerun of such a step (dp = 2: no majority) found the rank that did not reproduce its own result.
    if (what == "non_finite" || what == "error" || what == "sdc" || what == "sdc_culprit") {
      if (what == "non_finite" && j.contains("step") && j["step"].is_number_integer())
        nonfinite_step_ = j["step"].get<int>();
      if (names_sdc_culprit(what, j.value("no_majority", false))) sdc_ranks_.push_back(rank_of(i));
      events_.write("fault", f);
    } else if (what == "fault_injected") {
      events_.write("injected", f);
    } else {
      events_.write("warning", f);
    }
  }

  void on_stderr(size_t i, const std::string& line) {
    for (const char* a : kAlerts)
      if (line.find(a) != std::string::npos) {
        events_.write("warning", {{"rank", rank_of(i)}, {"reason", "alert"}, {"line", line.substr(0, 500)}});
        return;
      }
  }

  std::vector<bool> running_flags() const {
    std::vector<bool> v;
    for (const auto& r : ranks_) v.push_back(r.running);
    return v;
  }

  // Hangs of this node's ranks, without the driver (which otherwise judges every node's ranks together).
  void check_hang(double now) {
    if (stopping_) return;
    auto h = watch_.check_hang(now, running_flags());
    if (!h) return;
    say(fmt::format("hang detected: {}: {}", h->why, h->blame.line));
    detected_ = fmt::format("hang: {}: {}", h->why, h->blame.line);
    detected_at_ = now;
    events_.write("detected", {{"reason", "hang"},
                               {"why", h->why},
                               {"blame", h->blame.line},
                               {"ranks", h->blame.ranks},
                               {"seconds_since_progress", h->since_progress_s}});
    exit_code_ = kHangExit;  // the ranks' own codes only say they were stopped
    begin_stop(SIGTERM, h->blame.ranks, /*abandon=*/true);
  }

  // ---- under the job driver ------------------------------------------------------------------------------------
  // The loop of an agent of a supervised job (every one-node job, and a multi-node one with restarts or spares):
  // register, then run whatever attempt the driver plans for this node (or wait as a spare), until the driver says
  // the job is done or this node is evicted.
  int run_driven() {
    ctl_ = connect_job_store(store_);
    std::unique_ptr<Store> driver_store;
    std::thread driver;
    std::atomic<int> driver_code{-1};
    std::atomic<bool> driver_done{false};
    if (opt_.node_rank == 0) {  // the driver lives in node 0's agent, beside the store it serves
      driver_store = connect_job_store(store_);
      driver = std::thread([&] {
        EventLog log;
        try {
          log.open(opt_.events, 0);
        } catch (const std::exception& e) {
          say(fmt::format("driver: no event log: {}", e.what()));
        }
        driver_code = run_driver(opt_, *driver_store, log, dashboard_.get(), notifier_.get());
        driver_done = true;
      });
    }
    std::atomic<bool> quit{false};
    lease_ = std::make_unique<NodeLease>(opt_.node_timeout_s);
    std::thread alive([&] { keep_alive(quit); });
    // Node 0 serves the store and runs the driver: it cannot be cut off from them, and must outlive every lease.
    std::thread fence;
    if (opt_.node_rank != 0) fence = std::thread([&] { fence_watch(quit); });
    int code = 0;
    try {
      code = driven_loop();
    } catch (const std::exception& e) {  // the store failed under us: nothing to coordinate with any more
      say(fmt::format("the job store: {}", e.what()));
      code = lost_store_exit();
    }
    quit = true;
    alive.join();
    if (fence.joinable()) fence.join();
    if (driver.joinable()) {
      if (code >= 128) {
        // Signalled: the driver reads proto::kUserStopKey (or this node's end record) and ends the job within a poll
        // or two. A driver stuck longer (a store call, a diagnosis) is not waited for: the process ends here, and
        // the driver with it.
        for (const double until = now_seconds() + kDriverEndWaitSeconds; !driver_done && now_seconds() < until;)
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        if (!driver_done) {
          if (notifier_) notifier_->close();  // what the driver said so far still goes out
          std::fflush(nullptr);
          std::_Exit(code);
        }
      }
      driver.join();
      code = driver_code;
    }
    return code;
  }

  int driven_loop() {
    proto::AgentHello hello;
    hello.agent = opt_.node_rank;
    hello.nproc = opt_.nproc;
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    hello.host = host;
    if (opt_.node_rank >= opt_.nnodes && opt_.diagnose) {  // a spare proves itself before it may be enlisted
      say(fmt::format("spare node {}: checking this node (megatrain diagnose)", opt_.node_rank));
      hello.diagnosis = diagnose_node();
    }
    ctl_->set(proto::agent_key(opt_.node_rank), hello.to_json().dump());
    if (opt_.several_agents())
      say(fmt::format("node {} registered{}; waiting for the driver's plan", opt_.node_rank,
                      opt_.node_rank >= opt_.nnodes ? " as a spare" : ""));
    for (int attempt = 0;; ++attempt) {
      std::optional<proto::AttemptPlan> plan;
      if (int c = wait_for_plan(attempt, &plan); c >= 0) return c;
      events_.set_attempt(attempt);
      const int slot = plan->slot_of(opt_.node_rank);
      if (slot < 0) continue;  // a spare, or a node left out of this attempt
      Placement where;
      where.first = slot * opt_.nproc;
      where.world = plan->world();
      where.extra_args = plan->extra_args;
      AttemptEnd end = run_attempt(attempt, where);
      proto::AgentEnd rec;
      rec.code = end.code;
      rec.user_stop = end.user_stop;
      rec.best_step = end.best_step;
      rec.nonfinite_step = end.nonfinite_step;
      rec.sdc_ranks = end.sdc_ranks;
      rec.detected = end.detected;
      if (store_lost_) return lost_store_exit();
      // The ranks' last steps before the end: the driver reads statuses every half second, and would otherwise
      // miss the progress of an attempt shorter than that (no "resumed" event for a restart near the end).
      try {
        publish_status(now_seconds());
      } catch (const std::exception&) {
        store_lost_ = true;
        return lost_store_exit();
      }
      ctl_->set(proto::end_key(attempt, opt_.node_rank), rec.to_json().dump());
      if (end.user_stop) return end.code;
      // (also after this node's own ranks finished: the attempt may have failed elsewhere)
      if (opt_.diagnose) diagnose_on_request(attempt);
    }
  }

  // After a failed attempt the driver asks the surviving nodes to check themselves, in pairs over the network
  // (MegaScale's stop-and-check): wait for its request (or the next plan, or the job's end), run diagnose, report.
  void diagnose_on_request(int attempt) {
    const std::string me = std::to_string(opt_.node_rank);
    for (;;) {
      if (ctl_->check(proto::diagnose_key(attempt))) break;
      if (ctl_->check(proto::plan_key(attempt + 1)) || ctl_->check(proto::kDoneKey) ||
          ctl_->check(proto::evicted_key(opt_.node_rank)) || store_lost_ || !wait_watching_signals(0.2))
        return;
    }
    auto req = nlohmann::json::parse(ctl_->get(proto::diagnose_key(attempt), Millis(5000)), nullptr, false);
    std::string group;
    int pair_rank = 0;
    if (req.is_object() && req.contains("pairs") && req["pairs"].contains(me)) {
      group = req["pairs"][me].value("group", "");
      pair_rank = req["pairs"][me].value("rank", 0);
    }
    nlohmann::json report = diagnose_node(group, pair_rank);
    ctl_->set(proto::diag_key(attempt, opt_.node_rank), report.dump());
  }

  int lost_store_exit() {
    say("the job store (node 0: the driver) cannot be reached; this node's part of the job ends");
    events_.write("gave_up", {{"exit_code", 22}, {"reason", "the job store is gone"}});
    return 22;
  }

  // Waits for attempt `attempt`'s plan. Returns -1 with the plan, or the code this agent exits with (the job is
  // done, this node was evicted, the store is gone, the agent was signalled).
  int wait_for_plan(int attempt, std::optional<proto::AttemptPlan>* plan) {
    for (;;) {
      try {
        if (ctl_->check(proto::kDoneKey)) {
          const int code = std::atoi(ctl_->get(proto::kDoneKey, Millis(5000)).c_str());
          ctl_->set(proto::done_ack_key(opt_.node_rank), "1");  // the driver keeps the store up until it reads this
          if (opt_.node_rank != 0) events_.write(code == 0 ? "done" : "gave_up", {{"exit_code", code}});
          return code;
        }
        if (ctl_->check(proto::evicted_key(opt_.node_rank))) {
          const std::string why = ctl_->get(proto::evicted_key(opt_.node_rank), Millis(5000));
          if (opt_.node_rank == 0) {
            // Node 0 keeps the store and the driver: it stays up, without ranks, until the job is done.
            if (!evicted_said_) say(fmt::format("this node was evicted ({}); it keeps serving the driver", why));
            evicted_said_ = true;
          } else {
            say(fmt::format("this node was evicted by the driver: {}", why));
            return kEvictedExit;
          }
        }
        if (ctl_->check(proto::plan_key(attempt))) {
          auto j = nlohmann::json::parse(ctl_->get(proto::plan_key(attempt), Millis(5000)));
          *plan = proto::AttemptPlan::from_json(j);
          return -1;
        }
      } catch (const nlohmann::json::exception& e) {
        say(fmt::format("the driver's plan of attempt {} is unreadable: {}", attempt, e.what()));
        return 1;
      } catch (const std::exception& e) {
        say(fmt::format("the job store: {}", e.what()));
        return lost_store_exit();
      }
      if (store_lost_) return lost_store_exit();
      if (!wait_watching_signals(0.2)) return exit_code_;
    }
  }

  // Bumps this agent's liveness counter (every second, or a quarter of --node-timeout when that is shorter) from its
  // own thread and store client, so the driver sees a live node even while the main loop waits on a slow rank or a
  // diagnosis. Each acknowledged bump renews the node's lease (node_lease.h).
  void keep_alive(std::atomic<bool>& quit) {
    std::unique_ptr<Store> s;
    int failures = 0;
    while (!quit) {
      const double next = now_seconds() + lease_->renew_interval();
      try {
        // Once the lease runs, a reconnection may take no longer than the lease: past it the node leaves anyway,
        // and the agent's exit (which joins this thread) must not wait out the client's 30 s for a store that died.
        if (!s)
          s = connect_job_store(store_, lease_->armed() ? Millis(int64_t(1000 * lease_->length())) : Millis(30000));
        const double sent = now_seconds();
        s->add(proto::alive_key(opt_.node_rank), 1);
        lease_->renewed(sent);
        failures = 0;
      } catch (const std::exception&) {
        s.reset();
        if (++failures >= 3) store_lost_ = true;  // (the client itself already retried for seconds)
      }
      while (!quit && now_seconds() < next) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  // The other half of the lease: once it lapses, this node's ranks must be gone before the driver declares the node
  // lost and the job goes on without it (node_lease.h says what they would do otherwise). Its own thread, because
  // the main loop may be stuck in a store call for the client's whole timeout (30 s) when the network is gone.
  // The ranks get SIGKILL, not a grace period: they are cut off, no step boundary they could reach would help, and
  // a rank that dies of its own lost peer is exactly what must not happen. Then the agent leaves (exit 22, as for a
  // lost store): the driver has evicted, or is about to evict, this node. (The ranks' last output, still in their
  // pipes, is not copied out: the agent does not wait for anything any more.)
  void fence_watch(std::atomic<bool>& quit) {
    while (!quit) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const double now = now_seconds();
      if (!lease_->lapsed(now)) continue;
      const double age = lease_->age(now);
      std::vector<pid_t> groups;
      {
        std::lock_guard<std::mutex> lock(groups_mu_);
        groups = live_groups_;
      }
      for (pid_t g : groups) ::killpg(g, SIGKILL);
      say(fmt::format("this node's last acknowledged liveness bump was sent {:.1f} s ago (the driver declares a node "
                      "lost after {:.0f} s without one): its lease lapsed; {}leaving the job",
                      age, opt_.node_timeout_s,
                      groups.empty() ? ""
                                     : fmt::format("killed its {} so that none of them acts after the job goes "
                                                   "on without this node; ",
                                                   plural(int(groups.size()), "rank"))));
      events_.write("fenced",
                    {{"lease_age_s", age}, {"node_timeout_s", opt_.node_timeout_s}, {"ranks_killed", groups.size()}});
      std::fflush(nullptr);
      std::_Exit(22);  // the ranks' PR_SET_PDEATHSIG covers any started since the copy was taken
    }
  }

  // Every half second of an attempt: publish this node's ranks' statuses, and stop when the attempt is stopped.
  void driven_tick(double now) {
    if (store_lost_) {
      if (!stopping_) {
        say("the job store (node 0: the driver) is gone; stopping this node's ranks");
        exit_code_ = 22;
        begin_stop(SIGTERM, {}, /*abandon=*/true);
      }
      return;
    }
    try {
      publish_status(now);
      if (!stopping_ && ctl_->check(proto::stop_key(attempt_))) {
        auto j = nlohmann::json::parse(ctl_->get(proto::stop_key(attempt_), Millis(5000)), nullptr, false);
        const std::string why = j.is_object() ? j.value("reason", "") : "";
        say(fmt::format("the attempt was stopped ({}); stopping this node's {}", why, plural(running_count(), "rank")));
        exit_code_ = j.is_object() ? j.value("code", 1) : 1;
        std::vector<int> blamed;  // the driver names the ranks blamed for a hang (see begin_stop)
        if (j.is_object() && j.contains("kill_now") && j["kill_now"].is_array())
          for (const auto& r : j["kill_now"])
            if (r.is_number_integer()) blamed.push_back(r.get<int>());
        begin_stop(SIGTERM, blamed, j.is_object() && j.value("abandon", false));
      }
    } catch (const std::exception& e) {
      say(fmt::format("the job store: {}", e.what()));
      store_lost_ = true;
    }
  }

  // This node's ranks' statuses, for the driver's hang, straggler and progress watch.
  void publish_status(double now) {
    nlohmann::json ranks = nlohmann::json::array();
    const auto running = running_flags();
    for (size_t i = 0; i < watch_.status().size(); ++i)
      ranks.push_back(proto::status_to_json(watch_.status()[i], running[i], now));
    ctl_->set(proto::status_key(attempt_, opt_.node_rank), nlohmann::json{{"ranks", ranks}}.dump());
  }

  // Tells every node that this attempt failed here (driven mode only; the first word stands). abandon: as begin_stop's.
  void announce_stop(const std::string& why, bool abandon) {
    if (!opt_.driven() || !ctl_ || store_lost_ || !in_attempt_) return;
    try {
      if (!ctl_->check(proto::stop_key(attempt_)))
        ctl_->set(proto::stop_key(attempt_), nlohmann::json{{"by", fmt::format("node {}", opt_.node_rank)},
                                                            {"code", std::max(1, exit_code_)},
                                                            {"reason", why},
                                                            {"abandon", abandon}}
                                                 .dump());
    } catch (const std::exception&) {
      store_lost_ = true;
    }
  }

  // Tells the driver the job ends with this agent's signal, also between attempts (when no attempt's stop key or end
  // record could say so).
  void announce_user_stop() {
    if (!opt_.driven() || !ctl_ || store_lost_) return;
    try {
      if (!ctl_->check(proto::kUserStopKey)) ctl_->set(proto::kUserStopKey, std::to_string(exit_code_));
    } catch (const std::exception&) {
      store_lost_ = true;
    }
  }

  // `megatrain diagnose --json` on this node, as a child process (this process has threads; the checks fork
  // ranks of their own). The report, or {"pass": false, "error": ...} when it could not run.
  // With a pair group, the pairwise check with the neighbour the driver named runs too (over the job store).
  nlohmann::json diagnose_node(const std::string& pair_group = "", int pair_rank = 0) {
    char tmpl[] = "/tmp/mt-diagnose-XXXXXX";
    int fd = ::mkstemp(tmpl);
    if (fd < 0) return {{"pass", false}, {"error", std::string("mkstemp: ") + std::strerror(errno)}};
    ::close(fd);
    std::string expect;  // single-quoted for the shell, a ' inside as '\''
    for (char c : opt_.diagnose_expect) expect += c == '\'' ? std::string("'\\''") : std::string(1, c);
    std::string cmd = fmt::format("MEGATRAIN_NODE_RANK={} /proc/{}/exe diagnose --json --node {} --local-ranks {}{}",
                                  opt_.node_rank, ::getpid(), opt_.node_rank, std::max(2, opt_.nproc),
                                  expect.empty() ? "" : " --expect '" + expect + "'");
    char secret_path[] = "/tmp/mt-diagnose-secret-XXXXXX";  // mkstemp makes it mode 600
    bool secret_file = false;
    if (!pair_group.empty()) {
      const std::string addr = !opt_.iface.empty() ? opt_.iface
                                                   : route_source_address(store_.master_addr, store_.master_port);
      cmd += fmt::format(" --pair-store {} --pair-group {} --pair-rank {} --iface {}", store_.url, pair_group,
                         pair_rank, addr);
      // The store's secret goes through a private file, never a command line (ps shows those).
      if (int sfd = ::mkstemp(secret_path); sfd >= 0) {
        write_all(sfd, store_.secret.data(), store_.secret.size());
        ::close(sfd);
        secret_file = true;
        cmd += fmt::format(" --secret-file {}", secret_path);
      }
    }
    cmd += fmt::format(" > {} 2>&1 < /dev/null", tmpl);
    const double t0 = now_seconds();
    // (system() runs /bin/sh with SIGCHLD blocked in this thread, which is what a signalfd loop needs anyway)
    const int st = std::system(cmd.c_str());
    if (secret_file) ::unlink(secret_path);
    std::ifstream f(tmpl);
    std::stringstream ss;
    ss << f.rdbuf();
    ::unlink(tmpl);
    nlohmann::json report;
    std::string line, last;
    while (std::getline(ss, line))
      if (!line.empty() && line[0] == '{') last = line;
    report = nlohmann::json::parse(last, nullptr, false);
    if (!report.is_object())
      report = {{"pass", false},
                {"error", fmt::format("diagnose {}: {}", describe_status(st), ss.str().substr(0, 500))}};
    report["seconds"] = now_seconds() - t0;
    events_.write("diagnosed", {{"pass", report.value("pass", false)}, {"report", report}});
    return report;
  }

  // ---- processes and signals ----------------------------------------------------------------------------------
  // Signals arrive through a signalfd, so they are blocked before any thread (the store server) exists and every
  // thread inherits the mask. Children get the original mask back before exec. SIGINT / SIGHUP that the caller
  // ignores (nohup, a background job of a script) stay ignored, for the agent and its ranks alike.
  void setup_signals() {
    sigset_t set;
    sigemptyset(&set);
    for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) {
      struct sigaction sa {};
      ::sigaction(s, nullptr, &sa);
      if (sa.sa_handler != SIG_IGN || s == SIGTERM || s == SIGCHLD) sigaddset(&set, s);
    }
    MT_CHECK(::sigprocmask(SIG_BLOCK, &set, &old_mask_) == 0, "sigprocmask: {}", std::strerror(errno));
    sigfd_ = ::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    MT_CHECK(sigfd_ >= 0, "signalfd: {}", std::strerror(errno));
    ::signal(SIGPIPE, SIG_IGN);
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  }

  std::vector<std::string> inherited_env() {
    std::set<std::string> ours = {"RANK",
                                  "WORLD_SIZE",
                                  "LOCAL_RANK",
                                  "LOCAL_WORLD_SIZE",
                                  "MASTER_ADDR",
                                  "MASTER_PORT",
                                  "MEGATRAIN_STORE",
                                  kStoreSecretEnv,
                                  "MEGATRAIN_ATTEMPT",
                                  "MEGATRAIN_NODE_RANK",
                                  "MEGATRAIN_STORE_PREFIX",
                                  "MEGATRAIN_HEARTBEAT_FD",
                                  "MEGATRAIN_FENCE_KEYS"};
    if (!opt_.iface.empty()) ours.insert(kIfaceEnv);
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      std::string kv = *e;
      if (!ours.count(kv.substr(0, kv.find('=')))) env.push_back(kv);
    }
    return env;
  }

  // The OpenBLAS core the ranks (this binary's subcommands) run, chosen once for the node before any starts
  // (launch/blas_core.h): each rank would otherwise pay the self-tests, or a re-exec, itself.
  void give_ranks_blas_core(const BlasCoreDecision& d) {
    if (blas_core_decided()) return;  // an outer launcher chose; base_env_ carries it
    for (const std::string& kv : blas_core_env(d)) {
      const std::string key = kv.substr(0, kv.find('=') + 1);
      std::erase_if(base_env_, [&](const std::string& e) { return e.rfind(key, 0) == 0; });
      base_env_.push_back(kv);
    }
    if (d.action == BlasCoreAction::Use) say(fmt::format("ranks run OpenBLAS core {}: {}", d.core, d.reason));
  }

  void abort_start(const std::string& why) {
    say(why + "; stopping the ranks already started");
    if (exit_code_ == 0) exit_code_ = 1;
    begin_stop(SIGTERM, {}, /*abandon=*/true);
  }

  int running_count() const {
    return int(std::count_if(ranks_.begin(), ranks_.end(), [](const RankProcess& r) { return r.running; }));
  }

  // Signals every rank's process group, including groups whose leader already exited (its children may live on).
  void signal_all(int sig) {
    for (auto& r : ranks_)
      if (r.pid > 0) ::killpg(r.pid, sig);
  }

  // Stops every rank: `sig` now, SIGKILL after the grace period. The ranks in `kill_now` (global ranks blamed for a
  // hang) get SIGKILL at once. Why: a rank stuck in a collective (or stopped) never reaches the step boundary where
  // SIGTERM is honoured, so its grace period is pure lost time; and while it lives its peers stay blocked in their
  // collectives with it, so they would be killed after the grace too, holding their in-memory snapshots. Killed at
  // once, it closes its connections: the peers' collectives fail as a lost peer, they write their snapshots for the
  // restart (fast checkpoints) and exit by themselves.
  //
  // abandon (a stop because a rank or node failed, not the user's or a straggler's): training ranks first get SIGUSR1,
  // so that any of them waiting for a collective gives up at once instead of waiting for a peer that may never
  // answer (core/stop_request.h): it writes its in-memory snapshots for the restart and exits 22 within a moment,
  // where it would otherwise sit out the grace period and die by SIGKILL with its snapshots. A stop that is not a
  // failure keeps the ranks' way to a step boundary and a checkpoint there.
  void begin_stop(int sig, const std::vector<int>& kill_now = {}, bool abandon = false) {
    if (stopping_) return;
    stopping_ = true;
    dump_blamed_stacks(kill_now);  // before anything disturbs them
    kill_at_ = now_seconds() + opt_.grace;
    if (abandon && trains()) signal_all(SIGUSR1);
    for (auto& r : ranks_)
      if (r.running && r.pid > 0 && std::find(kill_now.begin(), kill_now.end(), r.global) != kill_now.end()) {
        say(fmt::format("rank {} (pid {}) is blamed for the hang; killing it now", r.global, r.pid));
        ::killpg(r.pid, SIGKILL);
      }
    signal_all(sig);
  }

  // The native stacks of this node's ranks blamed for a hang (stack_dump.h), at most kMaxStackDumps of them, each
  // in a file beside the event log (stacks/attempt-A-rank-R.txt) and as a `stacks` event naming each thread's
  // innermost megatrain function. It delays the stop by gdb's time (a second or two a rank): a hang already cost
  // far more, and without the stacks a hang that comes back is a guess.
  void dump_blamed_stacks(const std::vector<int>& blamed) {
    if (!opt_.stack_dumps) return;
    int dumped = 0;
    for (auto& r : ranks_) {
      if (!r.running || r.pid <= 0 || std::find(blamed.begin(), blamed.end(), r.global) == blamed.end()) continue;
      if (dumped++ == kMaxStackDumps) {
        say(fmt::format("stacks: only the first {} blamed ranks of this node are dumped", kMaxStackDumps));
        break;
      }
      StackDump d = dump_stacks(r.pid, opt_.stack_timeout_s);
      nlohmann::json f = {{"rank", r.global}, {"pid", r.pid}, {"seconds", d.seconds}, {"frames", d.frames}};
      if (!d.error.empty()) f["error"] = d.error;
      if (!opt_.events.empty() && !d.text.empty()) {
        const std::filesystem::path file = std::filesystem::path(opt_.events).parent_path() / "stacks" /
                                           fmt::format("attempt-{}-rank-{}.txt", attempt_, r.global);
        std::error_code ec;
        std::filesystem::create_directories(file.parent_path(), ec);
        std::ofstream(file) << d.text;
        f["file"] = file.string();
      }
      say(d.error.empty() ? fmt::format("rank {}'s stacks ({} s): {}{}", r.global, fmt::format("{:.1f}", d.seconds),
                                        fmt::join(d.frames, "; "),
                                        f.contains("file") ? " (all in " + f["file"].get<std::string>() + ")" : "")
                          : fmt::format("rank {}'s stacks: {}", r.global, d.error));
      events_.write("stacks", f);
    }
  }

  // ---- the dashboard and the webhook ------------------------------------------------------------------------
  // Both live in node 0's process and belong to the job driver (driver.h), which publishes its view of every rank
  // and feeds them its events; only a job with the driver has them (cli/cmd_launch.cpp refuses them otherwise). Node
  // 0's agent creates them before the driver's thread starts. With one agent, its own events (a rank's exit, a
  // fault, the stacks) are the job's too, so they go to both as well; with several, each node's agent events stay in
  // its log, and a message per node would repeat what the driver says once.
  void open_dashboard() {
    if (opt_.dashboard.empty() || opt_.node_rank != 0) return;
    dashboard_ = std::make_unique<Dashboard>(opt_.dashboard, opt_.dashboard_token, opt_.dashboard_tls);
    if (!opt_.several_agents()) events_.add_observer([this](const nlohmann::json& e) { dashboard_->event(e); });
    const std::string url = dashboard_->url();
    say(fmt::format("dashboard: {} (state as JSON: {}api/job, Prometheus: {}metrics){}", url, url, url,
                    opt_.dashboard_token.empty() ? "" : "; every request needs the token (?token=, or Bearer)"));
    if (opt_.dashboard_tls.enabled()) {  // (an expiry under a week away is said by the first publish: a notice)
      const TlsCertInfo& c = dashboard_->certificate();
      say(fmt::format("dashboard: HTTPS with {} ({}), valid until {}", opt_.dashboard_tls.cert, c.subject,
                      c.not_after));
    }
    events_.write("dashboard", {{"url", url}});
  }

  void open_notifier() {
    if (opt_.notify.empty() || opt_.node_rank != 0) return;
    NotifyOptions n;
    n.url = opt_.notify;
    n.events = opt_.notify_events;
    n.ca_file = opt_.notify_ca;
    n.job = opt_.job_name;
    notifier_ = std::make_unique<Notifier>(n, [](const std::string& line) { say(line); });
    if (!opt_.several_agents()) events_.add_observer([this](const nlohmann::json& e) { notifier_->event(e); });
  }

  void on_rank_exit(RankProcess& r, int st) {
    r.running = false;
    bool failed = !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (!failed || stopping_) return;  // exits caused by a stop are expected, not news
    say(fmt::format("rank {} (pid {}) {}; stopping the other {}", r.global, r.pid, describe_status(st),
                    plural(running_count(), "rank")));
    detected_at_ = now_seconds();
    events_.write("detected", {{"reason", "exit"},
                               {"rank", r.global},
                               {"status", describe_status(st)},
                               {"code", exit_code_of(st)}});
    exit_code_ = std::max(1, exit_code_of(st));
    detected_ = fmt::format("rank {} {}", r.global, describe_status(st));
    announce_stop(detected_, /*abandon=*/true);
    begin_stop(SIGTERM, {}, /*abandon=*/true);
  }

  void reap() {
    for (;;) {
      int st = 0;
      pid_t pid = ::waitpid(-1, &st, WNOHANG);
      if (pid <= 0) return;
      for (auto& r : ranks_)
        if (r.pid == pid && r.running) on_rank_exit(r, st);
      // Any other pid is an orphaned descendant handed to us as subreaper: reaping it is all it needs.
    }
  }

  void on_signals() {
    signalfd_siginfo si;
    while (::read(sigfd_, &si, sizeof si) == ssize_t(sizeof si)) {
      int sig = int(si.ssi_signo);
      if (sig == SIGCHLD) {
        reap();
      } else if (!stopping_ || !user_stop_) {
        const char* name = ::sigabbrev_np(sig);
        say(fmt::format("received SIG{}; stopping {}", name ? name : std::to_string(sig),
                        plural(running_count(), "rank")));
        exit_code_ = 128 + sig;
        user_stop_ = true;
        announce_stop(fmt::format("the agent of node {} was signalled", opt_.node_rank), /*abandon=*/false);
        announce_user_stop();
        if (stopping_) signal_all(sig);
        begin_stop(sig);  // forwarded as is: ranks may treat SIGINT and SIGTERM differently
      } else if (!killed_) {
        say("signalled again; killing the ranks now");
        kill_at_ = now_seconds();
      }
    }
  }

  // Sleeps before a restart, still answering signals; false when one ended the job.
  bool wait_watching_signals(double seconds) {
    const double until = now_seconds() + seconds;
    for (double now; (now = now_seconds()) < until;) {
      pollfd p{sigfd_, POLLIN, 0};
      if (::poll(&p, 1, int((until - now) * 1000) + 1) > 0) on_signals();
      if (user_stop_) return false;
    }
    return true;
  }

  void supervise() {
    double drain_until = 0;  // once all ranks are gone: stop waiting for pipes held open by escaped processes
    bool cleaned = false;
    double next_check = 0;
    std::vector<pollfd> fds;
    std::vector<OutputStream*> owners;
    for (;;) {
      double now = now_seconds();
      if (stopping_ && !killed_ && running_count() > 0 && now >= kill_at_) {
        for (auto& r : ranks_)
          if (r.running)
            say(fmt::format("rank {} (pid {}) still running after the grace period; killing it", r.global, r.pid));
        signal_all(SIGKILL);
        killed_ = true;
      }
      if (running_count() == 0 && !cleaned) {
        // Whatever the ranks left behind (it may hold their pipes open): first their groups, then escapees.
        signal_all(SIGKILL);
        kill_orphans();
        cleaned = true;
        drain_until = now + 2.0;
      }
      if (!cleaned && now >= next_check) {
        if (opt_.driven())
          driven_tick(now);
        else
          check_hang(now);
        next_check = now + 0.5;
      }

      fds.clear();
      owners.clear();
      fds.push_back({sigfd_, POLLIN, 0});
      for (auto& r : ranks_)
        for (OutputStream* s : {&r.out, &r.err, &r.hb})
          if (s->fd() >= 0) {
            fds.push_back({s->fd(), POLLIN, 0});
            owners.push_back(s);
          }
      if (cleaned && (fds.size() == 1 || now >= drain_until)) break;

      double until = cleaned ? drain_until : std::min(next_check, (stopping_ && !killed_) ? kill_at_ : now + 3600);
      int ms = int(std::clamp((until - now) * 1000.0 + 1, 0.0, 3.6e6));
      int n = ::poll(fds.data(), fds.size(), ms);
      if (n < 0 && errno != EINTR) {
        say(fmt::format("poll: {}", std::strerror(errno)));
        break;
      }
      if (n <= 0) continue;
      for (size_t i = 1; i < fds.size(); ++i)
        if (fds[i].revents) owners[i - 1]->drain();
      if (fds[0].revents) on_signals();
    }
    for (auto& r : ranks_)
      for (OutputStream* s : {&r.out, &r.err, &r.hb})
        if (s->fd() >= 0) s->close();
    kill_orphans();
  }

  // Processes that escaped the ranks' groups (setsid daemons) were reparented to us: kill and reap them, and
  // repeat for their own children, which become ours in turn.
  void kill_orphans() {
    double deadline = now_seconds() + 2.0;
    for (;;) {
      reap();
      std::vector<pid_t> kids = my_children();
      if (kids.empty() || now_seconds() > deadline) return;
      for (pid_t p : kids) ::kill(p, SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  const LaunchOptions& opt_;
  JobWatch watch_;
  JobStore store_;
  EventLog events_;
  std::unique_ptr<Notifier> notifier_;  // after events_: destroyed (and flushed) before the log it observes
  SpawnSpec spec_;
  std::vector<std::string> base_env_;

  // The current attempt.
  std::vector<RankProcess> ranks_;
  double detected_at_ = -1;
  int attempt_ = 0, nonfinite_step_ = -1;
  std::vector<int> sdc_ranks_;
  std::string detected_;

  // Under the job driver (driven mode).
  std::unique_ptr<Store> ctl_;           // this agent's client of the job store
  std::atomic<bool> store_lost_{false};  // the liveness thread could not reach the store
  std::unique_ptr<NodeLease> lease_;     // renewed by keep_alive, watched by fence_watch
  std::mutex groups_mu_;
  std::vector<pid_t> live_groups_;  // the process groups of this attempt's ranks, for fence_watch
  bool evicted_said_ = false;
  bool in_attempt_ = false;

  std::unique_ptr<Dashboard> dashboard_;
  const double job_started_ = now_seconds();

  int sigfd_ = -1;
  sigset_t old_mask_{};
  bool stopping_ = false, killed_ = false, user_stop_ = false;
  double kill_at_ = 0;
  int exit_code_ = 0;
};

}  // namespace

int run_agent(const LaunchOptions& opt) { return Agent(opt).run(); }

}  // namespace mt::launch
