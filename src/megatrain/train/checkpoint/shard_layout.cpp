#include "megatrain/train/checkpoint/shard_layout.h"

#include <optional>

#include "megatrain/optim/optimizer.h"
#include "megatrain/parallel/data_parallel.h"

namespace mt {

namespace {

// The pieces of `box` (in tensor i's shard; `data` holds the box's elements contiguously) under full tensor
// `name`: one per contiguous run of tp's split dimension, clipped to the saved shape. A piece that is not
// contiguous within the box is copied to `staging`.
void add_layout_pieces(const RankHoldings& h, std::vector<ShardPiece>& out, std::deque<HostBuffer>& staging, int i,
                       const std::string& name, const char* group, const Slice& box, const float* data) {
  const std::vector<int64_t> gshape = saved_shape(h.cfg.model, h.model.params().info(i));
  const size_t n = gshape.size();
  for (const Placement& pl : shard_placements(h.model.params().info(i).shard, box)) {
    const std::optional<Slice> full = intersect(pl.full, whole_slice(gshape));
    if (!full) continue;
    std::vector<int64_t> at(n);  // where the piece starts within the box
    for (size_t d = 0; d < n; ++d) at[d] = pl.local.start[d] + (full->start[d] - pl.full.start[d]) - box.start[d];
    const float* p = nullptr;
    if (slice_contiguous(Slice{at, full->extent}, box.extent)) {
      p = data + flat_index(at, box.extent);
    } else {
      staging.emplace_back(static_cast<size_t>(full->numel()) * sizeof(float), false);
      copy_box(data, box.extent, at, staging.back().data(), full->extent, std::vector<int64_t>(n, 0), full->extent,
               sizeof(float));
      p = staging.back().f32();
    }
    out.push_back(ShardPiece{name, group, gshape, *full, DType::F32, p});
  }
}

}  // namespace

std::vector<int64_t> saved_shape(const ModelConfig& model, const ParamInfo& info) {
  std::vector<int64_t> s = info.shard.full_shape;
  if (info.name == "wte.weight" || info.name == "lm_head.weight") s[0] = model.padded_vocab();
  return s;
}

std::vector<std::string> shard_files(const ParallelConfig& parallel) {
  std::vector<std::string> files;
  for (int p = 0; p < parallel.pp; ++p)
    for (int t = 0; t < parallel.tp; ++t)
      for (int d = 0; d < parallel.dp; ++d) files.push_back(shard_file_name(p, t, d));
  return files;
}

std::vector<ShardPiece> pieces_to_write(const RankHoldings& h, std::deque<HostBuffer>& staging) {
  const ParamStore& ps = h.model.params();
  const MeshCoord c = h.coord();
  auto mine = [&](int i) { return i != h.wte_copy && (c.tp == 0 || ps.info(i).shard.tp_sharded()); };
  std::vector<ShardPiece> out;
  for (int i = 0; i < static_cast<int>(ps.size()); ++i) {
    // The dp replica that writes the parameter: dp rank 0, or for an expert shard its expert-dp rank 0.
    const int replica = ps.info(i).shard.ep_sharded() ? c.dp / h.cfg.parallel.ep : c.dp;
    if (!mine(i) || replica != 0) continue;
    const Slice all = whole_slice(ps.info(i).shape);
    add_layout_pieces(h, out, staging, i, ps.info(i).name, "model.safetensors", all, ps.param(i).f32());
    if (h.opt) {
      add_layout_pieces(h, out, staging, i, "m." + ps.info(i).name, "optim.safetensors", all, h.opt->m(i).f32());
      add_layout_pieces(h, out, staging, i, "v." + ps.info(i).name, "optim.safetensors", all, h.opt->v(i).f32());
    }
  }
  for (DataParallel* zero : h.zero_instances()) {
    for (const DataParallel::MomentSlice& ms : zero->moment_slices()) {
      if (!mine(ms.tensor)) continue;
      const ParamInfo& info = ps.info(ms.tensor);
      for (const Slice& box :
           flat_range_slices(info.shape, static_cast<int64_t>(ms.begin), static_cast<int64_t>(ms.end))) {
        const int64_t off = flat_index(box.start, info.shape) - static_cast<int64_t>(ms.begin);
        add_layout_pieces(h, out, staging, ms.tensor, "m." + info.name, "optim.safetensors", box, ms.m + off);
        add_layout_pieces(h, out, staging, ms.tensor, "v." + info.name, "optim.safetensors", box, ms.v + off);
      }
    }
  }
  return out;
}


bool pieces_cover_holdings(const RankHoldings& h) {
  const MeshCoord c = h.coord();
  return !h.mesh || (c.dp == 0 && c.tp == 0 && h.wte_copy < 0);
}

bool writes_gathered_stage(const RankHoldings& h) {
  const MeshCoord c = h.coord();
  return !h.mesh || (c.dp == 0 && c.tp == 0);
}

bool one_reader(const RankHoldings& h) {
  return h.mesh && h.cfg.ckpt.one_reader && h.cfg.parallel.dp > 1 && h.cfg.parallel.ep == 1;
}

bool reads_replicas(const RankHoldings& h) { return !one_reader(h) || h.coord().dp == 0; }

}  // namespace mt
