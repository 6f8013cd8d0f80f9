// Prometheus against megatrain (deploy/prometheus), with Debian's prometheus and promtool (scripts/setup installs
// them). The shipped rules must pass `promtool test rules` against known answers (tests/prometheus/
// megatrain_rules_test.yml: each alert fires at a known minute with known labels and text, and series beside it must
// not). And a real Prometheus, configured by the shipped scrape example, scrapes a real dashboard over HTTPS with its
// token: every value it stored must be the one the dashboard published (the oracle), the target must be healthy with
// no scrape error (Prometheus's own parser accepts the exposition), and the shipped recording rules must have run.
#include <httplib.h>
#include <signal.h>

#include <map>

#include "support/comm_servers.h"
#include "support/files.h"
#include "support/launch_testutil.h"
#include "megatrain/launch/dashboard.h"
#include "support/test_util.h"
#include "support/tls_testutil.h"

using namespace mt;
using namespace mt::launch;
using namespace mt::test;
namespace fs = std::filesystem;

namespace {

const fs::path kRules = fs::path(MT_SOURCE_DIR) / "deploy/prometheus/megatrain.rules.yml";
const fs::path kScrape = fs::path(MT_SOURCE_DIR) / "deploy/prometheus/scrape.yml";
const fs::path kRulesTest = fs::path(MT_SOURCE_DIR) / "tests/prometheus/megatrain_rules_test.yml";

fs::path scrape_dir(const std::string& name) {
  const fs::path d = fs::path(temp_root()) / ("mt_prometheus_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Runs a shell command; its exit code, with its output in *out.
int shell(const std::string& cmd, std::string* out) {
  std::string full = cmd + " 2>&1";
  FILE* p = ::popen(full.c_str(), "r");
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out->append(buf, n);
  const int st = ::pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

void require_prometheus() {
  for (const char* tool : {"/usr/bin/prometheus", "/usr/bin/promtool"})
    ASSERT_TRUE(fs::exists(tool)) << tool << " is missing: scripts/setup installs Debian's prometheus";
}

// A job of four ranks (pp 2 x tp 2) at steps 40..43, each with its own loss and compute time.
JobView four_ranks() {
  JobView v;
  v.state = "running";
  v.attempt = 1, v.restarts = 1, v.max_restarts = 3;
  v.world = 4, v.nodes = 2;
  v.started = 100.0, v.now = 160.0, v.useful_s = 45.0;
  for (int r = 0; r < 4; ++r) {
    RankView rv;
    RankStatus& s = rv.status;
    s.rank = r;
    s.step = 40 + r;
    s.heard = true;
    s.last_heard = 159.0;
    s.phase = "forward_backward";
    s.dp = 1, s.pp = 2, s.tp = 2, s.grad_accum = 1;
    s.coord_dp = 0, s.coord_pp = r / 2, s.coord_tp = r % 2;
    s.loss = 3.25 - 0.125 * r;
    s.step_time = 0.5;
    s.compute_time = 0.25 + 0.0625 * r;
    s.tokens_per_s = 8192.0 - r;
    rv.running = true;
    rv.node = r / 2;
    v.ranks.push_back(rv);
  }
  return v;
}

// The shipped scrape example with this test's paths and target, scraping and evaluating each second.
std::string scrape_config(const std::string& target, const std::string& ca, const std::string& token) {
  std::string text = slurp(kScrape);
  auto put = [&](const std::string& from, const std::string& to) {
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << "deploy/prometheus/scrape.yml no longer holds '" << from << "'";
    text.replace(at, from.size(), to);
  };
  put("scrape_interval: 15s", "scrape_interval: 1s");
  put("evaluation_interval: 15s", "evaluation_interval: 1s");
  put("/etc/prometheus/megatrain.rules.yml", kRules.string());
  put("/etc/megatrain/cluster-ca.pem", ca);
  put("/etc/megatrain/dashboard-token", token);
  put("node00:8443", target);
  return text;
}

// An instant query's samples, keyed by `key`'s label value (or "" for a series without it).
std::map<std::string, double> query(httplib::Client& c, const std::string& promql, const std::string& key) {
  std::map<std::string, double> out;
  auto r = c.Get("/api/v1/query", httplib::Params{{"query", promql}}, httplib::Headers{});
  if (!r || r->status != 200) return out;
  const nlohmann::json j = nlohmann::json::parse(r->body, nullptr, false);
  if (j.is_discarded() || j.value("status", "") != "success") return out;
  for (const auto& s : j["data"]["result"])
    out[s["metric"].value(key, "")] = std::stod(s["value"][1].get<std::string>());
  return out;
}

}  // namespace

TEST(Prometheus, TheShippedRulesPassTheirUnitTests) {
  require_prometheus();
  std::string out;
  EXPECT_EQ(shell("promtool check rules " + kRules.string(), &out), 0) << out;
  EXPECT_NE(out.find("SUCCESS: 8 rules found"), std::string::npos) << out;
  out.clear();
  // promtool reads rule_files relative to the test file's folder.
  EXPECT_EQ(shell("cd " + kRulesTest.parent_path().string() + " && promtool test rules " +
                      kRulesTest.filename().string(),
                  &out),
            0)
      << out;
  EXPECT_NE(out.find("SUCCESS"), std::string::npos) << out;
}

TEST(Prometheus, ARealPrometheusScrapesTheDashboardOverHttpsWithItsToken) {
  require_prometheus();
  const fs::path dir = scrape_dir("scrape");
  const TestCert tc = make_test_cert(dir, "dash");
  const std::string secret = "prometheus-reads-this-token";
  const std::string token = (dir / "token").string();
  std::ofstream(token) << secret << "\n";
  fs::permissions(token, fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::replace);
  Dashboard d("127.0.0.1:0", secret, TlsFiles{tc.cert, tc.key});
  const JobView view = four_ranks();
  d.publish(view);

  const std::string config = (dir / "prometheus.yml").string();
  std::ofstream(config) << scrape_config(fmt::format("127.0.0.1:{}", d.port()), tc.cert, token);
  const int port = comm_test::free_port();
  const std::string log = (dir / "prometheus.log").string();
  const pid_t prom = start_logged("/usr/bin/prometheus",
                                  {"--config.file=" + config, "--storage.tsdb.path=" + (dir / "tsdb").string(),
                                   fmt::format("--web.listen-address=127.0.0.1:{}", port), "--log.level=warn"},
                                  log);
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(2, 0);
  // The recording rules run after a scrape stored the samples they read: once megatrain:job_step exists, both did.
  // (Prometheus starts in about a second; 120 s is for a loaded CI machine.)
  std::map<std::string, double> job_step;
  for (const double t0 = now_seconds(); job_step.empty() && now_seconds() - t0 < 120;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    job_step = query(c, "megatrain:job_step", "");
  }
  if (job_step.empty()) {  // why: the target's last scrape error (a refused token or certificate), and the log
    auto t = c.Get("/api/v1/targets");
    FAIL() << "no megatrain:job_step after 120 s; targets: " << (t ? t->body : "(no answer)") << "\nprometheus said:\n"
           << slurp(log);
  }
  ASSERT_EQ(job_step.size(), 1u);
  EXPECT_EQ(job_step.begin()->second, 43);

  // The target: healthy, scraped without error, over https.
  auto targets = c.Get("/api/v1/targets");
  ASSERT_TRUE(targets && targets->status == 200);
  const nlohmann::json t = nlohmann::json::parse(targets->body)["data"]["activeTargets"];
  ASSERT_EQ(t.size(), 1u) << t.dump();
  EXPECT_EQ(t[0]["health"], "up") << t.dump();
  EXPECT_EQ(t[0]["lastError"], "") << t.dump();
  EXPECT_EQ(t[0]["scrapeUrl"], fmt::format("https://127.0.0.1:{}/metrics", d.port())) << t.dump();

  // Every rank's values as published, each under its own labels.
  const auto steps = query(c, "megatrain_rank_step", "rank");
  const auto losses = query(c, "megatrain_rank_loss", "rank");
  const auto compute = query(c, "megatrain_rank_compute_seconds", "rank");
  const auto pp = query(c, "megatrain_rank_step", "pp");
  ASSERT_EQ(steps.size(), 4u);
  for (const RankView& r : view.ranks) {
    const std::string k = std::to_string(r.status.rank);
    EXPECT_EQ(steps.at(k), r.status.step) << k;
    EXPECT_EQ(losses.at(k), *r.status.loss) << k;
    EXPECT_EQ(compute.at(k), *r.status.compute_time) << k;
  }
  EXPECT_EQ(pp.size(), 2u);  // two stages, two tensor-parallel ranks each
  EXPECT_EQ(query(c, "megatrain_job_restarts", "").at(""), 1);
  EXPECT_EQ(query(c, "megatrain_job_state", "state").at("running"), 1);
  EXPECT_EQ(query(c, "megatrain_job_state", "state").at("failed"), 0);
  EXPECT_EQ(query(c, "megatrain_job_effective_training_ratio", "").at(""), 45.0 / 60.0);
  EXPECT_EQ(query(c, "megatrain:job_tokens_per_second", "").at(""), 8192);
  EXPECT_EQ(query(c, "up", "job").at("megatrain"), 1);

  ::kill(prom, SIGTERM);
  EXPECT_EQ(finish_within(prom, 60), 0) << slurp(log);
}
