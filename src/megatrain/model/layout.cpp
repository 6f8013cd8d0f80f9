#include "megatrain/model/layout.h"

#include <fmt/format.h>

namespace mt {

void declare_gpt_params(const ModelConfig& cfg, ParamStore& s) {
  cfg.validate();
  const int64_t C = cfg.d_model, Vp = cfg.padded_vocab(), hd = cfg.head_dim(), F = cfg.ff_dim();
  const int64_t qkv = (cfg.n_head + 2 * cfg.kv_heads()) * hd;
  const int64_t fc = cfg.mlp == "swiglu" ? 2 * F : F;
  const bool ln_bias = cfg.norm == "layernorm" && cfg.bias;
  auto norm = [&](const std::string& n) {
    s.add(n + ".weight", {C}, false);
    if (ln_bias) s.add(n + ".bias", {C}, false);
  };
  auto linear = [&](const std::string& n, int64_t out, int64_t in) {
    s.add(n + ".weight", {out, in}, true);
    if (cfg.bias) s.add(n + ".bias", {out}, false);
  };
  s.add("wte.weight", {Vp, C}, true);
  if (cfg.pos == "learned") s.add("wpe.weight", {cfg.max_seq_len, C}, true);
  for (int l = 0; l < cfg.n_layer; ++l) {
    std::string p = fmt::format("h.{}.", l);
    norm(p + "ln_1");
    linear(p + "attn.c_attn", qkv, C);
    linear(p + "attn.c_proj", C, cfg.n_head * hd);
    if (cfg.block == "sequential") norm(p + "ln_2");
    linear(p + "mlp.c_fc", fc, C);
    linear(p + "mlp.c_proj", C, F);
  }
  norm("ln_f");
  if (!cfg.tied_embeddings) s.add("lm_head.weight", {Vp, C}, true);
}

}  // namespace mt
