#include "megatrain/perf/memory.h"

#include <algorithm>

namespace mt::perf {

double params_per_gpu(const ModelConfig& m, int tp, int pp, int rank) {
  const double embed = double(m.padded_vocab(tp)) * m.d_model + (m.pos == PosKind::Learned ? double(m.max_seq_len) * m.d_model : 0);
  const double layers = double(m.num_params()) - double(m.vocab_size) * m.d_model -
                        (m.pos == PosKind::Learned ? double(m.max_seq_len) * m.d_model : 0) -
                        (m.tied_embeddings ? 0 : double(m.vocab_size) * m.d_model);
  double p = layers / pp / tp;
  // The first stage holds the embedding; the last the LM head: its own matrix when untied, a second copy of the
  // tied one when the two ends are different stages (Megatron keeps both and all-reduces their gradients).
  if (rank == 0) p += embed / tp;
  if (rank == pp - 1 && (pp > 1 || !m.tied_embeddings)) p += double(m.padded_vocab(tp)) * m.d_model / tp;
  return p;
}

double layer_activation_bytes(const ModelConfig& m, const Shape& s, const Techniques& t) {
  const double sbh = double(s.seq) * s.micro_batch * m.d_model, tp = s.tp;
  switch (t.recompute) {
    case Recompute::Full:
      return 2 * sbh / tp;
    case Recompute::Selective:
      return 34 * sbh / tp;
    case Recompute::None:  // flash attention keeps no a*s*s score matrices, so this equals selective
      return 34 * sbh / tp;
  }
  return 0;
}

MemoryBreakdown memory_per_gpu(const ModelConfig& m, const Shape& s, const Techniques& t, int dp, int pp, int v,
                               int peak_in_flight_chunks) {
  MemoryBreakdown b;
  const double p = params_per_gpu(m, s.tp, pp, 0);
  b.params = 2 * p;
  b.grads = 4 * p;
  b.optimizer = 12 * p / dp;
  const int layers_per_chunk = m.n_layer / (pp * v);
  b.activations = layer_activation_bytes(m, s, t) * layers_per_chunk * std::max(1, peak_in_flight_chunks);
  // The embedding output of each in-flight micro-batch on the first stage, and one layer's working set (the
  // backward of the layer being recomputed holds its full activations once).
  b.activations += (t.recompute == Recompute::None ? 0 : 34.0 * s.seq * s.micro_batch * m.d_model / s.tp);
  return b;
}

}  // namespace mt::perf
