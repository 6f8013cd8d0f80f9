#include "megatrain/parallel/pipeline_eval.h"

#include <functional>
#include <vector>

#include "megatrain/core/buffer.h"
#include "megatrain/core/error.h"

namespace mt {

namespace {

// Runs micro-batches 0..micro-1 through this rank's chunks (virtual stage c * pp + rank), receiving each chunk's
// input from the previous stage and sending its output to the next; the last chunk of the model is handed to
// `last` instead (with its input, or an empty tensor when the whole model is one chunk on this rank).
void forward_stages(GPT& m, ProcessGroup& pp, int micro, int B, int T, const int32_t* tokens,
                    const std::function<void(int c, Tensor x, int mb)>& last) {
  const int P = pp.size(), r = pp.rank(), V = m.num_chunks();
  MT_CHECK(P > 1 && P * V > 1, "pipeline forward needs parallel.pp > 1 (pp group {} has {} rank)", pp.name(), P);
  MT_CHECK(micro > 0 && B > 0 && T > 0, "pipeline forward of {} micro-batches of {} x {}", micro, B, T);
  MT_CHECK(tokens || !m.part().embedding, "pipeline forward: the first stage needs the tokens");
  const int64_t rows = static_cast<int64_t>(B) * T / m.tp_size(), C = m.config().d_model;
  Ops& ops = m.ops();
  const DType dt = ops.compute_dtype();
  const size_t bytes = static_cast<size_t>(rows * C) * dtype_size(dt);
  // Evaluation and sampling are not steps: their boundary buffers are allocated per call, in the backend's memory.
  Buffer in = ops.alloc(bytes);
  // Outputs stay alive until their sends complete: one buffer per (chunk, micro-batch) of this call.
  std::vector<Buffer> out(static_cast<size_t>(V) * micro);
  std::vector<WorkPtr> sends;
  auto view = [&](const Buffer& b) { return b.view({rows, C}, dt); };
  for (int c = 0; c < V; ++c) {
    const int s = c * P + r;  // this chunk's virtual stage
    for (int mb = 0; mb < micro; ++mb) {
      const int tag = s * micro + mb;  // unique per transfer of this call; the receiver computes the same
      Tensor x;
      if (!m.first_chunk(c)) {
        pp.recv(view(in), (r + P - 1) % P, tag - micro)->wait();
        x = view(in);
      }
      if (m.last_chunk(c)) {
        last(c, x, mb);
        continue;
      }
      const int32_t* tok = tokens ? tokens + static_cast<size_t>(mb) * B * T : nullptr;
      Tensor y = m.logits_chunk(c, x, tok, B, T);
      Buffer& o = out[static_cast<size_t>(c) * micro + mb];
      o = ops.alloc(bytes);
      ops.copy(view(o), y);
      sends.push_back(pp.send(view(o), (r + 1) % P, tag));
    }
  }
  for (auto& w : sends) w->wait();
}

}  // namespace

double pipeline_eval_loss(GPT& model, ProcessGroup& pp, const int32_t* tokens, const int32_t* targets, int micro, int B,
                          int T) {
  double sum = 0;
  forward_stages(model, pp, micro, B, T, tokens, [&](int c, Tensor x, int mb) {
    const size_t off = static_cast<size_t>(mb) * B * T;
    const int32_t* tg = targets + off;
    int64_t valid = 0;
    for (int64_t i = 0; i < static_cast<int64_t>(B) * T; ++i) valid += tg[i] >= 0;
    float loss = 0;
    // The training loss path (the same kernels as one process's forward); no backward follows, so the slot is freed.
    model.forward_chunk(c, 0, x, tokens ? tokens + off : nullptr, tg, B, T, 1.0f, &loss, /*train=*/false);
    model.release_activations(c, 0);
    sum += static_cast<double>(loss) * static_cast<double>(valid);
  });
  return sum;
}

Tensor pipeline_logits(GPT& model, ProcessGroup& pp, const int32_t* tokens, int B, int T) {
  Tensor logits;
  forward_stages(model, pp, 1, B, T, tokens,
                 [&](int c, Tensor x, int) { logits = model.logits_chunk(c, x, tokens, B, T); });
  return logits;
}

}  // namespace mt
