// HF Mixtral interop. The oracle is a naive double-precision forward written here from HF's MixtralForCausalLM
// (modeling_mixtral.py): RMSNorm, q/k/v projections, RoPE through rotate_half, repeat_kv for grouped-query attention,
// causal softmax, o_proj; then MixtralSparseMoeBlock: router logits = gate(x), softmax over the E experts, the top k
// probabilities renormalised to sum 1, each chosen expert w2(silu(w1 x) * w3 x) weighted by its probability and
// summed; final norm, lm_head. It reads the HF tensors by their HF names, so it shares nothing with megatrain's name
// mapping, router or kernels. A tiny random Mixtral in HF's layout must give the same logits after import as this
// forward; export must give back HF's tensors bit for bit; bad files are refused naming the tensor or key.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "support/ckpt_testutil.h"
#include "support/files.h"
#include "support/hf_llama_oracle.h"
#include "megatrain/ckpt/hf_model.h"
#include "megatrain/ckpt/hf_model_files.h"
#include "megatrain/ckpt/model_weights.h"
#include "megatrain/model/layout.h"
#include "megatrain/ckpt/safetensors.h"
#include "megatrain/core/fs.h"
#include "megatrain/kernels/ops.h"
#include "megatrain/model/gpt.h"

using namespace mt;
using namespace ckpt_test;
using nlohmann::json;

namespace {

// V not a multiple of the vocabulary padding, two query heads per key/value head, E = 4 experts of width F, k = 2.
constexpr int V = 37, C = 32, H = 4, KV = 2, HD = C / H, F = 48, E = 4, K = 2, L = 2, T = 7;
constexpr double kEps = 1e-6, kTheta = 5000.0;

using hf_oracle::HfModel;
using hf_oracle::HfTensor;
using hf_oracle::matvec;
using hf_oracle::read_back;
using hf_oracle::Vec;

HfModel random_mixtral(bool tied, uint32_t seed = 11) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 0.25f);
  HfModel m;
  auto add = [&](const std::string& n, std::vector<int64_t> shape, float mean = 0.0f) {
    HfTensor t{shape, {}};
    const int64_t k = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
    for (int64_t i = 0; i < k; ++i) t.v.push_back(mean + normal(gen));
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
    add(p + "block_sparse_moe.gate.weight", {E, C});
    for (int e = 0; e < E; ++e) {
      const std::string x = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
      add(x + "w1.weight", {F, C});
      add(x + "w2.weight", {C, F});
      add(x + "w3.weight", {F, C});
    }
  }
  add("model.norm.weight", {C}, 1.0f);
  if (!tied) add("lm_head.weight", {V, C});
  return m;
}

json mixtral_config(bool tied) {
  return {{"architectures", {"MixtralForCausalLM"}},
          {"model_type", "mixtral"},
          {"vocab_size", V},
          {"hidden_size", C},
          {"intermediate_size", F},
          {"num_hidden_layers", L},
          {"num_attention_heads", H},
          {"num_key_value_heads", KV},
          {"num_local_experts", E},
          {"num_experts_per_tok", K},
          {"max_position_embeddings", 64},
          {"rms_norm_eps", kEps},
          {"rope_theta", kTheta},
          {"hidden_act", "silu"},
          {"sliding_window", nullptr},
          {"tie_word_embeddings", tied},
          {"output_router_logits", false},
          {"torch_dtype", "float32"}};
}

void write_mixtral(const std::string& dir, const HfModel& m, const json& config) {
  std::filesystem::create_directories(dir);
  write_text(dir + "/config.json", config.dump(2));
  std::vector<TensorRef> refs;
  for (auto& [n, t] : m) refs.push_back({n, DType::F32, t.shape, t.v.data()});
  write_safetensors(dir + "/model.safetensors", refs, {{"format", "pt"}});
}

// ---- the oracle: HF's Mixtral forward, in double (its attention: support/hf_llama_oracle.h) ------------------
Vec rms_norm(const Vec& x, const HfTensor& w) { return hf_oracle::rms_norm(x, w, kEps); }  // MixtralRMSNorm

// Mixtral's attention is Llama's, with the default rotary frequencies theta^(-2i/HD).
const hf_oracle::AttentionShape kAttention{H, KV, HD, kEps,
                                           [](int i) { return 1.0 / std::pow(kTheta, (2.0 * i) / HD); }};

// MixtralSparseMoeBlock on one token: softmax over E, top k, renormalised, experts' SwiGLU weighted and summed.
Vec sparse_moe(const HfModel& m, const std::string& p, const Vec& x) {
  const Vec logits = matvec(m.at(p + "block_sparse_moe.gate.weight"), x);
  const double mx = *std::max_element(logits.begin(), logits.end());
  Vec prob(E);
  double z = 0;
  for (int e = 0; e < E; ++e) z += (prob[e] = std::exp(logits[e] - mx));
  for (double& pr : prob) pr /= z;
  std::vector<int> order(E);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return prob[a] > prob[b]; });
  double kept = 0;
  for (int j = 0; j < K; ++j) kept += prob[order[j]];
  Vec y(C, 0.0);
  for (int j = 0; j < K; ++j) {
    const std::string xp = p + "block_sparse_moe.experts." + std::to_string(order[j]) + ".";
    const Vec g = matvec(m.at(xp + "w1.weight"), x), u = matvec(m.at(xp + "w3.weight"), x);
    Vec act(F);
    for (int f = 0; f < F; ++f) act[f] = g[f] / (1.0 + std::exp(-g[f])) * u[f];
    const Vec d = matvec(m.at(xp + "w2.weight"), act);
    for (int c = 0; c < C; ++c) y[c] += prob[order[j]] / kept * d[c];
  }
  return y;
}

std::vector<Vec> hf_mixtral_logits(const HfModel& m, const std::vector<int32_t>& tokens, bool tied) {
  const int n = static_cast<int>(tokens.size());
  std::vector<Vec> x(n, Vec(C));
  for (int t = 0; t < n; ++t)
    for (int c = 0; c < C; ++c) x[t][c] = m.at("model.embed_tokens.weight").v[tokens[t] * C + c];
  for (int l = 0; l < L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const std::vector<Vec> a = hf_oracle::attention(m, p, x, kAttention);
    for (int t = 0; t < n; ++t) {
      for (int c = 0; c < C; ++c) x[t][c] += a[t][c];
      const Vec y = sparse_moe(m, p, rms_norm(x[t], m.at(p + "post_attention_layernorm.weight")));
      for (int c = 0; c < C; ++c) x[t][c] += y[c];
    }
  }
  std::vector<Vec> logits(n);
  const HfTensor& head = m.at(tied ? "model.embed_tokens.weight" : "lm_head.weight");
  for (int t = 0; t < n; ++t) logits[t] = matvec(head, rms_norm(x[t], m.at("model.norm.weight")));
  return logits;
}

const std::vector<int32_t> kTokens = {3, 36, 0, 17, 17, 5, 29};

// Our logits for the model stored at `weights` (an HF directory or a checkpoint), against the oracle's.
void expect_logits_match(const std::string& weights, const HfModel& m, bool tied) {
  const ModelConfig cfg = model_config_of(weights);
  auto ops = make_cpu_ops();
  GPT gpt(cfg, *ops);
  load_model_weights(weights, cfg, gpt.params());
  const Tensor logits = gpt.logits(kTokens.data(), 1, T);
  const std::vector<Vec> want = hf_mixtral_logits(m, kTokens, tied);
  const float* got = logits.f32();
  const int64_t Vp = cfg.padded_vocab();
  // fp32 against double: each logit comes through two layers of dot products of at most 48 terms of O(1) values,
  // so its rounding error is a small multiple of 48 x 2^-24 x |terms| ~ 1e-5; the largest seen is 4.1e-6. A wrong
  // expert, w1/w3 order, top-k choice or gate normalisation moves logits by O(0.1) (not renormalising the top-k
  // probabilities: by 2.0). (The router's margins are far above fp32's rounding for
  // this seed, so both sides choose the same experts.)
  EXPECT_LT(hf_oracle::worst_logit_error(got, Vp, want), 3e-5) << weights;
}

}  // namespace

TEST(HfMixtral, ImportComputesWhatHfsMixtralComputes) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    ScratchDir dir;
    const HfModel m = random_mixtral(tied);
    write_mixtral(dir / "hf", m, mixtral_config(tied));
    const ModelConfig c = model_config_of(dir / "hf");
    EXPECT_EQ(c.moe_experts, E);
    EXPECT_EQ(c.moe_top_k, K);
    EXPECT_EQ(c.moe_d_ff, F);
    EXPECT_EQ(c.moe_router, MoeRouter::Softmax);
    EXPECT_EQ(c.moe_shared_experts, 0);
    EXPECT_EQ(c.moe_layers(), L);
    EXPECT_EQ(c.kv_heads(), KV);
    EXPECT_EQ(c.window, 0);
    EXPECT_EQ(c.tied_embeddings, tied);
    expect_logits_match(dir / "hf", m, tied);  // straight from the HF directory (model.init_from)
    convert_hf_to_checkpoint(dir / "hf", dir / "ck");
    expect_logits_match(dir / "ck", m, tied);  // through `megatrain convert --from-hf`
  }
}

TEST(HfMixtral, ImportExportImportIsExactAndWritesMixtralsConfig) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    ScratchDir dir;
    const HfModel m = random_mixtral(tied);
    write_mixtral(dir / "hf", m, mixtral_config(tied));
    convert_hf_to_checkpoint(dir / "hf", dir / "ck");
    convert_checkpoint_to_hf(dir / "ck", dir / "out/model.safetensors");
    const HfModel back = read_back(dir / "out/model.safetensors");
    ASSERT_EQ(back.size(), m.size());  // the same names, nothing more
    for (auto& [n, t] : m) {
      SCOPED_TRACE(n);
      ASSERT_TRUE(back.count(n));
      EXPECT_EQ(back.at(n).shape, t.shape);
      EXPECT_EQ(std::memcmp(back.at(n).v.data(), t.v.data(), t.v.size() * sizeof(float)), 0);
    }
    const json cj = json::parse(read_text_file(dir / "out/config.json"));
    const json want = mixtral_config(tied);
    for (auto& [k, v] : want.items()) EXPECT_EQ(cj.at(k), v) << k;  // HF's own keys and values
    // The export imports again to the same network and the same tensors, bit for bit.
    expect_logits_match(dir / "out", m, tied);
    convert_hf_to_checkpoint(dir / "out", dir / "ck2");
    convert_checkpoint_to_hf(dir / "ck2", dir / "out2/model.safetensors");
    const HfModel again = read_back(dir / "out2/model.safetensors");
    for (auto& [n, t] : m) EXPECT_EQ(std::memcmp(again.at(n).v.data(), t.v.data(), t.v.size() * sizeof(float)), 0) << n;
  }
}

TEST(HfMixtral, BadFilesAreRefusedNamingTheTensorOrKey) {
  ScratchDir dir;
  const HfModel m = random_mixtral(false);
  auto refused = [&](const std::string& name, const HfModel& mm, const json& config,
                     std::initializer_list<const char*> parts) {
    SCOPED_TRACE(name);
    write_mixtral(dir / name, mm, config);
    const std::string e = error_of([&] {
      const ModelConfig c = model_config_of(dir / name);
      ParamStore store;
      import_hf_model(HfModelFiles::open(dir / name), c, store);
    });
    for (const char* p : parts) EXPECT_NE(e.find(p), std::string::npos) << e;
  };
  HfModel missing = m;
  missing.erase("model.layers.1.block_sparse_moe.experts.3.w3.weight");
  refused("missing", missing, mixtral_config(false), {"model.layers.1.block_sparse_moe.experts.3.w3.weight"});
  HfModel wrong = m;
  wrong["model.layers.0.block_sparse_moe.experts.2.w2.weight"].shape = {F, C};
  refused("shape", wrong, mixtral_config(false), {"model.layers.0.block_sparse_moe.experts.2.w2.weight", "[48, 32]"});
  HfModel extra = m;
  extra["model.layers.0.block_sparse_moe.experts.4.w1.weight"] =
      m.at("model.layers.0.block_sparse_moe.experts.0.w1.weight");
  refused("extra", extra, mixtral_config(false), {"model.layers.0.block_sparse_moe.experts.4.w1.weight"});
  json c = mixtral_config(false);
  c["num_experts_per_tok"] = E + 1;
  refused("top-k", m, c, {"config.json", "num_experts_per_tok = 5", "num_local_experts = 4"});
  c = mixtral_config(false);
  c.erase("num_local_experts");
  refused("no-experts", m, c, {"config.json", "num_local_experts is missing"});
}

// The whole-model loader (one process's model.init_from) into a rank's shard of the model (here ep rank 1 of 2, half
// the experts) is refused naming the tensor and both shapes; it wrote past the shard before (a crash without a
// message). Sharded layouts load their slices through the checkpointer instead.
TEST(HfMixtral, LoadingTheWholeModelIntoARanksShardIsRefusedNamingTheTensor) {
  ScratchDir dir;
  const HfModel m = random_mixtral(false);
  write_mixtral(dir / "hf", m, mixtral_config(false));
  const ModelConfig cfg = model_config_of(dir / "hf");
  ParamStore shard;
  declare_gpt_params(cfg, shard, 1, 0, {}, 2, 1);
  shard.allocate();
  const std::string e = error_of([&] { load_model_weights(dir / "hf", cfg, shard); });
  EXPECT_NE(e.find("h.0.moe.experts.c_fc.weight"), std::string::npos) << e;
  EXPECT_NE(e.find(fmt::format("{}x{}x{}", E / 2, 2 * F, C)), std::string::npos) << e;
  EXPECT_NE(e.find(fmt::format("{}x{}x{}", E, 2 * F, C)), std::string::npos) << e;
  // The same store declared whole loads.
  ParamStore whole;
  declare_gpt_params(cfg, whole);
  whole.allocate();
  EXPECT_NO_THROW(load_model_weights(dir / "hf", cfg, whole));
}

TEST(HfMixtral, AMoeModelMixtralCannotHoldIsRefusedNamingTheKey) {
  ScratchDir dir;
  write_mixtral(dir / "hf", random_mixtral(false), mixtral_config(false));
  const ModelConfig mixtral = model_config_of(dir / "hf");
  EXPECT_EQ(hf_family(mixtral), HfFamily::Llama);
  auto refusal = [&](auto change) {
    ModelConfig c = mixtral;
    change(c);
    return error_of([&] { hf_family(c); });
  };
  EXPECT_NE(refusal([](ModelConfig& c) { c.moe_first_dense = 1; }).find("model.moe_first_dense = 1"),
            std::string::npos);
  EXPECT_NE(refusal([](ModelConfig& c) { c.moe_every = 2; }).find("model.moe_every = 2"), std::string::npos);
  EXPECT_NE(refusal([](ModelConfig& c) { c.moe_router = MoeRouter::SigmoidBias; }).find("model.moe_router"),
            std::string::npos);
  EXPECT_NE(refusal([](ModelConfig& c) { c.moe_shared_experts = 1; }).find("model.moe_shared_experts = 1"),
            std::string::npos);
}
