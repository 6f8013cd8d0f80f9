#include "megatrain/train/model_stack.h"

#include <fmt/format.h>

#include "megatrain/model/layout.h"
#include "megatrain/parallel/data_parallel.h"

namespace mt {

ModelStack build_model_stack(const RunConfig& cfg, Topology& topo) {
  ModelStack s;
  const MeshShape& shape = topo.shape;
  const MeshCoord& at = topo.coord;
  const int pp = shape.pp, vstages = cfg.parallel.virtual_stages;
  s.microbatches = cfg.pipeline_microbatches();
  if (shape.tp > 1) {
    TensorParallelOptions to;
    to.chunks = cfg.parallel.tp_chunks;
    to.overlap = cfg.parallel.overlap;
    s.tp_comm = std::make_unique<ProcessGroupTpComm>(topo.device_mesh->tp(), *topo.ops, to);
    // Planned up front: a micro-batch's B*T rows of d_model, the most any of the model's tp collectives moves.
    s.tp_comm->reserve(static_cast<int64_t>(cfg.data.batch_size) * cfg.data.seq_len, cfg.model.d_model,
                       topo.ops->compute_dtype());
  }
  if (shape.ep > 1) s.ep_comm = std::make_unique<ProcessGroupEpComm>(topo.device_mesh->ep(), cfg.parallel.ep_overlap);
  const GptPart part = pp > 1 ? pipeline_part(cfg.model, pp, vstages, at.pp, cfg.parallel.stage_layers) : GptPart{};
  s.model = std::make_unique<GPT>(cfg.model, *topo.ops, dp_pad_multiple(shape.dp), s.tp_comm.get(), part,
                                  s.ep_comm.get());
  if (pp > 1) {
    s.schedule = vstages > 1 ? make_interleaved_1f1b(pp, vstages, s.microbatches) : make_1f1b(pp, s.microbatches);
    if (cfg.model.tied_embeddings && (at.pp == 0 || at.pp == pp - 1)) {
      const std::vector<int> ranks = {mesh_rank(shape, {at.dp, 0, at.tp}), mesh_rank(shape, {at.dp, pp - 1, at.tp})};
      s.embedding_group = topo.make_device_group(GroupRole::Embedding, fmt::format("emb[{},{}]", ranks[0], ranks[1]),
                                                 ranks);
      if (at.pp == pp - 1) s.wte_copy = s.model->params().index("wte.weight");
    }
  }
  s.norms = make_norm_plan(s.model->params(), shape.tp > 1 ? &topo.host_mesh->tp() : nullptr,
                           pp > 1 ? &topo.host_mesh->pp() : nullptr, s.wte_copy);
  return s;
}

}  // namespace mt
