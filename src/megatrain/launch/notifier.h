// Telling people what the supervisor did (`megatrain launch --notify URL`): the event-log lines a person should
// hear about (a fault detected, a restart, a resume, a node evicted, the job done or given up) are POSTed to a
// webhook as they happen, so a job that recovers by itself at 3 a.m. still leaves word of it where the team reads.
//
// Each POST carries one JSON object:
//   {"text": "megatrain JOB, attempt 1: rank 2 failed (exit 1)", "job": "JOB", "event": {the event-log line}}
// "text" is the line chat webhooks show; "event" is the line exactly as the event log has it, for machines.
//
// Delivery never delays supervision: event() only queues, and one thread of the Notifier's own sends, in order.
// A 5xx answer, a 429 or a failed connection is tried again (kTries in all, 1 s then 2 s apart); any other non-2xx
// answer is final. Nothing is dropped without a word: an event that could not be delivered, or that found the queue
// full (kMaxQueued: a webhook down for hours), is said on the launcher's output as it happens, and the counts are
// said when the notifier closes. Closing sends what is still queued, for at most kCloseSeconds, so that the last
// event ("done", "gave_up") goes out before the launcher exits.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace mt::launch {

// The events sent when --notify-events is not given: the ones that change what the job is doing.
extern const std::vector<std::string> kDefaultNotifyEvents;
// Every event name the supervisors write (event_log.h), for checking --notify-events.
extern const std::vector<std::string> kAllEventNames;

struct NotifyOptions {
  std::string url;                  // http://HOST[:PORT][/PATH] or https://...
  std::vector<std::string> events;  // names from kAllEventNames, "EVENT:REASON" (only the lines of that event with
                                    // that "reason": warning:loss_spike), or {"all"}; empty: kDefaultNotifyEvents
  std::string ca_file;              // PEM file of the CAs an https server's certificate is checked against; "":
                                    // the system's
  std::string job;                  // the job's name in each message
};

// The job's name when none is given: SLURM_JOB_NAME, else this host's name.
std::string default_job_name();

// The URL split for the HTTP client. Throws mt::Error (Config) naming the URL (and `option`, the place it came
// from) when it is not http(s)://HOST...
struct WebhookUrl {
  std::string scheme_host_port;  // "https://hooks.example.com:443"
  std::string path;              // "/services/T0/B0/x" ("/" when the URL has none)
};
WebhookUrl parse_webhook_url(const std::string& url, const char* option = "--notify");

// The line for people ("text") for an event-log line.
std::string notify_text(const nlohmann::json& event, const std::string& job);

// POSTs one event now, with the retries above (Notifier's rule); false with *why set when it was not delivered.
// (`megatrain notify`: a job script's own events, e.g. the Slurm script's requeue when the driver is gone.)
bool post_event(const NotifyOptions& o, const nlohmann::json& event, std::string* why);

class Notifier {
 public:
  static constexpr int kTries = 3;
  static constexpr size_t kMaxQueued = 1000;
  static constexpr double kCloseSeconds = 10;

  // Checks the URL, the event names and the CA file (Config errors naming them); connects to nothing yet. `say`
  // prints a line on the launcher's output (called from the sending thread).
  Notifier(NotifyOptions o, std::function<void(const std::string&)> say);
  ~Notifier();  // close()
  Notifier(const Notifier&) = delete;
  Notifier& operator=(const Notifier&) = delete;

  // Queues the event if its name is selected. Never blocks on the network; any thread.
  void event(const nlohmann::json& e);
  // Sends what is queued (for at most kCloseSeconds), stops the thread and says the counts. Idempotent.
  void close();

  struct Counts {
    int sent = 0, failed = 0, dropped = 0;  // dropped: found the queue full, or still queued when close() gave up
  };
  Counts counts() const;

 private:
  void run();

  NotifyOptions opt_;
  WebhookUrl where_;
  std::set<std::string> selected_;                                 // every line of these events
  std::map<std::string, std::set<std::string>> selected_reasons_;  // event -> the reasons whose lines go
  std::function<void(const std::string&)> say_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<nlohmann::json> queue_;
  bool closing_ = false, closed_ = false;
  double close_deadline_ = 0;
  Counts counts_;
  std::thread thread_;
};

}  // namespace mt::launch
