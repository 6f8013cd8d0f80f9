// HF Llama interop. The oracle is a naive double-precision forward written here from HF's LlamaForCausalLM
// (modeling_llama.py): RMSNorm, q/k/v projections, RoPE through rotate_half, repeat_kv for grouped-query attention,
// causal softmax, o_proj, down(silu(gate) * up), final norm, lm_head. It reads the HF tensors by their HF names, so
// it shares nothing with megatrain's name mapping or kernels. A tiny random Llama in HF's layout must give the same
// logits after import as this forward; export must give back HF's tensors bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "support/ckpt_testutil.h"
#include "support/files.h"
#include "support/hf_llama_oracle.h"
#include "megatrain/ckpt/config_json.h"
#include "megatrain/ckpt/hf_llama.h"
#include "megatrain/ckpt/hf_model.h"
#include "megatrain/ckpt/hf_model_files.h"
#include "megatrain/ckpt/model_weights.h"
#include "megatrain/core/bf16.h"
#include "megatrain/core/fs.h"
#include "megatrain/kernels/ops.h"
#include "megatrain/model/gpt.h"
#include "megatrain/model/layout.h"

using namespace mt;
using namespace ckpt_test;
using nlohmann::json;

namespace {

// V not a multiple of the vocabulary padding, F not a multiple of 64 (not the Llama rule), two query heads per
// key/value head.
constexpr int V = 37, C = 32, H = 4, KV = 2, HD = C / H, F = 40, L = 2, T = 7;
constexpr double kEps = 1e-6, kTheta = 5000.0;

using hf_oracle::HfModel;
using hf_oracle::HfTensor;
using hf_oracle::matvec;
using hf_oracle::read_back;
using hf_oracle::Vec;

HfModel random_llama(bool tied, bool bf16_values = false, uint32_t seed = 7) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 0.25f);
  HfModel m;
  auto add = [&](const std::string& n, std::vector<int64_t> shape, float mean = 0.0f) {
    HfTensor t{shape, {}};
    int64_t k = 1;
    for (auto d : shape) k *= d;
    for (int64_t i = 0; i < k; ++i) {
      const float x = mean + normal(gen);
      t.v.push_back(bf16_values ? round_bf16(x) : x);
    }
    m[n] = t;
  };
  add("model.embed_tokens.weight", {V, C});
  for (int l = 0; l < L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {C}, 1.0f);
    add(p + "self_attn.q_proj.weight", {H * HD, C});
    add(p + "self_attn.k_proj.weight", {KV * HD, C});
    add(p + "self_attn.v_proj.weight", {KV * HD, C});
    add(p + "self_attn.o_proj.weight", {C, H * HD});
    add(p + "post_attention_layernorm.weight", {C}, 1.0f);
    add(p + "mlp.gate_proj.weight", {F, C});
    add(p + "mlp.up_proj.weight", {F, C});
    add(p + "mlp.down_proj.weight", {C, F});
  }
  add("model.norm.weight", {C}, 1.0f);
  if (!tied) add("lm_head.weight", {V, C});
  return m;
}

json llama_config(bool tied) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", V},
          {"hidden_size", C},
          {"intermediate_size", F},
          {"num_hidden_layers", L},
          {"num_attention_heads", H},
          {"num_key_value_heads", KV},
          {"max_position_embeddings", 64},
          {"rms_norm_eps", kEps},
          {"rope_theta", kTheta},
          {"hidden_act", "silu"},
          {"tie_word_embeddings", tied},
          {"attention_bias", false},
          {"rope_scaling", nullptr},
          {"torch_dtype", "float32"}};
}

// Writes m into dir as save_pretrained does: config.json and model.safetensors, or (shards > 1) the tensors dealt
// round-robin into model-0000k-of-0000n.safetensors with model.safetensors.index.json.
void write_llama(const std::string& dir, const HfModel& m, const json& config, int shards = 1,
                 DType dtype = DType::F32) {
  std::filesystem::create_directories(dir);
  write_text(dir + "/config.json", config.dump(2));
  std::vector<std::vector<TensorRef>> files(shards);
  static std::vector<std::vector<uint16_t>> halves;  // kept alive until written
  halves.clear();
  halves.reserve(m.size());
  int k = 0;
  for (auto& [n, t] : m) {
    TensorRef r{n, DType::F32, t.shape, t.v.data()};
    if (dtype == DType::BF16) {
      auto& h = halves.emplace_back();
      for (float x : t.v) h.push_back(float_to_bf16(x));
      r.dtype = DType::BF16;
      r.data = h.data();
    }
    files[k++ % shards].push_back(r);
  }
  if (shards == 1) {
    write_safetensors(dir + "/model.safetensors", files[0], {{"format", "pt"}});
    return;
  }
  json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
  for (int s = 0; s < shards; ++s) {
    const std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards);
    for (auto& r : files[s]) index["weight_map"][r.name] = name;
    write_safetensors(dir + "/" + name, files[s], {{"format", "pt"}});
  }
  write_text(dir + "/model.safetensors.index.json", index.dump(2));
}

// ---- the oracle: HF's Llama forward, in double (its attention: support/hf_llama_oracle.h) --------------------
Vec rms_norm(const Vec& x, const HfTensor& w) { return hf_oracle::rms_norm(x, w, kEps); }  // LlamaRMSNorm

// config.json's rope_scaling of type "llama3" (absent: factor 0).
struct Llama3Scaling {
  double factor = 0, low = 1, high = 4, original = 8192;
};

// The inverse frequencies of modeling_rope_utils: the default ones, rescaled by _compute_llama3_parameters.
double hf_inv_freq(int i, const Llama3Scaling& sc) {
  const double inv = 1.0 / std::pow(kTheta, (2.0 * i) / HD);
  if (sc.factor == 0) return inv;
  const double wavelen = 2 * M_PI / inv;
  double out = wavelen > sc.original / sc.low ? inv / sc.factor : inv;
  const double smooth = (sc.original / wavelen - sc.low) / (sc.high - sc.low);
  if (!(wavelen < sc.original / sc.high) && !(wavelen > sc.original / sc.low))
    out = (1 - smooth) * out / sc.factor + smooth * out;
  return out;
}

// logits [T][V] of HF's LlamaForCausalLM on one sequence.
// window > 0: Mistral's sliding window, transformers' sliding_window_overlay: key s is seen from t when s > t - W.
std::vector<Vec> hf_llama_logits(const HfModel& m, const std::vector<int32_t>& tokens, bool tied,
                                 const Llama3Scaling& sc, int window = 0) {
  const int n = static_cast<int>(tokens.size());
  const hf_oracle::AttentionShape shape{H, KV, HD, kEps, [&sc](int i) { return hf_inv_freq(i, sc); }, window};
  std::vector<Vec> x(n, Vec(C));
  for (int t = 0; t < n; ++t)
    for (int c = 0; c < C; ++c) x[t][c] = m.at("model.embed_tokens.weight").v[tokens[t] * C + c];
  for (int l = 0; l < L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const std::vector<Vec> att = hf_oracle::attention(m, p, x, shape);
    for (int t = 0; t < n; ++t) {
      for (int c = 0; c < C; ++c) x[t][c] += att[t][c];
      const Vec h2 = rms_norm(x[t], m.at(p + "post_attention_layernorm.weight"));
      const Vec g = matvec(m.at(p + "mlp.gate_proj.weight"), h2), u = matvec(m.at(p + "mlp.up_proj.weight"), h2);
      Vec act(F);
      for (int f = 0; f < F; ++f) act[f] = g[f] / (1.0 + std::exp(-g[f])) * u[f];  // silu(gate) * up
      const Vec d = matvec(m.at(p + "mlp.down_proj.weight"), act);
      for (int c = 0; c < C; ++c) x[t][c] += d[c];
    }
  }
  std::vector<Vec> logits(n);
  const HfTensor& head = m.at(tied ? "model.embed_tokens.weight" : "lm_head.weight");
  for (int t = 0; t < n; ++t) logits[t] = matvec(head, rms_norm(x[t], m.at("model.norm.weight")));
  return logits;
}

// The sequence every forward here runs.
const std::vector<int32_t> kTokens = {3, 36, 0, 17, 17, 5, 29};

double max_abs_diff(const std::vector<Vec>& a, const std::vector<Vec>& b) {
  double d = 0;
  for (size_t t = 0; t < a.size(); ++t)
    for (size_t j = 0; j < a[t].size(); ++j) d = std::max(d, std::abs(a[t][j] - b[t][j]));
  return d;
}

// Our logits for the model stored at `weights` (an HF directory or a checkpoint), against the oracle's.
void expect_logits_match(const std::string& weights, const HfModel& m, bool tied, const Llama3Scaling& sc = {},
                         int window = 0) {
  const ModelConfig cfg = model_config_of(weights);
  auto ops = make_cpu_ops();
  GPT gpt(cfg, *ops);
  load_model_weights(weights, cfg, gpt.params());
  const Tensor logits = gpt.logits(kTokens.data(), 1, T);
  const std::vector<Vec> want = hf_llama_logits(m, kTokens, tied, sc, window);
  const float* got = logits.f32();
  const int64_t Vp = cfg.padded_vocab();
  // fp32 against double: each logit comes through two layers of dot products of at most 40 terms of O(1) values,
  // so its rounding error is a small multiple of 40 x 2^-24 x |terms| ~ 1e-5; the largest seen is 2.1e-6. A wrong
  // rotation pairing, head grouping or gate/up order moves logits by O(0.1).
  EXPECT_LT(hf_oracle::worst_logit_error(got, Vp, want), 2e-5) << weights;
}

}  // namespace

TEST(HfLlama, ImportComputesWhatHfsLlamaComputes) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    ScratchDir dir;
    const HfModel m = random_llama(tied);
    write_llama(dir / "hf", m, llama_config(tied));
    const ModelConfig c = model_config_of(dir / "hf");
    EXPECT_EQ(c.norm, NormKind::RmsNorm);
    EXPECT_EQ(c.mlp, MlpKind::SwiGlu);
    EXPECT_EQ(c.pos, PosKind::Rope);
    EXPECT_FALSE(c.bias);
    EXPECT_EQ(c.n_head, H);
    EXPECT_EQ(c.kv_heads(), KV);
    EXPECT_EQ(c.ff_dim(), F);
    EXPECT_EQ(c.vocab_size, V);
    EXPECT_EQ(c.max_seq_len, 64);
    EXPECT_EQ(c.norm_eps, float(kEps));
    EXPECT_EQ(c.rope_theta, float(kTheta));
    EXPECT_EQ(c.tied_embeddings, tied);
    expect_logits_match(dir / "hf", m, tied);  // straight from the HF directory (model.init_from)
    convert_hf_to_checkpoint(dir / "hf", dir / "ck");
    expect_logits_match(dir / "ck", m, tied);  // through `megatrain convert --from-hf`
  }
}

TEST(HfLlama, TheFileTheIndexAndBf16AllReadTheSame) {
  ScratchDir dir;
  const HfModel m = random_llama(false, /*bf16_values=*/true);  // exact in bf16, so every form holds the same values
  write_llama(dir / "one", m, llama_config(false));
  write_llama(dir / "sharded", m, llama_config(false), 3);
  write_llama(dir / "bf16", m, llama_config(false), 2, DType::BF16);
  const HfModelFiles sharded = HfModelFiles::open(dir / "sharded");
  EXPECT_EQ(sharded.num_files(), 3u);
  for (const std::string& where : {dir / "one", dir / "one/model.safetensors", dir / "sharded",
                                   dir / "sharded/model.safetensors.index.json", dir / "bf16"}) {
    SCOPED_TRACE(where);
    ParamStore s;
    EXPECT_TRUE(load_model_weights(where, model_config_of(where), s));
    ParamStore ref;
    load_model_weights(dir / "one", model_config_of(dir / "one"), ref);
    ASSERT_EQ(s.total_floats(), ref.total_floats());
    EXPECT_EQ(std::memcmp(s.params_data(), ref.params_data(), s.total_floats() * sizeof(float)), 0);
  }
  expect_logits_match(dir / "bf16", m, false);
}

TEST(HfLlama, ExportGivesBackHfsTensorsAndAConfigHfReads) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    ScratchDir dir;
    const HfModel m = random_llama(tied);
    write_llama(dir / "hf", m, llama_config(tied));
    convert_hf_to_checkpoint(dir / "hf", dir / "ck");
    const ModelConfig c = convert_checkpoint_to_hf(dir / "ck", dir / "out/model.safetensors");
    EXPECT_EQ(c.n_head, H);
    const HfModel back = read_back(dir / "out/model.safetensors");
    ASSERT_EQ(back.size(), m.size());  // the same names, nothing more (no padding rows, no tied lm_head)
    for (auto& [n, t] : m) {
      SCOPED_TRACE(n);
      ASSERT_TRUE(back.count(n));
      EXPECT_EQ(back.at(n).shape, t.shape);
      EXPECT_EQ(std::memcmp(back.at(n).v.data(), t.v.data(), t.v.size() * sizeof(float)), 0);
    }
    const json cj = json::parse(read_text_file(dir / "out/config.json"));
    const json want = llama_config(tied);
    for (auto& [k, v] : want.items()) EXPECT_EQ(cj.at(k), v) << k;  // HF's own keys and values
    EXPECT_EQ(cj.at("head_dim"), HD);
    EXPECT_EQ(cj.at("mlp_bias"), false);
    // What was exported imports again to the same network.
    expect_logits_match(dir / "out", m, tied);
  }
}

// What a tensor- or pipeline-parallel rank reads (HfSliceReader): every box of every parameter, from the sharded
// bf16 files, must hold exactly the elements the whole-model import put there, and vocabulary rows past the
// real ones (a tp layout pads further) read as zero.
TEST(HfLlama, SlicesEqualTheWholeImportBoxByBox) {
  ScratchDir dir;
  const HfModel m = random_llama(false, /*bf16_values=*/true);
  write_llama(dir / "hf", m, llama_config(false), 3, DType::BF16);
  const HfModelFiles files = HfModelFiles::open(dir / "hf");
  const ModelConfig cfg = model_config_of(dir / "hf");
  ParamStore whole;
  load_model_weights(dir / "hf", cfg, whole);
  HfSliceReader reader(files, cfg);
  std::mt19937 gen(3);
  for (const ParamInfo& p : whole.infos()) {
    SCOPED_TRACE(p.name);
    const float* ref = whole.param(p.name).f32();
    const int64_t R = p.shape[0], C = p.shape.size() == 2 ? p.shape[1] : 1;
    for (int trial = 0; trial < 6; ++trial) {
      // A random box, written at an offset into a larger destination (as a shard's box is).
      const int64_t r0 = std::uniform_int_distribution<int64_t>(0, R - 1)(gen);
      const int64_t nr = std::uniform_int_distribution<int64_t>(1, R - r0)(gen);
      const int64_t c0 = std::uniform_int_distribution<int64_t>(0, C - 1)(gen);
      const int64_t nc = std::uniform_int_distribution<int64_t>(1, C - c0)(gen);
      const bool two = p.shape.size() == 2;
      const Slice src = two ? Slice{{r0, c0}, {nr, nc}} : Slice{{r0}, {nr}};
      const std::vector<int64_t> dshape = two ? std::vector<int64_t>{nr + 2, nc + 3} : std::vector<int64_t>{nr + 2};
      const std::vector<int64_t> dstart = two ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{1};
      std::vector<float> out(static_cast<size_t>(shape_numel(dshape)), -7.0f);
      reader.read(p.name, src, out.data(), dshape, dstart);
      for (int64_t i = 0; i < nr; ++i)
        for (int64_t j = 0; j < (two ? nc : 1); ++j) {
          const float got = two ? out[(1 + i) * (nc + 3) + 2 + j] : out[1 + i];
          ASSERT_EQ(got, ref[(r0 + i) * C + (two ? c0 + j : 0)]) << src.str() << " at " << i << "," << j;
        }
      EXPECT_EQ(out[0], -7.0f);  // nothing outside the box is written
    }
  }
  // Rows past the real vocabulary (a tp layout pads the vocabulary further) read as zeros, whatever the padding.
  std::vector<float> pad(4 * C, -7.0f);
  reader.read("wte.weight", Slice{{V - 1, 0}, {4, C}}, pad.data(), {4, C}, {0, 0});
  for (int64_t j = 0; j < C; ++j) EXPECT_EQ(pad[j], m.at("model.embed_tokens.weight").v[(V - 1) * C + j]);
  for (int64_t k = C; k < 4 * C; ++k) EXPECT_EQ(pad[k], 0.0f) << k;
  // A model the files do not hold is refused when the reader is made, naming the field.
  ModelConfig other = cfg;
  other.n_kv_head = H;
  EXPECT_NE(error_of([&] { HfSliceReader(files, other); }).find("model.n_kv_head = 2 but the config says 4"),
            std::string::npos);
}

TEST(HfLlama, ABf16ExportHoldsEachWeightToHalfABf16Step) {
  ScratchDir dir;
  const HfModel m = random_llama(false);
  write_llama(dir / "hf", m, llama_config(false));
  convert_hf_to_checkpoint(dir / "hf", dir / "ck");
  convert_checkpoint_to_hf(dir / "ck", dir / "f32/model.safetensors");
  convert_checkpoint_to_hf(dir / "ck", dir / "bf16/model.safetensors", DType::BF16);
  const HfModelFiles f = HfModelFiles::open(dir / "bf16");
  for (auto& [n, t] : m) {
    SCOPED_TRACE(n);
    EXPECT_EQ(f.tensor(n).dtype_str, "BF16");
    const std::vector<float> got = f.read_f32(n);
    ASSERT_EQ(got.size(), t.v.size());
    // Rounded to nearest: within half a bf16 step, 2^-8 of the value (8 significant bits), and the error is not a
    // truncation's (which would be one-sided and up to a whole step).
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_LE(std::abs(double(got[i]) - t.v[i]), std::ldexp(std::abs(double(t.v[i])), -8)) << i;
  }
  EXPECT_EQ(json::parse(read_text_file(dir / "bf16/config.json")).at("torch_dtype"), "bfloat16");
  EXPECT_EQ(json::parse(read_text_file(dir / "f32/config.json")).at("torch_dtype"), "float32");
  const auto bytes = [&](const std::string& p) { return std::filesystem::file_size(p); };
  EXPECT_LT(bytes(dir / "bf16/model.safetensors"), bytes(dir / "f32/model.safetensors") * 0.55);
}

// Llama 3.1 and later scale RoPE's low frequencies for long contexts (rope_type "llama3"). The band here puts
// head_dim 8's four wavelengths (6.3, 53, 444, 3737 at theta 5000) into every regime: kept (< 64 / 4), interpolated,
// divided (> 64 / 1), so a model that ignored the scaling, or got a regime wrong, gives other logits.
TEST(HfLlama, Llama31RopeScalingImportsExportsAndComputesAsHfDoes) {
  ScratchDir dir;
  const HfModel m = random_llama(false);
  json config = llama_config(false);
  config["rope_scaling"] = {{"rope_type", "llama3"},
                            {"factor", 8.0},
                            {"low_freq_factor", 1.0},
                            {"high_freq_factor", 4.0},
                            {"original_max_position_embeddings", 64}};
  write_llama(dir / "hf", m, config);
  const ModelConfig c = model_config_of(dir / "hf");
  EXPECT_EQ(c.rope_scaling, 8.0f);
  EXPECT_EQ(c.rope_original_max_len, 64);
  const Llama3Scaling sc{8.0, 1.0, 4.0, 64.0};
  expect_logits_match(dir / "hf", m, false, sc);
  // The scaling matters at these positions: the unscaled HF forward is far from what was computed.
  EXPECT_GT(max_abs_diff(hf_llama_logits(m, kTokens, false, sc), hf_llama_logits(m, kTokens, false, {})), 1e-3);
  // Exported, the scaling is written as HF writes it, and the file reads back as the same network.
  convert_hf_to_checkpoint(dir / "hf", dir / "ck");
  convert_checkpoint_to_hf(dir / "ck", dir / "out/model.safetensors");
  const json back = json::parse(read_text_file(dir / "out/config.json"));
  EXPECT_EQ(back.at("rope_scaling"), config["rope_scaling"]);
  expect_logits_match(dir / "out", m, false, sc);
  // transformers 5 spells it rope_parameters, with rope_theta inside.
  json v5 = llama_config(false);
  v5.erase("rope_theta");
  v5.erase("rope_scaling");
  v5["rope_parameters"] = config["rope_scaling"];
  v5["rope_parameters"]["rope_theta"] = kTheta;
  write_llama(dir / "v5", m, v5);
  expect_logits_match(dir / "v5", m, false, sc);
}

// Mistral is Llama with sliding-window attention (MegaScale's SWA, model.window): a window of 3 over 7 positions
// hides keys from every query past the third, so the full-attention forward would give other logits.
TEST(HfLlama, MistralIsLlamaWithASlidingWindow) {
  ScratchDir dir;
  const HfModel m = random_llama(false);
  json config = llama_config(false);
  config["architectures"] = {"MistralForCausalLM"};
  config["model_type"] = "mistral";
  config["sliding_window"] = 3;
  config.erase("attention_bias");  // not a MistralConfig key
  write_llama(dir / "hf", m, config);
  EXPECT_EQ(model_config_of(dir / "hf").window, 3);
  expect_logits_match(dir / "hf", m, false, {}, 3);
  EXPECT_GT(max_abs_diff(hf_llama_logits(m, kTokens, false, {}, 3), hf_llama_logits(m, kTokens, false, {}, 0)), 1e-3);
  // A megatrain model with a window exports as Mistral, and reads back as the same network.
  convert_hf_to_checkpoint(dir / "hf", dir / "ck");
  convert_checkpoint_to_hf(dir / "ck", dir / "out/model.safetensors");
  const json back = json::parse(read_text_file(dir / "out/config.json"));
  EXPECT_EQ(back.at("model_type"), "mistral");
  EXPECT_EQ(back.at("architectures"), json::array({"MistralForCausalLM"}));
  EXPECT_EQ(back.at("sliding_window"), 3);
  EXPECT_FALSE(back.contains("attention_bias"));
  expect_logits_match(dir / "out", m, false, {}, 3);
  // null: full attention.
  config["sliding_window"] = nullptr;
  write_llama(dir / "full", m, config);
  EXPECT_EQ(model_config_of(dir / "full").window, 0);
  // A Llama config does not have one: a sliding_window there is a mistake, not a setting to drop.
  json llama = llama_config(false);
  llama["sliding_window"] = 3;
  write_llama(dir / "llama", m, llama);
  EXPECT_NE(error_of([&] { model_config_of(dir / "llama"); }).find("sliding_window is a Mistral setting"),
            std::string::npos);
}

TEST(HfLlama, WhatMegatrainCannotComputeIsRefusedByName) {
  ScratchDir dir;
  const HfModel m = random_llama(false);
  auto refused = [&](const std::string& name, json config, std::initializer_list<const char*> parts) {
    SCOPED_TRACE(name);
    write_llama(dir / name, m, config);
    const std::string e = error_of([&] { model_config_of(dir / name); });
    for (const char* p : parts) EXPECT_NE(e.find(p), std::string::npos) << e;
  };
  json c = llama_config(false);
  c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  refused("scaling", c, {"config.json", "rope_scaling.original_max_position_embeddings is missing"});
  c = llama_config(false);
  c["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0}};
  refused("yarn", c, {"rope_parameters of type \"yarn\" is not supported"});
  c = llama_config(false);
  c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  refused("linear", c, {"rope_scaling of type \"linear\" is not supported"});
  c = llama_config(false);
  c["attention_bias"] = true;
  refused("qkv-bias", c, {"attention_bias = true"});
  c = llama_config(false);
  c["hidden_act"] = "gelu";
  refused("gelu", c, {"hidden_act", "gelu", "silu"});
  c = llama_config(false);
  c["head_dim"] = 16;
  refused("head-dim", c, {"head_dim = 16", "8 wide"});
  c = llama_config(false);
  c.erase("num_attention_heads");
  refused("no-heads", c, {"num_attention_heads is missing"});
  c = llama_config(false);
  c["num_key_value_heads"] = "two";
  refused("kv-type", c, {"num_key_value_heads must be a positive integer", "\"two\""});
  c = llama_config(false);
  c["model_type"] = "qwen2";
  refused("qwen", c, {"\"qwen2\"", "\"gpt2\", \"llama\", \"mistral\" and \"mixtral\""});
  c = llama_config(false);
  c["num_hidden_layers"] = 1;  // the file holds two: the second would be lost
  refused("fewer-layers", c, {"num_hidden_layers = 1", "holds a layer 1"});

  // No config.json: the head count is not in the shapes.
  write_llama(dir / "bare", m, llama_config(false));
  std::filesystem::remove(dir / "bare/config.json");
  EXPECT_NE(error_of([&] { model_config_of(dir / "bare/model.safetensors"); }).find("needs the config.json"),
            std::string::npos);
  EXPECT_NE(error_of([&] { model_config_of(dir / "bare"); }).find("needs the config.json"), std::string::npos);

  // Shapes that disagree with the config, missing and extra tensors, a tied head that differs from the embedding.
  auto import_error = [&](const std::string& name, const HfModel& mm, const json& config) {
    write_llama(dir / name, mm, config);
    ParamStore s;
    return error_of([&] { load_model_weights(dir / name, model_config_of(dir / name), s); });
  };
  HfModel bad = m;
  bad["model.layers.1.self_attn.k_proj.weight"].shape = {HD, C * KV};
  EXPECT_NE(import_error("shape", bad, llama_config(false))
                .find("'model.layers.1.self_attn.k_proj.weight' has shape "
                      "[8, 64] but this model (h.1.attn.c_attn.weight) "
                      "needs [16, 32]"),
            std::string::npos);
  bad = m;
  bad.erase("model.layers.0.mlp.up_proj.weight");
  EXPECT_NE(import_error("missing", bad, llama_config(false)).find("no tensor 'model.layers.0.mlp.up_proj.weight'"),
            std::string::npos);
  bad = m;
  bad["model.layers.0.self_attn.q_proj.bias"] = {{H * HD}, std::vector<float>(H * HD, 1.0f)};
  EXPECT_NE(import_error("extra", bad, llama_config(false)).find("have no place in a Llama with this config"),
            std::string::npos);
  bad = m;
  bad["model.layers.0.self_attn.rotary_emb.inv_freq"] = {{HD / 2}, std::vector<float>(HD / 2, 1.0f)};
  ParamStore ok;
  write_llama(dir / "inv-freq", bad, llama_config(false));
  EXPECT_NO_THROW(load_model_weights(dir / "inv-freq", model_config_of(dir / "inv-freq"), ok));  // a buffer: skipped
  EXPECT_NE(import_error("untied-head", m, llama_config(true)).find("differs from model.embed_tokens.weight"),
            std::string::npos);
  EXPECT_NE(import_error("no-head", random_llama(true), llama_config(false)).find("no lm_head.weight"),
            std::string::npos);
}

TEST(HfLlama, ABrokenIndexIsNamed) {
  ScratchDir dir;
  const HfModel m = random_llama(false);
  write_llama(dir / "hf", m, llama_config(false), 2);
  const std::string index = dir / "hf/model.safetensors.index.json";
  const json good = json::parse(read_text_file(index));
  auto with_index = [&](const json& ix) {
    write_text(index, ix.dump());
    return error_of([&] { HfModelFiles::open(dir / "hf"); });
  };
  json ix = good;
  ix["weight_map"]["model.norm.weight"] = "model-00009-of-00009.safetensors";
  EXPECT_NE(with_index(ix).find("which does not exist"), std::string::npos);
  ix = good;
  ix["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors";
  EXPECT_NE(with_index(ix).find("is not a file name in the index's folder"), std::string::npos);
  ix = good;
  const std::string norm_file = good["weight_map"]["model.norm.weight"];
  ix["weight_map"]["model.norm.weight"] = norm_file == "model-00001-of-00002.safetensors"
                                              ? "model-00002-of-00002.safetensors"
                                              : "model-00001-of-00002.safetensors";
  EXPECT_NE(with_index(ix).find("which does not hold it"), std::string::npos);
  ix = good;
  ix["weight_map"].erase("model.norm.weight");
  EXPECT_NE(with_index(ix).find("holds tensor 'model.norm.weight', which the index does not list"), std::string::npos);
  ix = good;
  ix.erase("weight_map");
  EXPECT_NE(with_index(ix).find("weight_map"), std::string::npos);
  write_text(index, "{");
  EXPECT_NE(error_of([&] { HfModelFiles::open(dir / "hf"); }).find("is not valid JSON"), std::string::npos);
}

TEST(HfLlama, AModelNeitherFormatHoldsIsRefusedWithBothReasons) {
  ScratchDir dir;
  ModelConfig c;
  c.vocab_size = V;
  c.n_layer = 1;
  c.n_head = 2;
  c.d_model = 16;
  c.max_seq_len = 16;
  c.norm = NormKind::RmsNorm;  // neither GPT-2 (layernorm) nor Llama (gelu, learned positions, biases)
  ParamStore s;
  declare_gpt_params(c, s);
  s.allocate();
  save_checkpoint(dir / "ck", 0, {{kModelFile, param_tensor_refs(s)}}, {{kModelConfigKey, model_config_to_json(c)}});
  const std::string e = error_of([&] { convert_checkpoint_to_hf(dir / "ck", dir / "out/model.safetensors"); });
  EXPECT_NE(e.find("neither the GPT-2 nor the Llama layout"), std::string::npos) << e;
  EXPECT_NE(e.find("HF GPT-2 cannot express model.norm = 'rmsnorm'"), std::string::npos) << e;
  EXPECT_NE(e.find("HF Llama cannot express model.mlp = 'gelu'"), std::string::npos) << e;
  EXPECT_FALSE(std::filesystem::exists(dir / "out/model.safetensors"));
}
