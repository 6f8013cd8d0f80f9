// megatrain trace merge: argument parsing only; merging and checking are in obs/chrome_trace.h, obs/trace_check.h.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "megatrain/cli/commands.h"
#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"
#include "megatrain/obs/chrome_trace.h"
#include "megatrain/obs/trace_check.h"

namespace mt::cli {

int cmd_trace(int argc, char** argv) {
  CLI::App app{"Merge the ranks' timeline files (train.trace_steps writes <out_dir>/trace/rank<R>.json) into one\n"
               "Chrome trace on rank 0's clock, for ui.perfetto.dev or chrome://tracing, and say what it shows: where\n"
               "each rank's steps went, whether the ranks' clocks agree (no collective completes before all its\n"
               "members entered it), and which ranks the others waited for in each kind of collective.\n"
               "  megatrain trace merge runs/job/trace -o job.json\n"
               "  megatrain trace merge node0/trace node1/trace -o job.json --check   # exit 1 on a problem",
               "megatrain trace"};
  app.require_subcommand(1);
  CLI::App* merge = app.add_subcommand("merge", "merge rank files (or directories of them) into one trace");
  std::vector<std::string> paths;
  std::string out;
  bool no_align = false, json = false, check = false;
  merge->add_option("paths", paths, "rank*.json files, or directories holding them")->required();
  merge->add_option("--out,-o", out, "the merged trace (default: trace.json beside the first directory or file)");
  merge->add_flag("--no-align", no_align, "keep each rank's own clock (to see what the alignment corrects)");
  merge->add_flag("--json", json, "print the report as JSON");
  merge->add_flag("--check", check, "exit 1 when a rank is missing or the clocks disagree");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const obs::MergedTrace m = obs::merge_rank_traces(paths, !no_align);
  if (out.empty()) {
    std::string first = paths.front();
    while (first.size() > 1 && first.back() == '/') first.pop_back();
    const size_t slash = first.rfind('/');
    out = (slash == std::string::npos ? std::string(".") : first.substr(0, slash)) + "/trace.json";
  }
  with_kind(ErrorKind::IO, [&] { write_file_atomic(out, obs::to_chrome(m).dump()); });
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
    for (const obs::StepBreakdown& b : obs::step_breakdown(m))
      j["breakdown"].push_back({{"rank", b.rank}, {"steps", b.steps}, {"step_s", b.step_s}, {"parts_s", b.parts_s}});
    fmt::print("{}\n", j.dump(2));
  } else {
    fmt::print("trace: {} spans of {} ranks -> {} (open in ui.perfetto.dev)\n", m.events.size(), m.ranks.size(), out);
    if (!m.missing_ranks.empty())
      fmt::print("trace: no file for rank(s) {} of {}\n", fmt::join(m.missing_ranks, ", "), m.ranks.front().world);
    fmt::print("{}", obs::format_report(m, r));
  }
  return check && (!m.missing_ranks.empty() || !r.violations.empty()) ? 1 : 0;
}

}  // namespace mt::cli
