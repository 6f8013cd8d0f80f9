// Forward-only passes through the pipeline stages of a GPT (built with a GptPart) over the pp group: the
// validation loss and text sampling with parallel.pp > 1. No schedule and no backward: each micro-batch goes
// through the virtual stages in order, and since sends are asynchronous, stage s+1 works on micro-batch mb while
// stage s computes mb+1 (a GPipe forward). No activations stay held (GPT::logits_chunk, and the loss's slot is
// released), so call these between training steps, not inside one.
#pragma once
#include <cstdint>

#include "megatrain/comm/process_group.h"
#include "megatrain/model/gpt.h"

namespace mt {

// Loss of `micro` micro-batches (tokens / targets hold micro * B rows of T; tokens are read on the first stage,
// targets on the last). Returns on the rank holding the last stage the summed per-position loss over every
// valid target (mean loss x valid targets, per micro-batch), 0 elsewhere. Every pp rank must call it.
double pipeline_eval_loss(GPT& model, ProcessGroup& pp, const int32_t* tokens, const int32_t* targets, int micro, int B,
                          int T);

// Logits of one batch [B, T] through every stage: on the rank holding the last stage a [B*T, local_vocab()] view
// valid until the next call on the model, an empty tensor elsewhere. Every pp rank must call it.
Tensor pipeline_logits(GPT& model, ProcessGroup& pp, const int32_t* tokens, int B, int T);

}  // namespace mt
