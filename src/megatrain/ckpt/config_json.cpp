#include "megatrain/ckpt/config_json.h"

#include <fmt/format.h>

#include <functional>
#include <map>
#include <string>

#include "megatrain/core/error.h"

namespace mt {

using nlohmann::json;

double shortest_decimal(float x) { return std::stod(fmt::format("{}", x)); }

json model_config_to_json(const ModelConfig& c) {
  json recompute = json::array();
  for (bool b : c.recompute) recompute.push_back(b);
  json j = {{"vocab_size", c.vocab_size},
            {"vocab_pad_to", c.vocab_pad_to},
            {"n_layer", c.n_layer},
            {"n_head", c.n_head},
            {"n_kv_head", c.n_kv_head},
            {"d_model", c.d_model},
            {"d_ff", c.d_ff},
            {"max_seq_len", c.max_seq_len},
            {"norm", kind_name(c.norm)},
            {"mlp", kind_name(c.mlp)},
            {"pos", kind_name(c.pos)},
            {"rope_theta", shortest_decimal(c.rope_theta)},
            {"rope_scaling", shortest_decimal(c.rope_scaling)},
            {"rope_low_freq_factor", shortest_decimal(c.rope_low_freq_factor)},
            {"rope_high_freq_factor", shortest_decimal(c.rope_high_freq_factor)},
            {"rope_original_max_len", c.rope_original_max_len},
            {"block", kind_name(c.block)},
            {"window", c.window},
            {"tied_embeddings", c.tied_embeddings},
            {"bias", c.bias},
            {"norm_eps", shortest_decimal(c.norm_eps)},
            {"init_std", shortest_decimal(c.init_std)},
            {"recompute", recompute},
            {"recompute_act", c.recompute_act},
            {"recompute_norm", c.recompute_norm}};
  // The MoE keys only for a MoE model: a dense model's manifest stays as it was.
  if (c.moe()) {
    j["moe_experts"] = c.moe_experts;
    j["moe_top_k"] = c.moe_top_k;
    j["moe_d_ff"] = c.moe_d_ff;
    j["moe_shared_experts"] = c.moe_shared_experts;
    j["moe_every"] = c.moe_every;
    j["moe_first_dense"] = c.moe_first_dense;
    j["moe_router"] = kind_name(c.moe_router);
    j["moe_bias_rate"] = shortest_decimal(c.moe_bias_rate);
    j["moe_aux_loss"] = shortest_decimal(c.moe_aux_loss);
    j["moe_z_loss"] = shortest_decimal(c.moe_z_loss);
    j["moe_capacity_factor"] = shortest_decimal(c.moe_capacity_factor);
  }
  return j;
}

ModelConfig model_config_from_json(const json& j) {
  MT_CHECK(j.is_object(), "model config must be a JSON object (got {})", j.type_name());
  ModelConfig c;
  using Setter = std::function<void(const json&)>;
  auto integer = [](const char* key, int& dst) -> Setter {
    return [key, &dst](const json& v) {
      MT_CHECK(v.is_number_integer() && v.get<int64_t>() == static_cast<int>(v.get<int64_t>()),
               "model config key '{}' must be an integer (got {})", key, v.dump());
      dst = v.get<int>();
    };
  };
  auto number = [](const char* key, float& dst) -> Setter {
    return [key, &dst](const json& v) {
      MT_CHECK(v.is_number(), "model config key '{}' must be a number (got {})", key, v.dump());
      dst = v.get<float>();
    };
  };
  // A kind (norm, mlp, pos, block): a string spelling, parsed and checked by parse_kind (model/config.h).
  auto kind = [](const char* key, auto& dst) -> Setter {
    return [key, &dst](const json& v) {
      MT_CHECK(v.is_string(), "model config key '{}' must be a string (got {})", key, v.dump());
      parse_kind(fmt::format("model.{}", key), v.get<std::string>(), dst);
    };
  };
  auto boolean = [](const char* key, bool& dst) -> Setter {
    return [key, &dst](const json& v) {
      MT_CHECK(v.is_boolean(), "model config key '{}' must be true or false (got {})", key, v.dump());
      dst = v.get<bool>();
    };
  };
  const std::map<std::string, Setter> setters = {
      {"vocab_size", integer("vocab_size", c.vocab_size)},
      {"vocab_pad_to", integer("vocab_pad_to", c.vocab_pad_to)},
      {"n_layer", integer("n_layer", c.n_layer)},
      {"n_head", integer("n_head", c.n_head)},
      {"n_kv_head", integer("n_kv_head", c.n_kv_head)},
      {"d_model", integer("d_model", c.d_model)},
      {"d_ff", integer("d_ff", c.d_ff)},
      {"max_seq_len", integer("max_seq_len", c.max_seq_len)},
      {"norm", kind("norm", c.norm)},
      {"mlp", kind("mlp", c.mlp)},
      {"pos", kind("pos", c.pos)},
      {"rope_theta", number("rope_theta", c.rope_theta)},
      {"rope_scaling", number("rope_scaling", c.rope_scaling)},
      {"rope_low_freq_factor", number("rope_low_freq_factor", c.rope_low_freq_factor)},
      {"rope_high_freq_factor", number("rope_high_freq_factor", c.rope_high_freq_factor)},
      {"rope_original_max_len", integer("rope_original_max_len", c.rope_original_max_len)},
      {"block", kind("block", c.block)},
      {"window", integer("window", c.window)},
      {"tied_embeddings", boolean("tied_embeddings", c.tied_embeddings)},
      {"bias", boolean("bias", c.bias)},
      {"norm_eps", number("norm_eps", c.norm_eps)},
      {"init_std", number("init_std", c.init_std)},
      {"recompute_act", boolean("recompute_act", c.recompute_act)},
      {"recompute_norm", boolean("recompute_norm", c.recompute_norm)},
      {"moe_experts", integer("moe_experts", c.moe_experts)},
      {"moe_top_k", integer("moe_top_k", c.moe_top_k)},
      {"moe_d_ff", integer("moe_d_ff", c.moe_d_ff)},
      {"moe_shared_experts", integer("moe_shared_experts", c.moe_shared_experts)},
      {"moe_every", integer("moe_every", c.moe_every)},
      {"moe_first_dense", integer("moe_first_dense", c.moe_first_dense)},
      {"moe_router", kind("moe_router", c.moe_router)},
      {"moe_bias_rate", number("moe_bias_rate", c.moe_bias_rate)},
      {"moe_aux_loss", number("moe_aux_loss", c.moe_aux_loss)},
      {"moe_z_loss", number("moe_z_loss", c.moe_z_loss)},
      {"moe_capacity_factor", number("moe_capacity_factor", c.moe_capacity_factor)},
      {"recompute",
       [&c](const json& v) {
         MT_CHECK(v.is_array(), "model config key 'recompute' must be a list of booleans (got {})", v.dump());
         c.recompute.clear();
         for (auto& b : v) {
           MT_CHECK(b.is_boolean(), "model config key 'recompute' must be a list of booleans (got {})", v.dump());
           c.recompute.push_back(b.get<bool>());
         }
       }},
  };
  for (auto& [key, v] : j.items()) {
    auto it = setters.find(key);
    MT_CHECK(it != setters.end(), "unknown model config key '{}'", key);
    it->second(v);
  }
  c.validate();
  return c;
}

ModelConfig model_config_from_manifest(const json& extra, const std::string& dir) {
  MT_CHECK(extra.is_object() && extra.contains("model"),
           "checkpoint {}: manifest.json records no model config (extra.model); was it written by megatrain?", dir);
  try {
    return model_config_from_json(extra["model"]);
  } catch (const Error& e) {
    fail("checkpoint {}: manifest.json, extra.model: {}", dir, e.what());
  }
}

}  // namespace mt
