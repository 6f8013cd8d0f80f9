#include "megatrain/perf/memory.h"

#include <algorithm>

#include "megatrain/model/layout.h"

namespace mt::perf {

double params_per_gpu(const ModelConfig& m, int tp, int pp, int rank, int v, const std::vector<int>& stage_layers) {
  const double embed = double(m.padded_vocab(tp)) * m.d_model +
                       (m.pos == PosKind::Learned ? double(m.max_seq_len) * m.d_model : 0);
  const double layers = double(m.num_params()) - double(m.vocab_size) * m.d_model -
                        (m.pos == PosKind::Learned ? double(m.max_seq_len) * m.d_model : 0) -
                        (m.tied_embeddings ? 0 : double(m.vocab_size) * m.d_model);
  double p = layers / pp / tp;
  if (!stage_layers.empty()) {  // this rank's share of the layers: its chunks' counts
    const std::vector<int> counts = stage_layer_counts(m, pp, v, stage_layers);
    int mine = 0;
    for (int c = 0; c < v; ++c) mine += counts[c * pp + rank];
    p = layers * mine / m.n_layer / tp;
  }
  // The first stage holds the embedding; the last the LM head: its own matrix when untied, a second copy of the
  // tied one when the two ends are different stages (Megatron keeps both and all-reduces their gradients).
  if (rank == 0) p += embed / tp;
  if (rank == pp - 1 && (pp > 1 || !m.tied_embeddings)) p += double(m.padded_vocab(tp)) * m.d_model / tp;
  return p;
}

double layer_activation_bytes(const ModelConfig& m, const Shape& s, const Techniques& t) {
  const double sbh = double(s.seq) * s.micro_batch * m.d_model, tp = s.tp;
  switch (t.recompute) {
    case Recompute::Full: return 2 * sbh / tp;
    case Recompute::Selective: return 34 * sbh / tp;
    case Recompute::None:  // flash attention keeps no a*s*s score matrices, so this equals selective
      return 34 * sbh / tp;
  }
  return 0;
}

MemoryBreakdown memory_per_gpu(const ModelConfig& m, const Shape& s, const Techniques& t, int dp, int pp, int v,
                               int peak_in_flight_chunks, const std::vector<int>& stage_layers) {
  MemoryBreakdown b;
  const double p = params_per_gpu(m, s.tp, pp, 0, v, stage_layers);
  b.params = 2 * p;
  b.grads = 4 * p;
  b.optimizer = 12 * p / dp;
  // Rank 0's chunks (it holds the most micro-batches in flight); with an uneven split, its largest.
  int layers_per_chunk = 0;
  const std::vector<int> counts = stage_layer_counts(m, pp, v, stage_layers);
  for (int c = 0; c < v; ++c) layers_per_chunk = std::max(layers_per_chunk, counts[c * pp]);
  b.activations = layer_activation_bytes(m, s, t) * layers_per_chunk * std::max(1, peak_in_flight_chunks);
  // The embedding output of each in-flight micro-batch on the first stage, and one layer's working set (the
  // backward of the layer being recomputed holds its full activations once).
  b.activations += (t.recompute == Recompute::None ? 0 : 34.0 * s.seq * s.micro_batch * m.d_model / s.tp);
  return b;
}

}  // namespace mt::perf
