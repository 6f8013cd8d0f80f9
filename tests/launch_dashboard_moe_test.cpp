// The dashboard's view of a mixture-of-experts model's routing load (launch/dashboard.h's "moe", obs/moe_load.h):
// a real `megatrain launch --dashboard` over a MoE training run, whose served tokens per expert, shares, busiest
// expert over the mean and drops must be the ones the rank itself logged in metrics.jsonl (the oracle) at the step
// served, in the JSON and in the page a real headless chromium renders; a dense job's page has no such view; a
// rank's status carries the load from a node's agent to the job driver.
#include <httplib.h>
#include <limits.h>
#include <signal.h>

#include <functional>
#include <map>
#include <regex>

#include "support/files.h"
#include "support/headless_dom.h"
#include "support/launch_testutil.h"
#include "support/megatrain.h"
#include "support/metrics.h"
#include "support/small_job.h"
#include "megatrain/core/clock.h"
#include "megatrain/launch/dashboard.h"
#include "megatrain/launch/job_protocol.h"
#include "megatrain/launch/job_view.h"
#include "support/test_util.h"

using namespace mt;
using namespace mt::launch;
using namespace mt::test;
namespace fs = std::filesystem;

namespace {

// One MoE layer as the oracle sees it: metrics.jsonl's counts and what the dashboard must make of them.
struct Expected {
  std::vector<int64_t> tokens;
  int64_t dropped = 0;
  std::vector<double> share;  // tokens / their sum
  double max_over_mean = 0;   // the largest count over the mean count
};

// From metrics.jsonl's `moe` field (or the same shape): [{layer, tokens_per_expert, dropped, ...}].
std::map<int, Expected> expected_of(const nlohmann::json& moe) {
  std::map<int, Expected> out;
  for (const auto& l : moe) {
    Expected e;
    e.tokens = l["tokens_per_expert"].get<std::vector<int64_t>>();
    e.dropped = l["dropped"].get<int64_t>();
    int64_t sum = 0, most = 0;
    for (int64_t t : e.tokens) sum += t, most = std::max(most, t);
    for (int64_t t : e.tokens) e.share.push_back(static_cast<double>(t) / static_cast<double>(sum));
    e.max_over_mean = static_cast<double>(most) / (static_cast<double>(sum) / static_cast<double>(e.tokens.size()));
    out[l["layer"].get<int>()] = e;
  }
  return out;
}

// The served JSON's layers against the oracle's.
void expect_json_matches(const nlohmann::json& moe, const std::map<int, Expected>& want) {
  ASSERT_EQ(moe["layers"].size(), want.size()) << moe.dump();
  for (const auto& l : moe["layers"]) {
    const int layer = l["layer"].get<int>();
    ASSERT_TRUE(want.count(layer)) << "layer " << layer;
    const Expected& e = want.at(layer);
    EXPECT_EQ(l["tokens_per_expert"].get<std::vector<int64_t>>(), e.tokens) << "layer " << layer;
    EXPECT_EQ(l["dropped"].get<int64_t>(), e.dropped) << "layer " << layer;
    EXPECT_EQ(l["share"].get<std::vector<double>>(), e.share) << "layer " << layer;
    EXPECT_DOUBLE_EQ(l["max_over_mean"].get<double>(), e.max_over_mean) << "layer " << layer;
  }
}

// The page's MoE table: its step, and every cell's count and share and every row's imbalance and drops, against
// the oracle's (the page writes each number as JavaScript's shortest round-trip text: it parses back exactly).
int expect_page_matches(const std::string& dom, const std::function<std::map<int, Expected>(int step)>& want_at) {
  std::smatch m;
  if (!std::regex_search(dom, m, std::regex(R"re(<table id="moe-table" data-step="(\d+)" data-rank="0")re"))) {
    ADD_FAILURE() << "no MoE table on the page: " << dom;
    return -1;
  }
  const int step = std::stoi(m[1]);
  const std::map<int, Expected> want = want_at(step);
  size_t cells = 0, rows = 0;
  const std::regex cell(
      R"re(<td class="moe-cell" data-layer="(\d+)" data-expert="(\d+)" data-tokens="(\d+)" data-share="([^"]+)")re");
  for (auto it = std::sregex_iterator(dom.begin(), dom.end(), cell); it != std::sregex_iterator(); ++it, ++cells) {
    const int layer = std::stoi((*it)[1]), e = std::stoi((*it)[2]);
    if (!want.count(layer) || e >= static_cast<int>(want.at(layer).tokens.size())) {
      ADD_FAILURE() << "a cell of no expert: " << (*it)[0];
      continue;
    }
    EXPECT_EQ(std::stoll((*it)[3]), want.at(layer).tokens[e]) << (*it)[0];
    EXPECT_EQ(std::stod((*it)[4]), want.at(layer).share[e]) << (*it)[0];
  }
  const std::regex
      row(R"re(<tr class="moe-layer" data-layer="(\d+)" data-max-over-mean="([^"]+)" data-dropped="(\d+)")re");
  for (auto it = std::sregex_iterator(dom.begin(), dom.end(), row); it != std::sregex_iterator(); ++it, ++rows) {
    const Expected& e = want.at(std::stoi((*it)[1]));
    EXPECT_DOUBLE_EQ(std::stod((*it)[2]), e.max_over_mean) << (*it)[0];
    EXPECT_EQ(std::stoll((*it)[3]), e.dropped) << (*it)[0];
  }
  size_t experts = 0;
  for (const auto& [layer, e] : want) experts += e.tokens.size();
  EXPECT_EQ(cells, experts) << "a cell per layer and expert";
  EXPECT_EQ(rows, want.size()) << "a row per MoE layer";
  return step;
}

JobView one_rank() {
  JobView v;
  v.state = "running";
  v.world = 1;
  RankView r;
  r.running = true;
  r.status.rank = 0;
  r.status.heard = true;
  r.status.step = 7;
  v.ranks = {r};
  return v;
}

// Layer 1: 30, 10, 0, 20 (5 dropped); layer 3: an even 15 each.
const nlohmann::json kLayers = nlohmann::json::parse(R"([{"layer": 1, "tokens_per_expert": [30, 10, 0, 20],
  "dropped": 5}, {"layer": 3, "tokens_per_expert": [15, 15, 15, 15], "dropped": 0}])");

RankStatus status_with_load(int step) {
  RankStatus s;
  s.rank = 0;
  std::vector<obs::MoeLayerLoad> load;
  for (const auto& l : kLayers)
    load.push_back({l["layer"].get<int>(), l["dropped"].get<int64_t>(),
                    l["tokens_per_expert"].get<std::vector<int64_t>>()});
  for (const std::string& line : obs::moe_load_lines(0, step, load, PIPE_BUF))
    EXPECT_TRUE(s.apply(nlohmann::json::parse(line), 1.0)) << line;
  return s;
}

}  // namespace

TEST(DashboardMoe, ARanksStatusCarriesItsLoadFromTheAgentToTheDriver) {
  const RankStatus s = status_with_load(9);
  ASSERT_EQ(s.moe.step, 9);
  bool running = false;
  const RankStatus back = proto::status_from_json(proto::status_to_json(s, true, 2.0), 2.0, &running);
  EXPECT_EQ(back.moe.step, 9);
  expect_json_matches(obs::moe_load_json(back.moe, 0), expected_of(kLayers));
}

// The view without a launch: a published dense job has none, in the JSON and on the page; a MoE job's rank 0 with
// a load has one, whose numbers are worked out above from the counts sent.
TEST(DashboardMoe, ADenseJobHasNoViewAndAMoeJobACellPerLayerAndExpert) {
  const fs::path dir = fs::path(temp_root()) / "mt-dashboard-moe-view";
  fs::remove_all(dir);
  fs::create_directories(dir);
  Dashboard d("127.0.0.1:0");
  JobView v = one_rank();
  d.publish(v);
  EXPECT_TRUE(nlohmann::json::parse(d.api_job())["moe"].is_null());
  const std::string dense = rendered_dom(d.url(), dir);
  EXPECT_NE(dense.find("<div id=\"moe\"></div>"), std::string::npos) << dense;
  EXPECT_EQ(dense.find("<td class=\"moe-cell\""), std::string::npos) << dense;

  v.ranks[0].status.moe = status_with_load(7).moe;
  d.publish(v);
  const nlohmann::json moe = nlohmann::json::parse(d.api_job())["moe"];
  EXPECT_EQ(moe["step"], 7);
  EXPECT_EQ(moe["rank"], 0);
  expect_json_matches(moe, expected_of(kLayers));
  EXPECT_EQ(expect_page_matches(rendered_dom(d.url(), dir), [](int) { return expected_of(kLayers); }), 7);
  if (!HasFailure()) fs::remove_all(dir);
}

// A real MoE job under `megatrain launch --dashboard`: 2 layers of 4 experts, top 2, a capacity of 1.0 x the even
// share (so some assignments are dropped). What the dashboard serves for a step must be what rank 0 logged for it.
TEST(LaunchDashboardMoe, TheServedLoadIsTheOneTheRankLoggedForThatStep) {
  prepare_launch_data();
  const fs::path dir = case_dir("mt-dashboard-moe-");
  const std::string out = (dir / "run").string(), events = (dir / "events.jsonl").string();
  std::vector<std::string> args = {"launch",      "--nproc",     "1",  "--events", events,
                                   "--dashboard", "127.0.0.1:0", "--", "train"};
  for (const std::string& f : SmallJob(out)
                                  .model(2, 64, 2, 32)
                                  .steps(100000)
                                  .set("model.moe_experts", 4)
                                  .set("model.moe_top_k", 2)
                                  .set("model.moe_d_ff", 32)
                                  .set("model.moe_capacity_factor", "1.0")
                                  .set("ckpt.every", 0)
                                  .set("ckpt.save_final", "false")
                                  .args())
    args.push_back(f);
  pid_t launcher = start_logged(kMegatrain, args, (dir / "launch.log").string());
  struct Reaper {  // a failed assertion leaves no job behind
    pid_t& pid;
    ~Reaper() {
      if (pid > 0) ::kill(pid, SIGKILL), ::waitpid(pid, nullptr, 0);
    }
  } reaper{launcher};
  auto running = [&] { return ::waitpid(launcher, nullptr, WNOHANG) == 0; };

  std::string url;
  for (const double t0 = now_seconds(); url.empty(); std::this_thread::sleep_for(std::chrono::milliseconds(50))) {
    for (const auto& e : events_of(events))
      if (e.value("event", "") == "dashboard") url = e.value("url", "");
    ASSERT_TRUE(running()) << "launch ended:\n" << slurp(dir / "launch.log");
    ASSERT_LT(now_seconds() - t0, 60) << "no dashboard event";
  }
  std::smatch m;
  ASSERT_TRUE(std::regex_match(url, m, std::regex(R"(http://127\.0\.0\.1:(\d+)/)"))) << url;
  httplib::Client c("127.0.0.1", std::stoi(m[1]));
  nlohmann::json moe;
  for (const double t0 = now_seconds();; std::this_thread::sleep_for(std::chrono::milliseconds(100))) {
    ASSERT_TRUE(running()) << "launch ended:\n" << slurp(dir / "launch.log");
    ASSERT_LT(now_seconds() - t0, 300) << "no MoE load at step 3 or later: " << moe.dump();
    if (auto r = c.Get("/api/job")) moe = nlohmann::json::parse(r->body)["moe"];
    if (moe.is_object() && moe["step"].get<int>() >= 3) break;
  }

  // The oracle: metrics.jsonl's train line of the step (written before the step's heartbeat).
  const std::string metrics = out + "/metrics.jsonl";
  auto logged_at = [&](int step) {
    for (const auto& l : events_of(metrics))
      if (l.value("kind", "") == "train" && l["step"] == step) return expected_of(l["moe"]);
    ADD_FAILURE() << "no train line of step " << step << " in " << metrics;
    return std::map<int, Expected>{};
  };
  const std::map<int, Expected> want = logged_at(moe["step"].get<int>());
  EXPECT_EQ(want.size(), 2u) << "both layers are MoE";
  expect_json_matches(moe, want);
  int64_t dropped = 0;
  for (const auto& l : events_of(metrics))
    if (l.value("kind", "") == "train")
      for (const auto& layer : l["moe"]) dropped += layer["dropped"].get<int64_t>();
  EXPECT_GT(dropped, 0) << "the capacity should have dropped some assignments: the drops would go untested";

  EXPECT_GE(expect_page_matches(rendered_dom(url, dir), logged_at), moe["step"].get<int>());

  ::kill(launcher, SIGTERM);
  EXPECT_EQ(finish_within(launcher, 120), 128 + SIGTERM) << slurp(dir / "launch.log");
  launcher = -1;
  if (!HasFailure() && !std::getenv("MT_KEEP_TEST_DIRS")) fs::remove_all(dir);
}
