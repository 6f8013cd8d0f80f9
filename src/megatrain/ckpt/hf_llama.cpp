#include "megatrain/ckpt/hf_llama.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>

#include "megatrain/ckpt/config_json.h"
#include "megatrain/ckpt/safetensors.h"
#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"
#include "megatrain/model/layout.h"

namespace mt {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// One of our parameters as HF Llama stores it: the HF tensors whose rows, stacked in this order, make it.
struct LlamaSource {
  std::vector<std::string> parts;
};

bool ends_in(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

LlamaSource llama_source(const ModelConfig& c, const std::string& ours) {
  auto layer_part = [&](const char* suffix) { return ends_in(ours, suffix); };
  if (ours == "wte.weight") return {{"model.embed_tokens.weight"}};
  if (ours == "ln_f.weight") return {{"model.norm.weight"}};
  if (ours == "lm_head.weight") return {{"lm_head.weight"}};
  // h.{i}.<rest>
  const size_t dot = ours.find('.', 2);
  MT_CHECK(ours.rfind("h.", 0) == 0 && dot != std::string::npos, "HF Llama has no place for parameter '{}'", ours);
  const std::string p = "model.layers." + ours.substr(2, dot - 2) + ".";
  if (layer_part(".ln_1.weight")) return {{p + "input_layernorm.weight"}};
  if (layer_part(".ln_2.weight")) return {{p + "post_attention_layernorm.weight"}};
  if (layer_part(".attn.c_attn.weight"))
    return {{p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight"}};
  if (layer_part(".attn.c_proj.weight")) return {{p + "self_attn.o_proj.weight"}};
  if (layer_part(".mlp.c_fc.weight")) return {{p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"}};
  if (layer_part(".mlp.c_proj.weight")) return {{p + "mlp.down_proj.weight"}};
  // Mixtral: expert e's rows of our stacked tensors are w1 | w3 (c_fc) and w2 (c_proj), expert after expert.
  if (layer_part(".moe.router.weight")) return {{p + "block_sparse_moe.gate.weight"}};
  const bool fc = layer_part(".moe.experts.c_fc.weight"), proj = layer_part(".moe.experts.c_proj.weight");
  if (fc || proj) {
    LlamaSource s;
    for (int e = 0; e < c.moe_experts; ++e) {
      const std::string x = fmt::format("{}block_sparse_moe.experts.{}.", p, e);
      if (fc) s.parts.insert(s.parts.end(), {x + "w1.weight", x + "w3.weight"});
      if (proj) s.parts.push_back(x + "w2.weight");
    }
    return s;
  }
  fail("HF Llama has no place for parameter '{}'", ours);
}


// Typed reads of config.json, each error naming the file and the key.
struct LlamaSettings {
  const HfModelFiles& m;
  const std::string& where;

  int count(const char* key, std::optional<int64_t> absent) const {
    const json* v = m.setting(key);
    if (!v) {
      MT_CHECK(absent.has_value(), "{}: {} is missing; an HF Llama config must give it", where, key);
      return static_cast<int>(*absent);
    }
    MT_CHECK(v->is_number_integer() && v->get<int64_t>() >= 1 && v->get<int64_t>() <= INT_MAX,
             "{}: {} must be a positive integer (got {})", where, key, v->dump());
    return v->get<int>();
  }
  double number(const json* v, const char* key, double absent) const {
    if (!v) return absent;
    MT_CHECK(v->is_number(), "{}: {} must be a number (got {})", where, key, v->dump());
    return v->get<double>();
  }
  bool flag(const char* key, bool absent) const {
    const json* v = m.setting(key);
    if (!v) return absent;
    MT_CHECK(v->is_boolean(), "{}: {} must be true or false (got {})", where, key, v->dump());
    return v->get<bool>();
  }
};

}  // namespace

bool is_hf_llama_buffer(const std::string& name) { return ends_in(name, ".rotary_emb.inv_freq"); }

std::vector<HfRowBlock> hf_llama_row_blocks(const ModelConfig& c, const std::string& ours) {
  const std::vector<std::string> parts = llama_source(c, ours).parts;
  const int64_t hd = c.head_dim();
  std::vector<int64_t> rows;
  if (ends_in(ours, ".moe.router.weight"))
    rows = {c.moe_experts};
  else if (ends_in(ours, ".moe.experts.c_fc.weight"))
    rows.assign(parts.size(), c.moe_ff_dim());  // [E, 2F, C] as E*2F rows of C
  else if (ends_in(ours, ".moe.experts.c_proj.weight"))
    rows.assign(parts.size(), c.d_model);  // [E, C, F] as E*C rows of F
  else if (ends_in(ours, ".attn.c_attn.weight"))
    rows = {c.n_head * hd, c.kv_heads() * hd, c.kv_heads() * hd};
  else if (ends_in(ours, ".mlp.c_fc.weight"))
    rows = {c.ff_dim(), c.ff_dim()};
  else if (ours == "wte.weight" || ours == "lm_head.weight")
    rows = {c.vocab_size};
  else
    rows = {c.d_model};
  std::vector<HfRowBlock> blocks;
  for (size_t k = 0; k < parts.size(); ++k) blocks.push_back({parts[k], rows[k]});
  return blocks;
}

void check_hf_llama_convertible(const ModelConfig& c) {
  auto refuse = [](const std::string& what) {
    fail("HF Llama cannot express {} (the Llama layout converts: rmsnorm, swiglu, rope, sequential block, no "
         "biases; grouped-query attention, a tied or untied head and a sliding window (as Mistral) are fine)",
         what);
  };
  if (c.norm != NormKind::RmsNorm) refuse(fmt::format("model.norm = '{}'", kind_name(c.norm)));
  if (c.mlp != MlpKind::SwiGlu) refuse(fmt::format("model.mlp = '{}'", kind_name(c.mlp)));
  if (c.pos != PosKind::Rope) refuse(fmt::format("model.pos = '{}'", kind_name(c.pos)));
  if (c.block != BlockKind::Sequential) refuse(fmt::format("model.block = '{}'", kind_name(c.block)));
  if (c.bias) refuse("model.bias = true");
  // MoE exports as Mixtral: every layer MoE, the softmax router, no shared experts.
  if (c.moe() && (c.moe_every != 1 || c.moe_first_dense != 0))
    refuse(fmt::format("model.moe_every = {} / model.moe_first_dense = {} (Mixtral's layers are all MoE)", c.moe_every,
                       c.moe_first_dense));
  if (c.moe() && c.moe_router != MoeRouter::Softmax) refuse("model.moe_router other than \"softmax\" (Mixtral's)");
  if (c.moe() && c.moe_shared_experts > 0)
    refuse(fmt::format("model.moe_shared_experts = {} (Mixtral has no shared experts)", c.moe_shared_experts));
}

bool is_hf_llama(const HfModelFiles& m) {
  if (const json* t = m.setting("model_type")) return *t == "llama" || *t == "mistral" || *t == "mixtral";
  return m.has("model.embed_tokens.weight");
}

namespace {

// The type a rope_scaling (or rope_parameters) object gives, "default" where it names none.
std::string llama_rope_type(const LlamaSettings& s, const json& r, const std::string& key) {
  MT_CHECK(r.is_object(), "{}: {} must be an object (got {})", s.where, key, r.dump());
  for (const char* k : {"rope_type", "type"})  // "type": the older spelling
    if (r.contains(k) && !r[k].is_null()) {
      MT_CHECK(r[k].is_string(), "{}: {}.{} must be a string (got {})", s.where, key, k, r[k].dump());
      return r[k].get<std::string>();
    }
  return std::string("default");
}

// Llama 3.1's scaling of RoPE's frequencies ("llama3"), read into scaled; the default type leaves it unscaled.
void read_llama_rope_scaling(const LlamaSettings& s, const json& r, const std::string& key, RopeFreqs& scaled) {
  const std::string type = llama_rope_type(s, r, key);
  if (type == "default") return;
  MT_CHECK(type == "llama3",
           "{}: {} of type \"{}\" is not supported: megatrain scales RoPE's frequencies as "
           "Llama 3.1 does (\"llama3\") or not at all",
           s.where, key, type);
  auto field = [&](const char* k, std::optional<double> absent) {
    if (!r.contains(k) || r[k].is_null()) {
      MT_CHECK(absent.has_value(), "{}: {}.{} is missing; rope type \"llama3\" needs it", s.where, key, k);
      return *absent;
    }
    return s.number(&r[k], (key + "." + k).c_str(), 0.0);
  };
  scaled.scaling = static_cast<float>(field("factor", std::nullopt));
  scaled.low_freq_factor = static_cast<float>(field("low_freq_factor", 1.0));
  scaled.high_freq_factor = static_cast<float>(field("high_freq_factor", 4.0));
  const double orig = field("original_max_position_embeddings", std::nullopt);
  MT_CHECK(orig >= 1 && orig <= INT_MAX && orig == static_cast<int>(orig),
           "{}: {}.original_max_position_embeddings must be a positive integer (got {})", s.where, key, orig);
  scaled.original_len = static_cast<int>(orig);
}

// RoPE: rope_theta (returned), and rope_scaling (transformers 5: both in rope_parameters), whose only type
// megatrain computes is Llama 3.1's "llama3" (kernels/rope_freqs.h), read into scaled.
double read_llama_rope(const LlamaSettings& s, RopeFreqs& scaled) {
  const HfModelFiles& m = s.m;
  double theta = s.number(m.setting("rope_theta"), "rope_theta", 10000.0);
  if (const json* r = m.setting("rope_scaling")) read_llama_rope_scaling(s, *r, "rope_scaling", scaled);
  if (const json* rp = m.setting("rope_parameters")) {  // transformers 5 moved rope_theta and rope_type here
    read_llama_rope_scaling(s, *rp, "rope_parameters", scaled);
    if (rp->contains("rope_theta") && !(*rp)["rope_theta"].is_null())
      theta = s.number(&(*rp)["rope_theta"], "rope_parameters.rope_theta", theta);
  }
  return theta;
}

// The activation and biases, which megatrain's Llama layout fixes.
void refuse_llama_variants(const LlamaSettings& s) {
  const std::string& where = s.where;
  if (const json* act = s.m.setting("hidden_act"))
    MT_CHECK(*act == "silu" || *act == "swish",
             "{}: hidden_act = {} is not supported: megatrain's SwiGLU gates "
             "with silu",
             where, act->dump());
  MT_CHECK(!s.flag("attention_bias", false),
           "{}: attention_bias = true is not supported: megatrain's Llama layout has "
           "no biases",
           where);
  MT_CHECK(!s.flag("mlp_bias", false), "{}: mlp_bias = true is not supported: megatrain's Llama layout has no biases",
           where);
}

// The ModelConfig that config.json describes, before its checks (check_llama_config).
ModelConfig llama_model_config(const LlamaSettings& s, bool mistral, double theta, const RopeFreqs& scaled) {
  const HfModelFiles& m = s.m;
  const std::string& where = s.where;
  ModelConfig c;
  c.norm = NormKind::RmsNorm;
  c.mlp = MlpKind::SwiGlu;
  c.pos = PosKind::Rope;
  c.block = BlockKind::Sequential;
  c.bias = false;
  // Mistral is Llama with sliding-window attention: a query at t sees keys t - W < s <= t, as megatrain's
  // model.window (kernels/ops.h AttnShape) and transformers' sliding-window mask both define it. null: full causal.
  c.window = mistral ? s.count("sliding_window", 0) : 0;
  MT_CHECK(mistral || !m.setting("sliding_window"),
           "{}: sliding_window is a Mistral setting; model_type \"llama\" "
           "attends to every earlier token",
           where);
  c.d_model = s.count("hidden_size", std::nullopt);
  c.n_layer = s.count("num_hidden_layers", std::nullopt);
  c.n_head = s.count("num_attention_heads", std::nullopt);
  c.n_kv_head = s.count("num_key_value_heads", c.n_head);
  c.d_ff = s.count("intermediate_size", std::nullopt);
  c.vocab_size = s.count("vocab_size", std::nullopt);
  c.max_seq_len = s.count("max_position_embeddings", 2048);  // HF LlamaConfig's defaults, here and below
  c.norm_eps = static_cast<float>(s.number(m.setting("rms_norm_eps"), "rms_norm_eps", 1e-6));
  c.rope_theta = static_cast<float>(theta);
  c.rope_scaling = scaled.scaling;
  if (scaled.scaling > 0) {
    c.rope_low_freq_factor = scaled.low_freq_factor;
    c.rope_high_freq_factor = scaled.high_freq_factor;
    c.rope_original_max_len = scaled.original_len;
  }
  if (const json* ir = m.setting("initializer_range"))
    c.init_std = static_cast<float>(s.number(ir, "initializer_range", 0.02));
  c.tied_embeddings = s.flag("tie_word_embeddings", false);
  return c;
}

// Mixtral's experts: num_local_experts of width intermediate_size, num_experts_per_tok of them per token, on every
// layer, by the softmax router with the top-k renormalised (modeling_mixtral's MixtralSparseMoeBlock).
void read_mixtral_experts(const LlamaSettings& s, ModelConfig& c) {
  c.moe_experts = s.count("num_local_experts", std::nullopt);
  c.moe_top_k = s.count("num_experts_per_tok", std::nullopt);
  MT_CHECK(c.moe_top_k <= c.moe_experts, "{}: num_experts_per_tok = {} is more than num_local_experts = {}", s.where,
           c.moe_top_k, c.moe_experts);
  c.moe_d_ff = c.d_ff;
  c.moe_router = MoeRouter::Softmax;
  if (const json* coef = s.m.setting("router_aux_loss_coef"))
    c.moe_aux_loss = static_cast<float>(s.number(coef, "router_aux_loss_coef", 0.0));
}

// c's heads, its validity, and its layer count against the tensors.
void check_llama_config(const LlamaSettings& s, const ModelConfig& c) {
  const HfModelFiles& m = s.m;
  const std::string& where = s.where;
  MT_CHECK(c.d_model % c.n_head == 0, "{}: hidden_size {} is not a multiple of num_attention_heads {}", where,
           c.d_model, c.n_head);
  if (m.setting("head_dim"))
    MT_CHECK(s.count("head_dim", std::nullopt) == c.d_model / c.n_head,
             "{}: head_dim = {} is not supported: megatrain's heads are hidden_size / num_attention_heads = {} wide",
             where, m.setting("head_dim")->dump(), c.d_model / c.n_head);
  try {
    c.validate();
  } catch (const Error& e) {
    fail("{}: {}", where, e.what());
  }
  // The layer count must match the tensors: a file with more layers would otherwise lose them in silence.
  MT_CHECK(!m.has(fmt::format("model.layers.{}.input_layernorm.weight", c.n_layer)),
           "{}: num_hidden_layers = {} but {} holds a layer {}", where, c.n_layer, m.source(), c.n_layer);
}

}  // namespace

ModelConfig infer_hf_llama_config(const HfModelFiles& m) {
  MT_CHECK(m.config().has_value(),
           "{}: an HF Llama needs the config.json saved with it (its head counts are not in the tensor shapes); there "
           "is none beside it",
           m.source());
  const std::string& where = m.config_path();
  const LlamaSettings s{m, where};
  const json* type = m.setting("model_type");
  MT_CHECK(!type || *type == "llama" || *type == "mistral" || *type == "mixtral",
           "{} describes a {} model; this converter reads model_type \"llama\", \"mistral\" and \"mixtral\"", where,
           type->dump());
  const bool mixtral = type && *type == "mixtral";
  const bool mistral = mixtral || (type && *type == "mistral");  // Mixtral's attention is Mistral's
  // What HF's Llama can compute and megatrain's cannot is refused by name, never converted into another network.
  RopeFreqs scaled{0.0f};
  const double theta = read_llama_rope(s, scaled);
  refuse_llama_variants(s);
  ModelConfig c = llama_model_config(s, mistral, theta, scaled);
  if (mixtral) read_mixtral_experts(s, c);
  check_llama_config(s, c);
  return c;
}

void import_hf_llama(const HfModelFiles& m, const ModelConfig& cfg, ParamStore& store) {
  check_hf_llama_convertible(cfg);
  if (store.size() == 0) {
    declare_gpt_params(cfg, store);
    store.allocate();
  }
  MT_CHECK(store.params_data() != nullptr, "import_hf_llama: the parameter store is not allocated");
  std::set<std::string> used;
  for (int i = 0; i < static_cast<int>(store.size()); ++i) {
    const ParamInfo& p = store.info(i);
    MT_CHECK(p.shape.size() <= 3, "import_hf_llama: parameter '{}' has more than 3 dimensions", p.name);
    const std::vector<HfRowBlock> blocks = hf_llama_row_blocks(cfg, p.name);
    const int64_t cols = p.shape.size() >= 2 ? p.shape.back() : 1;  // an expert stack [E, R, cols]: E*R rows
    float* dst = store.param(i).f32();
    size_t at = 0;
    for (const HfRowBlock& b : blocks) {
      const std::string& hn = b.name;
      if (!m.has(hn) && hn == "lm_head.weight")
        fail("{}: the config unties the LM head (tie_word_embeddings = false) but there is no lm_head.weight",
             m.source());
      MT_CHECK(m.has(hn), "{}: no tensor '{}', which parameter '{}' needs", m.source(), hn, p.name);
      const TensorData& t = m.float_tensor(hn);
      const std::vector<int64_t> want = p.shape.size() >= 2 ? std::vector<int64_t>{b.rows, cols}
                                                            : std::vector<int64_t>{b.rows};
      MT_CHECK(t.shape == want, "{}: tensor '{}' has shape {} but this model ({}) needs {}", m.file_of(hn), hn,
               t.shape_str(), p.name, shape_str(want));
      // Straight into the parameter: a temporary copy per tensor costs fresh pages for twice the model's size, and
      // clearing them was most of an import's time under perf.
      to_f32(t, 0, t.numel(), dst + at);
      at += static_cast<size_t>(t.numel());
      used.insert(hn);
    }
    std::fill(dst + at, dst + p.numel, 0.0f);  // the vocabulary padding rows
  }
  std::vector<std::string> unused;
  for (auto& name : m.names()) {
    if (used.count(name) || is_hf_llama_buffer(name)) continue;
    if (name == "lm_head.weight" && cfg.tied_embeddings) {  // a tied head saved anyway: it must be the embedding
      MT_CHECK(m.same_values(name, "model.embed_tokens.weight"),
               "{}: lm_head.weight differs from model.embed_tokens.weight but the config ties them "
               "(tie_word_embeddings = true)",
               m.source());
      continue;
    }
    unused.push_back(name);
  }
  if (!unused.empty()) {
    std::string list;
    for (size_t i = 0; i < std::min<size_t>(unused.size(), 5); ++i) list += (i ? ", " : "") + unused[i];
    fail("{}: {} tensor(s) have no place in a Llama with this config (n_layer {}): {}{}", m.source(), unused.size(),
         cfg.n_layer, list, unused.size() > 5 ? ", ..." : "");
  }
}

json hf_llama_config_json(const ModelConfig& c, DType dtype) {
  check_hf_llama_convertible(c);
  const bool mistral = c.window > 0;  // Llama with sliding-window attention
  json j = {{"architectures", {mistral ? "MistralForCausalLM" : "LlamaForCausalLM"}},
            {"model_type", mistral ? "mistral" : "llama"},
            {"vocab_size", c.vocab_size},
            {"hidden_size", c.d_model},
            {"intermediate_size", c.ff_dim()},
            {"num_hidden_layers", c.n_layer},
            {"num_attention_heads", c.n_head},
            {"num_key_value_heads", c.kv_heads()},
            {"head_dim", c.head_dim()},
            {"max_position_embeddings", c.max_seq_len},
            {"rms_norm_eps", shortest_decimal(c.norm_eps)},
            {"rope_theta", shortest_decimal(c.rope_theta)},
            {"rope_scaling", c.rope_scaling > 0 ? json{{"rope_type", "llama3"},
                                                       {"factor", shortest_decimal(c.rope_scaling)},
                                                       {"low_freq_factor", shortest_decimal(c.rope_low_freq_factor)},
                                                       {"high_freq_factor", shortest_decimal(c.rope_high_freq_factor)},
                                                       {"original_max_position_embeddings", c.rope_original_max_len}}
                                                : json(nullptr)},
            {"hidden_act", "silu"},
            {"attention_bias", false},
            {"mlp_bias", false},
            {"attention_dropout", 0.0},  // megatrain trains without dropout
            {"initializer_range", shortest_decimal(c.init_std)},
            {"tie_word_embeddings", c.tied_embeddings},
            {"pretraining_tp", 1},
            {"use_cache", true},
            {"torch_dtype", torch_dtype_name(dtype)}};
  if (c.vocab_size > 50256) j["bos_token_id"] = j["eos_token_id"] = 50256;  // GPT-2's <|endoftext|>: our tokenizer
  if (c.moe()) {  // Mixtral: MixtralConfig's keys; intermediate_size is each expert's width
    j["architectures"] = {"MixtralForCausalLM"};
    j["model_type"] = "mixtral";
    j["intermediate_size"] = c.moe_ff_dim();
    j["num_local_experts"] = c.moe_experts;
    j["num_experts_per_tok"] = c.moe_top_k;
    j["router_aux_loss_coef"] = shortest_decimal(c.moe_aux_loss);
    j["output_router_logits"] = false;
    j["sliding_window"] = c.window > 0 ? json(c.window) : json(nullptr);
    for (const char* k : {"attention_bias", "mlp_bias", "pretraining_tp"}) j.erase(k);  // not MixtralConfig's
  } else if (mistral) {
    j["sliding_window"] = c.window;
    for (const char* k : {"attention_bias", "mlp_bias", "pretraining_tp"}) j.erase(k);  // not MistralConfig's
  }
  return j;
}

void export_hf_llama(const ModelConfig& cfg, const ParamStore& store, const std::string& path, DType dtype) {
  check_hf_llama_convertible(cfg);
  MT_CHECK(store.params_data() != nullptr, "export_hf_llama: the parameter store is not allocated");
  ParamStore layout;
  declare_gpt_params(cfg, layout);
  std::vector<TensorRef> refs;
  for (auto& p : layout.infos()) {
    MT_CHECK(store.has(p.name), "export_hf_llama: the model has no parameter '{}'", p.name);
    const ParamInfo& have = store.info(store.index(p.name));
    MT_CHECK(have.shape == p.shape, "export_hf_llama: parameter '{}' has shape {} but the config implies {}", p.name,
             shape_str(have.shape), shape_str(p.shape));
    const int64_t cols = p.shape.size() >= 2 ? p.shape.back() : 1;  // an expert stack [E, R, cols]: E*R rows
    // Each part is a run of whole rows of ours (the vocabulary's padding rows are the tail): no copy needed.
    const float* at = store.param(p.name).f32();
    for (const HfRowBlock& b : hf_llama_row_blocks(cfg, p.name)) {
      std::vector<int64_t> shape = p.shape.size() >= 2 ? std::vector<int64_t>{b.rows, cols}
                                                       : std::vector<int64_t>{b.rows};
      refs.push_back({b.name, DType::F32, shape, at});
      at += b.rows * cols;
    }
  }
  const fs::path parent = fs::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) fs::create_directories(parent, ec);
  write_hf_weights(path, std::move(refs), dtype);
  write_file_atomic((parent / "config.json").string(), hf_llama_config_json(cfg, dtype).dump(2) + "\n");
}

}  // namespace mt
