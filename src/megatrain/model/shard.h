// How a parameter is split over the tensor-parallel ranks (Megatron layout), or over the expert-parallel ranks (a
// MoE layer's expert tensors [E, ...], rows = experts), and the copies between a full tensor and one rank's shard. A split dimension may consist of several consecutive parts that are chunked
// separately (c_attn: q | k | v rows; SwiGLU c_fc: gate | up rows), so every rank keeps the matching rows of
// each part and a local GEMM still produces [my q | my k | my v].
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mt {

struct ShardSpec {
  enum class Kind { Replicated, Rows, Cols };
  // The mesh axis of the split: tp (replicated over dp), or ep (the experts; replicated over the expert-dp group and
  // over tp). tp_size / tp_rank are that axis's size and my rank on it.
  enum class Axis { Tp, Ep };
  Kind kind = Kind::Replicated;
  Axis axis = Axis::Tp;
  int tp_size = 1, tp_rank = 0;
  std::vector<int64_t> full_shape;
  // Rows/Cols: sizes (in the full tensor) of the consecutive parts along the split dimension; each part is cut
  // into tp_size equal pieces. One part for a plain split.
  std::vector<int64_t> parts;

  bool sharded() const { return kind != Kind::Replicated && tp_size > 1; }
  bool tp_sharded() const { return sharded() && axis == Axis::Tp; }
  bool ep_sharded() const { return sharded() && axis == Axis::Ep; }
  int dim() const { return kind == Kind::Cols ? 1 : 0; }
  std::vector<int64_t> local_shape() const;
  int64_t full_numel() const;
  int64_t local_numel() const;

  // One contiguous run of the split dimension: [full_begin, full_begin + len) of the full tensor is
  // [local_begin, local_begin + len) of rank r's shard (slice offsets for per-rank checkpoint files later).
  struct Piece {
    int64_t full_begin = 0, local_begin = 0, len = 0;
  };
  std::vector<Piece> pieces(int rank) const;
  std::string describe() const;  // e.g. "rows{64,32,32}/2" for a manifest
};

ShardSpec replicated_spec(std::vector<int64_t> shape);
// Throws mt::Error naming `what` when a part does not divide by tp_size.
ShardSpec split_spec(ShardSpec::Kind kind, std::vector<int64_t> shape, std::vector<int64_t> parts, int tp_size,
                     int tp_rank, const std::string& what);

// Rank ep_rank's experts of a [E, ...] expert tensor: rows [ep_rank*E/ep, (ep_rank+1)*E/ep). Throws mt::Error
// naming the keys when ep does not divide E.
ShardSpec expert_spec(std::vector<int64_t> shape, int ep_size, int ep_rank, const std::string& what);

// local (my shard, spec.local_shape()) = my slice of full (spec.full_shape).
void shard_slice(const ShardSpec& spec, const float* full, float* local);
// Writes rank r's shard into its place in full.
void shard_place(const ShardSpec& spec, int rank, const float* local, float* full);

}  // namespace mt
