// megatrain trace merge: argument parsing only; merging and checking are in obs/chrome_trace.h, obs/trace_check.h.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "megatrain/cli/commands.h"
#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"
#include "megatrain/obs/chrome_trace.h"
#include "megatrain/obs/trace_check.h"
#include "megatrain/obs/trace_heat_map.h"

namespace mt::cli {

namespace {

// The heat map's columns: the newest traced steps, as many as a picture shows (4 px each at this many).
constexpr size_t kHeatMapSteps = 150;

// --heatmap's file must be writable before the merge starts: a typo should not cost a merge of a large trace.
void check_writable(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    fail_as(ErrorKind::Config, "--heatmap {}: cannot write there: the directory {} does not exist", path, dir.string());
  if (fs::is_directory(p, ec)) fail_as(ErrorKind::Config, "--heatmap {}: that is a directory, not a file", path);
  if (::access(dir.c_str(), W_OK) != 0)
    fail_as(ErrorKind::Config, "--heatmap {}: cannot write there: the directory {} is not writable ({})", path,
            dir.string(), std::strerror(errno));
}

// Draws the merged trace's heat map of slow ranks into `path`; returns the line that says what it shows.
std::string write_heat_map(const obs::MergedTrace& m, const std::string& path) {
  const obs::HeatMap h = obs::trace_heat_map(m, kHeatMapSteps);
  if (h.steps.empty())
    fail_as(ErrorKind::Data,
            "--heatmap {}: no step of these traces carries its compute time (\"compute_s\" in the step spans' "
            "arguments; traces written by an older megatrain lack it)",
            path);
  with_kind(ErrorKind::IO, [&] {
    write_file_atomic(path, obs::heat_map_svg(h, fmt::format("megatrain: slow ranks, steps {} to {}", h.steps.front(),
                                                             h.steps.back())));
  });
  const obs::HeatRow& top = h.rows[h.slowest.front()];
  return fmt::format("heat map: {} ranks x {} steps -> {}; slowest: rank {} at {:.2f} x the median compute time\n",
                     h.rows.size(), h.steps.size(), path, top.place.rank, top.mean);
}

}  // namespace

int cmd_trace(int argc, char** argv) {
  CLI::App app{"Merge the ranks' timeline files (train.trace_steps writes <out_dir>/trace/rank<R>.json) into one\n"
               "Chrome trace on rank 0's clock, for ui.perfetto.dev or chrome://tracing, and say what it shows: where\n"
               "each rank's steps went, whether the ranks' clocks agree (no collective completes before all its\n"
               "members entered it), and which ranks the others waited for in each kind of collective.\n"
               "  megatrain trace merge runs/job/trace -o job.json\n"
               "  megatrain trace merge node0/trace node1/trace -o job.json --check   # exit 1 on a problem\n"
               "  megatrain trace merge runs/job/trace --heatmap slow.svg            # and a heat map of slow ranks",
               "megatrain trace"};
  app.require_subcommand(1);
  CLI::App* merge = app.add_subcommand("merge", "merge rank files (or directories of them) into one trace");
  std::vector<std::string> paths;
  std::string out, heatmap;
  bool no_align = false, json = false, check = false;
  merge->add_option("paths", paths, "rank*.json files, or directories holding them")->required();
  merge->add_option("--out,-o", out, "the merged trace (default: trace.json beside the first directory or file)");
  merge->add_flag("--no-align", no_align, "keep each rank's own clock (to see what the alignment corrects)");
  merge->add_flag("--json", json, "print the report as JSON");
  merge->add_flag("--check", check, "exit 1 when a rank is missing or the clocks disagree");
  merge->add_option("--heatmap", heatmap,
                    "also draw the heat map of slow ranks as SVG: each rank's compute time per traced step, relative "
                    "to the median over the ranks at that step");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (!heatmap.empty()) check_writable(heatmap);
  const obs::MergedTrace m = obs::merge_rank_traces(paths, !no_align);
  if (out.empty()) {
    std::string first = paths.front();
    while (first.size() > 1 && first.back() == '/') first.pop_back();
    const size_t slash = first.rfind('/');
    out = (slash == std::string::npos ? std::string(".") : first.substr(0, slash)) + "/trace.json";
  }
  with_kind(ErrorKind::IO, [&] { write_file_atomic(out, obs::to_chrome(m).dump()); });
  const std::string heat_line = heatmap.empty() ? "" : write_heat_map(m, heatmap);
  const obs::TraceReport r = obs::check_trace(m);
  if (json) {
    nlohmann::json v = nlohmann::json::array();
    for (const auto& x : r.violations) v.push_back({{"what", x.what}, {"excess_s", x.excess_s}});
    nlohmann::json j = {{"out", out},
                        {"ranks", m.ranks.size()},
                        {"missing_ranks", m.missing_ranks},
                        {"spans", m.events.size()},
                        {"aligned", m.aligned},
                        {"collectives", r.meetings.size()},
                        {"transfers", r.transfers},
                        {"unmatched", r.unmatched},
                        {"max_error_bound_s", r.max_error_bound_s},
                        {"violations", v},
                        {"last_in", r.last_in},
                        {"caused_wait_s", r.caused_wait_s}};
    if (!heatmap.empty()) j["heatmap"] = heatmap;
    for (const obs::StepBreakdown& b : obs::step_breakdown(m))
      j["breakdown"].push_back({{"rank", b.rank}, {"steps", b.steps}, {"step_s", b.step_s}, {"parts_s", b.parts_s}});
    fmt::print("{}\n", j.dump(2));
  } else {
    fmt::print("trace: {} spans of {} ranks -> {} (open in ui.perfetto.dev)\n", m.events.size(), m.ranks.size(), out);
    if (!m.missing_ranks.empty())
      fmt::print("trace: no file for rank(s) {} of {}\n", fmt::join(m.missing_ranks, ", "), m.ranks.front().world);
    fmt::print("{}{}", obs::format_report(m, r), heat_line);
  }
  return check && (!m.missing_ranks.empty() || !r.violations.empty()) ? 1 : 0;
}

}  // namespace mt::cli
