#include "megatrain/launch/dashboard.h"

#include <httplib.h>
#include <openssl/err.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "megatrain/comm/store.h"
#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"
#include "megatrain/obs/heat_map.h"
#include "megatrain/obs/moe_load.h"

namespace mt::launch {

namespace {

std::unique_ptr<httplib::Server> make_server(const TlsFiles& tls) {
  if (!tls.enabled()) return std::make_unique<httplib::Server>();
  auto s = std::make_unique<httplib::SSLServer>(tls.cert.c_str(), tls.key.c_str());
  // check_tls_files passed, so what is left is OpenSSL's own refusal (e.g. a key too weak for its security level).
  if (!s->is_valid()) {
    const unsigned long e = ERR_get_error();
    char why[256] = "no reason given";
    if (e) ERR_error_string_n(e, why, sizeof why);
    ERR_clear_error();
    fail_as(ErrorKind::Config, "--dashboard-tls-cert {}: OpenSSL cannot serve with it and its key: {}", tls.cert, why);
  }
  return s;
}

// The files' identity: a renewal rewrites them in place or renames new ones over them (a new inode).
std::string file_ids(const TlsFiles& tls) {
  std::string ids;
  for (const std::string& f : {tls.cert, tls.key}) {
    struct stat st {};
    if (::stat(f.c_str(), &st) != 0) {
      ids += "missing;";
      continue;
    }
    ids += fmt::format("{}:{}:{}.{};", st.st_ino, st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
  }
  return ids;
}

}  // namespace

Dashboard::Dashboard(const std::string& address, std::string token, const TlsFiles& tls)
    : token_(std::move(token)), tls_files_(tls), tls_(tls.enabled()) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size())
    fail_as(ErrorKind::Config,
            "--dashboard '{}': expected HOST:PORT (e.g. 0.0.0.0:8080, or 127.0.0.1:0 for any "
            "free port)",
            address);
  host_ = address.substr(0, colon);
  int port = -1;
  try {
    size_t used = 0;
    port = std::stoi(address.substr(colon + 1), &used);
    if (used != address.size() - colon - 1) port = -1;
  } catch (const std::exception&) {
  }
  if (port < 0 || port > 65535) fail_as(ErrorKind::Config, "--dashboard '{}': the port must be 0..65535", address);
  if (tls_) {
    files_seen_ = file_ids(tls);
    cert_ = check_tls_files(tls);  // last_cert_check_ stays 0: the first publish() looks (an expiry is said at once)
  }
  port_ = start(port, make_server(tls_files_));
  if (port_ <= 0)
    fail_as(ErrorKind::Config, "--dashboard '{}': cannot listen there (address in use, or not this host's)", address);
}

int Dashboard::start(int port, std::unique_ptr<httplib::Server> server) {
  server_ = std::move(server);
  // SO_REUSEADDR only (a restarted launcher may bind at once), not the library's default SO_REUSEPORT as well: with
  // it a second job given the same port would bind too, and the kernel would share the connections between them.
  server_->set_socket_options([](int sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  if (!token_.empty()) {
    server_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      const std::string auth = req.get_header_value("Authorization");
      // secrets_equal (the store's): response times do not tell how much of a guess was right.
      const bool ok = (auth.rfind("Bearer ", 0) == 0 && secrets_equal(auth.substr(7), token_)) ||
                      (req.has_param("token") && secrets_equal(req.get_param_value("token"), token_));
      if (ok) return httplib::Server::HandlerResponse::Unhandled;
      res.status = 401;
      res.set_header("WWW-Authenticate", "Bearer");
      res.set_content("megatrain dashboard: this request needs the dashboard's token (Authorization: Bearer TOKEN, "
                      "or ?token=TOKEN)\n",
                      "text/plain; charset=utf-8");
      return httplib::Server::HandlerResponse::Handled;
    });
  }
  server_->Get("/", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(kDashboardPage, "text/html; charset=utf-8");
  });
  server_->Get("/api/job", [this](const httplib::Request&, httplib::Response& res) {
    res.set_header("Cache-Control", "no-store");
    res.set_content(api_job(), "application/json");
  });
  server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics(), "text/plain; version=0.0.4; charset=utf-8");
  });
  const int bound = port == 0 ? server_->bind_to_any_port(host_) : (server_->bind_to_port(host_, port) ? port : -1);
  if (bound <= 0) return -1;
  auto ended = std::make_shared<std::atomic<bool>>(false);
  thread_ = std::thread([this, ended] {
    server_->listen_after_bind();
    *ended = true;
  });
  // stop() only ends a server that is already listening: one stopped before its thread got there would listen on,
  // and the destructor's join would never return. So the dashboard exists only once it listens.
  while (!server_->is_running() && !*ended) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return bound;
}

void Dashboard::stop_server() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

Dashboard::~Dashboard() { stop_server(); }

void Dashboard::check_certificate() {
  if (!tls_ || !server_) return;
  last_cert_check_ = now_seconds();
  auto notice = [&](const char* reason, const std::string& text) {
    if (notice_) notice_(reason, text);
  };
  if (const std::string ids = file_ids(tls_files_); ids != files_seen_) {
    files_seen_ = ids;
    TlsCertInfo renewed;
    std::unique_ptr<httplib::Server> next;  // made before the old one stops: OpenSSL may still refuse the pair
    try {
      renewed = check_tls_files(tls_files_);
      next = make_server(tls_files_);
    } catch (const Error& e) {
      notice("certificate_refused",
             fmt::format("dashboard: the changed certificate or key is not served, the one before stays: {}",
                         e.what()));
      return;
    }
    // A new server on the same port (httplib's takes its certificate once): requests in those milliseconds fail,
    // and a client asks again.
    stop_server();
    server_.reset();
    if (start(port_, std::move(next)) != port_) {
      server_.reset();
      notice("dashboard_lost", fmt::format("dashboard: cannot listen on port {} again after the certificate's "
                                           "renewal (taken meanwhile); the job goes on without a dashboard",
                                           port_));
      return;
    }
    cert_ = renewed;
    expiry_said_day_ = std::numeric_limits<int>::max();
    notice("certificate_renewed", fmt::format("dashboard: now serving the renewed certificate {} ({}), valid until {}",
                                              tls_files_.cert, cert_.subject, cert_.not_after));
  }
  // Under a week before it runs out, once a day: a job outlives many short-lived certificates.
  const double days = (cert_.expires_at - unix_seconds()) / 86400.0;
  const int day = static_cast<int>(std::floor(days));
  if (days < 7 && day < expiry_said_day_) {
    expiry_said_day_ = day;
    notice("certificate_expiring",
           days < 0 ? fmt::format("dashboard: the certificate {} expired on {}; clients refuse it. Renew the files: "
                                  "the dashboard serves the new ones within a minute",
                                  tls_files_.cert, cert_.not_after)
                    : fmt::format("dashboard: the certificate {} expires in {:.1f} days ({}); renew the files: the "
                                  "dashboard serves the new ones within a minute",
                                  tls_files_.cert, days, cert_.not_after));
  }
}

std::string Dashboard::url() const {
  const std::string host = host_ == "0.0.0.0" || host_ == "::" ? "127.0.0.1" : host_;
  return fmt::format("{}://{}:{}/", tls_ ? "https" : "http", host, port_);
}

void Dashboard::publish(const JobView& v) {
  // Outside the lock: a renewal restarts the server, whose request threads take the lock.
  if (tls_ && now_seconds() - last_cert_check_ >= kCertificateCheckSeconds) check_certificate();
  std::lock_guard<std::mutex> lock(mu_);
  if (v.attempt != history_attempt_) {  // a new attempt numbers its steps afresh from its checkpoint
    history_attempt_ = v.attempt;
    last_step_.clear();
    compute_.clear();
  }
  for (const RankView& r : v.ranks) {
    const RankStatus& s = r.status;
    // A step joins the history once per rank: each of the rank's step records newer than the newest step it already
    // gave. A view made of statuses without records (none in the window) gives the newest step's numbers alone.
    auto [it, fresh] = last_step_.try_emplace(s.rank, s.start_step >= 0 ? s.start_step : 0);
    auto add = [&](int step, const std::optional<double>& loss, double step_time, std::optional<double> compute) {
      if (step <= it->second) return;
      it->second = step;
      if (compute) compute_[step][s.rank] = *compute;
      StepPoint& p = history_[{v.attempt, step}];
      if (!p.loss && loss) p.loss = loss;
      p.fastest = p.ranks == 0 ? step_time : std::min(p.fastest, step_time);
      p.slowest = p.ranks == 0 ? step_time : std::max(p.slowest, step_time);
      ++p.ranks;
    };
    for (const StepRecord& rec : s.recent) add(rec.step, rec.loss, rec.step_time, rec.compute_time);
    if (s.recent.empty() && s.step_time) add(s.step, s.loss, *s.step_time, s.compute_time);
  }
  while (history_.size() > kMaxHistory) history_.erase(history_.begin());
  while (compute_.size() > kHeatSteps) compute_.erase(compute_.begin());
  view_ = v;
}

void Dashboard::event(const nlohmann::json& e) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(e);
  while (events_.size() > kMaxEvents) events_.pop_front();
  // A silent data corruption stays on the page (a fault the job recovers from would otherwise scroll away): the
  // rank's own report (train/sdc_check.h) is the event's detail.
  const std::string reason = e.value("reason", "");
  if (e.value("event", "") == "fault" && (reason == "sdc" || reason == "sdc_culprit")) {
    const nlohmann::json d = e.contains("detail") && e["detail"].is_object() ? e["detail"] : nlohmann::json::object();
    sdc_.push_back({{"attempt", e.value("attempt", 0)},
                    {"node", e.value("node", 0)},
                    {"rank", e.value("rank", -1)},
                    {"reason", reason},
                    {"step", d.value("step", -1)},
                    {"tensor", d.value("tensor", "")},
                    {"transient", d.value("transient", false)}});
  }
}

std::string Dashboard::api_job() const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json j = job_json(view_);
  nlohmann::json h = nlohmann::json::array();
  for (const auto& [key, p] : history_)
    h.push_back({{"attempt", key.first},
                 {"step", key.second},
                 {"loss", p.loss ? nlohmann::json(*p.loss) : nlohmann::json()},
                 {"fastest", p.fastest},
                 {"slowest", p.slowest},
                 {"ranks", p.ranks}});
  j["history"] = std::move(h);
  j["heatmap"] = obs::heat_map_json(heat_map());
  nlohmann::json ev = nlohmann::json::array();
  for (const nlohmann::json& e : events_) ev.push_back(e);
  j["events"] = std::move(ev);
  j["sdc"] = sdc_;
  // A MoE model's routing load: the lowest rank's that sent one (the main rank's, which metrics.jsonl logs).
  j["moe"] = nullptr;
  for (const RankView& r : view_.ranks)
    if (r.status.moe.step >= 0) {
      j["moe"] = obs::moe_load_json(r.status.moe, r.status.rank);
      break;
    }
  // Event lines quote the ranks' output, which need not be UTF-8: replace what JSON cannot carry. (A NaN loss is
  // written as null by the library.)
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

obs::HeatMap Dashboard::heat_map() const {
  std::vector<obs::HeatPlace> places;
  for (const RankView& r : view_.ranks)
    if (r.status.rank >= 0)  // known once its agent started it
      places.push_back({r.status.rank, r.node, r.status.coord_dp, r.status.coord_pp, r.status.coord_tp});
  std::vector<obs::HeatSample> samples;
  for (const auto& [step, by_rank] : compute_)
    for (const auto& [rank, compute] : by_rank) samples.push_back({rank, step, compute});
  return obs::heat_map(places, samples, kHeatSteps);
}

std::string Dashboard::metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  return prometheus_text(view_);
}

}  // namespace mt::launch
