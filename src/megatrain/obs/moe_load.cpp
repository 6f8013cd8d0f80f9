#include "megatrain/obs/moe_load.h"

#include <algorithm>

#include "megatrain/core/error.h"

namespace mt::obs {

namespace {

nlohmann::ordered_json piece(int rank, int step, int n_layers, const MoeLayerLoad& l, size_t first,
                             nlohmann::ordered_json tokens) {
  return {{"type", "moe"},      {"rank", rank},         {"step", step},
          {"layers", n_layers}, {"layer", l.layer},     {"experts", l.tokens.size()},
          {"first", first},     {"dropped", l.dropped}, {"tokens", std::move(tokens)}};
}

}  // namespace

std::vector<std::string> moe_load_lines(int rank, int step, const std::vector<MoeLayerLoad>& layers, size_t max_line) {
  std::vector<std::string> lines;
  const int n = static_cast<int>(layers.size());
  for (const MoeLayerLoad& l : layers) {
    // The line without tokens, its "first" as long as it can get: each token adds its digits and a comma.
    const size_t base = piece(rank, step, n, l, l.tokens.size(), nlohmann::ordered_json::array()).dump().size() + 1;
    MT_CHECK(base + 21 <= max_line, "a moe heartbeat line cannot hold one count in {} bytes", max_line);
    size_t first = 0;
    do {
      nlohmann::ordered_json tokens = nlohmann::ordered_json::array();
      size_t size = base, e = first;
      for (; e < l.tokens.size(); ++e) {
        const size_t add = std::to_string(l.tokens[e]).size() + (e > first ? 1 : 0);
        if (size + add > max_line) break;
        size += add;
        tokens.push_back(l.tokens[e]);
      }
      lines.push_back(piece(rank, step, n, l, first, std::move(tokens)).dump() + "\n");
      first = e;
    } while (first < l.tokens.size());
  }
  return lines;
}

bool MoeLoad::apply(const nlohmann::json& j) {
  if (!j.is_object() || j.value("type", "") != "moe") return false;
  try {
    const int step = j.at("step").get<int>(), n_layers = j.at("layers").get<int>(), layer = j.at("layer").get<int>();
    const size_t experts = j.at("experts").get<size_t>(), first = j.at("first").get<size_t>();
    const auto tokens = j.at("tokens").get<std::vector<int64_t>>();
    if (n_layers <= 0 || n_layers > 4096 || experts > (1u << 20) || first + tokens.size() > experts) return false;
    if (step < pending_step_ || step <= this->step) return false;
    if (step > pending_step_) {
      pending_step_ = step;
      pending_layers_ = n_layers;
      pending_.clear();
      filled_.clear();
    }
    auto it = std::find_if(pending_.begin(), pending_.end(), [&](const MoeLayerLoad& l) { return l.layer == layer; });
    if (it == pending_.end()) {
      if (static_cast<int>(pending_.size()) >= pending_layers_) return false;
      pending_.push_back({layer, 0, std::vector<int64_t>(experts, 0)});
      filled_.push_back(0);
      it = pending_.end() - 1;
    }
    if (it->tokens.size() != experts) return false;
    it->dropped = j.at("dropped").get<int64_t>();
    std::copy(tokens.begin(), tokens.end(), it->tokens.begin() + static_cast<long>(first));
    size_t& filled = filled_[static_cast<size_t>(it - pending_.begin())];
    filled += tokens.size();
    bool complete = static_cast<int>(pending_.size()) == pending_layers_;
    for (size_t i = 0; i < pending_.size(); ++i) complete = complete && filled_[i] >= pending_[i].tokens.size();
    if (complete) {
      this->step = pending_step_;
      layers = pending_;
      std::sort(layers.begin(), layers.end(), [](const auto& a, const auto& b) { return a.layer < b.layer; });
    }
  } catch (const nlohmann::json::exception&) {
    return false;  // a field of the wrong type: a rank must not be able to crash its supervisor
  }
  return true;
}

nlohmann::json moe_load_json(const MoeLoad& load, int rank) {
  nlohmann::json layers = nlohmann::json::array();
  for (const MoeLayerLoad& l : load.layers) {
    int64_t routed = 0, most = 0;
    for (int64_t t : l.tokens) routed += t, most = std::max(most, t);
    nlohmann::json share = nlohmann::json::array();
    for (int64_t t : l.tokens) share.push_back(routed > 0 ? static_cast<double>(t) / routed : 0.0);
    const double mean = l.tokens.empty() ? 0.0 : static_cast<double>(routed) / l.tokens.size();
    layers.push_back({{"layer", l.layer},
                      {"tokens_per_expert", l.tokens},
                      {"dropped", l.dropped},
                      {"routed", routed},
                      {"share", std::move(share)},
                      {"max_over_mean", mean > 0 ? nlohmann::json(most / mean) : nlohmann::json()}});
  }
  return {{"rank", rank}, {"step", load.step}, {"layers", std::move(layers)}};
}

nlohmann::json moe_load_to_wire(const MoeLoad& load) {
  nlohmann::json layers = nlohmann::json::array();
  for (const MoeLayerLoad& l : load.layers) layers.push_back({l.layer, l.dropped, l.tokens});
  return {{"step", load.step}, {"layers", std::move(layers)}};
}

MoeLoad moe_load_from_wire(const nlohmann::json& j) {
  MoeLoad m;
  m.step = j.at("step").get<int>();
  for (const auto& l : j.at("layers"))
    m.layers.push_back({l.at(0).get<int>(), l.at(1).get<int64_t>(), l.at(2).get<std::vector<int64_t>>()});
  return m;
}

}  // namespace mt::obs
