// How predictions are shown: a table for people and JSON for programs (`megatrain simulate [--json]`).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "megatrain/perf/presets.h"
#include "megatrain/perf/scale_costs.h"
#include "megatrain/perf/search.h"
#include "megatrain/perf/step_model.h"

namespace mt::perf {

nlohmann::json to_json(const Job& j);
// step_seconds, mfu, tokens_per_second, breakdown{compute,tp,pp,dp,bubble,optimizer,straggler}, memory_bytes{...}
nlohmann::json to_json(const Prediction& p);
std::string format_prediction(const Job& j, const Prediction& p, const Cluster& c);

// A preset's rows with predictions: JSON rows carry gpus, batch, system (or step), mfu_predicted, mfu_paper,
// step_seconds_predicted, step_seconds_paper, the error, and the breakdown.
nlohmann::json table2_json(const std::vector<PresetRow>& rows, const std::vector<Prediction>& preds);
std::string format_table2(const std::vector<PresetRow>& rows, const std::vector<Prediction>& preds);
nlohmann::json table3_json(const std::vector<PresetRow>& rows, const std::vector<Prediction>& preds);
std::string format_table3(const std::vector<PresetRow>& rows, const std::vector<Prediction>& preds);

nlohmann::json to_json(const SearchResult& r, int top);
std::string format_search(const SearchResult& r, const Cluster& c, int top);

// The scale costs, each figure with its basis (figure_bases: a prediction, or from the paper's own figures, and the
// origin of its constants): JSON under "basis", text as an indented line under each figure.
nlohmann::json to_json(const GroupInitCost& g, const CheckpointCost& k, const Availability& a, const Cluster& c);
std::string format_scale(const GroupInitCost& g, const CheckpointCost& k, const Availability& a, const Layout& L,
                         const Cluster& c);

std::string format_constants(const Cluster& c);

}  // namespace mt::perf
