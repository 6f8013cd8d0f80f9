// The heat map of slow ranks (MegaScale §5.1): each rank's compute time at each of the recent steps, divided by the
// median over the ranks of that same step. A straggler is then a row hotter than 1 at every step, whatever the
// steps' length, and a step that was slow for every rank (a checkpoint, an evaluation) stays at 1: only what sets
// a rank apart from its peers shows. Compute time is the step less the time the rank was blocked on communication
// (the straggler rule's measure), because a fast rank's step is as long as the slow one's: it waits for it.
//
// Two pictures are drawn from it: the dashboard's (launch/dashboard.h serves heat_map_json, its page draws it) and
// `megatrain trace merge --heatmap FILE.svg` (heat_map_svg, from the traced steps). Both lay the rows out by the
// rank's place in the mesh, (dp, pp, tp), and name the slowest ranks beside the map. At 1,024 ranks a row per rank
// is unreadable, so each node also gets a row: per step the hottest of its ranks (a mean would hide one slow GPU
// among eight), and the page opens a node's ranks on a click.
//
// Pure: the same samples give the same map, so tests compare it with hand-computed answers.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mt::obs {

// Where a rank runs: its node and its coordinates in the mesh (-1: not known yet, e.g. a rank still starting).
struct HeatPlace {
  int rank = 0;
  int node = 0;
  int dp = -1, pp = -1, tp = -1;
};

// One rank's compute time at one step.
struct HeatSample {
  int rank = 0;
  int step = 0;
  double compute_s = 0;
};

struct HeatRow {
  HeatPlace place;
  std::vector<std::optional<double>> rel;  // per column: compute / the step's median (none: no sample, or median 0)
  double mean = 0;                         // the mean of rel over the columns that have one (0 when none has)
  int samples = 0;                         // the columns that have one
};

struct HeatNode {
  int node = 0;
  std::vector<int> ranks;                  // its ranks, in row order
  std::vector<std::optional<double>> rel;  // per column: the largest of its ranks' values
  double mean = 0;                         // the largest of its ranks' means
  int hottest_rank = -1;                   // the rank with that mean (-1 when no rank has samples)
};

struct HeatMap {
  std::vector<int> steps;        // the columns: the newest steps sampled, oldest first
  std::vector<double> median_s;  // per column: the median compute time over the ranks that reported that step
  std::vector<HeatRow> rows;     // by (dp, pp, tp); ranks whose place is not known after them, by rank
  std::vector<HeatNode> nodes;   // by node
  std::vector<size_t> slowest;   // indexes into rows: the hottest by mean first, at most kSlowest, only sampled rows
  static constexpr size_t kSlowest = 5;
};

// The map of `places` (one per rank; of a rank given twice, the first counts) over the newest `max_steps` steps that have
// samples. Samples of a rank not in `places` are left out; of one (rank, step) given twice, the last counts. The
// median of an even count is the mean of the two middle values.
HeatMap heat_map(const std::vector<HeatPlace>& places, const std::vector<HeatSample>& samples, size_t max_steps);

// {"steps": [...], "median_s": [...], "rows": [{rank, node, coord: [dp,pp,tp]|null, rel: [x|null], mean, samples}],
//  "nodes": [{node, ranks, rel, mean, hottest_rank|null}], "slowest": [{rank, node, coord, mean}]}; the relative
// values rounded to 4 decimals (what a picture can show; 1,024 rows of them go to the page each second).
nlohmann::json heat_map_json(const HeatMap& h);

// A standalone SVG picture: a row per rank (a <g class="heat-row" data-rank="R" data-mean="M">, the hottest with
// data-hottest="true"), a column per step, a colour scale (blue under the median, white at it, red at twice it and
// above), and the slowest ranks named beside it (<text class="slowest" data-rank="R">). `title` heads it.
std::string heat_map_svg(const HeatMap& h, const std::string& title);

// The cell colour for a relative value, as "#rrggbb" (the page's script draws with the same scale).
std::string heat_colour(double rel);

}  // namespace mt::obs
