// The supervisor's webhook (launch/notifier.h): the text and URL rules against known answers; delivery, retries,
// refusals, overflow and TLS against a real HTTP(S) server in this process (cpp-httplib, a certificate made by the
// openssl command); and a real supervised job with an injected crash, whose webhook must receive exactly the
// event-log lines of the selected kinds, in order (the event log is the oracle).
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <mutex>

#include "support/files.h"
#include "support/launch_testutil.h"
#include "support/megatrain.h"
#include "support/metrics.h"
#include "support/small_job.h"
#include "support/webhook_receiver.h"
#include "megatrain/core/error.h"
#include "megatrain/launch/notifier.h"
#include "support/test_util.h"

using namespace mt;
using namespace mt::launch;
using namespace mt::test;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

json ev(const std::string& name, int attempt, json fields = json::object()) {
  json e = {{"t", 1700000000.5}, {"event", name}, {"attempt", attempt}, {"node", 0}};
  for (auto& [k, v] : fields.items()) e[k] = v;
  return e;
}

// The launcher's output lines, as the notifier says them.
struct Said {
  std::mutex mu;
  std::vector<std::string> lines;
  std::function<void(const std::string&)> fn() {
    return [this](const std::string& l) {
      std::lock_guard<std::mutex> lock(mu);
      lines.push_back(l);
    };
  }
  std::string all() {
    std::lock_guard<std::mutex> lock(mu);
    std::string s;
    for (const auto& l : lines) s += l + "\n";
    return s;
  }
};

TEST(NotifyText, SaysWhatHappenedForEachKindOfEvent) {
  const std::string j = "gpt-7b";
  EXPECT_EQ(notify_text(ev("detected", 0, {{"reason", "exit"}, {"rank", 2}, {"status", "was killed by signal 9"}}), j),
            "megatrain gpt-7b, attempt 0: fault detected: rank 2 was killed by signal 9");
  EXPECT_EQ(notify_text(ev("detected", 1,
                           {{"reason", "hang"},
                            {"why", "no progress for 30 s"},
                            {"blame", "rank 3 never entered all_reduce dp[1] #7"}}),
                        j),
            "megatrain gpt-7b, attempt 1: fault detected: hang: no progress for 30 s: rank 3 never entered "
            "all_reduce dp[1] #7");
  EXPECT_EQ(notify_text(ev("detected", 0,
                           {{"by", "driver"}, {"reason", "node_lost"}, {"node", 1}, {"line", "node 1 is lost"}}),
                        j),
            "megatrain gpt-7b, attempt 0: fault detected: node 1 is lost");
  EXPECT_EQ(notify_text(ev("restarting", 0,
                           {{"delay_s", 2.0}, {"failure_code", 22}, {"reason", "restart 1 of 3"}, {"nodes", {0, 2}}}),
                        j),
            "megatrain gpt-7b, attempt 0: restarting in 2.0 s after a failure (code 22): restart 1 of 3; next on "
            "nodes 0,2");
  EXPECT_EQ(notify_text(ev("resumed", 1, {{"rank", 0}, {"step", 5}, {"from", 4}, {"seconds", 3.25}}), j),
            "megatrain gpt-7b, attempt 1: resumed: step 5 done, 3.2 s after the restart (from the checkpoint of step "
            "4)");
  EXPECT_EQ(notify_text(ev("evicted", 1, {{"node", 3}, {"reason", "it failed diagnose"}}), j),
            "megatrain gpt-7b, attempt 1: node 3 evicted: it failed diagnose");
  EXPECT_EQ(notify_text(ev("done", 1,
                           {{"exit_code", 0}, {"best_step", 10}, {"restarts", 1}, {"reason", "every rank finished"}}),
                        j),
            "megatrain gpt-7b, attempt 1: done: every rank finished (step 10, 1 restarts)");
  EXPECT_EQ(notify_text(ev("gave_up", 3, {{"exit_code", 41}, {"reason", "all 3 restarts are spent"}}), j),
            "megatrain gpt-7b, attempt 3: gave up (exit 41): all 3 restarts are spent");
  EXPECT_EQ(notify_text(ev("warning", 0,
                           {{"rank", 0},
                            {"reason", "loss_spike"},
                            {"detail", {{"step", 812}, {"loss", 7.5}, {"threshold", 4.25}, {"rule", "factor"}}}}),
                        j),
            "megatrain gpt-7b, attempt 0: loss spike at step 812: loss 7.5 over the threshold 4.25 (rule: factor)");
  // Any other event: its fields, less the ones every line has.
  EXPECT_EQ(notify_text(ev("planned", 0, {{"by", "driver"}, {"nodes", {0, 1}}, {"world", 4}}), j),
            "megatrain gpt-7b, attempt 0: planned: {\"nodes\":[0,1],\"world\":4}");
}

TEST(WebhookUrl, SplitsHttpAndHttpsUrlsAndRefusesTheRestNamingThem) {
  WebhookUrl w = parse_webhook_url("http://127.0.0.1:8080/hook");
  EXPECT_EQ(w.scheme_host_port, "http://127.0.0.1:8080");
  EXPECT_EQ(w.path, "/hook");
  w = parse_webhook_url("https://hooks.example.com/services/T0/B0/x?y=1");
  EXPECT_EQ(w.scheme_host_port, "https://hooks.example.com");
  EXPECT_EQ(w.path, "/services/T0/B0/x?y=1");
  w = parse_webhook_url("http://[::1]:9000");
  EXPECT_EQ(w.scheme_host_port, "http://[::1]:9000");
  EXPECT_EQ(w.path, "/");
  for (const char* bad : {"ftp://host/x", "hooks.example.com/x", "http://", "http://host:/x", "http://host:99999/x",
                          "http://host:8o/x", "http://user:pw@host/x", "http://[::1/x"}) {
    try {
      parse_webhook_url(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind, ErrorKind::Config) << bad;
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

TEST(Notifier, RefusesUnknownEventNamesAndABadCaFileBeforeSendingAnything) {
  Said said;
  NotifyOptions o;
  o.url = "http://127.0.0.1:9/hook";
  o.events = {"detected", "restarted"};  // "restarted" is not an event (restarting is)
  try {
    Notifier n(o, said.fn());
    ADD_FAILURE() << "an unknown event name was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind, ErrorKind::Config);
    EXPECT_NE(std::string(e.what()).find("'restarted'"), std::string::npos) << e.what();
  }
  o.events = {};
  o.url = "https://127.0.0.1:9/hook";
  o.ca_file = "/nonexistent/ca.pem";
  EXPECT_THROW(Notifier(o, said.fn()), Error);
  const fs::path not_pem = fs::path(temp_root()) / "mt-notify-not-pem.txt";
  std::ofstream(not_pem) << "hello\n";
  o.ca_file = not_pem.string();
  try {
    Notifier n(o, said.fn());
    ADD_FAILURE() << "a file without a certificate was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no PEM certificate"), std::string::npos) << e.what();
  }
  fs::remove(not_pem);
}

TEST(Notifier, DeliversTheSelectedEventsInOrderWithTheirLinesAndText) {
  Receiver r;
  Said said;
  NotifyOptions o;
  o.url = r.url() + "?key=s3cret";
  o.job = "job-a";
  std::vector<json> fed = {ev("started", 0),
                           ev("detected", 0, {{"reason", "exit"}, {"rank", 1}, {"status", "x"}}),
                           ev("warning", 0, {{"rank", 1}, {"reason", "straggler"}}),
                           ev("restarting", 0, {{"delay_s", 0.0}, {"failure_code", 1}, {"reason", "r"}}),
                           ev("resumed", 1, {{"step", 3}, {"from", 2}, {"seconds", 1.0}}),
                           ev("caught_up", 1),
                           ev("done", 1, {{"best_step", 9}})};
  {
    Notifier n(o, said.fn());
    for (const json& e : fed) n.event(e);
    n.close();
    EXPECT_EQ(n.counts().sent, 4);
    EXPECT_EQ(n.counts().failed, 0);
    EXPECT_EQ(n.counts().dropped, 0);
  }
  const auto got = r.bodies();
  ASSERT_EQ(got.size(), 4u) << said.all();
  const std::vector<json> want = {fed[1], fed[3], fed[4], fed[6]};  // the default kinds
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i]["event"], want[i]);
    EXPECT_EQ(got[i]["job"], "job-a");
    EXPECT_EQ(got[i]["text"], notify_text(want[i], "job-a"));
  }
  EXPECT_NE(said.all().find("notify: 4 sent, 0 not delivered, 0 dropped"), std::string::npos) << said.all();
  EXPECT_EQ(said.all().find("s3cret"), std::string::npos) << "the URL's secret was printed:\n" << said.all();

  // EVENT:REASON: of the warnings only the loss spikes (a rank's event: "reason" is the rank's event name).
  Receiver r3;
  o.url = r3.url();
  o.events = {"done", "warning:loss_spike"};
  {
    Notifier n3(o, said.fn());
    n3.event(ev("warning", 0, {{"rank", 1}, {"reason", "straggler"}}));
    n3.event(ev("warning", 0, {{"rank", 0}, {"reason", "loss_spike"}, {"detail", {{"loss", 9.5}}}}));
    n3.event(ev("detected", 0, {{"reason", "loss_spike"}}));  // another event with that reason: not selected
    n3.event(ev("done", 0));
  }
  ASSERT_EQ(r3.bodies().size(), 2u);
  EXPECT_EQ(r3.bodies()[0]["event"]["reason"], "loss_spike");
  EXPECT_EQ(r3.bodies()[1]["event"]["event"], "done");
  o.events = {"warning:"};
  EXPECT_THROW(Notifier(o, said.fn()), Error);
  o.events = {};

  // "all": every kind, including the ones the default leaves out.
  Receiver r2;
  o.url = r2.url();
  o.events = {"all"};
  Notifier n2(o, said.fn());
  for (const json& e : fed) n2.event(e);
  n2.close();
  EXPECT_EQ(r2.bodies().size(), fed.size());
}

TEST(Notifier, RetriesServerErrorsButNotARefusal) {
  Receiver r;
  // Event 0: 503 then 200 (delivered on its second try). Event 1: 400 (refused: final, no second try).
  r.answer = [](int i) { return i == 0 ? 503 : i == 2 ? 400 : 200; };
  Said said;
  NotifyOptions o;
  o.url = r.url();
  Notifier n(o, said.fn());
  n.event(ev("detected", 0, {{"reason", "exit"}, {"rank", 0}, {"status", "a"}}));
  n.event(ev("gave_up", 0, {{"exit_code", 1}, {"reason", "b"}}));
  n.close();
  EXPECT_EQ(r.requests(), 3) << said.all();
  EXPECT_EQ(n.counts().sent, 1);
  EXPECT_EQ(n.counts().failed, 1);
  ASSERT_EQ(r.bodies().size(), 1u);
  EXPECT_EQ(r.bodies()[0]["event"]["event"], "detected");
  EXPECT_NE(said.all().find("the 'gave_up' event of attempt 0 was not delivered to http://127.0.0.1:"),
            std::string::npos)
      << said.all();
  EXPECT_NE(said.all().find("HTTP 400"), std::string::npos) << said.all();
}

TEST(Notifier, AWebhookThatIsDownIsSaidAndCountedNotWaitedFor) {
  int port;
  {  // a port nothing listens on: bound, its number read, closed (a connection to it is refused)
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    socklen_t len = sizeof a;
    ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
    port = ntohs(a.sin_port);
    ::close(fd);
  }
  Said said;
  NotifyOptions o;
  o.url = fmt::format("http://127.0.0.1:{}/hook", port);
  Notifier n(o, said.fn());
  n.event(ev("detected", 0, {{"reason", "exit"}, {"rank", 0}, {"status", "a"}}));
  n.close();
  EXPECT_EQ(n.counts().sent, 0);
  EXPECT_EQ(n.counts().failed, 1);
  EXPECT_NE(said.all().find("the 'detected' event of attempt 0 was not delivered"), std::string::npos) << said.all();
  EXPECT_NE(said.all().find("cannot connect"), std::string::npos) << "the cause is named:\n" << said.all();
}

TEST(Notifier, EventsBeyondTheQueueAreDroppedAndSaidNeverBlocking) {
  Receiver r;
  r.hold();
  Said said;
  NotifyOptions o;
  o.url = r.url();
  o.events = {"all"};
  Notifier n(o, said.fn());
  n.event(ev("warning", 0, {{"seq", 0}}));
  r.wait_for_requests(1);  // the first is in flight, held by the webhook; the queue is empty
  const int extra = 5, total = 1 + int(Notifier::kMaxQueued) + extra;
  for (int i = 1; i < total; ++i) n.event(ev("warning", 0, {{"seq", i}}));
  EXPECT_EQ(n.counts().dropped, extra);
  EXPECT_NE(said.all().find("dropping new ones"), std::string::npos) << said.all();
  r.release();
  n.close();
  const auto c = n.counts();
  // What close() could not send within its deadline (a busy machine) is dropped too, and said; nothing vanishes.
  EXPECT_EQ(c.sent + c.failed + c.dropped, total);
  EXPECT_EQ(c.failed, 0);
  const auto got = r.bodies();
  ASSERT_EQ(int(got.size()), c.sent);
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(got[i]["event"]["seq"], int(i)) << "in order, and the dropped ones are the newest";
}

TEST(Notifier, HttpsChecksTheWebhooksCertificate) {
  const fs::path dir = fs::path(temp_root()) / "mt-notify-tls";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string cert = (dir / "cert.pem").string(), key = (dir / "key.pem").string();
  const std::string cmd = fmt::format(
      "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 "
      "-keyout {} -out {} > {} 2>&1",
      key, cert, (dir / "openssl.log").string());
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "openssl (scripts/setup installs it): " << slurp(dir / "openssl.log");
  Receiver r(std::make_unique<httplib::SSLServer>(cert.c_str(), key.c_str()));
  Said said;
  NotifyOptions o;
  o.url = r.url("https");
  {  // a self-signed certificate is not among the system's CAs: refused, and said why, without retrying
    Notifier n(o, said.fn());
    n.event(ev("done", 0));
    n.close();
    EXPECT_EQ(n.counts().failed, 1);
    EXPECT_EQ(r.bodies().size(), 0u);
    EXPECT_NE(said.all().find("the server's certificate was refused (self-signed certificate)"), std::string::npos)
        << said.all();
  }
  o.ca_file = cert;  // the cluster's own CA
  Notifier n(o, said.fn());
  n.event(ev("done", 0));
  n.close();
  EXPECT_EQ(n.counts().sent, 1) << said.all();
  ASSERT_EQ(r.bodies().size(), 1u);
  EXPECT_EQ(r.bodies()[0]["event"]["event"], "done");
  fs::remove_all(dir);
}

// ---- a real job ------------------------------------------------------------------------------------------------

TEST(LaunchNotify, AJobThatRecoversTellsTheWebhookWhatItsEventLogSays) {
  prepare_launch_data();
  const fs::path dir = fs::path(temp_root()) / "mt-notify-job";
  fs::remove_all(dir);
  fs::create_directories(dir);
  Receiver r;
  const std::string events = (dir / "events.jsonl").string(), out = (dir / "run").string();
  // Rank 1 crashes at step 4 of the first attempt; the job restarts from the step-2 checkpoint and finishes.
  ::setenv("MEGATRAIN_FAULTS", "crash:rank=1:step=4", 1);
  std::vector<std::string> args = {"launch",      "--nproc",  "2",    "--max-restarts", "2",     "--backoff",
                                   "0",           "--events", events, "--notify",       r.url(), "--job-name",
                                   "notify-test", "--",       "train"};
  for (const std::string& f : SmallJob(out)
                                  .model(1, 32, 2, 32)
                                  .batch(2)
                                  .steps(6)
                                  .log_every(1)
                                  .unset("optim.lr")
                                  .unset("optim.warmup_steps")
                                  .set("ckpt.every", 2)
                                  .set("ckpt.save_final", "false")
                                  .with("--parallel.dp=2")
                                  .args())
    args.push_back(f);
  const pid_t launcher = start_logged(kMegatrain, args, (dir / "launch.log").string());
  ::unsetenv("MEGATRAIN_FAULTS");
  ASSERT_EQ(finish_within(launcher, 400), 0) << slurp(dir / "launch.log");

  // The oracle: the event log's lines of the default kinds, in order. The launcher sent them before it exited.
  std::vector<json> want;
  for (const json& e : events_of(events))
    if (std::find(kDefaultNotifyEvents.begin(), kDefaultNotifyEvents.end(), e["event"]) != kDefaultNotifyEvents.end())
      want.push_back(e);
  std::vector<std::string> kinds;
  for (const json& e : want) kinds.push_back(e["event"]);
  EXPECT_EQ(kinds, (std::vector<std::string>{"detected", "restarting", "resumed", "done"})) << slurp(events);
  const auto got = r.bodies();
  ASSERT_EQ(got.size(), want.size()) << slurp(dir / "launch.log");
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i]["event"], want[i]);
    EXPECT_EQ(got[i]["job"], "notify-test");
  }
  EXPECT_NE(got[0]["text"].get<std::string>().find("fault detected: rank 1 "), std::string::npos) << got[0].dump();
  // The job's effective training time: its kept steps' time is the sum of the final metrics lines' step_seconds
  // (rank 0's own record, the oracle), to the bit; the steps attempt 0 made after its last checkpoint are not in it.
  double kept = 0;
  int lines = 0;
  for (const json& l : events_of(out + "/metrics.jsonl"))
    if (l.value("kind", "") == "train") kept += l["step_seconds"].get<double>(), ++lines;
  EXPECT_EQ(lines, 6);
  const json& done = want.back();
  ASSERT_EQ(done["event"], "done");
  EXPECT_EQ(done["useful_s"].get<double>(), kept) << done.dump();
  EXPECT_GE(done["wall_s"].get<double>(), kept);
  EXPECT_EQ(done["effective_training"].get<double>(), kept / done["wall_s"].get<double>());
  EXPECT_NE(got.back()["text"].get<std::string>().find("effective training time"), std::string::npos)
      << got.back().dump();
  EXPECT_NE(slurp(dir / "launch.log").find("effective training time"), std::string::npos);
  EXPECT_NE(slurp(dir / "launch.log").find("notify: 4 sent, 0 not delivered, 0 dropped"), std::string::npos)
      << slurp(dir / "launch.log");
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

// `megatrain notify`: a job script's own event (the Slurm script's requeue), in the supervisor's format.
TEST(LaunchNotify, TheNotifyCommandPostsOneEventWithTypedFields) {
  const fs::path dir = fs::path(temp_root()) / "mt-notify-cmd";
  fs::create_directories(dir);
  const std::string log = (dir / "out.log").string();
  Receiver r;
  int code = finish_within(start_logged(kMegatrain,
                                        {"notify", "--url", r.url(), "--event", "requeued", "--job-name", "j",
                                         "--field", "requeue=1", "--field", "of=3", "--field",
                                         "reason=the driver's node was lost", "--field", "ok=true"},
                                        log),
                           60);
  EXPECT_EQ(code, 0) << slurp(log);
  ASSERT_EQ(r.bodies().size(), 1u) << slurp(log);
  const json b = r.bodies()[0];
  EXPECT_EQ(b["text"], "megatrain j: requeued (requeue 1 of 3): the driver's node was lost");
  EXPECT_EQ(b["event"]["requeue"], 1);  // JSON where the value parses as JSON, a string otherwise
  EXPECT_EQ(b["event"]["ok"], true);
  EXPECT_EQ(b["event"]["reason"], "the driver's node was lost");
  EXPECT_TRUE(b["event"]["t"].is_number());
  // Refused by the webhook: exit 1, saying why. Malformed: a config error (10), nothing sent.
  r.answer = [](int) { return 404; };
  code = finish_within(start_logged(kMegatrain, {"notify", "--url", r.url(), "--event", "x"}, log), 60);
  EXPECT_EQ(code, 1);
  EXPECT_NE(slurp(log).find("was not delivered to http://127.0.0.1:"), std::string::npos) << slurp(log);
  EXPECT_NE(slurp(log).find("HTTP 404"), std::string::npos) << slurp(log);
  code = finish_within(start_logged(kMegatrain, {"notify", "--url", r.url(), "--event", "x", "--field", "novalue"},
                                    log),
                       60);
  EXPECT_EQ(code, 10);
  EXPECT_NE(slurp(log).find("--field 'novalue': expected KEY=VALUE"), std::string::npos) << slurp(log);
  EXPECT_EQ(r.requests(), 2);
  fs::remove_all(dir);
}

TEST(LaunchNotify, OptionsWithoutAUrlOrATokenWithoutADashboardAreRefused) {
  const fs::path dir = fs::path(temp_root()) / "mt-notify-opts";
  fs::create_directories(dir);
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  // Token files follow the store secret's rules (comm/store.h): mode 600, 16..1024 printable bytes.
  const std::string token = (dir / "token").string(), open_token = (dir / "open-token").string();
  std::ofstream(token) << "  \n";
  fs::permissions(token, fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::replace);
  std::ofstream(open_token) << "0123456789abcdef0123\n";
  fs::permissions(open_token, fs::perms::owner_read | fs::perms::others_read | fs::perms::owner_write,
                  fs::perm_options::replace);
  for (const Case& c : std::vector<Case>{
           {{"--notify-events", "done"}, "need --notify URL"},
           {{"--notify", "ftp://x/y"}, "expected an http:// or https:// URL"},
           {{"--notify", "http://127.0.0.1:9/x", "--notify-events", "done,restarted"}, "'restarted'"},
           {{"--dashboard", "127.0.0.1:0", "--dashboard-token-file", token}, "has 0 bytes; it must have 16..1024"},
           {{"--dashboard", "127.0.0.1:0", "--dashboard-token-file", open_token}, "chmod 600 it"},
           {{"--dashboard-token-file", token}, "--dashboard-token-file without --dashboard"},
           {{"--dashboard", "127.0.0.1:0", "--dashboard-token-file", (dir / "none").string()},
            "No such file or directory"},
           // Several nodes without --max-restarts have no job driver, which alone sees the whole job.
           {{"--nnodes", "2", "--master", "10.9.8.7:1234", "--notify", "http://127.0.0.1:9/x"},
            "--notify on 2 nodes needs the job driver"}}) {
    std::vector<std::string> args = {"launch", "--nproc", "1"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    for (const char* a : {"--exec", "--", "/bin/true"}) args.push_back(a);
    const pid_t p = start_logged(kMegatrain, args, (dir / "out.log").string());
    EXPECT_EQ(finish_within(p, 60), 10) << fmt::format("{}", fmt::join(args, " ")) << "\n" << slurp(dir / "out.log");
    EXPECT_NE(slurp(dir / "out.log").find(c.says), std::string::npos) << slurp(dir / "out.log");
  }
  fs::remove_all(dir);
}

}  // namespace
