#include "megatrain/core/fault_spec.h"

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <map>
#include <set>

#include <fmt/format.h>

#include "megatrain/core/error.h"

namespace mt {

namespace {

constexpr const char* kKinds =
    "crash, hang, nan, slow, badnode, stage2_delay, kill_after_snapshot, clock_skew, bitflip, sdcgrad, slowburst";

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
      {"stage2_delay", {FaultKind::Stage2Delay, {"seconds"}, {"rank", "attempt"}, "seconds=T[:rank=R][:attempt=A]"}},
      {"kill_after_snapshot",
       {FaultKind::KillAfterSnapshot, {"rank", "step"}, {"attempt"}, "rank=R:step=S[:attempt=A]"}},
      {"bitflip", {FaultKind::BitFlip, {"rank", "step"}, {"attempt"}, "rank=R:step=S[:attempt=A]"}},
      {"sdcgrad", {FaultKind::SdcGrad, {"rank", "step"}, {"attempt"}, "rank=R:step=S[:attempt=A]"}},
      {"slowburst",
       {FaultKind::SlowBurst,
        {"rank", "factor"},
        {"rounds", "b", "w", "lambda", "p", "seed", "attempt"},
        "rank=R:factor=F:rounds=S.R,S.R,... or rank=R:factor=F:b=B:w=W:lambda=L[:p=P][:seed=N][:attempt=A]"}},
      {"clock_skew", {FaultKind::ClockSkew, {"rank", "seconds"}, {"attempt"}, "rank=R:seconds=T[:attempt=A]"}},
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
    case FaultKind::Stage2Delay: return "stage2_delay";
    case FaultKind::KillAfterSnapshot: return "kill_after_snapshot";
    case FaultKind::ClockSkew: return "clock_skew";
    case FaultKind::BitFlip: return "bitflip";
    case FaultKind::SdcGrad: return "sdcgrad";
    case FaultKind::SlowBurst: return "slowburst";
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
      if (key == "rank")
        f.rank = parse_int(value, 0, where, key);
      else if (key == "node")
        f.node = parse_int(value, 0, where, key);
      else if (key == "step")
        f.step = parse_int(value, 1, where, key);
      else if (key == "attempt")
        f.attempt = parse_int(value, 0, where, key);
      else if (key == "factor") {
        char* end = nullptr;
        errno = 0;
        f.factor = value.empty() ? 0 : std::strtod(value.c_str(), &end);
        if (value.empty() || errno != 0 || *end != '\0' || !std::isfinite(f.factor) || f.factor < 1 || f.factor > 1000)
          fail_as(ErrorKind::Config, "{}: factor='{}' must be a number in [1, 1000]", where, value);
      } else if (key == "rounds") {
        for (const std::string& sr : split(value, ',')) {
          const size_t dot = sr.find('.');
          if (dot == std::string::npos)
            fail_as(ErrorKind::Config, "{}: rounds: '{}' is not STEP.ROUND (e.g. rounds=2.0,2.1)", where, sr);
          f.rounds.emplace_back(parse_int(trim(sr.substr(0, dot)), 1, where, "rounds' step"),
                                parse_int(trim(sr.substr(dot + 1)), 0, where, "rounds' round"));
        }
      } else if (key == "b") {
        f.burst_b = parse_int(value, 1, where, key);
      } else if (key == "w") {
        f.burst_w = parse_int(value, 2, where, key);
      } else if (key == "lambda") {
        f.burst_lambda = parse_int(value, 1, where, key);
      } else if (key == "seed") {
        f.burst_seed = static_cast<uint64_t>(parse_int(value, 0, where, key));
      } else if (key == "p") {
        char* end = nullptr;
        errno = 0;
        f.burst_p = value.empty() ? -1 : std::strtod(value.c_str(), &end);
        if (value.empty() || errno != 0 || *end != '\0' || !(f.burst_p >= 0 && f.burst_p <= 1))
          fail_as(ErrorKind::Config, "{}: p='{}' must be a probability in [0, 1]", where, value);
      } else if (key == "seconds") {
        char* end = nullptr;
        errno = 0;
        f.seconds = value.empty() ? 0 : std::strtod(value.c_str(), &end);
        const bool any_sign = f.kind == FaultKind::ClockSkew;
        if (value.empty() || errno != 0 || *end != '\0' || !std::isfinite(f.seconds) || (!any_sign && f.seconds < 0))
          fail_as(ErrorKind::Config, "{}: seconds='{}' must be a {}number", where, value,
                  any_sign ? "" : "non-negative ");
      }
    }
    for (const std::string& k : ks.required)
      if (!seen.count(k)) fail_as(ErrorKind::Config, "{}: missing key '{}' ({} takes {})", where, k, kind, ks.keys);
    if (f.kind == FaultKind::SlowBurst) {
      const bool model = seen.count("b") || seen.count("w") || seen.count("lambda");
      if (model == (seen.count("rounds") > 0) ||
          (model && !(seen.count("b") && seen.count("w") && seen.count("lambda"))))
        fail_as(ErrorKind::Config, "{}: slowburst takes either rounds=... or all of b, w and lambda ({})", where,
                ks.keys);
      if (!model && (seen.count("p") || seen.count("seed")))
        fail_as(ErrorKind::Config, "{}: p and seed go with b, w and lambda ({})", where, ks.keys);
    }
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

std::vector<Fault> faults_for(FaultKind kind, int rank) {
  std::vector<Fault> out;
  const std::vector<Fault> all = faults_from_env();
  if (all.empty()) return out;
  const int attempt = attempt_from_env();
  for (const Fault& f : all)
    if (f.kind == kind && (f.rank < 0 || f.rank == rank) && f.fires_in(attempt)) out.push_back(f);
  return out;
}

}  // namespace mt
