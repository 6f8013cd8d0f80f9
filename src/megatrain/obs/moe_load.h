// A mixture-of-experts model's routing load as the dashboard shows it: per MoE layer, the assignments routed to
// each expert (before any capacity drop) and those dropped, at the newest step (docs/moe.md's metrics.jsonl `moe`
// field, the same numbers). The main rank sends them to its supervisor as heartbeat lines of their own
// (train/heartbeat.h), split so that each line stays under PIPE_BUF whatever the number of layers and experts:
//   {"type":"moe","rank":R,"step":S,"layers":M,"layer":L,"experts":E,"first":F,"dropped":D,"tokens":[...]}
// carries tokens[F, F + n) of layer L (M: the number of MoE layers, E: its experts; D on every piece of the layer).
// The supervisor puts the pieces together (MoeLoad::apply) and shows a step once all of its pieces arrived.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mt::obs {

struct MoeLayerLoad {
  int layer = -1;
  int64_t dropped = 0;
  std::vector<int64_t> tokens;  // [E]: assignments routed to each expert
};

// The heartbeat lines (each with its "\n") that carry one step's load; each at most max_line bytes with its newline.
std::vector<std::string> moe_load_lines(int rank, int step, const std::vector<MoeLayerLoad>& layers, size_t max_line);

struct MoeLoad {
  int step = -1;                     // of `layers` (-1: none complete yet)
  std::vector<MoeLayerLoad> layers;  // the newest complete step's, by layer

  // Takes one "moe" line; false (and no change) for a line that is not one or is malformed. A piece of a newer step
  // starts that step afresh; pieces of older steps are ignored.
  bool apply(const nlohmann::json& line);

 private:
  int pending_step_ = -1, pending_layers_ = 0;
  std::vector<MoeLayerLoad> pending_;
  std::vector<size_t> filled_;  // per pending layer: tokens received
};

// {"rank": R, "step": S, "layers": [{"layer", "tokens_per_expert", "dropped", "routed" (their sum), "share" (each
// expert's tokens over routed; 0s when none were routed), "max_over_mean" (the busiest expert's tokens over the
// mean: 1 is perfectly even, E the worst; null when none were routed)}]}.
nlohmann::json moe_load_json(const MoeLoad& load, int rank);

// The compact form a status travels in between supervisors ([[layer, dropped, [tokens]], ...] and the step), and
// back.
nlohmann::json moe_load_to_wire(const MoeLoad& load);
MoeLoad moe_load_from_wire(const nlohmann::json& j);

}  // namespace mt::obs
