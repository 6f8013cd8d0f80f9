// The tiny model the model and optimizer tests share: small enough for naive double references and finite
// differences, with every tensor kind (embeddings, norms, attention, MLP, biases) present.
#pragma once
#include <string>

#include "megatrain/model/config.h"

namespace mt::test {

// style "gpt2" (LayerNorm, GeLU, learned positions, tied embeddings) or "llama" (RMSNorm, SwiGLU, RoPE, GQA, no
// biases, untied head).
inline ModelConfig tiny_model(const std::string& style = "gpt2") {
  ModelConfig c;
  c.vocab_size = 37;
  c.vocab_pad_to = 16;
  c.n_layer = 2;
  c.n_head = 4;
  c.d_model = 16;
  c.max_seq_len = 8;
  c.init_std = 0.3f;
  if (style == "llama") {
    c.norm = NormKind::RmsNorm;
    c.mlp = MlpKind::SwiGlu;
    c.pos = PosKind::Rope;
    c.n_kv_head = 2;
    c.bias = false;
    c.tied_embeddings = false;
    c.d_ff = 24;
  }
  return c;
}

}  // namespace mt::test
