#include "megatrain/ckpt/model_weights.h"

#include <cstring>
#include <filesystem>

#include <fmt/ranges.h>

#include "megatrain/ckpt/config_json.h"
#include "megatrain/ckpt/hf_model.h"
#include "megatrain/core/error.h"
#include "megatrain/model/layout.h"

namespace mt {

namespace fs = std::filesystem;
using nlohmann::json;

std::vector<TensorRef> param_tensor_refs(const ParamStore& store) {
  MT_CHECK(store.params_data() != nullptr || store.size() == 0, "param_tensor_refs: the store is not allocated");
  std::vector<TensorRef> refs;
  refs.reserve(store.size());
  for (int i = 0; i < static_cast<int>(store.size()); ++i)
    refs.push_back(tensor_ref(store.info(i).name, store.param(i)));
  return refs;
}

void check_same_architecture(const ModelConfig& s, const ModelConfig& w, const std::string& source) {
  auto show = [](const auto& v) {
    if constexpr (std::is_enum_v<std::decay_t<decltype(v)>>)
      return std::string(kind_name(v));
    else
      return fmt::format("{}", v);
  };
  auto same = [&](const char* field, const auto& have, const auto& want) {
    MT_CHECK(have == want, "{} holds a model with model.{} = {} but the config says {}", source, field, show(have),
             show(want));
  };
  same("vocab_size", s.vocab_size, w.vocab_size);
  same("d_model", s.d_model, w.d_model);
  same("n_layer", s.n_layer, w.n_layer);
  same("n_head", s.n_head, w.n_head);
  same("n_kv_head", s.kv_heads(), w.kv_heads());
  if (w.moe_layers() < w.n_layer) same("d_ff", s.ff_dim(), w.ff_dim());  // the dense MLP's width, where one is
  same("norm", s.norm, w.norm);
  same("mlp", s.mlp, w.mlp);
  same("pos", s.pos, w.pos);
  same("block", s.block, w.block);
  same("bias", s.bias, w.bias);
  same("tied_embeddings", s.tied_embeddings, w.tied_embeddings);
  same("norm_eps", s.norm_eps, w.norm_eps);
  // The MoE layout (the weights' shapes and which layers hold experts); the losses' coefficients may change.
  same("moe_experts", s.moe_experts, w.moe_experts);
  if (w.moe()) {
    same("moe_top_k", s.moe_top_k, w.moe_top_k);
    same("moe_d_ff", s.moe_d_ff, w.moe_d_ff);
    same("moe_shared_experts", s.moe_shared_experts, w.moe_shared_experts);
    same("moe_every", s.moe_every, w.moe_every);
    same("moe_first_dense", s.moe_first_dense, w.moe_first_dense);
    same("moe_router", s.moe_router, w.moe_router);
  }
  if (w.pos == PosKind::Rope) {
    same("rope_theta", s.rope_theta, w.rope_theta);
    same("rope_scaling", s.rope_scaling, w.rope_scaling);
    if (w.rope_scaling > 0) {
      same("rope_low_freq_factor", s.rope_low_freq_factor, w.rope_low_freq_factor);
      same("rope_high_freq_factor", s.rope_high_freq_factor, w.rope_high_freq_factor);
      same("rope_original_max_len", s.rope_original_max_len, w.rope_original_max_len);
    }
  }
  if (w.pos == PosKind::Learned)
    MT_CHECK(s.max_seq_len >= w.max_seq_len,
             "{} has {} learned positions but the config asks for model.max_seq_len = {}", source, s.max_seq_len,
             w.max_seq_len);
}

static void prepare_store(const ModelConfig& cfg, ParamStore& store) {
  if (store.size() == 0) {
    declare_gpt_params(cfg, store);
    store.allocate();
  }
  MT_CHECK(store.params_data() != nullptr, "loading weights: the parameter store is not allocated");
  // The whole-model loaders write every tensor at its full shape: a rank's shard (tp, pp, ep) would be overrun.
  ParamStore whole;  // declared, never allocated
  declare_gpt_params(cfg, whole);
  MT_CHECK(store.size() == whole.size(),
           "loading whole-model weights: the parameter store holds {} tensors, the "
           "model {} (a rank's part of it? sharded layouts load their slices)",
           store.size(), whole.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    const ParamInfo &mine = store.info(static_cast<int>(i)), &full = whole.info(static_cast<int>(i));
    MT_CHECK(mine.name == full.name && mine.shape == full.shape,
             "loading whole-model weights: the parameter store's '{}' is {}, the model's '{}' {} (a rank's shard? "
             "sharded layouts load their slices)",
             mine.name, fmt::join(mine.shape, "x"), full.name, fmt::join(full.shape, "x"));
  }
}

void load_params(const Checkpoint& ck, const ModelConfig& cfg, ParamStore& store) {
  prepare_store(cfg, store);
  if (ck.extra().contains(kModelConfigKey))
    check_same_architecture(model_config_from_manifest(ck.extra(), ck.dir()), cfg, "checkpoint " + ck.dir());
  for (int i = 0; i < static_cast<int>(store.size()); ++i) {
    const ParamInfo& p = store.info(i);
    MT_CHECK(ck.has(p.name), "checkpoint {} has no tensor '{}', which the model needs", ck.dir(), p.name);
    const TensorData& t = ck.get(p.name);
    Tensor dst = store.param(i);
    // A different vocab padding (wte, lm_head) or a longer positions table (wpe): copy the leading rows.
    bool copy_rows = false;
    if (p.shape.size() == 2 && t.shape.size() == 2 && t.shape[1] == p.shape[1] && t.shape[0] != p.shape[0] &&
        t.dtype_str == "F32") {
      if (p.name == "wte.weight" || p.name == "lm_head.weight") copy_rows = t.shape[0] >= cfg.vocab_size;
      if (p.name == "wpe.weight") copy_rows = t.shape[0] > p.shape[0];
    }
    if (copy_rows) {
      int64_t rows = std::min<int64_t>(p.name == "wpe.weight" ? p.shape[0] : cfg.vocab_size, t.shape[0]);
      std::memset(dst.ptr, 0, p.numel * sizeof(float));
      std::memcpy(dst.ptr, t.data, static_cast<size_t>(rows * p.shape[1]) * sizeof(float));
    } else {
      ck.copy_into(p.name, dst);
    }
  }
  std::vector<std::string> extra;
  for (auto& n : ck.tensor_names(kModelFile))
    if (!store.has(n)) extra.push_back(n);
  MT_CHECK(extra.empty(), "checkpoint {} holds {} model tensor(s) this model does not have (first: '{}')", ck.dir(),
           extra.size(), extra.empty() ? "" : extra[0]);
}

// A model.safetensors inside a checkpoint stands for its checkpoint directory.
static bool is_checkpoint_file(const fs::path& p) {
  return p.filename() == kModelFile && fs::is_regular_file(p.parent_path() / "manifest.json");
}

// A directory or file of megatrain's own (a checkpoint), rather than an HF model.
static bool is_megatrain_checkpoint(const std::string& path) {
  std::error_code ec;
  MT_CHECK(fs::exists(path, ec), "weights path {} does not exist", path);
  const fs::path p(path);
  if (fs::is_directory(p, ec)) return !HfModelFiles::is_model_dir(path);
  return is_checkpoint_file(p);
}

static std::string checkpoint_dir_of(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) ? path : fs::path(path).parent_path().string();
}

bool load_model_weights(const std::string& path, const ModelConfig& cfg, ParamStore& store) {
  if (is_megatrain_checkpoint(path)) {
    Checkpoint ck = Checkpoint::load(checkpoint_dir_of(path));
    load_params(ck, cfg, store);
    return false;
  }
  const HfModelFiles m = HfModelFiles::open(path);
  check_same_architecture(hf_model_config(m, cfg.n_head), cfg, path);
  prepare_store(cfg, store);
  import_hf_model(m, cfg, store);
  return true;
}

bool is_hf_model(const std::string& path) { return !is_megatrain_checkpoint(path); }

ModelConfig model_config_of(const std::string& path, int n_head) {
  if (is_megatrain_checkpoint(path)) {
    Checkpoint ck = Checkpoint::load(checkpoint_dir_of(path), false);
    return model_config_from_manifest(ck.extra(), ck.dir());
  }
  return hf_model_config(HfModelFiles::open(path), n_head);
}

std::string convert_hf_to_checkpoint(const std::string& hf_path, const std::string& out_root, int n_head) {
  // Adding step 0 to a directory that already holds checkpoints would repoint its `latest`.
  MT_CHECK(list_checkpoints(out_root).empty() && !fs::exists(fs::path(out_root) / "latest"),
           "{} already holds checkpoints; convert into a new directory", out_root);
  const HfModelFiles m = HfModelFiles::open(hf_path);
  ModelConfig cfg = hf_model_config(m, n_head);
  ParamStore store;
  import_hf_model(m, cfg, store);
  return save_checkpoint(out_root, 0, {{kModelFile, param_tensor_refs(store)}},
                         {{kModelConfigKey, model_config_to_json(cfg)}});
}

ModelConfig convert_checkpoint_to_hf(const std::string& ckpt, const std::string& out_file, DType dtype) {
  Checkpoint ck = Checkpoint::load(ckpt);
  ModelConfig cfg = model_config_from_manifest(ck.extra(), ck.dir());
  hf_family(cfg);  // refuses a model neither format holds before anything is read
  ParamStore store;
  load_params(ck, cfg, store);
  export_hf_model(cfg, store, out_file, dtype);
  return cfg;
}

}  // namespace mt
