// Slices: boxes of row-major tensors (a start and an extent per dimension). A sharded checkpoint records where
// each piece it stores belongs in its full tensor as a slice, and a rank of any layout asks for the slices it
// needs; these are the few geometric helpers both sides share.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "megatrain/model/shard.h"

namespace mt {

struct Slice {
  std::vector<int64_t> start, extent;

  int64_t numel() const;
  std::string str() const;  // "[0:64, 32:64]" (begin:end per dimension); any slice, even a malformed one
  bool operator==(const Slice&) const = default;
};

int64_t shape_numel(const std::vector<int64_t>& shape);
// The number of elements of `shape`; nullopt when a dimension is negative or the product of the non-zero dimensions
// overflows int64 (so no stride of the shape overflows either).
std::optional<int64_t> checked_numel(const std::vector<int64_t>& shape);
Slice whole_slice(const std::vector<int64_t>& shape);
// The overlap of a and b (same rank), nullopt when they share no element.
std::optional<Slice> intersect(const Slice& a, const Slice& b);
// "" when s lies inside a tensor of `shape` (the same rank, no negative start or extent, start + extent within
// every dimension, checked without overflow); otherwise what is wrong. A slice read from a file must pass this
// before the other helpers here see it: they assume well-formed slices.
std::string slice_problem(const Slice& s, const std::vector<int64_t>& shape);
// Whether s lies inside a tensor of `shape` (slice_problem finds nothing).
bool slice_within(const Slice& s, const std::vector<int64_t>& shape);
// Whether the elements of s are one contiguous run of a row-major tensor of `shape`.
bool slice_contiguous(const Slice& s, const std::vector<int64_t>& shape);
// Flat (row-major) index of the element at `index` of a tensor of `shape`.
int64_t flat_index(const std::vector<int64_t>& index, const std::vector<int64_t>& shape);

// "" when `pieces` tile a tensor of `shape` exactly (each inside it, no two overlapping, every element covered);
// otherwise what is wrong, e.g. "pieces [0:2, 0:4] and [1:3, 0:4] overlap" or "6 of 16 elements are in no piece".
std::string tiling_problem(const std::vector<int64_t>& shape, const std::vector<Slice>& pieces);

// The slices, in increasing flat order, that cover exactly elements [begin, end) of a row-major tensor of `shape`
// (at most 2*ndim - 1 of them, each contiguous). ZeRO shards the optimizer moments as flat ranges; this turns
// such a range into boxes a checkpoint can place.
std::vector<Slice> flat_range_slices(const std::vector<int64_t>& shape, int64_t begin, int64_t end);

// Copies the box of `extent` at src_start of src (row-major, src_shape) to dst_start of dst (dst_shape); every
// element is elem_bytes long. Pointers need no alignment (safetensors data may be unaligned).
void copy_box(const void* src, const std::vector<int64_t>& src_shape, const std::vector<int64_t>& src_start, void* dst,
              const std::vector<int64_t>& dst_shape, const std::vector<int64_t>& dst_start,
              const std::vector<int64_t>& extent, size_t elem_bytes);

// Where a box of a tensor-parallel rank's shard lies in the full tensor: the box `local` (in the coordinates of
// spec.local_shape()) splits into one placement per contiguous run of the split dimension (ShardSpec::pieces).
struct Placement {
  Slice full;   // in the full tensor (spec.full_shape)
  Slice local;  // the same elements in the shard
};
std::vector<Placement> shard_placements(const ShardSpec& spec, const Slice& local);

}  // namespace mt
