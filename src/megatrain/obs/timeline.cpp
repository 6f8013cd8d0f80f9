#include "megatrain/obs/timeline.h"

#include <chrono>
#include <cstdlib>
#include <sstream>

namespace mt::obs {

namespace {

double read_skew() {
  const char* list = std::getenv("MEGATRAIN_TEST_CLOCK_SKEW_S");
  const char* rank = std::getenv("RANK");
  if (!list || !*list) return 0;
  const int r = rank ? std::atoi(rank) : 0;
  std::stringstream ss(list);
  std::string item;
  for (int i = 0; std::getline(ss, item, ','); ++i)
    if (i == r) return std::atof(item.c_str());
  return 0;
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
