#include "megatrain/ckpt/hf_gpt2.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include "megatrain/ckpt/config_json.h"
#include "megatrain/ckpt/hf_model_files.h"
#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"
#include "megatrain/model/layout.h"

namespace mt {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Linear weights HF GPT-2 stores as Conv1D [in, out].
bool is_conv1d(const std::string& name) {
  return ends_with(name, ".attn.c_attn.weight") || ends_with(name, ".attn.c_proj.weight") ||
         ends_with(name, ".mlp.c_fc.weight") || ends_with(name, ".mlp.c_proj.weight");
}

bool is_mask_buffer(const std::string& name) {
  return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias");
}

bool is_vocab_matrix(const std::string& name) { return name == "wte.weight" || name == "lm_head.weight"; }

// The name our parameter has in f ("" when absent).
std::string hf_name(const SafetensorsFile& f, const std::string& ours) {
  if (ours == "lm_head.weight") return f.has(ours) ? ours : "";
  if (f.has("transformer." + ours)) return "transformer." + ours;
  return f.has(ours) ? ours : "";
}

// dst[c][r] = src[r][c] for src [rows, cols], in cache-sized tiles.
void transpose(float* dst, const float* src, int64_t rows, int64_t cols) {
  constexpr int64_t B = 32;
  for (int64_t r0 = 0; r0 < rows; r0 += B)
    for (int64_t c0 = 0; c0 < cols; c0 += B)
      for (int64_t r = r0; r < std::min(rows, r0 + B); ++r)
        for (int64_t c = c0; c < std::min(cols, c0 + B); ++c) dst[c * rows + r] = src[r * cols + c];
}

std::vector<float> read_f32(const SafetensorsFile& f, const TensorData& t) {
  MT_CHECK(t.dtype_str == "F32" || t.dtype_str == "F16" || t.dtype_str == "BF16",
           "{}: tensor '{}' has dtype {}; expected F32, F16 or BF16", f.path(), t.name, t.dtype_str);
  std::vector<float> v(static_cast<size_t>(t.numel()));
  to_f32(t, v.data());
  return v;
}

std::optional<json> config_json_beside(const std::string& path) {
  fs::path p = fs::path(path).parent_path() / "config.json";
  if (!file_exists(p.string())) return std::nullopt;
  try {
    return json::parse(read_text_file(p.string()));
  } catch (const json::exception& e) {
    fail("{} is not valid JSON: {}", p.string(), e.what());
  }
}

}  // namespace

bool is_hf_gpt2_buffer(const std::string& name) { return is_mask_buffer(name); }

HfGpt2Tensor hf_gpt2_tensor(const SafetensorsFile& f, const std::string& ours) {
  return {hf_name(f, ours), is_conv1d(ours)};
}

void check_hf_gpt2_convertible(const ModelConfig& c) {
  auto refuse = [](const std::string& what) {
    fail("HF GPT-2 cannot express {} (only the GPT-2 layout converts: layernorm, gelu, learned positions, "
         "sequential block, biases, full multi-head attention)",
         what);
  };
  if (c.norm != NormKind::LayerNorm) refuse(fmt::format("model.norm = '{}'", kind_name(c.norm)));
  if (c.mlp != MlpKind::Gelu) refuse(fmt::format("model.mlp = '{}'", kind_name(c.mlp)));
  if (c.pos != PosKind::Learned) refuse(fmt::format("model.pos = '{}'", kind_name(c.pos)));
  if (c.block != BlockKind::Sequential) refuse(fmt::format("model.block = '{}'", kind_name(c.block)));
  if (!c.bias) refuse("model.bias = false");
  if (c.moe()) refuse(fmt::format("model.moe_experts = {} (MoE conversion is not written yet)", c.moe_experts));
  if (c.kv_heads() != c.n_head) refuse(fmt::format("model.n_kv_head = {} (grouped-query attention)", c.n_kv_head));
  if (c.window != 0) refuse(fmt::format("model.window = {} (sliding-window attention)", c.window));
}

ModelConfig infer_hf_gpt2_config(const SafetensorsFile& f, int n_head) {
  const std::string& path = f.path();
  auto find = [&](const std::string& ours) -> const TensorData* {
    std::string n = hf_name(f, ours);
    return n.empty() ? nullptr : &f.tensors().at(n);
  };
  const TensorData* wte = find("wte.weight");
  const TensorData* wpe = find("wpe.weight");
  MT_CHECK(wte && wpe, "{}: not an HF GPT-2 file (no wte.weight / wpe.weight, with or without 'transformer.')", path);
  MT_CHECK(wte->shape.size() == 2 && wpe->shape.size() == 2 && wte->shape[1] == wpe->shape[1],
           "{}: wte.weight {} and wpe.weight {} are not [vocab, C] and [positions, C]", path, wte->shape_str(),
           wpe->shape_str());
  ModelConfig c;
  c.vocab_size = static_cast<int>(wte->shape[0]);
  c.d_model = static_cast<int>(wte->shape[1]);
  c.max_seq_len = static_cast<int>(wpe->shape[0]);
  c.n_layer = 0;
  while (find(fmt::format("h.{}.ln_1.weight", c.n_layer))) ++c.n_layer;
  MT_CHECK(c.n_layer > 0, "{}: no transformer blocks (h.0.ln_1.weight is missing)", path);
  const TensorData* fc = find("h.0.mlp.c_fc.weight");
  MT_CHECK(fc && fc->shape.size() == 2 && fc->shape[0] == c.d_model,
           "{}: h.0.mlp.c_fc.weight is missing or not [{}, F]", path, c.d_model);
  const int F = static_cast<int>(fc->shape[1]);
  c.d_ff = F == 4 * c.d_model ? 0 : F;
  MT_CHECK(find("h.0.attn.c_attn.bias"), "{}: h.0.attn.c_attn.bias is missing; only GPT-2 with biases converts", path);
  // An lm_head equal to wte is a tied head that was saved anyway.
  c.tied_embeddings = true;
  if (f.has("lm_head.weight")) {
    const TensorData& lm = f.tensors().at("lm_head.weight");
    c.tied_embeddings = lm.shape == wte->shape && read_f32(f, lm) == read_f32(f, *wte);
  }

  if (auto cj = config_json_beside(path)) {
    const std::string where = (fs::path(path).parent_path() / "config.json").string();
    MT_CHECK(cj->is_object(), "{}: expected a JSON object of settings (got {})", where, cj->type_name());
    // A boolean setting, or its default when absent; any other type is an error naming the file and the key.
    auto flag = [&](const char* key, bool absent) {
      if (!cj->contains(key) || (*cj)[key].is_null()) return absent;
      MT_CHECK((*cj)[key].is_boolean(), "{}: {} must be true or false (got {})", where, key, (*cj)[key].dump());
      return (*cj)[key].get<bool>();
    };
    auto agree = [&](const char* key, int64_t have) {
      if (!cj->contains(key) || (*cj)[key].is_null()) return;
      MT_CHECK((*cj)[key].is_number_integer() && (*cj)[key].get<int64_t>() == have,
               "{} says {} = {} but the tensors in {} say {}", where, key, (*cj)[key].dump(), path, have);
    };
    if (cj->contains("model_type"))
      MT_CHECK((*cj)["model_type"] == "gpt2", "{} describes a {} model; only GPT-2 converts", where,
               (*cj)["model_type"].dump());
    agree("vocab_size", c.vocab_size);
    agree("n_embd", c.d_model);
    agree("n_layer", c.n_layer);
    agree("n_positions", c.max_seq_len);
    agree("n_inner", F);
    if (cj->contains("activation_function")) {
      std::string act = (*cj)["activation_function"].is_string() ? (*cj)["activation_function"].get<std::string>()
                                                                 : "?";
      MT_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu_fast",
               "{}: activation_function '{}' is not the tanh GELU megatrain computes", where, act);
    }
    MT_CHECK(!flag("scale_attn_by_inverse_layer_idx", false),
             "{}: scale_attn_by_inverse_layer_idx = true is not supported", where);
    MT_CHECK(flag("scale_attn_weights", true), "{}: scale_attn_weights = false is not supported", where);
    if (cj->contains("layer_norm_epsilon") && !(*cj)["layer_norm_epsilon"].is_null()) {
      MT_CHECK((*cj)["layer_norm_epsilon"].is_number(), "{}: layer_norm_epsilon must be a number (got {})", where,
               (*cj)["layer_norm_epsilon"].dump());
      c.norm_eps = (*cj)["layer_norm_epsilon"].get<float>();
    }
    if (!flag("tie_word_embeddings", true)) {
      MT_CHECK(f.has("lm_head.weight"), "{}: tie_word_embeddings = false but {} has no lm_head.weight", where, path);
      c.tied_embeddings = false;
    }
    if (cj->contains("n_head")) {
      const json& h = (*cj)["n_head"];
      MT_CHECK(h.is_number_integer() && h.get<int64_t>() >= 1 && h.get<int64_t>() <= INT32_MAX,
               "{}: n_head must be a positive integer (got {})", where, h.dump());
      int cfg_heads = h.get<int>();
      MT_CHECK(n_head <= 0 || n_head == cfg_heads, "n_head {} was asked for but {} says n_head = {}", n_head, where,
               cfg_heads);
      n_head = cfg_heads;
    }
  }
  if (n_head <= 0) {
    MT_CHECK(c.d_model % 64 == 0, "{}: cannot infer n_head for width {} (no config.json beside it); pass it (--n-head)",
             path, c.d_model);
    n_head = c.d_model / 64;
  }
  c.n_head = n_head;
  try {
    c.validate();
  } catch (const Error& e) {
    fail("{}: {}", path, e.what());
  }
  return c;
}

void import_hf_gpt2(const SafetensorsFile& f, const ModelConfig& cfg, ParamStore& store) {
  check_hf_gpt2_convertible(cfg);
  if (store.size() == 0) {
    declare_gpt_params(cfg, store);
    store.allocate();
  }
  MT_CHECK(store.params_data() != nullptr, "import_hf_gpt2: the parameter store is not allocated");
  const std::string& path = f.path();
  const int64_t V = cfg.vocab_size, C = cfg.d_model;
  std::set<std::string> used;
  for (int i = 0; i < static_cast<int>(store.size()); ++i) {
    const ParamInfo& p = store.info(i);
    std::string hn = hf_name(f, p.name);
    if (hn.empty() && p.name == "lm_head.weight")
      fail("{}: the config unties the LM head (tied_embeddings = false) but the file has no lm_head.weight", path);
    MT_CHECK(!hn.empty(), "{0}: no tensor for parameter '{1}' (looked for transformer.{1} and {1})", path, p.name);
    const TensorData& t = f.tensors().at(hn);
    used.insert(hn);
    std::vector<int64_t> want = p.shape;
    if (is_conv1d(p.name)) want = {p.shape[1], p.shape[0]};
    if (is_vocab_matrix(p.name)) want = {V, C};
    const bool wpe_longer = p.name == "wpe.weight" && t.shape.size() == 2 && t.shape[0] >= p.shape[0] &&
                            t.shape[1] == p.shape[1];  // a shorter context keeps the first positions
    MT_CHECK(t.shape == want || wpe_longer, "{}: tensor '{}' has shape {} but this model needs {}", path, hn,
             t.shape_str(), shape_str(want));
    std::vector<float> src = read_f32(f, t);
    float* dst = store.param(i).f32();
    if (is_conv1d(p.name)) {
      transpose(dst, src.data(), want[0], want[1]);
    } else {
      // wte/lm_head: the first V of padded_vocab() rows, the rest zero; wpe: the first max_seq_len rows.
      std::memset(dst, 0, p.numel * sizeof(float));
      std::memcpy(dst, src.data(), std::min(src.size(), p.numel) * sizeof(float));
    }
  }
  std::vector<std::string> unused;
  for (auto& name : f.names()) {
    if (used.count(name) || is_mask_buffer(name)) continue;
    if (name == "lm_head.weight" && cfg.tied_embeddings) {
      const TensorData& lm = f.tensors().at(name);
      std::vector<float> head = read_f32(f, lm);
      const float* wte = store.param("wte.weight").f32();
      MT_CHECK(lm.shape == std::vector<int64_t>({V, C}) && std::equal(head.begin(), head.end(), wte),
               "{}: lm_head.weight differs from wte.weight but the config ties them; set tied_embeddings = false",
               path);
      continue;
    }
    unused.push_back(name);
  }
  if (!unused.empty()) {
    std::string list;
    for (size_t i = 0; i < std::min<size_t>(unused.size(), 5); ++i) list += (i ? ", " : "") + unused[i];
    fail("{}: {} tensor(s) have no place in a GPT-2 with this config (n_layer {}): {}{}", path, unused.size(),
         cfg.n_layer, list, unused.size() > 5 ? ", ..." : "");
  }
}

json hf_gpt2_config_json(const ModelConfig& c, DType dtype) {
  check_hf_gpt2_convertible(c);
  json j = {{"architectures", {"GPT2LMHeadModel"}},
            {"model_type", "gpt2"},
            {"vocab_size", c.vocab_size},
            {"n_positions", c.max_seq_len},
            {"n_ctx", c.max_seq_len},
            {"n_embd", c.d_model},
            {"n_layer", c.n_layer},
            {"n_head", c.n_head},
            {"n_inner", c.ff_dim() == 4 * c.d_model ? json(nullptr) : json(c.ff_dim())},
            {"activation_function", "gelu_new"},  // tanh GELU, as our kernels compute
            {"layer_norm_epsilon", shortest_decimal(c.norm_eps)},
            {"initializer_range", shortest_decimal(c.init_std)},
            // megatrain trains without dropout
            {"resid_pdrop", 0.0},
            {"embd_pdrop", 0.0},
            {"attn_pdrop", 0.0},
            {"scale_attn_weights", true},
            {"tie_word_embeddings", c.tied_embeddings},
            {"torch_dtype", torch_dtype_name(dtype)}};
  if (c.vocab_size > 50256) j["bos_token_id"] = j["eos_token_id"] = 50256;  // GPT-2's <|endoftext|>
  return j;
}

void export_hf_gpt2(const ModelConfig& cfg, const ParamStore& store, const std::string& path, DType dtype) {
  check_hf_gpt2_convertible(cfg);
  ParamStore layout;
  declare_gpt_params(cfg, layout);
  MT_CHECK(store.params_data() != nullptr, "export_hf_gpt2: the parameter store is not allocated");
  const int64_t V = cfg.vocab_size, C = cfg.d_model;
  std::vector<TensorRef> refs;
  std::vector<std::vector<float>> transposed;
  transposed.reserve(layout.size());  // refs point into these: no reallocation
  for (auto& p : layout.infos()) {
    MT_CHECK(store.has(p.name), "export_hf_gpt2: the model has no parameter '{}'", p.name);
    const ParamInfo& have = store.info(store.index(p.name));
    MT_CHECK(have.shape == p.shape, "export_hf_gpt2: parameter '{}' has shape {} but the config implies {}", p.name,
             shape_str(have.shape), shape_str(p.shape));
    const float* src = store.param(p.name).f32();
    TensorRef r{p.name, DType::F32, p.shape, src};
    if (is_conv1d(p.name)) {
      auto& t = transposed.emplace_back(p.numel);
      transpose(t.data(), src, p.shape[0], p.shape[1]);
      r.shape = {p.shape[1], p.shape[0]};
      r.data = t.data();
    } else if (is_vocab_matrix(p.name)) {
      r.shape = {V, C};  // the padding rows are the tail: the first V rows are contiguous
    }
    refs.push_back(std::move(r));
  }
  const fs::path parent = fs::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) fs::create_directories(parent, ec);
  write_hf_weights(path, std::move(refs), dtype);
  fs::path cj = parent / "config.json";
  write_file_atomic(cj.string(), hf_gpt2_config_json(cfg, dtype).dump(2) + "\n");
}

}  // namespace mt
