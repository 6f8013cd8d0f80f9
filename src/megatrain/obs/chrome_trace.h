// Chrome trace files: one per rank, written by the trainer at the end of its trace window, and one merged file for
// the whole job (`megatrain trace merge`), which Perfetto (ui.perfetto.dev) and chrome://tracing open.
//
// A rank's file is itself a valid trace (events "X" with ts/dur in microseconds of its own clock, process = rank,
// one thread per track) plus a "megatrain" object: rank, world, the rank's place in the mesh, and its clock's
// offset to rank 0's with the bound on that offset's error (comm/clock_offset.h). Merging puts every rank on rank
// 0's clock, starts time at the job's first event, and names each process "rank R (dp, pp, tp)" in rank order.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "megatrain/obs/timeline.h"

namespace mt::obs {

struct RankTrace {
  int rank = 0, world = 1;
  std::string label;                  // e.g. "rank 1 (dp 0, pp 1, tp 0)"
  int dp = -1, pp = -1, tp = -1;      // the rank's place in the mesh (-1: a file written before it was recorded)
  double clock_offset_s = 0;          // add to this rank's times to read them on rank 0's clock
  double clock_error_s = 0;           // bound on |offset error|
  size_t dropped = 0;                 // spans beyond the timeline's limit
  int first_step = 0, last_step = 0;  // the trace window
};

nlohmann::json chrome_trace(const RankTrace& info, const std::vector<Span>& spans);
// Writes chrome_trace(...) atomically (a reader sees the whole file or none).
void write_rank_trace(const std::string& path, const RankTrace& info, const std::vector<Span>& spans);

// A span of the merged trace: times in seconds on rank 0's clock since `MergedTrace::base_unix_s`.
struct TraceEvent {
  int rank = 0;
  std::string name, cat, track;
  double t0 = 0, t1 = 0;
  nlohmann::json args;
};

struct MergedTrace {
  std::vector<RankTrace> ranks;    // by rank
  std::vector<int> missing_ranks;  // ranks below `world` with no file
  std::vector<TraceEvent> events;  // by rank, then start time
  double base_unix_s = 0;          // the earliest event, on rank 0's clock
  bool aligned = true;             // false: each rank's own clock (--no-align)
};

// Reads rank files (paths: files, or directories whose rank*.json are read) and merges them. A file that is not a
// megatrain rank trace, two files of one rank, or ranks of different world sizes are errors naming the file(s).
MergedTrace merge_rank_traces(const std::vector<std::string>& paths, bool align = true);
nlohmann::json to_chrome(const MergedTrace& m);

}  // namespace mt::obs
