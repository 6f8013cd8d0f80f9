#include "megatrain/launch/notifier.h"

#include <httplib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"
#include "megatrain/launch/http_failure.h"

namespace mt::launch {

using nlohmann::json;

const std::vector<std::string> kDefaultNotifyEvents = {"detected", "restarting", "resumed",
                                                       "evicted",  "done",       "gave_up"};
const std::vector<std::string> kAllEventNames = {
    "started", "fault",   "injected",   "detected", "stopped",   "restarting", "resumed", "caught_up", "warning",
    "done",    "gave_up", "registered", "planned",  "diagnosed", "evicted",    "fenced",  "dashboard", "stacks"};

std::string default_job_name() {
  if (const char* j = std::getenv("SLURM_JOB_NAME"); j && *j) return j;
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return host;
}

WebhookUrl parse_webhook_url(const std::string& url, const char* option) {
  const size_t sep = url.find("://");
  const std::string scheme = sep == std::string::npos ? "" : url.substr(0, sep);
  if (scheme != "http" && scheme != "https")
    fail_as(ErrorKind::Config, "{} '{}': expected an http:// or https:// URL", option, url);
  const size_t path_at = url.find('/', sep + 3);
  const std::string authority = url.substr(sep + 3,
                                           path_at == std::string::npos ? std::string::npos : path_at - sep - 3);
  if (authority.find('@') != std::string::npos)
    fail_as(ErrorKind::Config,
            "{} '{}': user:password@ in the URL is not supported; put the secret in the path "
            "or query, as webhook services do",
            option, url);
  // HOST, HOST:PORT, [IPv6] or [IPv6]:PORT.
  std::string host = authority, port;
  if (!authority.empty() && authority[0] == '[') {
    const size_t close = authority.find(']');
    if (close == std::string::npos) fail_as(ErrorKind::Config, "{} '{}': an unclosed '[' in the host", option, url);
    host = authority.substr(0, close + 1);
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') fail_as(ErrorKind::Config, "{} '{}': a malformed host", option, url);
      port = authority.substr(close + 2);
    }
  } else if (const size_t colon = authority.rfind(':'); colon != std::string::npos) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
    if (port.empty()) fail_as(ErrorKind::Config, "{} '{}': an empty port", option, url);
  }
  if (host.empty() || host == "[]") fail_as(ErrorKind::Config, "{} '{}': no host", option, url);
  if (!port.empty()) {
    const bool digits = port.size() <= 5 &&
                        std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits || std::stoi(port) < 1 || std::stoi(port) > 65535)
      fail_as(ErrorKind::Config, "{} '{}': the port must be 1..65535", option, url);
  }
  WebhookUrl w;
  w.scheme_host_port = scheme + "://" + host + (port.empty() ? "" : ":" + port);
  w.path = path_at == std::string::npos ? "/" : url.substr(path_at);
  return w;
}

namespace {

std::string str(const json& e, const char* key) {
  if (!e.contains(key)) return "";
  return e[key].is_string() ? e[key].get<std::string>() : e[key].dump();
}

std::string detected_text(const json& e) {
  const std::string reason = str(e, "reason");
  if (reason == "exit") return fmt::format("rank {} {}", str(e, "rank"), str(e, "status"));
  if (reason == "hang") return fmt::format("hang: {}: {}", str(e, "why"), str(e, "blame"));
  if (e.contains("line")) return str(e, "line");  // node_lost, straggler
  return reason;
}

}  // namespace

std::string notify_text(const json& e, const std::string& job) {
  const std::string event = str(e, "event");
  std::string what;
  if (event == "detected") {
    what = "fault detected: " + detected_text(e);
  } else if (event == "restarting") {
    what = fmt::format("restarting in {:.1f} s after a failure (code {}): {}", e.value("delay_s", 0.0),
                       str(e, "failure_code"), str(e, "reason"));
    if (e.contains("nodes"))
      what += fmt::format("; next on nodes {}", fmt::join(e["nodes"].get<std::vector<int>>(), ","));
  } else if (event == "resumed") {
    what = fmt::format("resumed: step {} done, {:.1f} s after the restart (from the checkpoint of step {})",
                       str(e, "step"), e.value("seconds", 0.0), str(e, "from"));
  } else if (event == "caught_up") {
    what = fmt::format("caught up: step {} reached again, {:.1f} s after the restart", str(e, "step"),
                       e.value("seconds", 0.0));
  } else if (event == "evicted") {
    what = fmt::format("node {} evicted: {}", str(e, "node"), str(e, "reason"));
  } else if (event == "done") {
    what = fmt::format("done: {} (step {}, {} restarts", e.value("reason", "every rank finished"), str(e, "best_step"),
                       e.value("restarts", 0));
    if (e.contains("effective_training") && e["effective_training"].is_number())
      what += fmt::format("; effective training time {:.1f}%", 100.0 * e["effective_training"].get<double>());
    what += ")";
  } else if (event == "gave_up") {
    what = fmt::format("gave up (exit {}): {}", str(e, "exit_code"), str(e, "reason"));
  } else if (event == "requeued") {
    what = fmt::format("requeued (requeue {} of {}): {}", str(e, "requeue"), str(e, "of"), str(e, "reason"));
  } else if (event == "warning" && str(e, "reason") == "loss_spike" && e.contains("detail") &&
             e["detail"].is_object()) {
    const json& d = e["detail"];
    what = fmt::format("loss spike at step {}: loss {} over the threshold {} (rule: {})", str(d, "step"),
                       str(d, "loss"), str(d, "threshold"), str(d, "rule"));
  } else if (event == "warning" || event == "fault") {
    what = fmt::format("{}: {}{}", event, e.contains("rank") ? "rank " + str(e, "rank") + ": " : "",
                       e.contains("line") ? str(e, "line") : str(e, "reason"));
  } else {
    json rest = e;
    for (const char* k : {"t", "event", "attempt", "node", "by"}) rest.erase(k);
    what = event + ": " + rest.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  if (!e.contains("attempt")) return fmt::format("megatrain {}: {}", job, what);  // a job script's own event
  return fmt::format("megatrain {}, attempt {}: {}", job, str(e, "attempt"), what);
}

Notifier::Notifier(NotifyOptions o, std::function<void(const std::string&)> say)
    : opt_(std::move(o)), where_(parse_webhook_url(opt_.url)), say_(std::move(say)) {
  const std::vector<std::string>& names = opt_.events.empty() ? kDefaultNotifyEvents : opt_.events;
  for (const std::string& item : names) {
    if (item == "all") {
      selected_.insert(kAllEventNames.begin(), kAllEventNames.end());
      continue;
    }
    // EVENT, or EVENT:REASON for only the lines of that event with that "reason" (warning:loss_spike).
    const size_t colon = item.find(':');
    const std::string n = item.substr(0, colon);
    if (std::find(kAllEventNames.begin(), kAllEventNames.end(), n) == kAllEventNames.end())
      fail_as(ErrorKind::Config, "--notify-events: '{}' is not an event the supervisor writes (one of: all, {})", n,
              fmt::join(kAllEventNames, ", "));
    if (colon == std::string::npos) {
      selected_.insert(n);
    } else if (colon + 1 < item.size()) {
      selected_reasons_[n].insert(item.substr(colon + 1));
    } else {
      fail_as(ErrorKind::Config, "--notify-events: '{}': a reason after the ':' (e.g. warning:loss_spike)", item);
    }
  }
  if (!opt_.ca_file.empty()) {
    if (where_.scheme_host_port.rfind("https://", 0) != 0)
      fail_as(ErrorKind::Config, "--notify-ca {}: the webhook URL is not https://", opt_.ca_file);
    std::ifstream f(opt_.ca_file);
    if (!f) fail_as(ErrorKind::Config, "--notify-ca {}: cannot open it", opt_.ca_file);
    std::string pem((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (pem.find("-----BEGIN CERTIFICATE-----") == std::string::npos)
      fail_as(ErrorKind::Config, "--notify-ca {}: no PEM certificate in it (missing, or not a CA bundle)",
              opt_.ca_file);
  }
  thread_ = std::thread([this] { run(); });
}

Notifier::~Notifier() { close(); }

void Notifier::event(const json& e) {
  const std::string name = e.value("event", "");
  if (!selected_.count(name)) {
    const auto it = selected_reasons_.find(name);
    if (it == selected_reasons_.end() || !e.contains("reason") || !e["reason"].is_string() ||
        !it->second.count(e["reason"].get<std::string>()))
      return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (closing_) return;
  if (queue_.size() >= kMaxQueued) {
    if (counts_.dropped++ == 0)
      say_(fmt::format("notify: {} events are waiting for the webhook already; dropping new ones (first: '{}' of "
                       "attempt {})",
                       kMaxQueued, e.value("event", ""), str(e, "attempt")));
    return;
  }
  queue_.push_back(e);
  cv_.notify_one();
}

void Notifier::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = closing_ = true;
    close_deadline_ = now_seconds() + kCloseSeconds;
    cv_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
  const Counts c = counts();
  if (c.sent + c.failed + c.dropped > 0)
    say_(fmt::format("notify: {} sent, {} not delivered, {} dropped ({})", c.sent, c.failed, c.dropped,
                     where_.scheme_host_port));
}

Notifier::Counts Notifier::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

void Notifier::run() {
  for (;;) {
    json e;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return closing_ || !queue_.empty(); });
      if (queue_.empty()) return;
      if (closing_ && now_seconds() > close_deadline_) {
        counts_.dropped += int(queue_.size());
        say_(fmt::format("notify: {} events still queued after {:.0f} s of closing; not sent", queue_.size(),
                         kCloseSeconds));
        queue_.clear();
        return;
      }
      e = std::move(queue_.front());
      queue_.pop_front();
    }
    std::string why;
    const bool ok = post_event(opt_, e, &why);
    if (!ok)
      say_(fmt::format("notify: the '{}' event of attempt {} was not delivered to {}: {}", e.value("event", ""),
                       str(e, "attempt"), where_.scheme_host_port, why));
    std::lock_guard<std::mutex> lock(mu_);
    (ok ? counts_.sent : counts_.failed)++;
  }
}

bool post_event(const NotifyOptions& o, const json& e, std::string* why) {
  const WebhookUrl where = parse_webhook_url(o.url);
  const json body = {{"text", notify_text(e, o.job)}, {"job", o.job}, {"event", e}};
  const std::string payload = body.dump(-1, ' ', false, json::error_handler_t::replace);
  httplib::Client client(where.scheme_host_port);
  client.set_connection_timeout(5, 0);
  client.set_read_timeout(5, 0);
  client.set_write_timeout(5, 0);
  if (where.scheme_host_port.rfind("https://", 0) == 0) {
    client.enable_server_certificate_verification(true);
    if (!o.ca_file.empty()) client.set_ca_cert_path(o.ca_file);
  }
  for (int attempt = 1; attempt <= Notifier::kTries; ++attempt) {
    if (attempt > 1) std::this_thread::sleep_for(std::chrono::seconds(1 << (attempt - 2)));  // 1 s, then 2 s
    auto res = client.Post(where.path, payload, "application/json");
    if (res && res->status >= 200 && res->status < 300) return true;
    if (res) {
      *why = fmt::format("HTTP {}{}", res->status, res->body.empty() ? "" : ": " + res->body.substr(0, 200));
      if (res->status < 500 && res->status != 429) break;  // the request itself is refused: trying again won't help
    } else {
      *why = http_failure(res, client, 5, 5);
      if (certificate_refused(res)) break;  // the same certificate next time
    }
  }
  return false;
}

}  // namespace mt::launch
