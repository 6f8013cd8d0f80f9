#include "megatrain/train/heartbeat.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "megatrain/comm/flight_recorder.h"
#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"

namespace mt {

namespace {

// The process's current heartbeat, for the free functions (set by the constructor, cleared by the destructor).
std::mutex g_current_mu;
Heartbeat* g_current = nullptr;

nlohmann::ordered_json optional_number(const std::optional<double>& v) {
  return v && std::isfinite(*v) ? nlohmann::ordered_json(*v) : nlohmann::ordered_json();
}

// Rounds to a millisecond: wait times need no more, and shorter numbers keep lines under PIPE_BUF.
double ms(double s) { return std::round(s * 1000.0) / 1000.0; }

}  // namespace

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::Init: return "init";
    case Phase::ForwardBackward: return "forward_backward";
    case Phase::Optimizer: return "optimizer";
    case Phase::Eval: return "eval";
    case Phase::Checkpoint: return "checkpoint";
    case Phase::Done: return "done";
  }
  return "?";
}

std::optional<HeartbeatSettings> heartbeat_settings_from_env() {
  const char* fd = std::getenv("MEGATRAIN_HEARTBEAT_FD");
  if (!fd || !*fd) return std::nullopt;
  HeartbeatSettings s;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(fd, &end, 10);
  if (errno != 0 || *end != '\0' || v < 0 || v > INT_MAX)
    fail_as(ErrorKind::Config, "MEGATRAIN_HEARTBEAT_FD='{}' is not a file descriptor (a number >= 0)", fd);
  s.fd = static_cast<int>(v);
  if (::fcntl(s.fd, F_GETFD) < 0)
    fail_as(ErrorKind::Config, "MEGATRAIN_HEARTBEAT_FD={}: no such open file descriptor in this process", s.fd);
  if (const char* iv = std::getenv("MEGATRAIN_HEARTBEAT_INTERVAL"); iv && *iv) {
    end = nullptr;
    errno = 0;
    const double d = std::strtod(iv, &end);
    if (errno != 0 || *end != '\0' || !std::isfinite(d) || d <= 0 || d > 3600)
      fail_as(ErrorKind::Config, "MEGATRAIN_HEARTBEAT_INTERVAL='{}' must be a number of seconds in (0, 3600]", iv);
    s.interval_s = d;
  }
  return s;
}

uint64_t resident_bytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long long size = 0, resident = 0;
  const int n = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) : 0;
}

Heartbeat::Heartbeat(const HeartbeatSettings& s, int rank) : settings_(s), rank_(rank) {
  thread_ = std::thread([this] { run(); });
  std::lock_guard<std::mutex> lock(g_current_mu);
  g_current = this;
}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(g_current_mu);
    if (g_current == this) g_current = nullptr;
  }
  enqueue([this] { return hb_line("exit"); }, false);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Heartbeat::set_coord(const MeshCoord& c) {
  std::lock_guard<std::mutex> lock(mu_);
  coord_ = c;
}

void Heartbeat::set_layout(int dp, int pp, int tp, int grad_accum, int start_step) {
  std::lock_guard<std::mutex> lock(mu_);
  layout_ = nlohmann::ordered_json{{"dp", dp}, {"pp", pp}, {"tp", tp}, {"grad_accum", grad_accum}};
  start_step_ = start_step;
}

void Heartbeat::set_phase(Phase p) {
  std::lock_guard<std::mutex> lock(mu_);
  phase_ = p;
}

void Heartbeat::set_step(int step) {
  std::lock_guard<std::mutex> lock(mu_);
  step_ = step;
}

void Heartbeat::step_done(int step, double loss, double step_time, double compute_time, double tokens_per_s,
                          double mfu) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    step_ = step;
    loss_ = loss;
    step_time_ = step_time;
    compute_time_ = compute_time;
    tokens_per_s_ = tokens_per_s;
    mfu_ = mfu;
  }
  enqueue([this] { return hb_line("step"); }, false);
}

std::string Heartbeat::hb_line(const char* at) const {
  const double now = unix_seconds();
  nlohmann::ordered_json colls = nlohmann::ordered_json::array(), pending = nlohmann::ordered_json::array();
  for (const GroupFlight& g : flight_recorder().snapshot()) {
    const std::optional<FlightEntry>& e = g.oldest_pending ? g.oldest_pending : g.last;
    if (!e) continue;
    nlohmann::ordered_json c = {{"group", g.group}, {"op", e->op}, {"seq", e->seq}, {"state", op_state_name(e->state)}};
    if (e->p2p()) c["peer"] = e->peer;
    if (!e->completed()) c["wait_s"] = ms(now - e->t_posted);
    colls.push_back(c);
    if (!e->completed()) pending.push_back(std::move(c));
  }
  nlohmann::ordered_json j;
  {
    std::lock_guard<std::mutex> lock(mu_);
    j = {{"type", "hb"}, {"rank", rank_}};
    j["coord"] = coord_ ? nlohmann::ordered_json({coord_->dp, coord_->pp, coord_->tp}) : nlohmann::ordered_json();
    if (layout_) j["layout"] = *layout_;
    if (start_step_) j["start_step"] = *start_step_;
    j["t"] = now;
    j["at"] = at;
    j["step"] = step_;
    j["phase"] = phase_name(phase_);
    j["loss"] = optional_number(loss_);
    j["step_time"] = optional_number(step_time_);
    j["compute_time"] = optional_number(compute_time_);
    j["tokens_per_s"] = optional_number(tokens_per_s_);
    j["mfu"] = optional_number(mfu_);
  }
  j["rss"] = resident_bytes();
  j["colls"] = colls;
  std::string line = j.dump();
  if (line.size() + 1 > PIPE_BUF) {  // many groups: keep those with an op in flight, which a hang report needs
    j["colls"] = pending;
    j["colls_truncated"] = true;
    line = j.dump();
    if (line.size() + 1 > PIPE_BUF) {
      j["colls"] = nlohmann::ordered_json::array();
      line = j.dump();
    }
  }
  return line + "\n";
}

void Heartbeat::moe_load(int step, const std::vector<obs::MoeLayerLoad>& layers) {
  for (const std::string& line : obs::moe_load_lines(rank_, step, layers, PIPE_BUF))
    enqueue([&] { return line; }, false);
}

void Heartbeat::event(const std::string& name, nlohmann::ordered_json fields, bool sync) {
  enqueue(
      [&] {
        nlohmann::ordered_json j = {{"type", "event"}, {"event", name}, {"rank", rank_}, {"t", unix_seconds()}};
        {
          std::lock_guard<std::mutex> lock(mu_);
          j["step"] = step_;
        }
        for (auto& [k, v] : fields.items()) j[k] = v;  // fields may name the step itself
        std::string line = j.dump();
        if (line.size() + 1 > PIPE_BUF && j.contains("message")) {  // a long error message: cut it, keep the line whole
          const std::string m = j["message"].get<std::string>();
          j["message"] = m.substr(0, m.size() - std::min(m.size(), line.size() + 1 - PIPE_BUF + 16)) + "...";
          line = j.dump();
        }
        return line + "\n";
      },
      sync);
}

void Heartbeat::enqueue(const std::function<std::string()>& make, bool sync) {
  std::unique_lock<std::mutex> order(order_mu_);
  std::string line = make();
  std::unique_lock<std::mutex> lock(mu_);
  order.unlock();  // the line has its place in the queue
  // A reader that stopped reading must not make the queue grow without bound: drop the oldest lines.
  constexpr size_t kMaxQueued = 1024;
  if (queue_.size() >= kMaxQueued) {
    queue_.pop_front();
    ++written_;
  }
  queue_.push_back(std::move(line));
  const uint64_t mine = ++enqueued_;
  cv_.notify_all();
  // Bounded, but generously: on a loaded machine the writer thread may not run for seconds, and a sync line
  // (a fault about to kill this process) that is lost leaves the supervisor without its reason.
  if (sync) written_cv_.wait_for(lock, std::chrono::seconds(10), [&] { return written_ >= mine || broken_; });
}

bool Heartbeat::write_line(const std::string& line) {
  size_t off = 0;
  while (off < line.size()) {
    const ssize_t n = ::write(settings_.fd, line.data() + off, line.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (errno == EPIPE) {  // the reader is gone: take the (blocked, so pending) SIGPIPE back
        sigset_t pipe_set;
        sigemptyset(&pipe_set);
        sigaddset(&pipe_set, SIGPIPE);
        timespec zero{0, 0};
        ::sigtimedwait(&pipe_set, nullptr, &zero);
      }
      return false;
    }
    off += static_cast<size_t>(n);
  }
  return true;
}

void Heartbeat::run() {
  sigset_t pipe_set;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  ::pthread_sigmask(SIG_BLOCK, &pipe_set, nullptr);
  std::unique_lock<std::mutex> lock(mu_);
  last_write_ = now_seconds();
  bool first = true;
  for (;;) {
    const auto due = std::chrono::duration<double>(first ? 0.0 : last_write_ + settings_.interval_s - now_seconds());
    cv_.wait_for(lock, due, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty() && stop_) break;
    const bool tick = queue_.empty() && (first || now_seconds() >= last_write_ + settings_.interval_s);
    std::deque<std::string> lines;
    if (tick) {
      // Stamp the tick and take the queue with no producer in between (order_mu_ before mu_): the lines queued
      // so far were stamped earlier and are written first; any line stamped later goes out after the tick.
      lock.unlock();
      std::lock_guard<std::mutex> order(order_mu_);
      std::string t = hb_line("tick");
      lock.lock();
      lines.swap(queue_);
      lines.push_back(std::move(t));
    } else {
      lines.swap(queue_);
    }
    const size_t queued = lines.size() - (tick ? 1 : 0);
    first = false;
    if (lines.empty()) continue;
    bool ok = !broken_;
    lock.unlock();
    for (const std::string& l : lines)
      if (ok) ok = write_line(l);
    lock.lock();
    if (!ok) broken_ = true;
    last_write_ = now_seconds();
    // Lines dropped after a failed write count as written: nobody waits for them.
    written_ += queued;
    if (broken_) written_ = enqueued_;
    written_cv_.notify_all();
  }
}

void heartbeat_phase(Phase p) {
  std::lock_guard<std::mutex> lock(g_current_mu);
  if (g_current) g_current->set_phase(p);
}

void heartbeat_event(const std::string& name, nlohmann::ordered_json fields, bool sync) {
  std::lock_guard<std::mutex> lock(g_current_mu);
  if (g_current) g_current->event(name, std::move(fields), sync);
}

}  // namespace mt
