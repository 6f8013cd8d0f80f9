// Hugging Face Llama weights (LlamaForCausalLM, MistralForCausalLM: Llama with sliding-window attention, and
// MixtralForCausalLM: Mistral whose MLPs are mixtures of experts) <-> megatrain parameters.
//
// megatrain's Llama-style model (rmsnorm, swiglu, rope, no biases, sequential block) is HF's Llama computed the same
// way: RoPE pairs (i, i + head_dim/2) as HF's rotate_half does, query head h reads key/value head h / (H / Hkv) as
// repeat_kv does, and the MLP is down(silu(gate) * up). So no weight is permuted, only regrouped:
//   model.embed_tokens.weight [V, C]                  -> wte.weight (padded_vocab() rows, the padding zero)
//   model.layers.{i}.input_layernorm.weight           -> h.{i}.ln_1.weight
//   model.layers.{i}.self_attn.{q,k,v}_proj.weight    -> h.{i}.attn.c_attn.weight, rows q | k | v
//   model.layers.{i}.self_attn.o_proj.weight          -> h.{i}.attn.c_proj.weight
//   model.layers.{i}.post_attention_layernorm.weight  -> h.{i}.ln_2.weight
//   model.layers.{i}.mlp.{gate,up}_proj.weight        -> h.{i}.mlp.c_fc.weight, rows gate | up
//   model.layers.{i}.mlp.down_proj.weight             -> h.{i}.mlp.c_proj.weight
//   model.norm.weight -> ln_f.weight;  lm_head.weight -> lm_head.weight (absent when tie_word_embeddings)
// Mixtral (model.moe_experts = E = num_local_experts, moe_top_k = num_experts_per_tok, moe_d_ff = F =
// intermediate_size, the softmax router, every layer MoE, no shared experts; model/moe.h computes what HF's
// MixtralSparseMoeBlock does: softmax over E, top k, the k probabilities renormalised) replaces the mlp lines by
//   model.layers.{i}.block_sparse_moe.gate.weight [E, C]               -> h.{i}.moe.router.weight
//   model.layers.{i}.block_sparse_moe.experts.{e}.{w1,w3}.weight [F, C] -> h.{i}.moe.experts.c_fc.weight[e], rows w1 | w3
//   model.layers.{i}.block_sparse_moe.experts.{e}.w2.weight [C, F]      -> h.{i}.moe.experts.c_proj.weight[e]
// so an expert stack [E, R, cols] is E x R rows of cols, expert after expert, and every part is still whole rows.
// Every linear weight is [out, in] on both sides. Unlike GPT-2, the head count is not in the shapes, so an HF
// Llama needs its config.json.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "megatrain/ckpt/hf_model_files.h"
#include "megatrain/model/config.h"
#include "megatrain/model/params.h"

namespace mt {

// Throws naming the first option HF Llama cannot express (layernorm, gelu, learned positions, parallel block,
// biases; for MoE: dense layers, a router other than softmax, shared experts). A sliding window exports as
// Mistral, MoE as Mixtral.
void check_hf_llama_convertible(const ModelConfig& cfg);

// True when the files are an HF Llama: config.json's model_type is "llama", "mistral" or "mixtral", or, without one, the tensor
// names are Llama's (model.embed_tokens.weight).
bool is_hf_llama(const HfModelFiles& m);

// The config config.json describes, checked against the tensors' shapes: hidden_size, num_hidden_layers,
// num_attention_heads, num_key_value_heads, intermediate_size, vocab_size, max_position_embeddings, rms_norm_eps,
// rope_theta and rope_scaling (or transformers 5's rope_parameters), tie_word_embeddings. What megatrain does not
// compute is refused by name: a rope type other than "default" and Llama 3.1's "llama3" (yarn, linear, dynamic,
// longrope), attention_bias, mlp_bias, a hidden_act other than silu, a head_dim other than hidden_size /
// num_attention_heads. Mixtral adds num_local_experts and num_experts_per_tok (at most num_local_experts), and
// router_aux_loss_coef as model.moe_aux_loss.
ModelConfig infer_hf_llama_config(const HfModelFiles& m);

// Fills store (declared for cfg and allocated; an empty store is declared and allocated here) from the files.
// F32, F16 and BF16 tensors are read. A missing tensor, a shape mismatch, or a tensor with no place in the model
// is an error naming it (rotary inv_freq buffers, which older files carry, are skipped).
void import_hf_llama(const HfModelFiles& m, const ModelConfig& cfg, ParamStore& store);

// Writes store as one HF Llama safetensors file at path in dtype (F32, or BF16 rounded to nearest even) and
// config.json beside it.
void export_hf_llama(const ModelConfig& cfg, const ParamStore& store, const std::string& path,
                     DType dtype = DType::F32);

// The HF tensors whose rows, stacked in this order, make our parameter `ours` of a model of cfg, with the rows each
// gives: q | k | v for c_attn, gate | up for c_fc, vocab_size rows for wte and lm_head (the padding rows are in no
// file), d_model for the rest. Throws for a name the Llama layout does not have.
struct HfRowBlock {
  std::string name;
  int64_t rows = 0;
};
std::vector<HfRowBlock> hf_llama_row_blocks(const ModelConfig& cfg, const std::string& ours);
// RoPE's inverse frequencies (*.rotary_emb.inv_freq), which files of older transformers carry: not weights.
bool is_hf_llama_buffer(const std::string& name);

// HF LlamaConfig keys for cfg (architectures LlamaForCausalLM, model_type "llama", ...); with model.window > 0,
// MistralConfig's (MistralForCausalLM, model_type "mistral", sliding_window); with model.moe_experts > 0,
// MixtralConfig's (MixtralForCausalLM, model_type "mixtral", num_local_experts, num_experts_per_tok,
// intermediate_size = model.moe_d_ff, sliding_window or null).
nlohmann::json hf_llama_config_json(const ModelConfig& cfg, DType dtype = DType::F32);

}  // namespace mt
