// ModelConfig <-> JSON, for checkpoint manifests ("extra": {"model": ...}) and tools.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "megatrain/model/config.h"

namespace mt {

// Every field, under its ModelConfig name.
nlohmann::json model_config_to_json(const ModelConfig& cfg);
// A float as the shortest decimal that reads back as the same float (1e-05, not 9.999999747378752e-06): how every
// JSON file megatrain writes (manifests, HF config.json) spells a float setting.
double shortest_decimal(float x);
// Fields absent from j keep their defaults; unknown keys and wrongly typed values are errors naming the key.
// The result is validated.
ModelConfig model_config_from_json(const nlohmann::json& j);
// The model config a checkpoint's manifest records (extra.model), read and validated as above; every error names
// the checkpoint's manifest (dir/manifest.json) and the key. Throws when extra records none.
ModelConfig model_config_from_manifest(const nlohmann::json& extra, const std::string& dir);

}  // namespace mt
