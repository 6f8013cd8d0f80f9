#include "megatrain/obs/timeline.h"

#include <chrono>
#include <cstdlib>
#include <exception>
#include <vector>

#include "megatrain/core/fault_spec.h"

namespace mt::obs {

namespace {

// The clock_skew fault naming this process's RANK (unset: 0), core/fault_spec.h. A malformed MEGATRAIN_FAULTS is
// the trainer's to report (rank_guard.h): the clock, read from any thread, never throws for it.
double read_skew() {
  try {
    const char* rank = std::getenv("RANK");
    const std::vector<Fault> f = faults_for(FaultKind::ClockSkew, rank ? std::atoi(rank) : 0);
    return f.empty() ? 0 : f.front().seconds;
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace

double injected_clock_skew() {
  static const double skew = read_skew();
  return skew;
}

double trace_clock() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count() + injected_clock_skew();
}

void Timeline::set_limit(size_t max_spans) {
  std::lock_guard<std::mutex> lock(mu_);
  limit_ = max_spans;
}

void Timeline::add(Span s) {
  if (!on()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (spans_.size() >= limit_) {
    ++dropped_;
    return;
  }
  spans_.push_back(std::move(s));
}

std::vector<Span> Timeline::take() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Span> out;
  out.swap(spans_);
  dropped_ = 0;
  return out;
}

size_t Timeline::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

Timeline& timeline() {
  static Timeline t;
  return t;
}

ScopedSpan::~ScopedSpan() {
  if (!on_) return;
  timeline().add(Span{std::move(name_), cat_, "main", t0_, trace_clock(), std::move(args_)});
}

}  // namespace mt::obs
