// The timeline: spans of what this process did, for a window of steps (train.trace_steps), kept in memory and
// written as Chrome trace events (obs/chrome_trace.h) that Perfetto (ui.perfetto.dev) and chrome://tracing open.
// A span is a named interval on a track of this process:
//   "main"           the training thread: each step, its phases (data, forward/backward, gradients, optimizer,
//                    checkpoint, eval), and inside them each micro-batch's forward and backward or, under pipeline
//                    parallelism, each action of the schedule (F/B of a micro-batch and chunk, waits for transfers);
//   "<group> <op>"   each collective of a process group (its track is the group: collectives of one group run in
//                    issue order on its own thread) and each send/recv (a track per direction and peer, since
//                    transfers overlap), recorded by the flight recorder when the op completes (comm/).
// Recording is off by default and costs one relaxed atomic load per span site then. While on, a span costs two
// clock reads and a short critical section; spans are kept up to a bound (set_limit), beyond which they are
// counted as dropped, never silently lost.
//
// The clock is the system clock (unix seconds), so the spans of several processes on one host line up as they are;
// across hosts each rank's file carries its offset to rank 0's clock, measured at the start of the run
// (comm/clock_offset.h), and `megatrain trace merge` applies it. The clock_skew fault (MEGATRAIN_FAULTS, e.g.
// "clock_skew:rank=1:seconds=40"; core/fault_spec.h) shifts a rank's trace clock, so tests can model hosts whose
// clocks disagree.
#pragma once
#include <atomic>
#include <cstddef>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace mt::obs {

// Unix seconds on this process's trace clock (the system clock, plus the injected test skew).
double trace_clock();
// The injected skew of this process (0 unless a clock_skew fault names its RANK).
double injected_clock_skew();

struct Span {
  std::string name;       // e.g. "step 5", "F mb2 c1", "allreduce"
  std::string cat;        // step | phase | compute | wait | comm
  std::string track;      // "main", or a group's track
  double t0 = 0, t1 = 0;  // trace_clock() seconds
  nlohmann::json args;    // shown with the span (micro-batch, chunk, seq, peer, ...)
};

class Timeline {
 public:
  static constexpr size_t kDefaultLimit = 1'000'000;
  bool on() const { return on_.load(std::memory_order_relaxed); }
  void set_on(bool on) { on_.store(on, std::memory_order_relaxed); }
  void set_limit(size_t max_spans);
  void add(Span s);          // kept while on() and under the limit; counted as dropped beyond it
  std::vector<Span> take();  // the spans so far, oldest first; clears them (and the dropped count)
  size_t dropped() const;

 private:
  std::atomic<bool> on_{false};
  mutable std::mutex mu_;
  std::vector<Span> spans_;
  size_t limit_ = kDefaultLimit, dropped_ = 0;
};

// The process's timeline.
Timeline& timeline();

// A span's name and arguments, built only when the timeline is on (see ScopedSpan).
struct SpanInfo {
  std::string name;
  nlohmann::json args;
};

// Records [construction, destruction) as a span on the "main" track when the timeline is on at construction.
// Where the name or arguments take work to build (a format, a JSON object), pass a function returning SpanInfo: it
// is called only when the timeline is on, so a span site costs one relaxed atomic load when it is off
// (bench_timeline: 7 ns, against 270 ns for building a pipeline action's name and arguments regardless).
class ScopedSpan {
 public:
  ScopedSpan(const char* cat, const char* name) : ScopedSpan(cat, [name] { return SpanInfo{name, nullptr}; }) {}
  template <typename Describe, typename = std::enable_if_t<std::is_invocable_r_v<SpanInfo, Describe>>>
  ScopedSpan(const char* cat, Describe&& describe) : on_(timeline().on()), cat_(cat) {
    if (!on_) return;
    SpanInfo i = describe();
    name_ = std::move(i.name);
    args_ = std::move(i.args);
    t0_ = trace_clock();
  }
  ~ScopedSpan();
  ScopedSpan(const ScopedSpan&) = delete;
  ScopedSpan& operator=(const ScopedSpan&) = delete;

 private:
  bool on_;
  double t0_ = 0;
  const char* cat_;
  std::string name_;
  nlohmann::json args_;
};

}  // namespace mt::obs
