// Hugging Face GPT-2 weights <-> megatrain parameters.
//
// HF names are ours with an optional "transformer." prefix (lm_head.weight never has one). HF's Conv1D stores
// linear weights [in, out]; ours are [out, in] (nn.Linear), so c_attn, attn.c_proj, c_fc and mlp.c_proj are
// transposed. HF's wte (and an untied lm_head) has exactly vocab_size rows; ours have padded_vocab() rows, the
// padding zero. The attention-mask buffers (*.attn.bias, *.attn.masked_bias) some files carry are ignored.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "megatrain/ckpt/safetensors.h"
#include "megatrain/model/config.h"
#include "megatrain/model/params.h"

namespace mt {

// Throws naming the first option HF GPT-2 cannot express (rmsnorm, swiglu, rope, parallel block, no bias,
// grouped-query attention, sliding window).
void check_hf_gpt2_convertible(const ModelConfig& cfg);

// The config an HF GPT-2 file describes: vocab_size, n_positions, n_embd, n_layer, n_inner and tying from the
// tensor shapes. Shapes cannot tell n_head: n_head > 0 sets it; else a config.json beside the file (HF keeps one
// there) gives it; else d_model / 64 (every GPT-2 size has 64-wide heads). A config.json that disagrees with
// the shapes, or describes a model GPT-2 is not, is an error.
ModelConfig infer_hf_gpt2_config(const SafetensorsFile& f, int n_head = 0);

// Fills store (declared for cfg with declare_gpt_params and allocated; an empty store is declared and allocated
// here) from the file. F32, F16 and BF16 files are read. Shape mismatches and tensors left unused are errors.
void import_hf_gpt2(const SafetensorsFile& f, const ModelConfig& cfg, ParamStore& store);

// Writes store as an HF GPT-2 safetensors file in dtype (F32, or BF16 rounded to nearest even; names without
// prefix, Conv1D layout, vocab_size rows) and config.json beside it.
void export_hf_gpt2(const ModelConfig& cfg, const ParamStore& store, const std::string& path, DType dtype = DType::F32);

// Where our parameter `ours` lives in an HF GPT-2 file: its name there ("" when absent) and whether HF stores it
// transposed (Conv1D [in, out] against our [out, in]). Vocabulary rows past vocab_size are not in the file.
struct HfGpt2Tensor {
  std::string name;
  bool transposed = false;
};
HfGpt2Tensor hf_gpt2_tensor(const SafetensorsFile& f, const std::string& ours);
// The attention-mask buffers (*.attn.bias, *.attn.masked_bias) some GPT-2 files carry: not weights.
bool is_hf_gpt2_buffer(const std::string& name);

// HF GPT2Config keys for cfg (vocab_size, n_positions, n_embd, n_layer, n_head, model_type "gpt2", ...).
nlohmann::json hf_gpt2_config_json(const ModelConfig& cfg, DType dtype = DType::F32);

}  // namespace mt
