#include "megatrain/perf/memory.h"

#include <algorithm>

#include "megatrain/core/error.h"
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

LayerParams layer_params(const ModelConfig& m, int layer) {
  ModelConfig dense = m;
  dense.moe_experts = 0;  // the same model with the dense MLP on every layer
  const double C = m.d_model, outside = double(m.vocab_size) * C +
                                        (m.pos == PosKind::Learned ? double(m.max_seq_len) * C : 0) +
                                        (m.tied_embeddings ? 0 : double(m.vocab_size) * C);
  const double dense_layer = (double(dense.num_params()) - outside) / m.n_layer;
  if (!m.moe_layer(layer)) return {dense_layer, 0};
  const double F = m.ff_dim(), fc = m.mlp == MlpKind::SwiGlu ? 2 * F : F;
  const double mlp = fc * C + C * F + (m.bias ? fc + C : 0);
  const double E = m.moe_experts, router = E * C + (m.moe_router == MoeRouter::SigmoidBias ? E : 0);
  const double expert = 3.0 * m.moe_d_ff * C;
  const double moe_dense = router + expert * m.moe_shared_experts;
  return {dense_layer - mlp + moe_dense, expert * E, moe_dense};
}

double moe_layer_activation_bytes(const ModelConfig& m, const Shape& s, const Techniques& t) {
  const double N = double(s.seq) * s.micro_batch, C = m.d_model, k = m.moe_top_k, F = m.moe_d_ff;
  const double E = m.moe_experts, S = m.moe_shared_experts, tp = s.tp;
  if (t.recompute == Recompute::Full) return 2 * N * C / tp;
  return (15 * N * C + 2 * N * C + 2 * N * k * C + 6 * N * k * F + 2 * N * k * C + 4 * N * E + 6 * N * S * F + N * C) /
         tp;
}

namespace {
// MoE: the rank's layers (its chunks), their dense and expert parameters and the activations its largest chunk keeps.
MemoryBreakdown moe_memory_per_gpu(const ModelConfig& m, const Shape& s, const Techniques& t, int dp, int pp, int v,
                                   int peak_in_flight_chunks, const std::vector<int>& stage_layers, int ep, int rank) {
  const std::vector<int> counts = stage_layer_counts(m, pp, v, stage_layers);
  std::vector<int> first(counts.size(), 0);
  for (size_t st = 1; st < counts.size(); ++st) first[st] = first[st - 1] + counts[st - 1];
  const double dense_act = layer_activation_bytes(m, s, t), moe_act = moe_layer_activation_bytes(m, s, t);
  double dense = 0, experts = 0, chunk_act = 0;
  for (int c = 0; c < v; ++c) {
    const int st = c * pp + rank;
    double act = 0;
    for (int l = first[st]; l < first[st] + counts[st]; ++l) {
      const LayerParams p = layer_params(m, l);
      dense += p.dense_per_gpu(s.tp);
      experts += p.experts / ep;
      act += m.moe_layer(l) ? moe_act : dense_act;
    }
    chunk_act = std::max(chunk_act, act);
  }
  const double vocab_rows = double(m.padded_vocab(s.tp)) * m.d_model / s.tp;
  if (rank == 0) dense += vocab_rows + (m.pos == PosKind::Learned ? double(m.max_seq_len) * m.d_model / s.tp : 0);
  if (rank == pp - 1 && (pp > 1 || !m.tied_embeddings)) dense += vocab_rows;  // the LM head (or its copy)
  MemoryBreakdown b;
  b.params = 2 * (dense + experts);
  b.grads = 4 * (dense + experts);
  b.optimizer = 12 * dense / dp + 12 * experts / (dp / ep);
  b.experts = 2 * experts + 4 * experts + 12 * experts / (dp / ep);
  b.activations = chunk_act * std::max(1, peak_in_flight_chunks);
  Techniques whole = t;
  whole.recompute = Recompute::None;
  b.activations += (t.recompute == Recompute::None ? 0 : moe_layer_activation_bytes(m, s, whole));
  return b;
}
}  // namespace

MemoryBreakdown memory_per_gpu(const ModelConfig& m, const Shape& s, const Techniques& t, int dp, int pp, int v,
                               int peak_in_flight_chunks, const std::vector<int>& stage_layers, int ep, int rank) {
  MT_CHECK(ep >= 1 && dp % ep == 0, "memory: parallel.ep = {} must divide parallel.dp = {}", ep, dp);
  MT_CHECK(rank >= 0 && rank < pp, "memory: pipeline rank {} of {}", rank, pp);
  if (m.moe()) return moe_memory_per_gpu(m, s, t, dp, pp, v, peak_in_flight_chunks, stage_layers, ep, rank);
  MemoryBreakdown b;
  const double p = params_per_gpu(m, s.tp, pp, rank, v, stage_layers);
  b.params = 2 * p;
  b.grads = 4 * p;
  b.optimizer = 12 * p / dp;
  // Rank 0's chunks (it holds the most micro-batches in flight); with an uneven split, its largest.
  int layers_per_chunk = 0;
  const std::vector<int> counts = stage_layer_counts(m, pp, v, stage_layers);
  for (int c = 0; c < v; ++c) layers_per_chunk = std::max(layers_per_chunk, counts[c * pp + rank]);
  b.activations = layer_activation_bytes(m, s, t) * layers_per_chunk * std::max(1, peak_in_flight_chunks);
  // The embedding output of each in-flight micro-batch on the first stage, and one layer's working set (the
  // backward of the layer being recomputed holds its full activations once).
  b.activations += (t.recompute == Recompute::None ? 0 : 34.0 * s.seq * s.micro_batch * m.d_model / s.tp);
  return b;
}

}  // namespace mt::perf
