// What one timeline span costs the thread that records it (obs/timeline.h): a span site with the timeline off (one
// relaxed atomic load: the name and arguments are not built), and on (building them, two clock reads, a lock, a
// vector push). The
// names and arguments are those of a pipeline action (`F3.1` and three integers), the commonest span in a trace.
// Prints JSON; bench/timeline_overhead.py measures the same cost at the level of a whole training step.
#include <fmt/format.h>

#include "bench_util.h"
#include "megatrain/obs/timeline.h"

using namespace mt;

int main() {
  constexpr int kSpans = 200000;
  obs::Timeline& t = obs::timeline();
  auto spans = [&] {
    for (int i = 0; i < kSpans; ++i) {
      obs::ScopedSpan s("compute", [i] {
        return obs::SpanInfo{fmt::format("F{}.{}", i % 8, i % 2), {{"mb", i % 8}, {"chunk", i % 2}, {"stage", i % 4}}};
      });
    }
    t.take();
  };
  t.set_on(false);
  const double off = bench::time_median(spans, 7) / kSpans;
  t.set_on(true);
  const double on = bench::time_median(spans, 7) / kSpans;
  t.set_on(false);
  fmt::print("{{\"bench\": \"timeline\", \"spans\": {}, \"ns_per_span_off\": {:.1f}, \"ns_per_span_on\": {:.1f}}}\n",
             kSpans, off * 1e9, on * 1e9);
  return 0;
}
