// A MoE model's routing load on its way to the dashboard (obs/moe_load.h): the heartbeat lines that carry a step's
// counts stay under their size limit however many experts a layer has, and put back together (in any order) give
// the very counts sent; the JSON's shares and imbalance against a hand-worked example; the supervisors' wire form.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "megatrain/obs/moe_load.h"

using namespace mt::obs;

namespace {

// Layer 1: 4 experts with small counts; layer 3: 1,000 experts with counts of up to 9 digits, which no single line
// of 512 bytes can hold.
std::vector<MoeLayerLoad> two_layers() {
  std::vector<MoeLayerLoad> l = {{1, 3, {6, 2, 0, 4}}, {3, 17, {}}};
  std::mt19937_64 rng(5);
  for (int e = 0; e < 1000; ++e) l[1].tokens.push_back(static_cast<int64_t>(rng() % 1000000000));
  return l;
}

void expect_same(const std::vector<MoeLayerLoad>& got, const std::vector<MoeLayerLoad>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].layer, want[i].layer);
    EXPECT_EQ(got[i].dropped, want[i].dropped);
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "layer " << want[i].layer;
  }
}

}  // namespace

TEST(MoeLoad, LinesStayUnderTheLimitAndReassembleInAnyOrderOnceAllArrived) {
  const auto sent = two_layers();
  auto lines = moe_load_lines(0, 12, sent, 512);
  EXPECT_GT(lines.size(), 2u) << "the 1,000-expert layer must be split";
  for (const std::string& l : lines) {
    EXPECT_LE(l.size(), 512u) << l;
    EXPECT_EQ(l.back(), '\n');
  }
  std::shuffle(lines.begin(), lines.end(), std::mt19937(3));
  MoeLoad load;
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(load.step, -1) << "complete before its last piece (" << i << " of " << lines.size() << ")";
    EXPECT_TRUE(load.apply(nlohmann::json::parse(lines[i])));
  }
  EXPECT_EQ(load.step, 12);
  expect_same(load.layers, sent);

  // A newer step's first pieces leave the complete one shown; an older step's are refused.
  auto next = two_layers();
  next[0].tokens = {1, 1, 1, 1};
  const auto newer = moe_load_lines(0, 13, next, 512);
  EXPECT_TRUE(load.apply(nlohmann::json::parse(newer[0])));
  EXPECT_EQ(load.step, 12);
  expect_same(load.layers, sent);
  EXPECT_FALSE(load.apply(nlohmann::json::parse(moe_load_lines(0, 11, sent, 512)[0])));
  for (size_t i = 1; i < newer.size(); ++i) load.apply(nlohmann::json::parse(newer[i]));
  EXPECT_EQ(load.step, 13);
  expect_same(load.layers, next);

  // Not a moe line, or a malformed one: refused, nothing changed.
  EXPECT_FALSE(load.apply({{"type", "hb"}, {"step", 20}}));
  EXPECT_FALSE(load.apply({{"type", "moe"}, {"step", "x"}}));
  EXPECT_FALSE(load.apply(nlohmann::json::parse(R"({"type":"moe","rank":0,"step":30,"layers":1,"layer":1,
      "experts":2,"first":1,"dropped":0,"tokens":[5,6]})")));  // past the layer's experts
  EXPECT_EQ(load.step, 13);
}

// Layer 1: tokens 6, 2, 0, 4 -> 12 routed, shares 1/2, 1/6, 0, 1/3; the mean 3, the busiest 6: max/mean 2.
// A layer to which nothing was routed has zero shares and no imbalance figure.
TEST(MoeLoad, JsonGivesEachExpertsShareAndTheBusiestOverTheMean) {
  MoeLoad load;
  load.step = 7;
  load.layers = {{1, 3, {6, 2, 0, 4}}, {2, 0, {0, 0}}};
  const nlohmann::json j = moe_load_json(load, 0);
  EXPECT_EQ(j["step"], 7);
  EXPECT_EQ(j["rank"], 0);
  ASSERT_EQ(j["layers"].size(), 2u);
  const auto& l = j["layers"][0];
  EXPECT_EQ(l["layer"], 1);
  EXPECT_EQ(l["routed"], 12);
  EXPECT_EQ(l["dropped"], 3);
  EXPECT_EQ(l["tokens_per_expert"], (std::vector<int64_t>{6, 2, 0, 4}));
  const auto share = l["share"].get<std::vector<double>>();
  ASSERT_EQ(share.size(), 4u);
  EXPECT_DOUBLE_EQ(share[0], 0.5);
  EXPECT_DOUBLE_EQ(share[1], 1.0 / 6);
  EXPECT_DOUBLE_EQ(share[2], 0.0);
  EXPECT_DOUBLE_EQ(share[3], 1.0 / 3);
  EXPECT_DOUBLE_EQ(l["max_over_mean"].get<double>(), 2.0);
  EXPECT_EQ(j["layers"][1]["share"], (std::vector<double>{0, 0}));
  EXPECT_TRUE(j["layers"][1]["max_over_mean"].is_null());
}

TEST(MoeLoad, TheWireFormRoundTrips) {
  MoeLoad load;
  load.step = 41;
  load.layers = two_layers();
  const MoeLoad back = moe_load_from_wire(nlohmann::json::parse(moe_load_to_wire(load).dump()));
  EXPECT_EQ(back.step, 41);
  expect_same(back.layers, load.layers);
}
