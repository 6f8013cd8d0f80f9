// The supervisor's dashboard (launch/dashboard.h, job_view.h): the renderings against known answers, the HTTP
// server against an HTTP client, and a real job: `megatrain launch --dashboard` over a pp2 x tp2 training run,
// whose served steps, layout and losses must be the ones the ranks themselves logged (metrics.jsonl, the oracle),
// which answers nothing without its token, and whose page must show every rank in a real headless browser
// (Debian's chromium, which scripts/setup installs).
#include <httplib.h>
#include <signal.h>

#include <map>
#include <regex>
#include <set>

#include "support/files.h"
#include "support/headless_dom.h"
#include "support/launch_testutil.h"
#include "support/megatrain.h"
#include "support/metrics.h"
#include "support/small_job.h"
#include "megatrain/core/error.h"
#include "megatrain/launch/dashboard.h"
#include "megatrain/launch/job_view.h"
#include "megatrain/launch/status_text.h"
#include "support/test_util.h"
#include "support/tls_testutil.h"

using namespace mt;
using namespace mt::launch;
using namespace mt::test;
namespace fs = std::filesystem;

namespace {

RankView rank_view(int rank, int step, bool with_numbers) {
  RankView r;
  r.status.rank = rank;
  r.status.step = step;
  r.running = true;
  r.node = rank / 2;
  if (with_numbers) {
    r.status.heard = true;
    r.status.last_heard = 100.0;
    r.status.phase = "forward_backward";
    r.status.coord_dp = 0, r.status.coord_pp = rank % 2, r.status.coord_tp = 0;
    r.status.dp = 1, r.status.pp = 2, r.status.tp = 1, r.status.grad_accum = 1;
    r.status.loss = 2.5 + rank;
    r.status.step_time = 0.25 * (rank + 1);
    r.status.compute_time = 0.2;
    r.status.mfu = 0.5;
    r.status.colls = {{"pp[0,1]", "recv", 7, "started"}, {"dp[0]", "all_reduce", 3, "done"}};
  }
  return r;
}

JobView two_ranks() {
  JobView v;
  v.state = "running";
  v.attempt = 1;
  v.restarts = 1;
  v.max_restarts = 3;
  v.nodes = 1;
  v.world = 2;
  v.started = 90.0;
  v.now = 101.5;
  v.useful_s = 5.75;
  v.ranks = {rank_view(0, 7, true), rank_view(1, 6, false)};
  return v;
}

TEST(JobView, JsonCarriesEveryRankAndNullForWhatWasNotReported) {
  const nlohmann::json j = job_json(two_ranks());
  EXPECT_EQ(j["job"]["state"], "running");
  EXPECT_EQ(j["job"]["uptime_s"], 11.5);
  EXPECT_EQ(j["job"]["useful_s"], 5.75);
  EXPECT_EQ(j["job"]["effective_training"], 0.5);  // 5.75 / 11.5
  EXPECT_EQ(j["job"]["layout"], (nlohmann::json{{"dp", 1}, {"pp", 2}, {"tp", 1}, {"grad_accum", 1}}));
  EXPECT_EQ(j["job"]["step"], (nlohmann::json{{"min", 6}, {"max", 7}}));
  ASSERT_EQ(j["ranks"].size(), 2u);
  const auto& a = j["ranks"][0];
  EXPECT_EQ(a["coord"], (nlohmann::json{0, 0, 0}));
  EXPECT_EQ(a["age_s"], 1.5);
  EXPECT_EQ(a["loss"], 2.5);
  EXPECT_EQ(a["step_time"], 0.25);
  ASSERT_EQ(a["in_flight"].size(), 1u) << "only the collective not yet done";
  EXPECT_EQ(a["in_flight"][0]["op"], "recv");
  const auto& b = j["ranks"][1];  // a rank that has said nothing yet
  for (const char* k : {"coord", "age_s", "loss", "step_time", "compute_time", "tokens_per_s", "mfu", "rss"})
    EXPECT_TRUE(b[k].is_null()) << k;
  EXPECT_EQ(b["step"], 6);
}

// Prometheus's text format, line by line: comments are HELP or TYPE; a sample is name{labels} value, and its
// metric's TYPE came before it. Returns the samples by their name{labels}.
std::map<std::string, std::string> parse_prometheus(const std::string& text) {
  static const std::regex help(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .+)"),
      type(R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) gauge)"),
      sample(R"re(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="(\\.|[^"\\])*",?)*\})? (\S+))re");
  std::set<std::string> typed;
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_match(line, m, help)) continue;
    if (std::regex_match(line, m, type)) {
      typed.insert(m[1]);
      continue;
    }
    if (!std::regex_match(line, m, sample)) {
      ADD_FAILURE() << "not a Prometheus line: '" << line << "'";
      continue;
    }
    EXPECT_TRUE(typed.count(m[1])) << "sample before its TYPE: " << line;
    std::size_t space = line.rfind(' ');
    std::string value = line.substr(space + 1);
    EXPECT_NO_THROW((void)std::stod(value)) << line;
    out[line.substr(0, space)] = value;
  }
  EXPECT_FALSE(text.empty() || text.back() != '\n') << "the format ends every line with a newline";
  return out;
}

TEST(JobView, PrometheusTextIsWellFormedAndLeavesOutUnreportedValues) {
  const auto s = parse_prometheus(prometheus_text(two_ranks()));
  EXPECT_EQ(s.at("megatrain_job_restarts"), "1");
  EXPECT_EQ(s.at("megatrain_job_useful_step_seconds"), "5.75");
  EXPECT_EQ(s.at("megatrain_job_effective_training_ratio"), "0.5");
  EXPECT_EQ(s.at("megatrain_job_state{state=\"running\"}"), "1");
  EXPECT_EQ(s.at("megatrain_job_state{state=\"failed\"}"), "0");
  const std::string r0 = "{rank=\"0\",node=\"0\",dp=\"0\",pp=\"0\",tp=\"0\"}";
  EXPECT_EQ(s.at("megatrain_rank_step" + r0), "7");
  EXPECT_EQ(s.at("megatrain_rank_loss" + r0), "2.5");
  EXPECT_EQ(s.at("megatrain_rank_heartbeat_age_seconds" + r0), "1.5");
  EXPECT_EQ(s.at("megatrain_rank_collectives_in_flight" + r0), "1");
  EXPECT_EQ(s.at("megatrain_rank_phase{rank=\"0\",node=\"0\",dp=\"0\",pp=\"0\",tp=\"0\",phase=\"forward_backward\"}"),
            "1");
  const std::string r1 = "{rank=\"1\",node=\"0\"}";  // no coordinates yet: no dp/pp/tp labels
  EXPECT_EQ(s.at("megatrain_rank_step" + r1), "6");
  EXPECT_FALSE(s.count("megatrain_rank_loss" + r1)) << "a loss never reported is left out, not 0";
  EXPECT_FALSE(s.count("megatrain_rank_heartbeat_age_seconds" + r1));
}

// `megatrain status`'s text: the job line, the step line with the slowest and fastest rank, and only the ranks
// that are not keeping up, each with why.
TEST(StatusText, SaysTheJobAndOnlyTheRanksWorthALook) {
  JobView v = two_ranks();  // rank 0 at step 7, in a recv; rank 1 at step 6, never heard
  v.detail = "attempt 0 failed (code 22): restart 1 of 3";
  nlohmann::json j = job_json(v);
  j["events"] = {{{"t", 1700000000.0}, {"event", "restarting"}, {"attempt", 0}, {"node", 0}, {"delay_s", 1.0}}};
  EXPECT_EQ(status_text(j),
            "job: running, attempt 1 (1 restart), dp1 x pp2 x tp1, 2 ranks on 1 node, up 12 s\n"
            "steps 6-7, loss 2.5000, step time 0.250-0.250 s (fastest-slowest rank), MFU 50.0%, effective training "
            "50.0%\n"
            "last word: attempt 0 failed (code 22): restart 1 of 3\n"
            "ranks to look at:\n"
            "  rank 0 (dp0,pp0,tp0) on node 0: step 7, forward_backward, in recv pp[0,1] #7 (started)\n"
            "  rank 1 on node 0: step 6, -, 1 behind\n"
            "newest events:\n"
            "  22:13:20Z restarting (attempt 0) {\"delay_s\":1.0}\n");
  // A healthy job: one line says so. A list beyond max_ranks says how many more.
  JobView ok = two_ranks();
  ok.ranks = {rank_view(0, 7, true), rank_view(1, 7, true)};
  for (auto& r : ok.ranks) r.status.colls.clear();
  EXPECT_NE(status_text(job_json(ok)).find("all 2 ranks at step 7, heard within 6 s, none waiting in a collective"),
            std::string::npos)
      << status_text(job_json(ok));
  EXPECT_NE(status_text(j, 1).find("  ... and 1 more\n"), std::string::npos) << status_text(j, 1);
}

TEST(Dashboard, HistoryTakesEachRanksNewStepOnceAndANewAttemptAfresh) {
  Dashboard d("127.0.0.1:0");
  JobView v = two_ranks();
  v.attempt = 0;
  v.ranks = {rank_view(0, 1, true), rank_view(1, 1, true)};
  d.publish(v);
  d.publish(v);  // the same heartbeat state again: nothing new
  v.ranks[0].status.step = 2;
  v.ranks[0].status.step_time = 3.0;
  d.publish(v);
  v.ranks[1].status.step = 2;
  v.ranks[1].status.step_time = 1.0;
  d.publish(v);
  v.attempt = 1;  // a restart from the step-1 checkpoint replays step 2
  v.ranks[0].status.start_step = v.ranks[1].status.start_step = 1;
  d.publish(v);
  const nlohmann::json h = nlohmann::json::parse(d.api_job())["history"];
  ASSERT_EQ(h.size(), 3u) << h.dump();
  EXPECT_EQ(h[0], (nlohmann::json{
                      {"attempt", 0}, {"step", 1}, {"loss", 2.5}, {"fastest", 0.25}, {"slowest", 0.5}, {"ranks", 2}}));
  EXPECT_EQ(h[1], (nlohmann::json{
                      {"attempt", 0}, {"step", 2}, {"loss", 2.5}, {"fastest", 1.0}, {"slowest", 3.0}, {"ranks", 2}}));
  EXPECT_EQ(h[2]["attempt"], 1);
  EXPECT_EQ(h[2]["step"], 2);
  EXPECT_EQ(h[2]["ranks"], 2);
}

// A supervisor that sees a rank's status less often than the rank steps (the job driver) gets the steps in between
// as the status's records: each joins the history with its own loss and time, once.
TEST(Dashboard, HistoryTakesEveryRecordedStepNotOnlyTheNewest) {
  Dashboard d("127.0.0.1:0");
  JobView v = two_ranks();
  v.attempt = 0;
  v.ranks = {rank_view(0, 3, true)};
  v.ranks[0].status.recent = {{1, 3.0, 0.1, 100, {}}, {2, 2.0, 0.2, 100, {}}, {3, 1.0, 0.3, 100, {}}};
  d.publish(v);
  v.ranks[0].status.step = 5;  // the next status: its window still holds step 3
  v.ranks[0].status.recent = {{3, 1.0, 0.3, 100, {}}, {4, 0.5, 0.4, 101, {}}, {5, 0.25, 0.5, 101, {}}};
  d.publish(v);
  const nlohmann::json h = nlohmann::json::parse(d.api_job())["history"];
  ASSERT_EQ(h.size(), 5u) << h.dump();
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(h[i]["step"], i + 1) << h.dump();
    EXPECT_EQ(h[i]["loss"], i < 3 ? 3.0 - i : 0.5 / (1 << (i - 3))) << h.dump();
    EXPECT_DOUBLE_EQ(h[i]["fastest"].get<double>(), 0.1 * (i + 1)) << h.dump();
    EXPECT_EQ(h[i]["ranks"], 1) << h.dump();
  }
}

// The heat map /api/job serves: each rank's compute time at each step its records gave, once, over the median of
// the ranks at that step (worked out by hand below); a new attempt starts afresh.
TEST(Dashboard, TheHeatMapIsEachRanksComputeTimeOverTheStepsMedian) {
  Dashboard d("127.0.0.1:0");
  JobView v = two_ranks();
  v.attempt = 0;
  v.ranks = {rank_view(0, 1, true), rank_view(1, 1, true), rank_view(2, 1, true)};
  for (int r = 0; r < 3; ++r) v.ranks[r].status.coord_pp = r;
  // step 1: 1, 3, 1 -> median 1 -> 1, 3, 1;  step 2: 2, 4, 1 -> median 2 -> 1, 2, 0.5
  const double step1[] = {1, 3, 1}, step2[] = {2, 4, 1};
  for (int r = 0; r < 3; ++r) v.ranks[r].status.recent = {{1, 2.0, 5.0, 100, step1[r]}};
  d.publish(v);
  for (int r = 0; r < 3; ++r) {
    v.ranks[r].status.step = 2;
    // The next statuses still hold step 1 (with another time, which must not count again) and now step 2.
    v.ranks[r].status.recent = {{1, 2.0, 5.0, 100, 9.0}, {2, 2.0, 5.0, 101, step2[r]}};
  }
  d.publish(v);
  nlohmann::json h = nlohmann::json::parse(d.api_job())["heatmap"];
  EXPECT_EQ(h["steps"], nlohmann::json({1, 2})) << h.dump();
  EXPECT_EQ(h["median_s"], nlohmann::json({1.0, 2.0})) << h.dump();
  ASSERT_EQ(h["rows"].size(), 3u) << h.dump();
  EXPECT_EQ(h["rows"][0]["rel"], nlohmann::json({1.0, 1.0})) << h.dump();
  EXPECT_EQ(h["rows"][1]["rel"], nlohmann::json({3.0, 2.0})) << h.dump();
  EXPECT_EQ(h["rows"][2]["rel"], nlohmann::json({1.0, 0.5})) << h.dump();
  EXPECT_EQ(h["rows"][1]["coord"], nlohmann::json({0, 1, 0}));
  std::vector<int> slowest;
  for (const auto& s : h["slowest"]) slowest.push_back(s["rank"].get<int>());
  EXPECT_EQ(slowest, (std::vector<int>{1, 0, 2}));
  EXPECT_EQ(h["slowest"][0]["mean"], 2.5);
  EXPECT_EQ(h["nodes"][0]["hottest_rank"], 1) << "ranks 0 and 1 are on node 0";

  v.attempt = 1;  // a restart: the map starts again with the new attempt's steps
  for (int r = 0; r < 3; ++r) v.ranks[r].status.recent = {{2, 2.0, 5.0, 102, 1.0}};
  d.publish(v);
  h = nlohmann::json::parse(d.api_job())["heatmap"];
  EXPECT_EQ(h["steps"], nlohmann::json({2})) << h.dump();
  EXPECT_EQ(h["rows"][1]["rel"], nlohmann::json({1.0})) << h.dump();
}

TEST(Dashboard, ServesThePageTheJobAndTheMetricsOverHttp) {
  Dashboard d("127.0.0.1:0");
  ASSERT_GT(d.port(), 0);
  EXPECT_EQ(d.url(), fmt::format("http://127.0.0.1:{}/", d.port()));
  d.publish(two_ranks());
  d.event({{"t", 1.0}, {"event", "started"}, {"bytes", std::string("\xff\xfe")}});  // not UTF-8: still served
  httplib::Client c("127.0.0.1", d.port());
  auto page = c.Get("/");
  ASSERT_TRUE(page) << httplib::to_string(page.error());
  EXPECT_EQ(page->status, 200);
  EXPECT_NE(page->body.find("<title>megatrain</title>"), std::string::npos);
  auto job = c.Get("/api/job");
  ASSERT_TRUE(job);
  EXPECT_EQ(job->get_header_value("Content-Type"), "application/json");
  const nlohmann::json j = nlohmann::json::parse(job->body);
  EXPECT_EQ(j["ranks"].size(), 2u);
  ASSERT_EQ(j["events"].size(), 1u);
  EXPECT_EQ(j["events"][0]["event"], "started");
  auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(metrics->body, d.metrics());
  EXPECT_EQ(c.Get("/nothing-here")->status, 404);
}

TEST(Dashboard, WithATokenAnswersOnlyRequestsThatCarryIt) {
  Dashboard d("127.0.0.1:0", "s3cret");
  d.publish(two_ranks());
  httplib::Client c("127.0.0.1", d.port());
  for (const char* path : {"/", "/api/job", "/metrics", "/api/job?token=s3cre", "/api/job?token=s3cret2"}) {
    auto r = c.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 401) << path;
    EXPECT_EQ(r->get_header_value("WWW-Authenticate"), "Bearer") << path;
    EXPECT_NE(r->body.find("needs the dashboard's token"), std::string::npos) << r->body;
  }
  auto q = c.Get("/api/job?token=s3cret");  // a browser's way
  ASSERT_TRUE(q);
  EXPECT_EQ(q->status, 200);
  EXPECT_EQ(nlohmann::json::parse(q->body)["ranks"].size(), 2u);
  c.set_bearer_token_auth("wrong");
  EXPECT_EQ(c.Get("/metrics")->status, 401);
  c.set_bearer_token_auth("s3cret");  // Prometheus's bearer_token, curl -H
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  EXPECT_EQ(m->body, d.metrics());
}

TEST(Dashboard, BadAddressesAreConfigErrorsNamingThem) {
  for (const char* bad : {"8080", "host:", ":8080", "127.0.0.1:http", "127.0.0.1:70000"}) {
    try {
      Dashboard d(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind, ErrorKind::Config) << bad;
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
  Dashboard taken("127.0.0.1:0");
  const std::string again = fmt::format("127.0.0.1:{}", taken.port());
  try {
    Dashboard d(again);
    ADD_FAILURE() << "a port in use was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot listen"), std::string::npos) << e.what();
  }
}

// ---- HTTPS -------------------------------------------------------------------------------------------------------

fs::path tls_dir(const std::string& test) {
  const fs::path d = fs::path(temp_root()) / ("mt_dashboard_tls_" + test);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// The error check_tls_files throws for `files`: a Config error, or "" when it accepts them.
std::string tls_refusal(const TlsFiles& files) {
  try {
    check_tls_files(files);
    return "";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind, ErrorKind::Config) << e.what();
    return e.what();
  }
}

TEST(Dashboard, WithACertificateServesHttpsOnlyToClientsThatTrustIt) {
  const fs::path dir = tls_dir("serves");
  const TestCert tc = make_test_cert(dir, "dash");       // valid for two days
  const std::string secret = "s3cretvalue-long-enough";  // 16 bytes or more: megatrain status reads it as a secret
  Dashboard d("127.0.0.1:0", secret, TlsFiles{tc.cert, tc.key});
  EXPECT_EQ(d.url(), fmt::format("https://127.0.0.1:{}/", d.port()));
  EXPECT_EQ(d.certificate().subject, "CN=127.0.0.1");
  EXPECT_GT(d.certificate().days_left, 1.9);
  EXPECT_LE(d.certificate().days_left, 2.0);
  d.publish(two_ranks());
  const std::string origin = fmt::format("https://127.0.0.1:{}", d.port());
  {  // trusting the certificate (its own CA here): the job, and the token still asked for
    httplib::Client c(origin);
    c.enable_server_certificate_verification(true);
    c.set_ca_cert_path(tc.cert);
    auto r = c.Get("/api/job");
    ASSERT_TRUE(r) << httplib::to_string(r.error());
    EXPECT_EQ(r->status, 401);
    c.set_bearer_token_auth(secret.c_str());
    auto m = c.Get("/metrics");
    ASSERT_TRUE(m) << httplib::to_string(m.error());
    EXPECT_EQ(m->status, 200);
    EXPECT_EQ(m->body, d.metrics());
  }
  {  // not trusting it (the system's CAs only): refused by the client, nothing read
    httplib::Client c(origin);
    c.enable_server_certificate_verification(true);
    auto r = c.Get("/api/job?token=" + secret);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error(), httplib::Error::SSLServerVerification);
  }
  {  // plain HTTP to the HTTPS port: no answer at all, so no token crosses the network in the clear and comes back
    httplib::Client c("127.0.0.1", d.port());
    c.set_read_timeout(5, 0);
    auto r = c.Get("/api/job?token=" + secret);
    EXPECT_TRUE(!r || r->status == 400) << (r ? r->body : "");
  }
  // `megatrain status` over HTTPS: with --ca the job; without, the refusal in words and what to do.
  const std::string token = (dir / "token").string();
  std::ofstream(token) << secret << "\n";
  fs::permissions(token, fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::replace);
  const std::string st = (dir / "status.log").string();
  EXPECT_EQ(finish_within(start_logged(kMegatrain, {"status", d.url(), "--token-file", token, "--ca", tc.cert}, st),
                          60),
            0)
      << slurp(st);
  EXPECT_NE(slurp(st).find("job: "), std::string::npos) << slurp(st);
  EXPECT_EQ(finish_within(start_logged(kMegatrain, {"status", d.url(), "--token-file", token}, st), 60), 1)
      << slurp(st);
  EXPECT_NE(slurp(st).find("the server's certificate was refused (self-signed certificate) (--ca FILE names the CA"),
            std::string::npos)
      << slurp(st);
}

// A job outlives short-lived certificates: a renewed pair is served without a restart, a bad one is not, and an
// expiry under a week away is said once a day. Oracle: which CA a client must trust to read the dashboard.
TEST(Dashboard, ARenewedCertificateIsServedAndABadOneIsNot) {
  const fs::path dir = tls_dir("renew");
  const TestCert first = make_test_cert(dir / "first", "dash", -60, 3 * 86400);  // 3 days: under a week
  const TestCert second = make_test_cert(dir / "second", "dash", -60, 30 * 86400);
  const TestCert expired = make_test_cert(dir / "expired", "dash", -2 * 86400, -86400);
  const TlsFiles served{(dir / "dash.crt").string(), (dir / "dash.key").string()};
  auto install = [&](const TestCert& c) {  // as a renewal tool does: new files renamed over the old ones
    for (auto [from, to] : {std::pair{c.cert, served.cert}, std::pair{c.key, served.key}}) {
      fs::copy_file(from, to + ".new", fs::copy_options::overwrite_existing);
      fs::permissions(to + ".new", fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::replace);
      fs::rename(to + ".new", to);
    }
  };
  install(first);
  Dashboard d("127.0.0.1:0", "", served);
  std::vector<std::pair<std::string, std::string>> said;
  d.on_notice([&](const std::string& reason, const std::string& text) { said.emplace_back(reason, text); });
  d.publish(two_ranks());
  const int port = d.port();
  auto readable_trusting = [&](const TestCert& ca) {
    httplib::Client c(fmt::format("https://127.0.0.1:{}", port));
    c.enable_server_certificate_verification(true);
    c.set_ca_cert_path(ca.cert);
    auto r = c.Get("/api/job");
    return r && r->status == 200;
  };
  EXPECT_TRUE(readable_trusting(first));
  EXPECT_FALSE(readable_trusting(second));

  d.check_certificate();  // unchanged files: only the expiry, 3 days away, is said; a second look the same day is quiet
  ASSERT_EQ(said.size(), 1u);
  EXPECT_EQ(said[0].first, "certificate_expiring");
  EXPECT_NE(said[0].second.find("expires in 3.0 days"), std::string::npos) << said[0].second;
  d.check_certificate();
  EXPECT_EQ(said.size(), 1u);

  install(second);
  d.check_certificate();
  ASSERT_EQ(said.size(), 2u);
  EXPECT_EQ(said[1].first, "certificate_renewed") << said[1].second;
  EXPECT_EQ(d.port(), port);
  EXPECT_TRUE(readable_trusting(second));
  EXPECT_FALSE(readable_trusting(first));
  EXPECT_EQ(d.certificate().days_left > 29, true);

  install(expired);  // refused: the renewed certificate stays
  d.check_certificate();
  ASSERT_EQ(said.size(), 3u);
  EXPECT_EQ(said[2].first, "certificate_refused");
  EXPECT_NE(said[2].second.find("the one before stays"), std::string::npos) << said[2].second;
  EXPECT_NE(said[2].second.find("expired on"), std::string::npos) << said[2].second;
  EXPECT_TRUE(readable_trusting(second));

  // A pair that passes our checks but that OpenSSL will not serve (a 512-bit RSA key, under Debian's security level):
  // the running server is kept, not stopped first.
  const TestCert weak = make_test_cert(dir / "weak", "dash", -60, 30 * 86400, "", 512);
  install(weak);
  d.check_certificate();
  ASSERT_EQ(said.size(), 4u);
  EXPECT_EQ(said[3].first, "certificate_refused");
  EXPECT_NE(said[3].second.find("OpenSSL cannot serve with it"), std::string::npos) << said[3].second;
  EXPECT_TRUE(readable_trusting(second));
}

TEST(Dashboard, EachUnusableCertificateOrKeyIsRefusedNamingItsFile) {
  const fs::path dir = tls_dir("refused");
  const TestCert good = make_test_cert(dir, "good"), other = make_test_cert(dir, "other");
  EXPECT_EQ(tls_refusal({good.cert, good.key}), "");
  auto expect = [](const std::string& got, const std::string& want, const std::string& file) {
    EXPECT_NE(got.find(want), std::string::npos) << got;
    EXPECT_NE(got.find(file), std::string::npos) << got;
  };
  const std::string missing = (dir / "missing.crt").string();
  expect(tls_refusal({missing, good.key}), "No such file or directory", missing);
  expect(tls_refusal({good.key, good.key}), "no PEM certificate in it", good.key);  // the key given as the cert
  const fs::path cert_copy = dir / "cert-as-key.pem";
  fs::copy_file(good.cert, cert_copy);
  fs::permissions(cert_copy, fs::perms::owner_read | fs::perms::owner_write);
  expect(tls_refusal({good.cert, cert_copy.string()}), "no PEM private key in it", cert_copy.string());
  expect(tls_refusal({good.cert, other.key}), "is not the private key of the certificate in " + good.cert, other.key);
  const TestCert locked = make_test_cert(dir, "locked", -60, 86400, "a passphrase");
  expect(tls_refusal({locked.cert, locked.key}), "is encrypted, and nothing would type its passphrase", locked.key);
  const TestCert expired = make_test_cert(dir, "expired", -2 * 86400, -86400);
  expect(tls_refusal({expired.cert, expired.key}), "expired on 20", expired.cert);
  const TestCert early = make_test_cert(dir, "early", 86400, 2 * 86400);
  expect(tls_refusal({early.cert, early.key}), "is not valid yet: from 20", early.cert);
  fs::permissions(good.key, fs::perms::group_read | fs::perms::others_read, fs::perm_options::add);
  expect(tls_refusal({good.cert, good.key}), "accessible to its group or others (mode 644); chmod 600 it", good.key);
  // The dashboard refuses the same way, before it listens.
  try {
    Dashboard d("127.0.0.1:0", "", TlsFiles{expired.cert, expired.key});
    ADD_FAILURE() << "an expired certificate was served";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind, ErrorKind::Config);
    EXPECT_NE(std::string(e.what()).find("expired on"), std::string::npos) << e.what();
  }
  // And `megatrain launch` before any rank starts (exit 10, a config error), as for a half-given pair.
  const std::string log = (dir / "launch.log").string();
  EXPECT_EQ(finish_within(start_logged(kMegatrain,
                                       {"launch", "--nproc", "1", "--dashboard", "127.0.0.1:0", "--dashboard-tls-cert",
                                        early.cert, "--dashboard-tls-key", early.key, "--exec", "--", "/bin/true"},
                                       log),
                          60),
            10)
      << slurp(log);
  EXPECT_NE(slurp(log).find("is not valid yet"), std::string::npos) << slurp(log);
  EXPECT_EQ(finish_within(start_logged(kMegatrain,
                                       {"launch", "--nproc", "1", "--dashboard", "127.0.0.1:0", "--dashboard-tls-cert",
                                        other.cert, "--exec", "--", "/bin/true"},
                                       log),
                          60),
            10)
      << slurp(log);
  EXPECT_NE(slurp(log).find("--dashboard-tls-cert without --dashboard-tls-key: HTTPS needs both"), std::string::npos)
      << slurp(log);
}

// ---- a real job ------------------------------------------------------------------------------------------------

// At 1,024 ranks a row per rank would not be read: the page draws a row per node (8 ranks each here), the node's
// value its hottest rank's, and names the slowest rank beside it. The oracle is the one rank given 3 x the others'
// compute time: its node's row must name it as its hottest rank, and it must head the list.
TEST(Dashboard, AtAThousandRanksThePageDrawsARowPerNodeNamingItsHottestRank) {
  constexpr int kRanks = 1024, kSlow = 517;
  JobView v;
  v.state = "running";
  v.nodes = kRanks / 8;
  v.world = kRanks;
  for (int r = 0; r < kRanks; ++r) {
    RankView rv = rank_view(r, 3, true);
    rv.node = r / 8;
    rv.status.coord_tp = r % 8, rv.status.coord_dp = (r / 8) % 32, rv.status.coord_pp = r / 256;
    rv.status.dp = 32, rv.status.pp = 4, rv.status.tp = 8;
    rv.status.colls.clear();
    for (int step = 1; step <= 3; ++step) rv.status.recent.push_back({step, 2.0, 1.0, 100, r == kSlow ? 3.0 : 1.0});
    v.ranks.push_back(rv);
  }
  Dashboard d("127.0.0.1:0");
  d.publish(v);
  const fs::path dir = fs::path(temp_root()) / "mt-dashboard-1024";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string dom = rendered_dom(d.url(), dir);
  std::map<int, std::string> hottest_of_node;
  const std::regex node(R"re(<g class="heat-node" data-node="(\d+)" data-mean="[0-9.]+" data-hottest-rank="(\d+)")re");
  for (auto it = std::sregex_iterator(dom.begin(), dom.end(), node); it != std::sregex_iterator(); ++it)
    hottest_of_node[std::stoi((*it)[1])] = (*it)[2];
  EXPECT_EQ(hottest_of_node.size(), 128u) << "a row per node";
  EXPECT_EQ(hottest_of_node[kSlow / 8], std::to_string(kSlow));
  EXPECT_EQ(dom.find("class=\"heat-row\""), std::string::npos) << "no node opened, so no rank rows";
  std::smatch m;
  ASSERT_TRUE(std::regex_search(dom, m, std::regex(R"re(<ol id="slowest"><li data-rank="(\d+)")re")));
  EXPECT_EQ(m[1], std::to_string(kSlow));

  // A node opened (the page's address keeps what a click opened): its 8 ranks' rows beneath it, the slow one hottest.
  const std::string opened = rendered_dom(d.url() + "#open=" + std::to_string(kSlow / 8), dir);
  std::vector<int> rows;
  const std::regex row(R"re(<g class="heat-row" data-rank="(\d+)")re");
  for (auto it = std::sregex_iterator(opened.begin(), opened.end(), row); it != std::sregex_iterator(); ++it)
    rows.push_back(std::stoi((*it)[1]));
  EXPECT_EQ(rows, (std::vector<int>{512, 513, 514, 515, 516, 517, 518, 519})) << "node 64's ranks, by (dp, pp, tp)";
  ASSERT_TRUE(std::regex_search(opened, m,
                                std::regex(R"re(<g class="heat-row" data-rank="(\d+)"[^>]*data-hottest="true")re")));
  EXPECT_EQ(m[1], std::to_string(kSlow));
  if (!HasFailure()) fs::remove_all(dir);
}

// A silent data corruption stays listed with its rank, node, step and tensor after the event feed has moved on, in
// the JSON and on the page chromium renders.
TEST(Dashboard, EverySilentDataCorruptionStaysListedWithItsRankNodeStepAndTensor) {
  Dashboard d("127.0.0.1:0");
  d.event({{"t", 1.0},
           {"event", "fault"},
           {"attempt", 0},
           {"node", 1},
           {"rank", 5},
           {"reason", "sdc"},
           {"detail", {{"event", "sdc"}, {"step", 20}, {"tensor", "h.0.attn.qkv.w"}}}});
  d.event({{"t", 2.0}, {"event", "fault"}, {"attempt", 0}, {"node", 0}, {"rank", 2}, {"reason", "non_finite"}});
  for (size_t i = 0; i < Dashboard::kMaxEvents + 5; ++i) d.event({{"t", 3.0}, {"event", "warning"}});
  const nlohmann::json j = nlohmann::json::parse(d.api_job());
  for (const auto& e : j["events"]) EXPECT_NE(e["event"], "fault");  // scrolled out of the feed
  ASSERT_EQ(j["sdc"].size(), 1u) << j["sdc"].dump();                 // the NaN is no sdc
  const nlohmann::json& f = j["sdc"][0];
  EXPECT_EQ(f["rank"], 5);
  EXPECT_EQ(f["node"], 1);
  EXPECT_EQ(f["step"], 20);
  EXPECT_EQ(f["tensor"], "h.0.attn.qkv.w");
  EXPECT_EQ(f["transient"], false);
  const fs::path dir = fs::path(temp_root()) / "mt-dashboard-sdc";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string dom = rendered_dom(d.url(), dir);
  EXPECT_NE(dom.find("<div class=\"sdc\">silent data corruption: rank 5 (node 1) at step 20, tensor h.0.attn.qkv.w, "
                     "its parameters differ from its replicas'; attempt 0</div>"),
            std::string::npos)
      << dom;
  if (!HasFailure()) fs::remove_all(dir);
}

class LaunchDashboard : public ::testing::Test {
 protected:
  void SetUp() override {
    prepare_launch_data();
    dir_ = case_dir("mt-dashboard-");  // one per test: ctest runs the fixture's tests side by side
  }
  void TearDown() override {
    if (launcher_ > 0) {
      ::kill(launcher_, SIGKILL);
      ::waitpid(launcher_, nullptr, 0);
    }
    if (!HasFailure() && !std::getenv("MT_KEEP_TEST_DIRS")) fs::remove_all(dir_);
  }
  fs::path dir_;
  pid_t launcher_ = -1;
};

TEST_F(LaunchDashboard, TheRanksStepsAndLossesAreServedAsTheJobRuns) {
  const std::string out = (dir_ / "run").string(), events = (dir_ / "events.jsonl").string();
  // The dashboard is behind a token: each request carries it (a header, or the page's ?token=).
  const std::string token = "t0k3n-of-this-test", token_file = (dir_ / "token").string();
  std::ofstream(token_file) << token << "\n";
  fs::permissions(token_file, fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::replace);
  // pp2 x tp2 on 4 ranks: two pipeline stages of two tensor-parallel ranks. The run is far longer than the test,
  // which ends it with SIGTERM once it has seen what it needs.
  std::vector<std::string> args = {"launch",   "--nproc", "4",           "--max-restarts", "1",
                                   "--events", events,    "--dashboard", "127.0.0.1:0",    "--dashboard-token-file",
                                   token_file, "--",      "train"};
  for (const std::string& f :
       SmallJob(out)
           .model(2, 64, 2, 32)
           .steps(100000)
           .log_every(1)
           .unset("optim.lr")
           .unset("optim.warmup_steps")
           .set("ckpt.every", 0)
           .set("ckpt.save_final", "false")
           .with({"--parallel.pp=2", "--parallel.tp=2", "--parallel.microbatches=2", "--parallel.tp_chunks=1"})
           .args())
    args.push_back(f);
  launcher_ = start_logged(kMegatrain, args, (dir_ / "launch.log").string());

  // The URL, from the launcher's event log.
  std::string url;
  for (const double t0 = now_seconds(); url.empty(); std::this_thread::sleep_for(std::chrono::milliseconds(50))) {
    for (const auto& e : events_of(events))
      if (e.value("event", "") == "dashboard") url = e.value("url", "");
    ASSERT_EQ(::waitpid(launcher_, nullptr, WNOHANG), 0) << "launch ended:\n" << slurp(dir_ / "launch.log");
    ASSERT_LT(now_seconds() - t0, 60) << "no dashboard event";
  }
  std::smatch m;
  ASSERT_TRUE(std::regex_match(url, m, std::regex(R"(http://127\.0\.0\.1:(\d+)/)"))) << url;
  httplib::Client c("127.0.0.1", std::stoi(m[1]));
  for (const char* path : {"/", "/api/job", "/metrics", "/api/job?token=wrong"}) {
    auto r = c.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 401) << path << " was served without the token";
  }
  c.set_bearer_token_auth(token.c_str());

  // Wait until every rank has completed 3 steps, as the dashboard sees it.
  nlohmann::json j;
  for (const double t0 = now_seconds();; std::this_thread::sleep_for(std::chrono::milliseconds(100))) {
    ASSERT_EQ(::waitpid(launcher_, nullptr, WNOHANG), 0) << "launch ended:\n" << slurp(dir_ / "launch.log");
    ASSERT_LT(now_seconds() - t0, 300) << "the ranks never reached step 3: " << j.dump();
    auto r = c.Get("/api/job");
    if (!r) continue;
    j = nlohmann::json::parse(r->body);
    if (!j["job"]["step"].is_null() && j["job"]["step"]["min"].get<int>() >= 3) break;
  }

  // The job and its layout, and every rank where the layout puts it.
  EXPECT_EQ(j["job"]["state"], "running");
  EXPECT_EQ(j["job"]["world"], 4);
  EXPECT_TRUE(j["moe"].is_null()) << "a dense model has no MoE load: " << j["moe"].dump();
  EXPECT_EQ(j["job"]["layout"]["pp"], 2);
  EXPECT_EQ(j["job"]["layout"]["tp"], 2);
  std::set<std::vector<int>> coords;
  for (const auto& r : j["ranks"]) {
    ASSERT_FALSE(r["coord"].is_null()) << r.dump();
    coords.insert(r["coord"].get<std::vector<int>>());
    EXPECT_TRUE(r["running"].get<bool>());
    EXPECT_LT(r["age_s"].get<double>(), 60.0) << "a heartbeat this old would be a hang";
  }
  EXPECT_EQ(coords, (std::set<std::vector<int>>{{0, 0, 0}, {0, 0, 1}, {0, 1, 0}, {0, 1, 1}}));

  // The oracle: the losses rank 0 logged itself. Each step the dashboard holds has the very same loss (the
  // heartbeat carries the double the metrics line was written from; JSON round-trips it exactly).
  std::map<int, double> logged;
  for (const auto& l : events_of(out + "/metrics.jsonl"))
    if (l.value("kind", "") == "train") logged[l["step"].get<int>()] = l["loss"].get<double>();
  int compared = 0;
  for (const auto& p : j["history"]) {
    if (p["loss"].is_null() || !logged.count(p["step"].get<int>())) continue;
    EXPECT_EQ(p["loss"].get<double>(), logged[p["step"].get<int>()]) << "step " << p["step"];
    EXPECT_LE(p["fastest"].get<double>(), p["slowest"].get<double>());
    ++compared;
  }
  EXPECT_GE(compared, 3) << j["history"].dump();

  // /metrics: every rank's step, labelled with its coordinates, at least the step seen above.
  auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  const auto samples = parse_prometheus(metrics->body);
  for (int rank = 0; rank < 4; ++rank) {
    int found = 0;
    for (const auto& [key, value] : samples)
      if (key.rfind(fmt::format("megatrain_rank_step{{rank=\"{}\",", rank), 0) == 0) {
        EXPECT_NE(key.find(",pp=\""), std::string::npos) << key;
        EXPECT_GE(std::stoi(value), 3) << key;
        ++found;
      }
    EXPECT_EQ(found, 1) << "rank " << rank;
  }
  EXPECT_EQ(samples.at("megatrain_job_state{state=\"running\"}"), "1");

  // `megatrain status`, a terminal's view of the same: with the token, the job and its layout; without, refused.
  {
    const std::string st = (dir_ / "status.log").string();
    EXPECT_EQ(finish_within(start_logged(kMegatrain, {"status", url, "--token-file", token_file}, st), 60), 0)
        << slurp(st);
    EXPECT_NE(slurp(st).find("job: running, attempt 0 (0 restarts), dp1 x pp2 x tp2, 4 ranks on 1 node"),
              std::string::npos)
        << slurp(st);
    EXPECT_EQ(finish_within(start_logged(kMegatrain, {"status", url}, st), 60), 1) << slurp(st);
    EXPECT_NE(slurp(st).find("answered HTTP 401 (the dashboard wants its token"), std::string::npos) << slurp(st);
  }

  // The page in a real browser: two stages, four rank cells with their steps, and the loss drawn.
  const std::string dom = rendered_dom(url + "?token=" + token, dir_);
  std::set<int> cells;
  const std::regex cell(R"re(class="rank[^"]*" data-rank="(\d+)" data-step="(\d+)" data-state="(\w+)")re");
  for (auto it = std::sregex_iterator(dom.begin(), dom.end(), cell); it != std::sregex_iterator(); ++it) {
    cells.insert(std::stoi((*it)[1]));
    EXPECT_GE(std::stoi((*it)[2]), 3) << (*it)[0];
  }
  EXPECT_EQ(cells, (std::set<int>{0, 1, 2, 3})) << dom;
  EXPECT_NE(dom.find("stage pp1"), std::string::npos);
  EXPECT_NE(dom.find("<b>running</b>"), std::string::npos);
  EXPECT_TRUE(std::regex_search(dom, std::regex(R"(id="job-effectivetraining">effective training: <b>\d+\.\d%</b>)")))
      << "no effective training time on the page";
  EXPECT_NE(dom.find("<polyline"), std::string::npos) << "no loss curve";
  EXPECT_NE(dom.find("<div id=\"moe\"></div>"), std::string::npos) << "a dense model's page has no MoE view";

  // SIGTERM ends the job cleanly: the ranks stop at a step boundary, the launcher exits as signalled.
  ::kill(launcher_, SIGTERM);
  EXPECT_EQ(finish_within(launcher_, 120), 128 + SIGTERM) << slurp(dir_ / "launch.log");
  launcher_ = -1;
}

// The heat map of slow ranks over a real job with one slow rank. The oracle is the injected fault: in a dp2 x tp2
// job rank 2 sleeps 3 x its step's compute each step (slow:factor=4) and its peers wait for it in collectives,
// which compute time leaves out; so rank 2 must be the hottest row, about 4 x the median, in the JSON the page draws
// from and in the page as a real browser renders it.
TEST_F(LaunchDashboard, TheSlowRankIsTheHottestRowOfTheHeatMap) {
  const std::string out = (dir_ / "run").string(), events = (dir_ / "events.jsonl").string();
  std::vector<std::string> args = {"launch",      "--nproc",     "4",  "--events", events,
                                   "--dashboard", "127.0.0.1:0", "--", "train"};
  for (const std::string& f : SmallJob(out)
                                  .model(1, 64, 2, 32)
                                  .steps(100000)
                                  .log_every(1)
                                  .set("ckpt.every", 0)
                                  .set("ckpt.save_final", "false")
                                  .with({"--parallel.dp=2", "--parallel.tp=2", "--parallel.tp_chunks=1"})
                                  .args())
    args.push_back(f);
  ::setenv("MEGATRAIN_FAULTS", "slow:rank=2:factor=4", 1);
  launcher_ = start_logged(kMegatrain, args, (dir_ / "launch.log").string());
  ::unsetenv("MEGATRAIN_FAULTS");

  std::string url;
  for (const double t0 = now_seconds(); url.empty(); std::this_thread::sleep_for(std::chrono::milliseconds(50))) {
    for (const auto& e : events_of(events))
      if (e.value("event", "") == "dashboard") url = e.value("url", "");
    ASSERT_EQ(::waitpid(launcher_, nullptr, WNOHANG), 0) << "launch ended:\n" << slurp(dir_ / "launch.log");
    ASSERT_LT(now_seconds() - t0, 60) << "no dashboard event";
  }
  std::smatch m;
  ASSERT_TRUE(std::regex_match(url, m, std::regex(R"(http://127\.0\.0\.1:(\d+)/)"))) << url;
  httplib::Client c("127.0.0.1", std::stoi(m[1]));

  // Until every rank has a value at 4 steps of the map.
  nlohmann::json h;
  for (const double t0 = now_seconds();; std::this_thread::sleep_for(std::chrono::milliseconds(200))) {
    ASSERT_EQ(::waitpid(launcher_, nullptr, WNOHANG), 0) << "launch ended:\n" << slurp(dir_ / "launch.log");
    ASSERT_LT(now_seconds() - t0, 300) << "the heat map never filled: " << h.dump();
    auto r = c.Get("/api/job");
    if (!r) continue;
    h = nlohmann::json::parse(r->body)["heatmap"];
    if (h["rows"].size() == 4 && std::all_of(h["rows"].begin(), h["rows"].end(),
                                             [](const nlohmann::json& row) { return row["samples"].get<int>() >= 4; }))
      break;
  }
  // The JSON: rows by (dp, pp, tp), which here is rank order; rank 2 hottest and named first.
  std::map<int, double> mean;
  std::vector<int> order;
  for (const auto& row : h["rows"]) {
    order.push_back(row["rank"].get<int>());
    mean[order.back()] = row["mean"].get<double>();
  }
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3})) << h.dump();
  EXPECT_EQ(h["slowest"][0]["rank"], 2) << h.dump();
  EXPECT_GT(mean[2], 2.0) << h.dump();
  for (int r : {0, 1, 3}) EXPECT_LT(mean[r], mean[2] / 1.5) << "rank " << r << ": " << h.dump();

  // The page in a real browser: the hottest row is rank 2's, and it heads the list of the slowest.
  const std::string dom = rendered_dom(url, dir_);
  ASSERT_TRUE(std::regex_search(dom, m,
                                std::regex(R"re(<g class="heat-row" data-rank="(\d+)"[^>]*data-hottest="true")re")))
      << dom;
  EXPECT_EQ(m[1], "2") << dom;
  ASSERT_TRUE(std::regex_search(dom, m, std::regex(R"re(<ol id="slowest"><li data-rank="(\d+)")re"))) << dom;
  EXPECT_EQ(m[1], "2") << dom;
  std::set<int> rows;
  const std::regex row(R"re(<g class="heat-row" data-rank="(\d+)")re");
  for (auto it = std::sregex_iterator(dom.begin(), dom.end(), row); it != std::sregex_iterator(); ++it)
    rows.insert(std::stoi((*it)[1]));
  EXPECT_EQ(rows, (std::set<int>{0, 1, 2, 3})) << "a row per rank (one node of 4 ranks: no node rows)";

  ::kill(launcher_, SIGTERM);
  EXPECT_EQ(finish_within(launcher_, 120), 128 + SIGTERM) << slurp(dir_ / "launch.log");
  launcher_ = -1;
}

}  // namespace
