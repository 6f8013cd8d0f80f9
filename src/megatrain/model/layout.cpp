#include "megatrain/model/layout.h"

#include <fmt/format.h>

#include "megatrain/core/error.h"

namespace mt {

std::vector<int> stage_layer_counts(const ModelConfig& cfg, int pp, int v, const std::vector<int>& given) {
  MT_CHECK(pp >= 1 && v >= 1, "parallel.pp = {} and parallel.virtual_stages = {} must be >= 1", pp, v);
  const int stages = pp * v;
  if (given.empty()) {
    MT_CHECK(cfg.n_layer % stages == 0,
             "model.n_layer = {} must be divisible by parallel.pp * "
             "parallel.virtual_stages = {} * {} for an even split (or give parallel.stage_layers: the layers of each "
             "virtual stage)",
             cfg.n_layer, pp, v);
    return std::vector<int>(stages, cfg.n_layer / stages);
  }
  MT_CHECK(static_cast<int>(given.size()) == stages,
           "parallel.stage_layers has {} entries but there are parallel.pp "
           "* parallel.virtual_stages = {} * {} = {} virtual stages (one count per stage)",
           given.size(), pp, v, stages);
  int64_t sum = 0;
  for (size_t s = 0; s < given.size(); ++s) {
    MT_CHECK(given[s] >= 1, "parallel.stage_layers[{}] = {}: every virtual stage needs at least one layer", s,
             given[s]);
    sum += given[s];
  }
  MT_CHECK(sum == cfg.n_layer, "parallel.stage_layers sums to {} layers but model.n_layer is {}", sum, cfg.n_layer);
  return given;
}

GptPart pipeline_part(const ModelConfig& cfg, int pp, int v, int r, const std::vector<int>& stage_layers) {
  MT_CHECK(pp >= 1 && v >= 1 && r >= 0 && r < pp,
           "pipeline rank {} of parallel.pp = {} with parallel.virtual_stages "
           "= {} is invalid",
           r, pp, v);
  const std::vector<int> counts = stage_layer_counts(cfg, pp, v, stage_layers);
  std::vector<int> first(counts.size() + 1, 0);  // first[s]: the first layer of virtual stage s
  for (size_t s = 0; s < counts.size(); ++s) first[s + 1] = first[s] + counts[s];
  GptPart part;
  for (int c = 0; c < v; ++c) part.chunks.emplace_back(first[c * pp + r], first[c * pp + r + 1]);
  part.embedding = r == 0;
  part.head = r == pp - 1;
  return part;
}

void declare_gpt_params(const ModelConfig& cfg, ParamStore& s, int tp, int tr, const GptPart& part, int ep_size,
                        int ep_rank) {
  cfg.validate();
  cfg.validate_tp(tp);
  using K = ShardSpec::Kind;
  const int64_t C = cfg.d_model, Vp = tp > 1 ? cfg.padded_vocab(tp) : cfg.padded_vocab(), hd = cfg.head_dim();
  const int64_t F = cfg.ff_dim(), q = cfg.n_head * hd, kv = cfg.kv_heads() * hd;
  const bool swiglu = cfg.mlp == MlpKind::SwiGlu;
  const bool ln_bias = cfg.norm == NormKind::LayerNorm && cfg.bias;
  auto rep = [&](const std::string& n, std::vector<int64_t> shape, bool decay) {
    s.add(n, replicated_spec(std::move(shape)), decay);
  };
  auto split = [&](const std::string& n, K k, std::vector<int64_t> shape, std::vector<int64_t> parts, bool decay) {
    s.add(n, split_spec(k, std::move(shape), std::move(parts), tp, tr, n), decay);
  };
  auto norm = [&](const std::string& n) {
    rep(n + ".weight", {C}, false);
    if (ln_bias) rep(n + ".bias", {C}, false);
  };
  // out[N, sum(parts)] = in @ w^T: the output features (rows of w) are split.
  auto column_parallel = [&](const std::string& n, std::vector<int64_t> parts) {
    int64_t out = 0;
    for (auto p : parts) out += p;
    split(n + ".weight", K::Rows, {out, C}, parts, true);
    if (cfg.bias) split(n + ".bias", K::Rows, {out}, parts, false);
  };
  // out[N, C] = in[N, in] @ w^T summed over the ranks: the input features (columns of w) are split.
  auto row_parallel = [&](const std::string& n, int64_t in) {
    split(n + ".weight", K::Cols, {C, in}, {in}, true);
    if (cfg.bias) rep(n + ".bias", {C}, false);
  };
  auto wte = [&] { split("wte.weight", K::Rows, {Vp, C}, {Vp}, true); };
  if (part.embedding) {
    wte();
    if (cfg.pos == PosKind::Learned) rep("wpe.weight", {cfg.max_seq_len, C}, true);
  }
  std::vector<int> layers;
  if (part.chunks.empty())
    for (int l = 0; l < cfg.n_layer; ++l) layers.push_back(l);
  for (auto [a, b] : part.chunks) {
    MT_CHECK(0 <= a && a < b && b <= cfg.n_layer && (layers.empty() || a >= layers.back() + 1),
             "model chunk [{}, {}) is not an increasing layer range within model.n_layer = {}", a, b, cfg.n_layer);
    for (int l = a; l < b; ++l) layers.push_back(l);
  }
  for (int l : layers) {
    std::string p = fmt::format("h.{}.", l);
    norm(p + "ln_1");
    column_parallel(p + "attn.c_attn", {q, kv, kv});
    row_parallel(p + "attn.c_proj", q);
    if (cfg.block == BlockKind::Sequential) norm(p + "ln_2");
    if (cfg.moe_layer(l)) {  // model/moe.h names and lays out these
      const int64_t E = cfg.moe_experts, MF = cfg.moe_ff_dim(), SF = int64_t{cfg.moe_shared_experts} * MF;
      rep(p + "moe.router.weight", {E, C}, true);
      if (cfg.moe_router == MoeRouter::SigmoidBias) rep(p + "moe.router.bias", {E}, false);
      for (auto [n, shape] : {std::pair{p + "moe.experts.c_fc.weight", std::vector<int64_t>{E, 2 * MF, C}},
                              std::pair{p + "moe.experts.c_proj.weight", std::vector<int64_t>{E, C, MF}}})
        s.add(n, expert_spec(shape, ep_size, ep_rank, n), true);
      if (SF > 0) {
        rep(p + "moe.shared.c_fc.weight", {2 * SF, C}, true);
        rep(p + "moe.shared.c_proj.weight", {C, SF}, true);
      }
      continue;
    }
    column_parallel(p + "mlp.c_fc", swiglu ? std::vector<int64_t>{F, F} : std::vector<int64_t>{F});
    row_parallel(p + "mlp.c_proj", F);
  }
  if (!part.head) return;
  norm("ln_f");
  if (!cfg.tied_embeddings) split("lm_head.weight", K::Rows, {Vp, C}, {Vp}, true);
  if (cfg.tied_embeddings && !part.embedding) wte();  // the last stage's copy of the tied embedding
}

}  // namespace mt
