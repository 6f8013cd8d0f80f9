// HF GPT-2 interop. The oracle is a tiny HF-layout file built here tensor by tensor (Conv1D [in, out], unpadded
// vocabulary, "transformer." prefix, attention-mask buffers) whose every value is distinct, so each element's
// destination after import is checked exactly; export must reproduce that file's tensors bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "support/ckpt_testutil.h"
#include "support/files.h"
#include "megatrain/ckpt/config_json.h"
#include "megatrain/ckpt/hf_gpt2.h"
#include "megatrain/ckpt/model_weights.h"
#include "megatrain/core/fs.h"
#include "megatrain/core/rng.h"
#include "megatrain/model/layout.h"

using namespace mt;
using namespace ckpt_test;
using nlohmann::json;

namespace {

constexpr int V = 10, C = 8, P = 6, L = 2, F = 32, H = 2;

struct HfTensor {
  std::vector<int64_t> shape;
  std::vector<float> v;
};
using HfModel = std::map<std::string, HfTensor>;  // names without prefix

// Every element distinct: tensor number * 1000 + index (exact in float).
HfModel tiny_hf(bool untied = false) {
  HfModel m;
  int id = 1;
  auto add = [&](const std::string& n, std::vector<int64_t> shape) {
    HfTensor t{shape, {}};
    int64_t k = 1;
    for (auto d : shape) k *= d;
    for (int64_t i = 0; i < k; ++i) t.v.push_back(static_cast<float>(id * 1000 + i));
    ++id;
    m[n] = t;
  };
  add("wte.weight", {V, C});
  add("wpe.weight", {P, C});
  for (int l = 0; l < L; ++l) {
    std::string p = "h." + std::to_string(l) + ".";
    add(p + "ln_1.weight", {C});
    add(p + "ln_1.bias", {C});
    add(p + "attn.c_attn.weight", {C, 3 * C});
    add(p + "attn.c_attn.bias", {3 * C});
    add(p + "attn.c_proj.weight", {C, C});
    add(p + "attn.c_proj.bias", {C});
    add(p + "ln_2.weight", {C});
    add(p + "ln_2.bias", {C});
    add(p + "mlp.c_fc.weight", {C, F});
    add(p + "mlp.c_fc.bias", {F});
    add(p + "mlp.c_proj.weight", {F, C});
    add(p + "mlp.c_proj.bias", {C});
  }
  add("ln_f.weight", {C});
  add("ln_f.bias", {C});
  if (untied) add("lm_head.weight", {V, C});
  return m;
}

// Writes m as HF does: "transformer." prefix (not on lm_head), plus the causal-mask buffers.
void write_hf(const std::string& path, const HfModel& m, bool prefix = true, bool buffers = true) {
  static std::vector<float> mask(P * P, 1.0f), masked_bias(1, -1e4f);
  std::vector<TensorRef> refs;
  for (auto& [n, t] : m) {
    bool pre = prefix && n != "lm_head.weight";
    refs.push_back({(pre ? "transformer." : "") + n, DType::F32, t.shape, t.v.data()});
  }
  if (buffers)
    for (int l = 0; l < L; ++l) {
      std::string p = std::string(prefix ? "transformer." : "") + "h." + std::to_string(l) + ".attn.";
      refs.push_back({p + "bias", DType::F32, {1, 1, P, P}, mask.data()});
      refs.push_back({p + "masked_bias", DType::F32, {}, masked_bias.data()});
    }
  write_safetensors(path, refs, {{"format", "pt"}});
}

ModelConfig tiny_cfg() {
  ModelConfig c;
  c.vocab_size = V;
  c.vocab_pad_to = 16;
  c.d_model = C;
  c.max_seq_len = P;
  c.n_layer = L;
  c.n_head = H;
  return c;
}

bool is_conv1d(const std::string& n) {
  for (const char* s : {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"})
    if (n.size() > std::strlen(s) && n.compare(n.size() - std::strlen(s), std::string::npos, s) == 0) return true;
  return false;
}

// Checks every element of store against the HF tensors: transposed Conv1D, padded vocabulary rows zero.
void expect_matches_hf(const ParamStore& store, const HfModel& m) {
  for (auto& info : store.infos()) {
    SCOPED_TRACE(info.name);
    ASSERT_TRUE(m.count(info.name));
    const HfTensor& hf = m.at(info.name);
    const float* ours = store.param(info.name).f32();
    if (is_conv1d(info.name)) {
      int64_t in = hf.shape[0], out = hf.shape[1];
      ASSERT_EQ(info.shape, (std::vector<int64_t>{out, in}));
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) ASSERT_EQ(ours[o * in + i], hf.v[i * out + o]) << o << "," << i;
    } else if (info.name == "wte.weight" || info.name == "lm_head.weight") {
      ASSERT_EQ(info.shape, (std::vector<int64_t>{16, C}));  // padded to 16 rows
      for (size_t k = 0; k < info.numel; ++k) ASSERT_EQ(ours[k], k < hf.v.size() ? hf.v[k] : 0.0f) << k;
    } else {
      ASSERT_EQ(info.shape, hf.shape);
      for (size_t k = 0; k < info.numel; ++k) ASSERT_EQ(ours[k], hf.v[k]) << k;
    }
  }
}

void fill_random(ParamStore& s, uint64_t seed) {
  Rng r(seed);
  for (int i = 0; i < static_cast<int>(s.size()); ++i) {
    Tensor t = s.param(i);
    for (int64_t k = 0; k < t.numel(); ++k) t.f32()[k] = r.normal();
  }
  // Vocabulary padding rows stay zero, as in a real model.
  for (const char* n : {"wte.weight", "lm_head.weight"})
    if (s.has(n)) std::memset(s.param(n).f32() + V * C, 0, (s.param(n).numel() - V * C) * 4);
}

}  // namespace

TEST(HfGpt2, InfersTheConfigFromShapesAndConfigJson) {
  ScratchDir dir;
  write_hf(dir / "model.safetensors", tiny_hf());
  write_text(dir / "config.json", R"({"model_type": "gpt2", "n_head": 2, "n_embd": 8, "n_layer": 2,
                                      "vocab_size": 10, "n_positions": 6, "layer_norm_epsilon": 1e-6,
                                      "activation_function": "gelu_new"})");
  auto f = SafetensorsFile::open(dir / "model.safetensors");
  ModelConfig c = infer_hf_gpt2_config(f);
  EXPECT_EQ(c.vocab_size, V);
  EXPECT_EQ(c.d_model, C);
  EXPECT_EQ(c.max_seq_len, P);
  EXPECT_EQ(c.n_layer, L);
  EXPECT_EQ(c.n_head, H);
  EXPECT_EQ(c.ff_dim(), F);
  EXPECT_EQ(c.norm_eps, 1e-6f);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(infer_hf_gpt2_config(f, 2).n_head, 2);
  EXPECT_ERROR_HAS(infer_hf_gpt2_config(f, 4), "n_head 4 was asked for", "n_head = 2");

  write_text(dir / "config.json", R"({"model_type": "gpt2", "n_head": 2, "n_layer": 3})");
  EXPECT_ERROR_HAS(infer_hf_gpt2_config(f), "n_layer = 3", "say 2");
  write_text(dir / "config.json", R"({"model_type": "llama"})");
  EXPECT_ERROR_HAS(infer_hf_gpt2_config(f), "describes a \"llama\" model");
  write_text(dir / "config.json", R"({"activation_function": "relu"})");
  EXPECT_ERROR_HAS(infer_hf_gpt2_config(f), "activation_function 'relu'");
  // Settings of the wrong type name the file and the key (issue 10 item 8: they were bare json type_errors).
  const std::string where = dir / "config.json";
  write_text(where, R"({"scale_attn_weights": "yes"})");
  EXPECT_ERROR_HAS(infer_hf_gpt2_config(f), where.c_str(), "scale_attn_weights must be true or false");
  write_text(where, R"({"scale_attn_by_inverse_layer_idx": 1})");
  EXPECT_ERROR_HAS(infer_hf_gpt2_config(f), where.c_str(), "scale_attn_by_inverse_layer_idx must be true or false");
  write_text(where, R"({"tie_word_embeddings": "no"})");
  EXPECT_ERROR_HAS(infer_hf_gpt2_config(f), where.c_str(), "tie_word_embeddings must be true or false");
  write_text(where, R"({"layer_norm_epsilon": "1e-5"})");
  EXPECT_ERROR_HAS(infer_hf_gpt2_config(f), where.c_str(), "layer_norm_epsilon must be a number");
  write_text(where, R"({"n_head": 4294967298})");
  EXPECT_ERROR_HAS(infer_hf_gpt2_config(f), where.c_str(), "n_head must be a positive integer");
  write_text(where, R"([1, 2])");
  EXPECT_ERROR_HAS(infer_hf_gpt2_config(f), where.c_str(), "expected a JSON object");
  // A value the model refuses (a negative epsilon) names the weights file.
  write_text(where, R"({"layer_norm_epsilon": -1, "n_head": 2})");
  const std::string weights = dir / "model.safetensors";
  EXPECT_ERROR_HAS(infer_hf_gpt2_config(f), weights.c_str(), "model.norm_eps = -1 is out of range");

  // Without config.json, n_head comes from the argument, or from 64-wide heads when the width allows.
  std::filesystem::remove(dir / "config.json");
  EXPECT_ERROR_HAS(infer_hf_gpt2_config(f), "cannot infer n_head", "--n-head");
  EXPECT_EQ(infer_hf_gpt2_config(f, 4).n_head, 4);
}

TEST(HfGpt2, ImportPlacesEveryValueExactly) {
  ScratchDir dir;
  HfModel m = tiny_hf();
  for (bool prefix : {true, false}) {
    SCOPED_TRACE(prefix ? "with transformer. prefix" : "without prefix");
    write_hf(dir / "model.safetensors", m, prefix);
    auto f = SafetensorsFile::open(dir / "model.safetensors");
    ParamStore store;  // empty: import declares and allocates it
    import_hf_gpt2(f, tiny_cfg(), store);
    expect_matches_hf(store, m);
  }
}

TEST(HfGpt2, ImportsUntiedHeadAndHalfPrecision) {
  ScratchDir dir;
  HfModel m = tiny_hf(true);
  write_hf(dir / "model.safetensors", m);
  auto f = SafetensorsFile::open(dir / "model.safetensors");
  ModelConfig c = infer_hf_gpt2_config(f, H);
  EXPECT_FALSE(c.tied_embeddings);
  c.vocab_pad_to = 16;
  ParamStore store;
  import_hf_gpt2(f, c, store);
  expect_matches_hf(store, m);

  // BF16: small integers are exact; write the tied model's tensors as BF16 bit patterns.
  HfModel small = tiny_hf();
  std::vector<std::vector<uint16_t>> keep;
  std::vector<TensorRef> refs;
  for (auto& [n, t] : small) {
    for (size_t k = 0; k < t.v.size(); ++k) t.v[k] = static_cast<float>(static_cast<int>(k % 200) - 100);
    auto& b = keep.emplace_back();
    for (float x : t.v) {
      uint32_t bits;
      std::memcpy(&bits, &x, 4);
      b.push_back(static_cast<uint16_t>(bits >> 16));
    }
    refs.push_back({"transformer." + n, DType::BF16, t.shape, b.data()});
  }
  write_safetensors(dir / "bf16.safetensors", refs);
  ParamStore s2;
  import_hf_gpt2(SafetensorsFile::open(dir / "bf16.safetensors"), tiny_cfg(), s2);
  expect_matches_hf(s2, small);
}

TEST(HfGpt2, ImportRefusesMismatches) {
  ScratchDir dir;
  HfModel m = tiny_hf();
  write_hf(dir / "model.safetensors", m);
  auto f = SafetensorsFile::open(dir / "model.safetensors");
  ModelConfig one = tiny_cfg();
  one.n_layer = 1;
  ParamStore s1;
  EXPECT_ERROR_HAS(import_hf_gpt2(f, one, s1), "have no place", "transformer.h.1.");
  ModelConfig wide = tiny_cfg();
  wide.d_model = 16;
  ParamStore s2;
  EXPECT_ERROR_HAS(import_hf_gpt2(f, wide, s2), "'transformer.wte.weight' has shape [10, 8]", "needs [10, 16]");
  ModelConfig untied = tiny_cfg();
  untied.tied_embeddings = false;
  ParamStore s3;
  EXPECT_ERROR_HAS(import_hf_gpt2(f, untied, s3), "no lm_head.weight");
  // An lm_head that differs from wte cannot be imported into a tied model.
  write_hf(dir / "untied.safetensors", tiny_hf(true));
  ParamStore s4;
  EXPECT_ERROR_HAS(import_hf_gpt2(SafetensorsFile::open(dir / "untied.safetensors"), tiny_cfg(), s4),
                   "lm_head.weight differs from wte.weight");
  // An lm_head equal to wte is a tied head: accepted.
  HfModel same = tiny_hf(true);
  same["lm_head.weight"] = same["wte.weight"];
  write_hf(dir / "same.safetensors", same);
  auto fs = SafetensorsFile::open(dir / "same.safetensors");
  EXPECT_TRUE(infer_hf_gpt2_config(fs, H).tied_embeddings);
  ParamStore s5;
  EXPECT_NO_THROW(import_hf_gpt2(fs, tiny_cfg(), s5));
}

TEST(HfGpt2, ExportReproducesTheHfFileAndConfig) {
  ScratchDir dir;
  for (bool untied : {false, true}) {
    SCOPED_TRACE(untied ? "untied" : "tied");
    HfModel m = tiny_hf(untied);
    write_hf(dir / "in.safetensors", m);
    ModelConfig c = tiny_cfg();
    c.tied_embeddings = !untied;
    ParamStore store;
    import_hf_gpt2(SafetensorsFile::open(dir / "in.safetensors"), c, store);
    std::filesystem::create_directories(dir / "out");
    export_hf_gpt2(c, store, dir / "out/model.safetensors");
    auto out = SafetensorsFile::open(dir / "out/model.safetensors");
    EXPECT_EQ(out.metadata().at("format"), "pt");
    EXPECT_EQ(out.names().size(), m.size());
    for (auto& [n, t] : m) {
      SCOPED_TRACE(n);
      const auto& d = out.get(n);
      EXPECT_EQ(d.dtype, DType::F32);
      EXPECT_EQ(d.shape, t.shape);
      ASSERT_EQ(d.nbytes, t.v.size() * 4);
      EXPECT_EQ(std::memcmp(d.data, t.v.data(), d.nbytes), 0);
    }
    json cj = json::parse(read_text_file(dir / "out/config.json"));
    EXPECT_EQ(cj["model_type"], "gpt2");
    EXPECT_EQ(cj["vocab_size"], V);
    EXPECT_EQ(cj["n_positions"], P);
    EXPECT_EQ(cj["n_embd"], C);
    EXPECT_EQ(cj["n_layer"], L);
    EXPECT_EQ(cj["n_head"], H);
    EXPECT_EQ(cj["activation_function"], "gelu_new");
    EXPECT_EQ(cj["layer_norm_epsilon"], 1e-5);
    EXPECT_EQ(cj["tie_word_embeddings"], !untied);
    EXPECT_TRUE(cj["n_inner"].is_null());
    // The exported pair reads back as the same config.
    ModelConfig back = infer_hf_gpt2_config(out);
    back.vocab_pad_to = c.vocab_pad_to;
    EXPECT_EQ(model_config_to_json(back), model_config_to_json(c));
  }
}

TEST(HfGpt2, ExportImportRoundTripIsExact) {
  ScratchDir dir;
  ModelConfig c = tiny_cfg();
  c.d_ff = 24;  // a non-default width travels through n_inner
  ParamStore a;
  declare_gpt_params(c, a);
  a.allocate();
  fill_random(a, 42);
  export_hf_gpt2(c, a, dir / "m.safetensors");
  auto f = SafetensorsFile::open(dir / "m.safetensors");
  ModelConfig inferred = infer_hf_gpt2_config(f);
  EXPECT_EQ(inferred.ff_dim(), 24);
  ParamStore b;
  import_hf_gpt2(f, c, b);
  ASSERT_EQ(a.total_floats(), b.total_floats());
  EXPECT_EQ(std::memcmp(a.params_data(), b.params_data(), a.total_floats() * 4), 0);
}

TEST(HfGpt2, NonGpt2ConfigsAreRefusedNamingTheOption) {
  ScratchDir dir;
  struct Case {
    const char* word;
    std::function<void(ModelConfig&)> edit;
  };
  std::vector<Case> cases = {
      {"model.norm = 'rmsnorm'", [](ModelConfig& c) { c.norm = NormKind::RmsNorm; }},
      {"model.mlp = 'swiglu'", [](ModelConfig& c) { c.mlp = MlpKind::SwiGlu; }},
      {"model.pos = 'rope'", [](ModelConfig& c) { c.pos = PosKind::Rope; }},
      {"model.block = 'parallel'", [](ModelConfig& c) { c.block = BlockKind::Parallel; }},
      {"model.bias = false", [](ModelConfig& c) { c.bias = false; }},
      {"model.n_kv_head = 1", [](ModelConfig& c) { c.n_kv_head = 1; }},
      {"model.window = 4", [](ModelConfig& c) { c.window = 4; }},
  };
  for (auto& k : cases) {
    SCOPED_TRACE(k.word);
    ModelConfig c = tiny_cfg();
    k.edit(c);
    ParamStore s;
    declare_gpt_params(c, s);
    s.allocate();
    EXPECT_ERROR_HAS(export_hf_gpt2(c, s, dir / "x.safetensors"), k.word, "HF GPT-2 cannot express");
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path));
}

TEST(ConfigJson, RoundTripAndStrictKeys) {
  ModelConfig c;
  c.vocab_size = 32000;
  c.n_layer = 3;
  c.n_head = 8;
  c.n_kv_head = 2;
  c.d_model = 256;
  c.norm = NormKind::RmsNorm;
  c.mlp = MlpKind::SwiGlu;
  c.pos = PosKind::Rope;
  c.rope_theta = 500000.0f;
  c.block = BlockKind::Parallel;
  c.window = 128;
  c.tied_embeddings = false;
  c.bias = false;
  c.norm_eps = 1e-6f;
  c.init_std = 0.01f;
  c.recompute = {true, false, true};
  c.recompute_act = true;
  c.recompute_norm = true;
  json j = model_config_to_json(c);
  // The kinds keep their user-facing spelling in manifests (extra.model), so older checkpoints still load.
  EXPECT_EQ(j["norm"], "rmsnorm");
  EXPECT_EQ(j["mlp"], "swiglu");
  EXPECT_EQ(j["pos"], "rope");
  EXPECT_EQ(j["block"], "parallel");
  const json defaults = model_config_to_json(ModelConfig());
  EXPECT_EQ(defaults["norm"], "layernorm");
  EXPECT_EQ(defaults["mlp"], "gelu");
  EXPECT_EQ(defaults["pos"], "learned");
  EXPECT_EQ(defaults["block"], "sequential");
  EXPECT_EQ(j["norm_eps"], 1e-6);  // written as the short decimal, not 9.99999997e-07
  ModelConfig back = model_config_from_json(json::parse(j.dump()));
  EXPECT_EQ(model_config_to_json(back), j);
  EXPECT_EQ(back.recompute, c.recompute);
  EXPECT_TRUE(back.recompute_act);
  EXPECT_TRUE(back.recompute_norm);
  EXPECT_EQ(back.norm_eps, c.norm_eps);
  EXPECT_EQ(back.rope_theta, c.rope_theta);
  // Absent keys keep defaults.
  EXPECT_EQ(model_config_from_json(json::object()).d_model, ModelConfig().d_model);
  EXPECT_ERROR_HAS(model_config_from_json({{"n_layers", 3}}), "unknown model config key 'n_layers'");
  EXPECT_ERROR_HAS(model_config_from_json({{"n_layer", "3"}}), "'n_layer' must be an integer");
  EXPECT_ERROR_HAS(model_config_from_json({{"bias", 1}}), "'bias' must be true or false");
  // Values from a manifest are validated like a config's (issue 10: window = 2^31-1 crashed generate, norm_eps = -1
  // was accepted and changed its output); from a manifest, the error names it.
  EXPECT_ERROR_HAS(model_config_from_json({{"window", 2147483647}}), "model.window = 2147483647 is out of range");
  EXPECT_ERROR_HAS(model_config_from_json({{"norm_eps", -1}}), "model.norm_eps = -1 is out of range");
  EXPECT_ERROR_HAS(model_config_from_json({{"init_std", 1e39}}), "model.init_std = inf is out of range");
  EXPECT_ERROR_HAS(model_config_from_manifest({{"model", {{"n_layer", 2147483647}}}}, "/ck/step_1"),
                   "checkpoint /ck/step_1: manifest.json, extra.model: model.n_layer = 2147483647 is out of range");
  EXPECT_ERROR_HAS(model_config_from_manifest(json::object(), "/ck/step_1"), "/ck/step_1", "no model config");
  EXPECT_ERROR_HAS(model_config_from_manifest(json(3), "/ck/step_1"), "/ck/step_1", "no model config");
  EXPECT_ERROR_HAS(model_config_from_json({{"norm", "batchnorm"}}), "model.norm must be 'layernorm' or 'rmsnorm'");
  EXPECT_ERROR_HAS(model_config_from_json({{"block", 2}}), "'block' must be a string");
  EXPECT_ERROR_HAS(model_config_from_json(json::array()), "must be a JSON object");
}

TEST(ModelWeights, LoadsFromHfFilesAndCheckpoints) {
  ScratchDir dir;
  HfModel m = tiny_hf();
  std::filesystem::create_directories(dir / "hf");
  write_text(dir / "hf/config.json", R"({"model_type": "gpt2", "n_head": 2})");
  ModelConfig c = tiny_cfg();
  write_hf(dir / "hf/model.safetensors", m);

  ParamStore from_hf;
  EXPECT_TRUE(load_model_weights(dir / "hf/model.safetensors", c, from_hf));
  expect_matches_hf(from_hf, m);

  // HF -> checkpoint (what `megatrain convert --from-hf` does), then load it back.
  std::string step_dir = convert_hf_to_checkpoint(dir / "hf/model.safetensors", dir / "ck");
  EXPECT_EQ(step_dir, dir / "ck/step_00000000");
  Checkpoint ck = Checkpoint::load(dir / "ck");
  EXPECT_EQ(ck.step(), 0);
  ModelConfig stored = model_config_from_json(ck.extra()["model"]);
  EXPECT_EQ(stored.n_head, H);
  EXPECT_EQ(model_config_of(dir / "ck").n_layer, L);
  for (std::string where : {dir / "ck", step_dir, step_dir + "/model.safetensors"}) {
    SCOPED_TRACE(where);
    ParamStore s;
    EXPECT_FALSE(load_model_weights(where, c, s));
    expect_matches_hf(s, m);
  }
  // A different vocab padding loads (the real rows are what count).
  ModelConfig pad = c;
  pad.vocab_pad_to = 64;
  ParamStore sp;
  load_model_weights(dir / "ck", pad, sp);
  EXPECT_EQ(sp.param("wte.weight").size(0), 64);
  EXPECT_EQ(std::memcmp(sp.param("wte.weight").ptr, m["wte.weight"].v.data(), V * C * 4), 0);
  // Architecture mismatches are named.
  ModelConfig heads = c;
  heads.n_head = 4;
  ParamStore sh;
  EXPECT_ERROR_HAS(load_model_weights(dir / "ck", heads, sh), "model.n_head = 2 but the config says 4");
  ParamStore sh2;
  EXPECT_ERROR_HAS(load_model_weights(dir / "hf/model.safetensors", heads, sh2), "n_head");
  ModelConfig layers = c;
  layers.n_layer = 3;
  ParamStore sl;
  EXPECT_ERROR_HAS(load_model_weights(dir / "hf/model.safetensors", layers, sl), "model.n_layer = 2");

  // checkpoint -> HF (`convert --to-hf`) gives back the original tensors.
  convert_checkpoint_to_hf(dir / "ck", dir / "back/model.safetensors");
  auto back = SafetensorsFile::open(dir / "back/model.safetensors");
  for (auto& [n, t] : m) EXPECT_EQ(std::memcmp(back.get(n).data, t.v.data(), t.v.size() * 4), 0) << n;
  EXPECT_TRUE(file_exists(dir / "back/config.json"));
  // Converting into a directory that already holds checkpoints would repoint its `latest`: refused.
  EXPECT_ERROR_HAS(convert_hf_to_checkpoint(dir / "hf/model.safetensors", dir / "ck"), "already holds checkpoints");
}
