// megatrain notify: argument parsing only. Posts one event to the webhook the way `launch --notify` posts the
// supervisor's (launch/notifier.h), for what a job script sees and no supervisor can say: the Slurm script's requeue
// after the driver's node was lost (deploy/slurm/megatrain.sbatch), a job's own milestones.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdlib>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "megatrain/cli/commands.h"
#include "megatrain/core/error.h"
#include "megatrain/launch/notifier.h"

namespace mt::cli {

int cmd_notify(int argc, char** argv) {
  CLI::App app{"Post one event to a webhook, as `megatrain launch --notify` posts the supervisor's:\n"
               "  {\"text\": \"megatrain JOB: requeued (requeue 1 of 3): ...\", \"job\": \"JOB\", \"event\": {...}}\n"
               "  megatrain notify --event requeued --field requeue=1 --field of=3 --field reason='driver lost'\n"
               "The URL is --url or MEGATRAIN_NOTIFY_URL. Exits 0 once the webhook took it, 1 when it did not\n"
               "(after the same retries as the supervisor's), saying why.",
               "megatrain notify"};
  launch::NotifyOptions o;
  std::string event;
  std::vector<std::string> fields;
  app.add_option("--url", o.url, "the webhook (http:// or https://); default: MEGATRAIN_NOTIFY_URL");
  app.add_option("--event", event, "the event's name, e.g. requeued")->required();
  app.add_option("--field", fields,
                 "KEY=VALUE added to the event (VALUE as JSON when it parses: 3, true, [1,2]; "
                 "else a string); repeatable")
      ->take_all();
  app.add_option("--job-name", o.job, "the job's name in the message (default: SLURM_JOB_NAME, else the host name)");
  app.add_option("--notify-ca", o.ca_file, "PEM file of the CAs that sign an https webhook's certificate");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (o.url.empty())
    if (const char* u = std::getenv("MEGATRAIN_NOTIFY_URL"); u && *u) o.url = u;
  if (o.url.empty()) fail_as(ErrorKind::Config, "no webhook: give --url or set MEGATRAIN_NOTIFY_URL");
  if (o.job.empty()) o.job = launch::default_job_name();
  using namespace std::chrono;
  nlohmann::json e = {{"t", duration<double>(system_clock::now().time_since_epoch()).count()}, {"event", event}};
  for (const std::string& f : fields) {
    const size_t eq = f.find('=');
    if (eq == std::string::npos || eq == 0) fail_as(ErrorKind::Config, "--field '{}': expected KEY=VALUE", f);
    const std::string key = f.substr(0, eq), value = f.substr(eq + 1);
    if (key == "t" || key == "event") fail_as(ErrorKind::Config, "--field '{}': '{}' is set by the command", f, key);
    nlohmann::json v = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
    e[key] = v.is_discarded() ? nlohmann::json(value) : v;
  }
  launch::parse_webhook_url(o.url);  // a malformed URL is a config error, not a failed delivery
  std::string why;
  if (launch::post_event(o, e, &why)) return 0;
  fmt::print(stderr, "megatrain notify: the '{}' event was not delivered to {}: {}\n", event,
             launch::parse_webhook_url(o.url).scheme_host_port, why);
  return 1;
}

}  // namespace mt::cli
