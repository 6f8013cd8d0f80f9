#include "megatrain/train/faults.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "megatrain/comm/flight_recorder.h"
#include "megatrain/core/error.h"
#include "megatrain/model/gpt.h"
#include "megatrain/train/heartbeat.h"

namespace mt {

namespace {

constexpr const char* kKinds = "crash, hang, nan, slow, badnode";

struct KindSyntax {
  FaultKind kind;
  std::set<std::string> required, optional;
  const char* keys;  // for messages
};

const std::map<std::string, KindSyntax>& syntax() {
  static const std::map<std::string, KindSyntax> s = {
      {"crash", {FaultKind::Crash, {"rank", "step"}, {"attempt"}, "rank=R:step=S[:attempt=A]"}},
      {"hang", {FaultKind::Hang, {"rank", "step"}, {"attempt"}, "rank=R:step=S[:attempt=A]"}},
      {"nan", {FaultKind::Nan, {"rank", "step"}, {"attempt"}, "rank=R:step=S[:attempt=A]"}},
      {"slow", {FaultKind::Slow, {"rank", "factor"}, {"step", "attempt"}, "rank=R:factor=F[:step=S][:attempt=A]"}},
      {"badnode", {FaultKind::BadNode, {"node"}, {"attempt"}, "node=N[:attempt=A]"}},
  };
  return s;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\n") - b + 1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t p = s.find(sep, start);
    out.push_back(s.substr(start, p == std::string::npos ? std::string::npos : p - start));
    if (p == std::string::npos) return out;
    start = p + 1;
  }
}

// An integer in [lo, INT_MAX], or a Config error naming the item and key.
int parse_int(const std::string& v, int lo, const std::string& where, const std::string& key) {
  char* end = nullptr;
  errno = 0;
  const long x = v.empty() ? 0 : std::strtol(v.c_str(), &end, 10);
  if (v.empty() || errno != 0 || *end != '\0' || x < lo || x > INT_MAX)
    fail_as(ErrorKind::Config, "{}: {}='{}' must be an integer >= {}", where, key, v, lo);
  return static_cast<int>(x);
}

int int_env(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  return parse_int(v, 0, fmt::format("environment variable {}", name), name);
}

}  // namespace

const char* fault_kind_name(FaultKind k) {
  switch (k) {
    case FaultKind::Crash: return "crash";
    case FaultKind::Hang: return "hang";
    case FaultKind::Nan: return "nan";
    case FaultKind::Slow: return "slow";
    case FaultKind::BadNode: return "badnode";
  }
  return "?";
}

std::vector<Fault> parse_faults(const std::string& text, const std::string& source) {
  std::vector<Fault> out;
  for (const std::string& raw : split(text, ';')) {
    const std::string item = trim(raw);
    if (item.empty()) continue;
    const std::string where = fmt::format("{} item '{}'", source, item);
    const std::vector<std::string> parts = split(item, ':');
    const std::string kind = trim(parts[0]);
    auto it = syntax().find(kind);
    if (it == syntax().end())
      fail_as(ErrorKind::Config, "{}: unknown fault kind '{}' (the kinds are {})", where, kind, kKinds);
    const KindSyntax& ks = it->second;
    Fault f;
    f.kind = ks.kind;
    f.item = item;
    if (f.kind == FaultKind::Slow) f.step = 1;
    std::set<std::string> seen;
    for (size_t i = 1; i < parts.size(); ++i) {
      const std::string kv = trim(parts[i]);
      const size_t eq = kv.find('=');
      if (eq == std::string::npos || eq == 0)
        fail_as(ErrorKind::Config, "{}: '{}' is not key=value ({} takes {})", where, kv, kind, ks.keys);
      const std::string key = trim(kv.substr(0, eq)), value = trim(kv.substr(eq + 1));
      if (!ks.required.count(key) && !ks.optional.count(key))
        fail_as(ErrorKind::Config, "{}: unknown key '{}' ({} takes {})", where, key, kind, ks.keys);
      if (!seen.insert(key).second) fail_as(ErrorKind::Config, "{}: key '{}' given twice", where, key);
      if (key == "rank") f.rank = parse_int(value, 0, where, key);
      else if (key == "node") f.node = parse_int(value, 0, where, key);
      else if (key == "step") f.step = parse_int(value, 1, where, key);
      else if (key == "attempt") f.attempt = parse_int(value, 0, where, key);
      else if (key == "factor") {
        char* end = nullptr;
        errno = 0;
        f.factor = value.empty() ? 0 : std::strtod(value.c_str(), &end);
        if (value.empty() || errno != 0 || *end != '\0' || !std::isfinite(f.factor) || f.factor < 1 ||
            f.factor > 1000)
          fail_as(ErrorKind::Config, "{}: factor='{}' must be a number in [1, 1000]", where, value);
      }
    }
    for (const std::string& k : ks.required)
      if (!seen.count(k))
        fail_as(ErrorKind::Config, "{}: missing key '{}' ({} takes {})", where, k, kind, ks.keys);
    out.push_back(f);
  }
  return out;
}

std::vector<Fault> faults_from_env() {
  const char* v = std::getenv("MEGATRAIN_FAULTS");
  return v ? parse_faults(v) : std::vector<Fault>{};
}

int attempt_from_env() { return int_env("MEGATRAIN_ATTEMPT", 0); }
int node_from_env() { return int_env("MEGATRAIN_NODE_RANK", 0); }

bool fault_badnode(int node) {
  const int attempt = attempt_from_env();
  for (const Fault& f : faults_from_env())
    if (f.kind == FaultKind::BadNode && f.node == node && f.fires_in(attempt)) return true;
  return false;
}

struct FaultInjector::Shared {
  std::atomic<int> step{0};
  int hang_step = 0;  // 0: no hang for this rank in this attempt
  std::string hang_item;
  int rank = 0, attempt = 0;
  std::atomic<bool> hung{false};
};

FaultInjector::FaultInjector(const std::vector<Fault>& faults, int rank, int attempt)
    : all_(faults), rank_(rank), attempt_(attempt), shared_(std::make_shared<Shared>()) {
  shared_->rank = rank;
  shared_->attempt = attempt;
  for (const Fault& f : faults) {
    if (f.kind == FaultKind::BadNode || f.rank != rank || !f.fires_in(attempt)) continue;
    mine_.push_back(f);
    if (f.kind == FaultKind::Hang && (shared_->hang_step == 0 || f.step < shared_->hang_step)) {
      shared_->hang_step = f.step;
      shared_->hang_item = f.item;
    }
  }
  if (shared_->hang_step > 0) {
    std::shared_ptr<Shared> sh = shared_;
    flight_recorder().set_enter_hook([sh](const std::string& group, const FlightEntry& e) {
      const int step = sh->step.load();
      if (step < sh->hang_step) return;
      // The first op to enter announces it; it and every op of this process entering after it block for good
      // (a stuck device blocks them all).
      if (!sh->hung.exchange(true)) {
        heartbeat_event("fault_injected",
                        {{"fault", sh->hang_item}, {"kind", "hang"}, {"step", step}, {"attempt", sh->attempt},
                         {"group", group}, {"op", e.op}, {"seq", e.seq}},
                        true);
        std::fprintf(stderr, "fault injected: %s (rank %d, step %d, attempt %d): blocking in %s #%lld of group %s\n",
                     sh->hang_item.c_str(), sh->rank, step, sh->attempt, e.op.c_str(),
                     static_cast<long long>(e.seq), group.c_str());
        std::fflush(stderr);
      }
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    });
  }
}

FaultInjector::~FaultInjector() {
  if (shared_->hang_step > 0) flight_recorder().set_enter_hook(nullptr);
}

void FaultInjector::check_world(int world_size) const {
  // Only the faults of this attempt: a job that shrank after attempt 0 may no longer have the rank one named.
  for (const Fault& f : all_)
    if (f.kind != FaultKind::BadNode && f.fires_in(attempt_) && f.rank >= world_size)
      fail_as(ErrorKind::Config, "MEGATRAIN_FAULTS item '{}': rank {} is outside the world of {} ranks", f.item,
              f.rank, world_size);
}

void FaultInjector::fired(const Fault& f, int step) {
  heartbeat_event("fault_injected",
                  {{"fault", f.item}, {"kind", fault_kind_name(f.kind)}, {"step", step}, {"attempt", attempt_}}, true);
  std::fflush(stdout);
  std::fprintf(stderr, "fault injected: %s (rank %d, step %d, attempt %d)\n", f.item.c_str(), rank_, step, attempt_);
  std::fflush(stderr);
}

void FaultInjector::begin_step(int step, GPT& model) {
  shared_->step = step;
  slept_ = 0;
  for (const Fault& f : mine_) {
    switch (f.kind) {
      case FaultKind::Crash:
        if (step == f.step) {
          fired(f, step);
          ::raise(SIGKILL);
        }
        break;
      case FaultKind::Nan:
        if (step == f.step) {
          fired(f, step);
          // A block's first parameter: every pipeline stage holds a block, and each block parameter enters every
          // row's forward (an embedding row would only matter where its token occurs).
          ParamStore& p = model.params();
          int victim = 0;
          for (size_t i = 0; i < p.size(); ++i)
            if (p.info(static_cast<int>(i)).name.rfind("h.", 0) == 0) {
              victim = static_cast<int>(i);
              break;
            }
          model.ops().scale(p.param(victim), NAN);
          p.refresh_weights(model.ops());
        }
        break;
      case FaultKind::Slow:
        if (step >= f.step) {
          if (!slow_announced_) {
            slow_announced_ = true;
            fired(f, step);
          }
          slept_ = (f.factor - 1) * base_compute_;
          if (slept_ > 0) std::this_thread::sleep_for(std::chrono::duration<double>(slept_));
        }
        break;
      case FaultKind::Hang:  // fires in the enter hook
      case FaultKind::BadNode:
        break;
    }
  }
}

void FaultInjector::step_compute(double seconds) { base_compute_ = std::max(0.0, seconds - slept_); }

}  // namespace mt
