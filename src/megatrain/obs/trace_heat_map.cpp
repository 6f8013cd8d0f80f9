#include "megatrain/obs/trace_heat_map.h"

namespace mt::obs {

HeatMap trace_heat_map(const MergedTrace& m, size_t max_steps) {
  std::vector<HeatPlace> places;
  for (const RankTrace& r : m.ranks) places.push_back({r.rank, 0, r.dp, r.pp, r.tp});
  std::vector<HeatSample> samples;
  for (const TraceEvent& e : m.events) {
    if (e.cat != "step" || e.track != "main" || !e.args.is_object()) continue;
    const auto step = e.args.find("step"), compute = e.args.find("compute_s");
    if (step == e.args.end() || compute == e.args.end() || !step->is_number_integer() || !compute->is_number())
      continue;
    samples.push_back({e.rank, step->get<int>(), compute->get<double>()});
  }
  return heat_map(places, samples, max_steps);
}

}  // namespace mt::obs
