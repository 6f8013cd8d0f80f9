#include "megatrain/obs/heat_map.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include <fmt/format.h>


namespace mt::obs {

namespace {

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

bool placed(const HeatPlace& p) { return p.dp >= 0 && p.pp >= 0 && p.tp >= 0; }

// Row order: placed ranks by (dp, pp, tp), then the others by rank.
bool row_before(const HeatRow& a, const HeatRow& b) {
  const HeatPlace &x = a.place, &y = b.place;
  if (placed(x) != placed(y)) return placed(x);
  if (placed(x) && std::tie(x.dp, x.pp, x.tp) != std::tie(y.dp, y.pp, y.tp))
    return std::tie(x.dp, x.pp, x.tp) < std::tie(y.dp, y.pp, y.tp);
  return x.rank < y.rank;
}

std::vector<HeatNode> node_rows(const std::vector<HeatRow>& rows, size_t columns) {
  std::map<int, HeatNode> by_node;
  for (const HeatRow& r : rows) {
    HeatNode& n = by_node[r.place.node];
    n.node = r.place.node;
    n.ranks.push_back(r.place.rank);
    n.rel.resize(columns);
    for (size_t c = 0; c < columns; ++c)
      if (r.rel[c] && (!n.rel[c] || *r.rel[c] > *n.rel[c])) n.rel[c] = r.rel[c];
    if (r.samples > 0 && (n.hottest_rank < 0 || r.mean > n.mean)) n.mean = r.mean, n.hottest_rank = r.place.rank;
  }
  std::vector<HeatNode> out;
  for (auto& [node, n] : by_node) out.push_back(std::move(n));
  return out;
}

nlohmann::json rounded(const std::optional<double>& x) {
  return x ? nlohmann::json(std::round(*x * 1e4) / 1e4) : nlohmann::json();
}

nlohmann::json coord_json(const HeatPlace& p) {
  return placed(p) ? nlohmann::json({p.dp, p.pp, p.tp}) : nlohmann::json();
}

std::string row_label(const HeatPlace& p) {
  return placed(p) ? fmt::format("rank {} (dp {}, pp {}, tp {})", p.rank, p.dp, p.pp, p.tp)
                   : fmt::format("rank {}", p.rank);
}

// Text for an SVG element: the markup characters escaped.
std::string xml_text(const std::string& t) {
  std::string out;
  for (char c : t) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}

}  // namespace

HeatMap heat_map(const std::vector<HeatPlace>& places, const std::vector<HeatSample>& samples, size_t max_steps) {
  HeatMap h;
  std::map<int, size_t> row_of;
  for (const HeatPlace& p : places) {
    if (row_of.count(p.rank)) continue;
    row_of[p.rank] = 0;
    h.rows.push_back({p, {}, 0, 0});
  }
  std::sort(h.rows.begin(), h.rows.end(), row_before);
  for (size_t i = 0; i < h.rows.size(); ++i) row_of[h.rows[i].place.rank] = i;

  std::map<int, std::map<int, double>> by_step;  // step -> rank -> compute (the last sample given wins)
  for (const HeatSample& s : samples)
    if (row_of.count(s.rank)) by_step[s.step][s.rank] = s.compute_s;
  while (by_step.size() > max_steps) by_step.erase(by_step.begin());

  for (HeatRow& r : h.rows) r.rel.resize(by_step.size());
  size_t col = 0;
  for (const auto& [step, computes] : by_step) {
    std::vector<double> v;
    for (const auto& [rank, c] : computes) v.push_back(c);
    const double median = median_of(v);
    h.steps.push_back(step);
    h.median_s.push_back(median);
    if (median > 0)
      for (const auto& [rank, c] : computes) h.rows[row_of[rank]].rel[col] = c / median;
    ++col;
  }
  for (HeatRow& r : h.rows) {
    double sum = 0;
    for (const auto& x : r.rel)
      if (x) sum += *x, ++r.samples;
    r.mean = r.samples ? sum / r.samples : 0;
  }
  h.nodes = node_rows(h.rows, h.steps.size());
  for (size_t i = 0; i < h.rows.size(); ++i)
    if (h.rows[i].samples > 0) h.slowest.push_back(i);
  std::stable_sort(h.slowest.begin(), h.slowest.end(), [&](size_t a, size_t b) {
    return h.rows[a].mean != h.rows[b].mean ? h.rows[a].mean > h.rows[b].mean
                                            : h.rows[a].place.rank < h.rows[b].place.rank;
  });
  if (h.slowest.size() > HeatMap::kSlowest) h.slowest.resize(HeatMap::kSlowest);
  return h;
}

nlohmann::json heat_map_json(const HeatMap& h) {
  auto rel_json = [](const std::vector<std::optional<double>>& rel) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& x : rel) a.push_back(rounded(x));
    return a;
  };
  nlohmann::json rows = nlohmann::json::array(), nodes = nlohmann::json::array(), slowest = nlohmann::json::array();
  for (const HeatRow& r : h.rows)
    rows.push_back({{"rank", r.place.rank},
                    {"node", r.place.node},
                    {"coord", coord_json(r.place)},
                    {"rel", rel_json(r.rel)},
                    {"mean", rounded(r.mean)},
                    {"samples", r.samples}});
  for (const HeatNode& n : h.nodes)
    nodes.push_back({{"node", n.node},
                     {"ranks", n.ranks},
                     {"rel", rel_json(n.rel)},
                     {"mean", rounded(n.mean)},
                     {"hottest_rank", n.hottest_rank >= 0 ? nlohmann::json(n.hottest_rank) : nlohmann::json()}});
  for (size_t i : h.slowest) {
    const HeatRow& r = h.rows[i];
    slowest.push_back({{"rank", r.place.rank},
                       {"node", r.place.node},
                       {"coord", coord_json(r.place)},
                       {"mean", rounded(r.mean)}});
  }
  return {{"steps", h.steps}, {"median_s", h.median_s}, {"rows", rows}, {"nodes", nodes}, {"slowest", slowest}};
}

std::string heat_colour(double rel) {
  // White at the median; towards blue (33, 102, 172) at half of it, towards red (178, 24, 43) at twice it.
  const bool hot = rel >= 1;
  const double t = std::clamp(hot ? rel - 1 : (1 - rel) * 2, 0.0, 1.0);
  const int to[3] = {hot ? 178 : 33, hot ? 24 : 102, hot ? 43 : 172};
  int c[3];
  for (int i = 0; i < 3; ++i) c[i] = static_cast<int>(std::lround(247 + (to[i] - 247) * t));
  return fmt::format("#{:02x}{:02x}{:02x}", c[0], c[1], c[2]);
}

std::string heat_map_svg(const HeatMap& h, const std::string& title) {
  const size_t rows = h.rows.size(), cols = h.steps.size();
  // Rows shrink to fit about 700 px, down to 2 px (1,024 ranks: a 2 km picture would not be read); labels only where
  // they fit, the slowest are named beside the map whatever the size.
  const double row_h = std::clamp(700.0 / std::max<size_t>(rows, 1), 2.0, 16.0);
  const double col_w = std::clamp(600.0 / std::max<size_t>(cols, 1), 4.0, 24.0);
  const bool labels = row_h >= 9;
  const double left = 190, top = 44;
  const double map_w = col_w * static_cast<double>(cols), map_h = row_h * static_cast<double>(rows);
  const double width = std::max(left + map_w + 340, 780.0),
               height = std::max(top + map_h + 40, top + 30.0 * (h.slowest.size() + 3));
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" font-family=\"sans-serif\" "
      "font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n"
      "<text x=\"8\" y=\"18\" font-size=\"14\">{}</text>\n"
      "<text x=\"8\" y=\"34\">compute time relative to the median over the ranks at the same step (white: the median, "
      "red: twice it or more, blue: half)</text>\n",
      width, height, xml_text(title));
  if (cols > 0)
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">step {}</text><text x=\"{:.1f}\" y=\"{:.1f}\" "
                     "text-anchor=\"end\">step {}</text>\n",
                     left, top + map_h + 14, h.steps.front(), left + map_w, top + map_h + 14, h.steps.back());
  const size_t hottest = h.slowest.empty() ? rows : h.slowest.front();
  for (size_t i = 0; i < rows; ++i) {
    const HeatRow& r = h.rows[i];
    const double y = top + row_h * static_cast<double>(i);
    s += fmt::format("<g class=\"heat-row\" data-rank=\"{}\" data-node=\"{}\" data-mean=\"{:.4f}\"{}>", r.place.rank,
                     r.place.node, r.mean, i == hottest ? " data-hottest=\"true\"" : "");
    if (labels) s += fmt::format("<text x=\"4\" y=\"{:.1f}\">{}</text>", y + row_h - 3, row_label(r.place));
    for (size_t c = 0; c < cols; ++c) {
      if (!r.rel[c]) continue;
      s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\"><title>{}, "
                       "step {}: {:.2f} x median</title></rect>",
                       left + col_w * static_cast<double>(c), y, col_w, row_h, heat_colour(*r.rel[c]),
                       row_label(r.place), h.steps[c], *r.rel[c]);
    }
    s += "</g>\n";
  }
  s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" stroke=\"#999\"/>\n", left,
                   top, map_w, map_h);
  const double sx = left + map_w + 16;
  s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-weight=\"bold\">slowest ranks (mean x median)</text>\n", sx,
                   top + 10);
  for (size_t k = 0; k < h.slowest.size(); ++k) {
    const HeatRow& r = h.rows[h.slowest[k]];
    s += fmt::format("<text class=\"slowest\" data-rank=\"{}\" x=\"{:.1f}\" y=\"{:.1f}\">{}. {}, node {}: {:.2f}x"
                     "</text>\n",
                     r.place.rank, sx, top + 28 + 18.0 * static_cast<double>(k), k + 1, row_label(r.place),
                     r.place.node, r.mean);
  }
  s += "</svg>\n";
  return s;
}

}  // namespace mt::obs
