// The heat map of slow ranks (obs/heat_map.h) against answers worked out by hand: a set of compute times of four
// ranks on two nodes, whose relative values, row order by (dp, pp, tp), node rows and slowest ranks are computed
// below the data; and its SVG picture, whose hottest row must be the slowest rank's.
#include <gtest/gtest.h>

#include <regex>

#include "megatrain/obs/heat_map.h"

using namespace mt::obs;

namespace {

// Ranks 0 and 1 on node 0, 2 and 3 on node 1; placed so that (dp, pp, tp) order is 0, 3, 1, 2.
std::vector<HeatPlace> four_places() { return {{0, 0, 0, 0, 0}, {1, 0, 0, 1, 0}, {2, 1, 1, 0, 0}, {3, 1, 0, 0, 1}}; }

// step 4: all 1 s (older than the 3 newest steps: left out)
// step 5: 1, 2, 1, 1  -> median 1   -> 1, 2, 1, 1
// step 6: 2, 6, 2, 4  -> median 3   -> 2/3, 2, 2/3, 4/3
// step 7: 1, 3, -, 1  -> median 1   -> 1, 3, -, 1
// means: rank 0 8/9, rank 1 7/3, rank 2 5/6, rank 3 10/9.
std::vector<HeatSample> four_samples() {
  std::vector<HeatSample> s;
  for (int r = 0; r < 4; ++r) s.push_back({r, 4, 1.0});
  const double c5[] = {1, 2, 1, 1}, c6[] = {2, 6, 2, 4};
  for (int r = 0; r < 4; ++r) s.push_back({r, 5, c5[r]}), s.push_back({r, 6, c6[r]});
  s.push_back({0, 7, 1}), s.push_back({1, 7, 3}), s.push_back({3, 7, 1});
  return s;
}

std::vector<int> row_ranks(const HeatMap& h) {
  std::vector<int> out;
  for (const HeatRow& r : h.rows) out.push_back(r.place.rank);
  return out;
}

const HeatRow& row_of(const HeatMap& h, int rank) {
  for (const HeatRow& r : h.rows)
    if (r.place.rank == rank) return r;
  throw std::runtime_error("no row");
}

TEST(HeatMap, EachCellIsTheComputeTimeOverTheMedianOfTheSameStep) {
  const HeatMap h = heat_map(four_places(), four_samples(), 3);
  EXPECT_EQ(h.steps, (std::vector<int>{5, 6, 7}));
  EXPECT_EQ(h.median_s, (std::vector<double>{1, 3, 1}));
  EXPECT_EQ(row_ranks(h), (std::vector<int>{0, 3, 1, 2})) << "rows by (dp, pp, tp)";
  const double want[4][3] = {{1, 2.0 / 3, 1}, {2, 2, 3}, {1, 2.0 / 3, -1}, {1, 4.0 / 3, 1}};
  const double mean[4] = {8.0 / 9, 7.0 / 3, 5.0 / 6, 10.0 / 9};
  for (int r = 0; r < 4; ++r) {
    const HeatRow& row = row_of(h, r);
    ASSERT_EQ(row.rel.size(), 3u);
    for (int c = 0; c < 3; ++c) {
      if (want[r][c] < 0) {
        EXPECT_FALSE(row.rel[c].has_value()) << "rank " << r << " reported no step 7";
        continue;
      }
      ASSERT_TRUE(row.rel[c].has_value()) << "rank " << r << " column " << c;
      EXPECT_NEAR(*row.rel[c], want[r][c], 1e-12) << "rank " << r << " column " << c;
    }
    EXPECT_NEAR(row.mean, mean[r], 1e-12) << "rank " << r;
    EXPECT_EQ(row.samples, r == 2 ? 2 : 3);
  }
}

TEST(HeatMap, TheSlowRankIsTheHottestRowAndTheSlowestAreNamedHottestFirst) {
  const HeatMap h = heat_map(four_places(), four_samples(), 3);
  std::vector<int> slowest;
  for (size_t i : h.slowest) slowest.push_back(h.rows[i].place.rank);
  EXPECT_EQ(slowest, (std::vector<int>{1, 3, 0, 2}));
}

TEST(HeatMap, ANodeRowTakesItsHottestRankAtEachStep) {
  const HeatMap h = heat_map(four_places(), four_samples(), 3);
  ASSERT_EQ(h.nodes.size(), 2u);
  EXPECT_EQ(h.nodes[0].node, 0);
  EXPECT_EQ(h.nodes[0].ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(h.nodes[0].hottest_rank, 1);
  EXPECT_NEAR(h.nodes[0].mean, 7.0 / 3, 1e-12);
  const double n0[] = {2, 2, 3}, n1[] = {1, 4.0 / 3, 1};
  EXPECT_EQ(h.nodes[1].ranks, (std::vector<int>{3, 2})) << "in row order";
  EXPECT_EQ(h.nodes[1].hottest_rank, 3);
  EXPECT_NEAR(h.nodes[1].mean, 10.0 / 9, 1e-12);
  for (int c = 0; c < 3; ++c) {
    EXPECT_NEAR(h.nodes[0].rel[c].value(), n0[c], 1e-12) << c;
    EXPECT_NEAR(h.nodes[1].rel[c].value(), n1[c], 1e-12) << c;
  }
}

TEST(HeatMap, UnplacedRanksFollowAndOddSamplesAreHandledAsDocumented) {
  // Rank 5 has no coordinates yet; rank 9 is not placed at all (its samples are left out); rank 0's step 1 is given
  // twice (the last counts); step 2's median is 0 (no relative value); rank 7 has no samples (never among the
  // slowest). Step 1: 3 (not 1), 1 -> median 2 -> 1.5, 0.5.
  const std::vector<HeatPlace> places = {{5, 0}, {0, 0, 0, 0, 0}, {7, 0, 0, 0, 1}};
  const std::vector<HeatSample> samples = {{0, 1, 1}, {5, 1, 1}, {0, 1, 3}, {9, 1, 100}, {0, 2, 0}, {5, 2, 0}};
  const HeatMap h = heat_map(places, samples, 10);
  EXPECT_EQ(row_ranks(h), (std::vector<int>{0, 7, 5}));
  EXPECT_EQ(h.steps, (std::vector<int>{1, 2}));
  EXPECT_NEAR(row_of(h, 0).rel[0].value(), 1.5, 1e-12);
  EXPECT_NEAR(row_of(h, 5).rel[0].value(), 0.5, 1e-12);
  EXPECT_FALSE(row_of(h, 0).rel[1].has_value());
  ASSERT_EQ(h.slowest.size(), 2u);
  EXPECT_EQ(h.rows[h.slowest[0]].place.rank, 0);
  EXPECT_EQ(h.rows[h.slowest[1]].place.rank, 5);
  const nlohmann::json j = heat_map_json(h);
  EXPECT_TRUE(j["rows"][2]["coord"].is_null());
  EXPECT_EQ(j["rows"][0]["coord"], nlohmann::json({0, 0, 0}));
  EXPECT_TRUE(j["rows"][0]["rel"][1].is_null());
  EXPECT_EQ(j["slowest"][0]["rank"], 0);
}

TEST(HeatMap, JsonRoundsTheRelativeValuesToFourDecimals) {
  const nlohmann::json j = heat_map_json(heat_map(four_places(), four_samples(), 3));
  EXPECT_EQ(j["steps"], nlohmann::json({5, 6, 7}));
  EXPECT_EQ(j["rows"][0]["rank"], 0);
  EXPECT_EQ(j["rows"][0]["rel"][1].get<double>(), 0.6667);
  EXPECT_EQ(j["rows"][2]["mean"].get<double>(), 2.3333);
  EXPECT_EQ(j["nodes"][1]["hottest_rank"], 3);
  EXPECT_EQ(j["slowest"][0]["rank"], 1);
}

TEST(HeatMap, ColoursAreWhiteAtTheMedianRedAtTwiceItAndBlueAtHalf) {
  EXPECT_EQ(heat_colour(1), "#f7f7f7");
  EXPECT_EQ(heat_colour(2), "#b2182b");
  EXPECT_EQ(heat_colour(7), "#b2182b");
  EXPECT_EQ(heat_colour(0.5), "#2166ac");
  EXPECT_EQ(heat_colour(1.5), "#d58891");  // halfway: 247 + (178 - 247) / 2 = 212.5 -> 213 (d5), 135.5 -> 136, 145
}

TEST(HeatMap, TheSvgMarksTheSlowestRanksRowAsTheHottestAndNamesIt) {
  const std::string svg = heat_map_svg(heat_map(four_places(), four_samples(), 3), "test <map>");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("test &lt;map&gt;"), std::string::npos);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(svg, m,
                                std::regex(R"re(<g class="heat-row" data-rank="(\d+)"[^>]*data-hottest="true")re")));
  EXPECT_EQ(m[1], "1");
  ASSERT_TRUE(std::regex_search(svg, m, std::regex(R"re(<text class="slowest" data-rank="(\d+)")re")));
  EXPECT_EQ(m[1], "1") << "the first named is the slowest";
  const std::regex row(R"re(<g class="heat-row" data-rank="(\d+)")re");
  std::vector<int> order;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), row); it != std::sregex_iterator(); ++it)
    order.push_back(std::stoi((*it)[1]));
  EXPECT_EQ(order, (std::vector<int>{0, 3, 1, 2}));
}

}  // namespace
