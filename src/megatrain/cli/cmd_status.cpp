// megatrain status: argument parsing and the HTTP fetch only. The text is launch/status_text.h's.
#include <httplib.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdlib>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "megatrain/cli/commands.h"
#include "megatrain/comm/store.h"
#include "megatrain/core/error.h"
#include "megatrain/launch/http_failure.h"
#include "megatrain/launch/notifier.h"
#include "megatrain/launch/status_text.h"

namespace mt::cli {

int cmd_status(int argc, char** argv) {
  CLI::App app{"Show a running job from its dashboard (megatrain launch --dashboard): state, layout, steps, loss,\n"
               "step times, MFU, effective training time, the ranks not keeping up and the newest events.\n"
               "  megatrain status http://node00:8080/ --token-file ~/.megatrain-token\n"
               "  megatrain status node00:8080 --watch 5\n"
               "  megatrain status https://node00:8443/ --ca ~/cluster-ca.pem\n"
               "The token is --token-file's first line, else MEGATRAIN_DASHBOARD_TOKEN. Exits 1 when the dashboard\n"
               "cannot be read (not there, refused, a wrong token), saying why.",
               "megatrain status"};
  std::string url, token_file, ca_file;
  double watch = 0;
  bool as_json = false;
  app.add_option("url", url, "the dashboard: http(s)://HOST:PORT/ (or HOST:PORT)")->required();
  app.add_option("--token-file", token_file, "a file whose first line is the dashboard's token");
  app.add_flag("--json", as_json, "print /api/job as it is");
  app.add_option("--ca", ca_file,
                 "for https: the CA bundle (PEM) the dashboard's certificate is checked against "
                 "(default: the system's CAs)")
      ->check(CLI::ExistingFile);
  app.add_option("--watch", watch, "show it again every this many seconds, until interrupted (0: once)")
      ->check(CLI::Range(0.0, 3600.0));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (url.find("://") == std::string::npos) url = "http://" + url;
  const launch::WebhookUrl where = launch::parse_webhook_url(url, "megatrain status");
  std::string token;
  if (!token_file.empty()) {
    token = with_kind(ErrorKind::Config, [&] { return read_secret_file(token_file, "dashboard token"); });
  } else if (const char* t = std::getenv("MEGATRAIN_DASHBOARD_TOKEN"); t && *t) {
    token = t;
  }
  std::string base = where.path;
  if (base.empty() || base.back() != '/') base += '/';

  httplib::Client client(where.scheme_host_port);
  client.set_connection_timeout(5, 0);
  client.set_read_timeout(10, 0);
  if (where.scheme_host_port.rfind("https://", 0) == 0) {
    client.enable_server_certificate_verification(true);
    if (!ca_file.empty()) client.set_ca_cert_path(ca_file);
  } else if (!ca_file.empty()) {
    fail_as(ErrorKind::Config, "--ca is for an https:// dashboard; {} is plain HTTP", where.scheme_host_port);
  }
  if (!token.empty()) client.set_bearer_token_auth(token.c_str());
  const bool tty = ::isatty(STDOUT_FILENO);
  for (;;) {
    auto res = client.Get(base + "api/job");
    if (!res) {
      fmt::print(stderr, "megatrain status: cannot read {}api/job: {}{}\n", where.scheme_host_port + base,
                 launch::http_failure(res, client, 5, 10),
                 launch::certificate_refused(res) && ca_file.empty() ? " (--ca FILE names the CA that signed it)" : "");
      return 1;
    }
    if (res->status != 200) {
      fmt::print(stderr, "megatrain status: {}api/job answered HTTP {}{}\n", where.scheme_host_port + base, res->status,
                 res->status == 401 ? " (the dashboard wants its token: --token-file FILE)" : "");
      return 1;
    }
    const auto j = nlohmann::json::parse(res->body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      fmt::print(stderr, "megatrain status: {}api/job is not the dashboard's JSON\n", where.scheme_host_port + base);
      return 1;
    }
    if (watch > 0 && tty) fmt::print("\033[H\033[2J");  // a terminal shows the newest only
    fmt::print("{}", as_json ? j.dump(2) + "\n" : launch::status_text(j));
    std::fflush(stdout);
    if (watch <= 0) return 0;
    if (!tty) fmt::print("----\n");
    std::this_thread::sleep_for(std::chrono::duration<double>(watch));
  }
}

}  // namespace mt::cli
