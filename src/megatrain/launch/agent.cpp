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
#include <set>
#include <thread>

#include "megatrain/comm/local_address.h"
#include "megatrain/comm/store.h"
#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"
#include "megatrain/launch/event_log.h"
#include "megatrain/launch/hang_blame.h"
#include "megatrain/launch/job_store.h"
#include "megatrain/launch/process_util.h"
#include "megatrain/launch/rank_process.h"
#include "megatrain/launch/rank_status.h"
#include "megatrain/launch/restart_policy.h"

extern char** environ;

namespace mt::launch {
namespace {

// Exit code the agent gives an attempt it stopped because it hung (the ranks' own codes then only say they were
// stopped): a communication timeout, which a restart may help.
constexpr int kHangCode = 21;

// Lines on a rank's stderr worth an event of their own (the rank may die before it can say more).
constexpr const char* kAlerts[] = {"NCCL WARN", "CUDA error", "out of memory", "Segmentation fault",
                                   "terminate called", "Bus error"};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + long(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// How one attempt ended.
struct AttemptEnd {
  int code = 0;               // 0: every rank exited 0
  bool user_stop = false;     // the agent was signalled: no restart
  int best_step = 0;          // the highest step any rank reported
  int nonfinite_step = -1;    // the step a rank reported a non-finite loss at, if it did
};

class Agent {
 public:
  explicit Agent(const LaunchOptions& o) : opt_(o) {
    policy_.max_restarts = o.max_restarts;
    policy_.backoff_s = o.backoff_s;
    policy_.no_progress_limit = o.no_progress_limit;
  }

  int run() {
    setup_signals();
    store_ = open_job_store(opt_);
    events_.open(opt_.events, opt_.node_rank);
    base_env_ = inherited_env();
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

    int restarts = 0, no_progress_run = 0, last_nonfinite = -1;
    for (int attempt = 0;; ++attempt) {
      events_.set_attempt(attempt);
      const int best_before = best_step_;
      AttemptEnd end = run_attempt(attempt);
      best_step_ = std::max(best_step_, end.best_step);
      if (end.code == 0 || end.user_stop) {
        events_.write(end.code == 0 ? "done" : "gave_up",
                      {{"exit_code", end.code}, {"best_step", best_step_}, {"restarts", restarts},
                       {"reason", end.code == 0 ? "every rank finished" : "the launcher was signalled"}});
        return end.code;
      }
      no_progress_run = end.best_step > best_before ? 0 : no_progress_run + 1;
      RestartDecision d = decide_restart(policy_, end.code, restarts, no_progress_run);
      if (!d.restart) {
        if (opt_.max_restarts > 0) say(fmt::format("giving up: {}", d.reason));
        events_.write("gave_up", {{"exit_code", d.exit_code}, {"failure_code", end.code}, {"reason", d.reason},
                                  {"best_step", best_step_}, {"restarts", restarts}});
        return d.exit_code;
      }
      // A batch that makes the loss non-finite again after a rollback is the data's fault, not the machine's.
      const int bad = end.nonfinite_step;
      if (bad > 0 && bad == last_nonfinite && skip_steps_.insert(bad).second)
        say(fmt::format("step {} was non-finite twice in a row; the next attempts skip its batch", bad));
      last_nonfinite = end.nonfinite_step;
      say(fmt::format("attempt {} failed (code {}); {}, in {:.1f} s", attempt, end.code, d.reason, d.delay_s));
      events_.write("restarting", {{"delay_s", d.delay_s}, {"failure_code", end.code}, {"reason", d.reason},
                                   {"attempt_best_step", end.best_step},
                                   {"skip_steps", std::vector<int>(skip_steps_.begin(), skip_steps_.end())}});
      if (!wait_watching_signals(d.delay_s)) {
        events_.write("gave_up", {{"exit_code", exit_code_}, {"reason", "the launcher was signalled"}});
        return exit_code_;
      }
      ++restarts;
    }
  }

 private:
  // ---- one attempt --------------------------------------------------------------------------------------------
  AttemptEnd run_attempt(int attempt) {
    attempt_ = attempt;
    stopping_ = killed_ = user_stop_ = false;
    exit_code_ = 0;
    detected_at_ = -1;
    nonfinite_step_ = -1;
    resumed_ = caught_up_ = false;
    const int best_before = best_step_;
    attempt_best_ = 0;
    ranks_.clear();
    status_.clear();
    straggle_count_.clear();
    recent_step_times_.clear();

    const int first = opt_.node_rank * opt_.nproc, world = opt_.nnodes * opt_.nproc;
    const std::string prefix = fmt::format("attempt-{}", attempt);
    SpawnSpec spec = spec_;
    const bool trains = !opt_.exec && !opt_.args.empty() && opt_.args[0] == "train";
    if (trains && !skip_steps_.empty())
      spec.argv.push_back(fmt::format("--train.skip_steps=[{}]", fmt::join(skip_steps_, ",")));
    say(fmt::format("{}starting {} (global {}..{} of {}), store {}",
                    attempt > 0 ? fmt::format("attempt {}: ", attempt) : "", plural(opt_.nproc, "rank"), first,
                    first + opt_.nproc - 1, world, store_.url));
    ranks_.resize(size_t(opt_.nproc));
    status_.resize(size_t(opt_.nproc));
    progress_mark_.assign(size_t(opt_.nproc), "");
    straggle_count_.assign(size_t(opt_.nproc), 0);
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
      if (opt_.max_restarts > 0) env.push_back("MEGATRAIN_STORE_PREFIX=" + prefix);
      if (!opt_.iface.empty()) env.push_back(fmt::format("{}={}", kIfaceEnv, opt_.iface));
      RankProcess& r = ranks_[size_t(i)];
      r.global = first + i;
      status_[size_t(i)].rank = first + i;
      if (std::string why = r.spawn(spec, env, !opt_.no_prefix); !why.empty()) {
        abort_start(why);
        break;
      }
      r.hb.set_hook([this, i](const std::string& line) { on_heartbeat(size_t(i), line); });
      r.err.set_hook([this, i](const std::string& line) { on_stderr(size_t(i), line); });
    }
    attempt_started_ = last_progress_ = now_seconds();
    events_.write("started", {{"ranks", opt_.nproc}, {"first_rank", first},
                              {"store_prefix", opt_.max_restarts > 0 ? prefix : ""},
                              {"skip_steps", std::vector<int>(skip_steps_.begin(), skip_steps_.end())}});
    best_before_attempt_ = best_before;
    supervise();
    if (detected_at_ > 0) events_.write("stopped", {{"seconds", now_seconds() - detected_at_}});
    AttemptEnd end;
    end.code = exit_code_;
    end.user_stop = user_stop_;
    end.best_step = attempt_best_;
    end.nonfinite_step = nonfinite_step_;
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
    RankStatus& s = status_[i];
    const int before = s.step;
    const bool first = !s.heard;  // a rank's first heartbeat (from init) gives the step it starts from: not progress
    if (!s.apply(j, now)) return;
    // Progress is a step completed or any collective moving on (a long evaluation or checkpoint is not a hang
    // while its collectives advance); a hung job has neither.
    std::string mark = fmt::format("{}|{}", s.step, s.phase);
    for (const auto& c : s.colls) mark += fmt::format("|{}#{}{}", c.group, c.seq, c.state);
    if (mark != progress_mark_[i]) {
      if (!first) last_progress_ = now;
      progress_mark_[i] = mark;
    }
    if (first || s.step == before) return;
    // A step completed.
    attempt_best_ = std::max(attempt_best_, s.step);
    if (s.step_time) {
      recent_step_times_.push_back(*s.step_time);
      if (recent_step_times_.size() > 64) recent_step_times_.erase(recent_step_times_.begin());
    }
    if (!resumed_) {  // the first step of the attempt: "resumed" after a restart
      resumed_ = true;
      if (attempt_ > 0)
        events_.write("resumed", {{"rank", s.rank}, {"step", s.step}, {"seconds", now - attempt_started_}});
    }
    if (!caught_up_ && best_before_attempt_ > 0 && min_step() >= best_before_attempt_) {
      caught_up_ = true;
      events_.write("caught_up", {{"step", min_step()}, {"seconds", now - attempt_started_}});
    }
    check_straggler(i);
  }

  void on_rank_event(size_t i, const nlohmann::json& j) {
    const std::string what = j.value("event", "");
    nlohmann::json f = {{"rank", status_[i].rank}, {"reason", what}, {"detail", j}};
    if (what == "non_finite" || what == "error") {
      if (what == "non_finite" && j.contains("step") && j["step"].is_number_integer())
        nonfinite_step_ = j["step"].get<int>();
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
        events_.write("warning", {{"rank", status_[i].rank}, {"reason", "alert"}, {"line", line.substr(0, 500)}});
        return;
      }
  }

  int min_step() const {
    int m = INT_MAX;
    for (const auto& s : status_) m = std::min(m, s.step);
    return m == INT_MAX ? 0 : m;
  }

  // A rank whose compute time stays over straggler_factor x its peers' median is slowing the whole job down
  // (every collective waits for it). Warned once per rank per attempt.
  void check_straggler(size_t i) {
    if (status_.size() < 2 || !status_[i].compute_time || straggle_count_[i] < 0) return;
    std::vector<double> peers;
    for (size_t k = 0; k < status_.size(); ++k)
      if (k != i && status_[k].compute_time) peers.push_back(*status_[k].compute_time);
    if (peers.empty()) return;
    const double m = median(peers), mine = *status_[i].compute_time;
    if (m <= 0 || mine <= opt_.straggler_factor * m) {
      straggle_count_[i] = 0;
      return;
    }
    if (++straggle_count_[i] < opt_.straggler_steps) return;
    straggle_count_[i] = -1;
    const std::string line =
        fmt::format("rank {} ({}) is a straggler: compute {:.3f} s per step against its peers' median {:.3f} s "
                    "({:.2f}x) for {} steps",
                    status_[i].rank, status_[i].coord, mine, m, mine / m, opt_.straggler_steps);
    say(line);
    events_.write("warning", {{"rank", status_[i].rank}, {"reason", "straggler"}, {"ratio", mine / m},
                              {"line", line}});
  }

  // Hangs: no progress for too long, or a live rank gone silent.
  void check_hang(double now) {
    if (stopping_) return;
    bool any = false, silent = false;
    for (size_t i = 0; i < status_.size(); ++i) {
      if (!status_[i].heard) continue;
      any = true;
      if (ranks_[i].running && now - status_[i].last_heard > opt_.heartbeat_timeout_s) silent = true;
    }
    if (!any) return;  // not a megatrain rank (or not yet talking): only exits are supervised
    // Before the first step, and while a rank initialises, evaluates or checkpoints (work with few or no
    // collectives, whose length no step time predicts), the start-up limit applies.
    const bool slow_phase = std::any_of(status_.begin(), status_.end(), [](const RankStatus& r) {
      return r.phase == "init" || r.phase == "eval" || r.phase == "checkpoint";
    });
    const double limit = resumed_ && !slow_phase
                             ? std::max(opt_.hang_floor_s, opt_.hang_factor * median(recent_step_times_))
                             : std::max(opt_.hang_floor_s, opt_.startup_timeout_s);
    if (!silent && now - last_progress_ <= limit) return;
    Blame b = blame_hang(status_, now, opt_.heartbeat_timeout_s);
    const std::string why = silent ? "a rank stopped sending heartbeats"
                                   : fmt::format("no progress (step or collective) for {:.0f} s (limit {:.0f} s)",
                                                 now - last_progress_, limit);
    say(fmt::format("hang detected: {}: {}", why, b.line));
    detected_at_ = now;
    events_.write("detected", {{"reason", "hang"}, {"why", why}, {"blame", b.line}, {"ranks", b.ranks},
                               {"seconds_since_progress", now - last_progress_}});
    exit_code_ = kHangCode;
    begin_stop(SIGTERM);
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
    std::set<std::string> ours = {"RANK",        "WORLD_SIZE",  "LOCAL_RANK",      "LOCAL_WORLD_SIZE",
                                  "MASTER_ADDR", "MASTER_PORT", "MEGATRAIN_STORE", kStoreSecretEnv,
                                  "MEGATRAIN_ATTEMPT", "MEGATRAIN_NODE_RANK", "MEGATRAIN_STORE_PREFIX",
                                  "MEGATRAIN_HEARTBEAT_FD"};
    if (!opt_.iface.empty()) ours.insert(kIfaceEnv);
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      std::string kv = *e;
      if (!ours.count(kv.substr(0, kv.find('=')))) env.push_back(kv);
    }
    return env;
  }

  void abort_start(const std::string& why) {
    say(why + "; stopping the ranks already started");
    if (exit_code_ == 0) exit_code_ = 1;
    begin_stop(SIGTERM);
  }

  int running_count() const {
    return int(std::count_if(ranks_.begin(), ranks_.end(), [](const RankProcess& r) { return r.running; }));
  }

  // Signals every rank's process group, including groups whose leader already exited (its children may live on).
  void signal_all(int sig) {
    for (auto& r : ranks_)
      if (r.pid > 0) ::killpg(r.pid, sig);
  }

  void begin_stop(int sig) {
    if (stopping_) return;
    stopping_ = true;
    kill_at_ = now_seconds() + opt_.grace;
    signal_all(sig);
  }

  void on_rank_exit(RankProcess& r, int st) {
    r.running = false;
    bool failed = !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (!failed || stopping_) return;  // exits caused by a stop are expected, not news
    say(fmt::format("rank {} (pid {}) {}; stopping the other {}", r.global, r.pid, describe_status(st),
                    plural(running_count(), "rank")));
    detected_at_ = now_seconds();
    events_.write("detected", {{"reason", "exit"}, {"rank", r.global}, {"status", describe_status(st)},
                               {"code", exit_code_of(st)}});
    exit_code_ = std::max(1, exit_code_of(st));
    begin_stop(SIGTERM);
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
  RestartPolicy policy_;
  JobStore store_;
  EventLog events_;
  SpawnSpec spec_;
  std::vector<std::string> base_env_;
  std::set<int> skip_steps_;
  int best_step_ = 0;

  // The current attempt.
  std::vector<RankProcess> ranks_;
  std::vector<RankStatus> status_;
  std::vector<std::string> progress_mark_;  // per rank: step, phase and collective states at its last change
  std::vector<int> straggle_count_;  // consecutive slow steps per rank; -1 once warned
  std::vector<double> recent_step_times_;
  double attempt_started_ = 0, last_progress_ = 0, detected_at_ = -1;
  int attempt_ = 0, attempt_best_ = 0, best_before_attempt_ = 0, nonfinite_step_ = -1;
  bool resumed_ = false, caught_up_ = false;

  int sigfd_ = -1;
  sigset_t old_mask_{};
  bool stopping_ = false, killed_ = false, user_stop_ = false;
  double kill_at_ = 0;
  int exit_code_ = 0;
};

}  // namespace

int run_agent(const LaunchOptions& opt) { return Agent(opt).run(); }

}  // namespace mt::launch
