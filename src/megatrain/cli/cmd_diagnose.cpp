// megatrain diagnose: argument parsing only; the checks are in launch/diagnose.h.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdlib>
#include <fstream>

#include "megatrain/cli/commands.h"
#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"
#include "megatrain/launch/diagnose.h"

namespace mt::cli {

int cmd_diagnose(int argc, char** argv) {
  CLI::App app{"Check this node before trusting it again (MegaScale's stop-and-check): a local all-reduce among\n"
               "--local-ranks processes (exact result and bandwidth), the backend's matmul rate and the memory\n"
               "bandwidth, each against --expect (a healthy node's report, written with --save).\n"
               "  megatrain diagnose --save healthy.json          # on a node known to be good\n"
               "  megatrain diagnose --expect healthy.json --json # after a fault; exit 1 when a check fails",
               "megatrain diagnose"};
  launch::DiagnoseOptions o;
  if (const char* n = std::getenv("MEGATRAIN_NODE_RANK")) o.node = std::atoi(n);
  if (const char* n = std::getenv("LOCAL_WORLD_SIZE")) o.local_ranks = std::max(2, std::atoi(n));
  std::string expect, save;
  bool json = false;
  app.add_option("--local-ranks", o.local_ranks, "processes in the local all-reduce (default LOCAL_WORLD_SIZE or 2)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--expect", expect, "JSON with a healthy node's values (what --save writes)");
  app.add_option("--save", save, "write this node's values there, to --expect them on other nodes");
  app.add_option("--tolerance", o.tolerance, "a value under this fraction of the expected one fails (default 0.5)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--node", o.node, "this node's index, for the report (default MEGATRAIN_NODE_RANK or 0)");
  app.add_flag("--json", json, "print the report as JSON");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (!expect.empty()) {
    o.expect = nlohmann::json::parse(read_text_file(expect), nullptr, /*allow_exceptions=*/false);
    MT_CHECK(o.expect.is_object(), "--expect {}: not a JSON object of check names and values", expect);
  }
  launch::DiagnoseReport r = launch::run_diagnose(o);
  if (!save.empty()) write_file_atomic(save, r.values().dump(2) + "\n");
  if (json) {
    fmt::print("{}\n", r.to_json().dump());
  } else {
    for (const auto& c : r.checks)
      fmt::print("{:<20} {:<4} {}\n", c.name, !c.ran ? "-" : c.pass ? "ok" : "FAIL",
                 c.ran ? fmt::format("{:.3g} {} ({})", c.value, c.unit, c.detail) : c.detail);
    fmt::print("node {}: {}\n", r.node, r.pass() ? "healthy" : "FAILED");
  }
  return r.pass() ? 0 : 1;
}

}  // namespace mt::cli
