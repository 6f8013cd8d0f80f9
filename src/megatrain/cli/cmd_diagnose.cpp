// megatrain diagnose: argument parsing only; the checks are in launch/diagnose.h.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <csignal>
#include <cstdlib>
#include <fstream>

#include "megatrain/cli/commands.h"
#include "megatrain/comm/local_address.h"
#include "megatrain/comm/store.h"
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
  app.add_option("--pair-store", o.pair_store,
                 "the store URL a neighbouring node meets this one at for the pairwise check (default: no pair)");
  app.add_option("--pair-group", o.pair_group, "the name both nodes of the pair use")->needs("--pair-store");
  app.add_option("--pair-rank", o.pair_rank, "this node's rank in the pair, 0 or 1")
      ->check(CLI::Range(0, 1))
      ->needs("--pair-store");
  app.add_option("--iface", o.iface, "the address this node listens on for the pairwise check (default 127.0.0.1)");
  app.add_option("--pair-timeout", o.pair_timeout_s, "seconds to wait for the neighbour (default 30)")
      ->check(CLI::Range(1.0, 3600.0));
  std::string secret_file;
  app.add_option("--secret-file", secret_file,
                 "the tcp store's secret for --pair-store (default MEGATRAIN_STORE_SECRET)")
      ->needs("--pair-store");
  app.add_flag("--json", json, "print the report as JSON");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  MT_CHECK(o.pair_store.empty() || !o.pair_group.empty(), "--pair-store needs --pair-group (the name both nodes use)");
  if (!secret_file.empty()) ::setenv(kStoreSecretEnv, read_store_secret_file(secret_file).c_str(), 1);
  if (const char* e = std::getenv("MEGATRAIN_IFACE"); e && *e && o.iface == "127.0.0.1") o.iface = e;
  if (!o.iface.empty() && o.iface.find_first_of(".:") == std::string::npos)
    o.iface = local_address_of(o.iface, "--iface").address;  // an interface name: its address
  if (!expect.empty()) {
    o.expect = nlohmann::json::parse(read_text_file(expect), nullptr, /*allow_exceptions=*/false);
    MT_CHECK(o.expect.is_object(), "--expect {}: not a JSON object of check names and values", expect);
  }
  std::signal(SIGPIPE, SIG_IGN);  // a peer that dies mid-check is a failed check, not a SIGPIPE death (cmd_train.cpp)
  launch::DiagnoseReport r = launch::run_diagnose(o);
  if (!save.empty()) write_file_atomic(save, r.values().dump(2) + "\n");
  if (json) {
    fmt::print("{}\n", r.to_json().dump());
  } else {
    for (const auto& c : r.checks)
      fmt::print("{:<20} {:<4} {}\n", c.name,
                 !c.ran   ? "-"
                 : c.pass ? "ok"
                          : "FAIL",
                 c.ran ? fmt::format("{:.3g} {} ({})", c.value, c.unit, c.detail) : c.detail);
    for (const std::string& n : r.notes) fmt::print("{}\n", n);
    fmt::print("node {}: {}\n", r.node, r.pass() ? "healthy" : "FAILED");
  }
  return r.pass() ? 0 : 1;
}

}  // namespace mt::cli
