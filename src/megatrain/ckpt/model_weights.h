// Model weights in and out of checkpoints, and the one entry point that reads weights from an HF GPT-2 or Llama
// model or a megatrain checkpoint (model.init_from, convert, generate).
#pragma once
#include <string>
#include <vector>

#include "megatrain/ckpt/checkpoint.h"
#include "megatrain/model/config.h"
#include "megatrain/model/params.h"

namespace mt {

// Where a checkpoint keeps the model parameters (by their ParamStore names), and the manifest's "extra" key
// holding the model config (model_config_to_json).
inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kModelConfigKey = "model";

// Every parameter of store as a TensorRef into its buffer (for CheckpointFiles{{kModelFile, ...}}).
std::vector<TensorRef> param_tensor_refs(const ParamStore& store);

// Throws naming the first field in which `stored` (from `source`) and `want` describe different networks.
// Fields that do not change the weights' meaning (vocab_pad_to, window, recompute, init_std, max_seq_len
// beyond the positions table) may differ.
void check_same_architecture(const ModelConfig& stored, const ModelConfig& want, const std::string& source);

// Copies the checkpoint's model parameters into store (declared for cfg and allocated). Every parameter must be
// present with its shape, except that wte/lm_head may carry a different vocab padding (the real rows are copied,
// the padding zeroed); tensors in kModelFile the model lacks are an error.
void load_params(const Checkpoint& ck, const ModelConfig& cfg, ParamStore& store);

// Reads weights for cfg into store (declared for cfg and allocated; an empty store is declared and allocated
// here) from an HF model (GPT-2 or Llama: a directory, .safetensors file or index, hf_model_files.h) or a megatrain
// checkpoint (root or step directory, or its model.safetensors). A checkpoint's stored config, or the config the HF
// model describes, must match cfg (check_same_architecture). Returns true when the source was an HF model, false
// for a megatrain checkpoint.
bool load_model_weights(const std::string& path, const ModelConfig& cfg, ParamStore& store);

// True when path is an HF model (a directory with config.json and HF weights, a .safetensors file or an index that
// no megatrain manifest sits beside), false for a megatrain checkpoint. Throws when path does not exist.
bool is_hf_model(const std::string& path);

// The config that a weights source describes: a checkpoint's extra.model, or an HF model's (GPT-2:
// infer_hf_gpt2_config, with n_head; Llama: infer_hf_llama_config, where n_head > 0 must agree with config.json).
ModelConfig model_config_of(const std::string& path, int n_head = 0);

// `megatrain convert`: HF model -> checkpoint root (step 0, kModelFile only, extra {"model": config}); returns the
// step directory written. And a checkpoint (root or step dir) -> HF file + config.json beside it, as GPT-2 or as
// Llama, whichever layout the model has (an error giving both reasons when it has neither).
std::string convert_hf_to_checkpoint(const std::string& hf_path, const std::string& out_root, int n_head = 0);
// dtype: F32 (exact) or BF16.
ModelConfig convert_checkpoint_to_hf(const std::string& ckpt, const std::string& out_file, DType dtype = DType::F32);

}  // namespace mt
