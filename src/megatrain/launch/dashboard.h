// The supervisor's HTTP dashboard (`megatrain launch --dashboard HOST:PORT`): what the job is doing, while it runs,
// for people and for monitoring systems. The supervisor that sees every rank (one node's agent, or the job driver
// on node 0) publishes a JobView whenever something changed; the server answers from the latest one:
//   GET /          a page (launch/dashboard_page.cpp) that polls /api/job each second: the job's state, a
//                  (dp, pp, tp) grid of the ranks with each one's step, phase and heartbeat age (a rank that
//                  stopped answering or waits on a collective stands out), the heat map of slow ranks, the loss and
//                  the spread of step times over steps, the newest events, and a banner for each silent data
//                  corruption;
//   GET /api/job   job_json(view) plus "history" (per step: the loss, and the fastest and slowest rank's step
//                  time), "heatmap" (obs/heat_map.h's heat_map_json: each rank's compute time over the newest
//                  kHeatSteps steps of the attempt, relative to the median over the ranks at the same step, rows by
//                  (dp, pp, tp), node rows, the slowest ranks), "events" (the newest event-log lines) and "sdc"
//                  (every silent-data-corruption fault of the job, however old: the event log's `fault` lines with
//                  reason sdc or sdc_culprit, as {attempt, node, rank, reason, step, tensor, transient}) and
//                  "moe" (a MoE model's routing load at the newest step the main rank sent, obs/moe_load.h's
//                  moe_load_json: per MoE layer the tokens per expert, their shares, max/mean and the drops; null for
//                  a dense model);
//   GET /metrics   the Prometheus text format (job_view.h).
// Without a token anyone who reaches the port reads the job (names, losses, the command line's events); with one
// (`--dashboard-token-file`), only those who hold it. Over plain HTTP the token crosses the network as it is; with a
// certificate and key (`--dashboard-tls-cert`, `--dashboard-tls-key`) the dashboard serves HTTPS only.
// The server runs on threads of its own (cpp-httplib's pool), so a slow client never delays supervision, and it
// never touches the supervisor's state: publish() copies the view under a lock.
#pragma once
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "megatrain/launch/job_view.h"
#include "megatrain/obs/heat_map.h"
#include "megatrain/launch/tls_files.h"

namespace httplib {
class Server;
}

namespace mt::launch {

extern const char* const kDashboardPage;  // dashboard_page.cpp

class Dashboard {
 public:
  // Listens on "HOST:PORT" (PORT 0: a free port the kernel picks; HOST 0.0.0.0: every interface). Throws
  // mt::Error (Config) naming the address when it is malformed or cannot be bound. With a token, every request
  // must carry it, as "Authorization: Bearer TOKEN" (Prometheus's bearer_token, curl -H) or "?token=TOKEN" (a
  // browser; the page passes its own query on to its fetches); others get 401. With `tls` enabled it serves HTTPS
  // with that certificate, checked first (check_tls_files: an unusable pair throws, naming its file and the problem).
  explicit Dashboard(const std::string& address, std::string token = "", const TlsFiles& tls = {});
  ~Dashboard();
  Dashboard(const Dashboard&) = delete;
  Dashboard& operator=(const Dashboard&) = delete;

  int port() const { return port_; }
  std::string url() const;                                  // http(s)://HOST:PORT/ (127.0.0.1 for a wildcard host)
  const TlsCertInfo& certificate() const { return cert_; }  // with TLS: the certificate being served

  // With TLS, publish() looks at the certificate and key files on its first call and then at most once every
  // kCertificateCheckSeconds (this does so now): a renewed pair (the files changed, and check_tls_files passes) is served from then on, the job
  // going on; a changed pair that fails the check is not (the one before stays). Each is said through the notice
  // callback (reason certificate_renewed, certificate_refused, or dashboard_lost when the port was taken in the
  // moment between servers), and so is a certificate under a week from expiry, once a day (certificate_expiring).
  void check_certificate();
  using Notice = std::function<void(const std::string& reason, const std::string& text)>;
  void on_notice(Notice n) { notice_ = std::move(n); }
  static constexpr double kCertificateCheckSeconds = 60;

  // Replaces the view. Each rank's step that is new joins the history (keyed by attempt and step: a restart
  // replays steps from its checkpoint, and those are the new attempt's).
  void publish(const JobView& v);
  // An event-log line (EventLog's observer); the newest kMaxEvents are kept, and every sdc fault.
  void event(const nlohmann::json& e);

  // The bodies the server sends (also for tests).
  std::string api_job() const;
  std::string metrics() const;

  static constexpr size_t kMaxEvents = 100;
  static constexpr size_t kMaxHistory = 2000;  // steps
  static constexpr size_t kHeatSteps = 30;     // the heat map's columns: 1,024 ranks x 30 steps each second

 private:
  struct StepPoint {
    std::optional<double> loss;
    double fastest = 0, slowest = 0;  // step time over the ranks that reported this step
    int ranks = 0;
  };

  mutable std::mutex mu_;
  JobView view_;
  std::map<std::pair<int, int>, StepPoint> history_;  // (attempt, step)
  std::map<int, int> last_step_;                      // per rank: the newest step already in history_ (this attempt)
  int history_attempt_ = -1;
  std::map<int, std::map<int, double>> compute_;  // the heat map's samples: step -> rank -> compute time (this attempt)
  std::deque<nlohmann::json> events_;
  std::vector<nlohmann::json> sdc_;  // the silent-data-corruption faults, kept for the job's whole life

  obs::HeatMap heat_map() const;  // of view_'s ranks and compute_ (mu_ held)
  // Serves on port (0: any) with `server` (make_server's), listening; the port, or -1 when it cannot bind.
  int start(int port, std::unique_ptr<httplib::Server> server);
  void stop_server();

  std::string host_, token_;
  int port_ = 0;
  TlsFiles tls_files_;
  bool tls_ = false;
  TlsCertInfo cert_;
  std::string files_seen_;  // the certificate and key files' identity (inode, size, mtime) when last looked at
  double last_cert_check_ = 0;
  int expiry_said_day_ = std::numeric_limits<int>::max();  // whole days left when the expiry was last said
  Notice notice_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
};

}  // namespace mt::launch
