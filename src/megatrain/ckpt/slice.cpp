#include "megatrain/ckpt/slice.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "megatrain/core/error.h"

namespace mt {

namespace {

int64_t prod(const std::vector<int64_t>& v, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to; ++i) p *= v[i];
  return p;
}

std::vector<int64_t> strides_of(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) s[i - 1] = s[i] * shape[i];
  return s;
}

// Covers [b, e) of the dimensions from d on, the dimensions before d fixed at `prefix`.
void cover(const std::vector<int64_t>& shape, size_t d, int64_t b, int64_t e, std::vector<int64_t>& prefix,
           std::vector<Slice>& out) {
  if (b >= e) return;
  const size_t n = shape.size();
  auto emit = [&](int64_t lo, int64_t hi) {  // indices [lo, hi) of dimension d, the later dimensions whole
    Slice s{prefix, std::vector<int64_t>(prefix.size(), 1)};
    s.start.push_back(lo);
    s.extent.push_back(hi - lo);
    for (size_t j = d + 1; j < n; ++j) {
      s.start.push_back(0);
      s.extent.push_back(shape[j]);
    }
    out.push_back(std::move(s));
  };
  auto within = [&](int64_t row, int64_t lo, int64_t hi) {  // a partial row: recurse one dimension down
    prefix.push_back(row);
    cover(shape, d + 1, lo, hi, prefix, out);
    prefix.pop_back();
  };
  const int64_t inner = prod(shape, d + 1, n);
  int64_t rb = b / inner;
  const int64_t re = e / inner;
  if (b % inner == 0 && e % inner == 0) return emit(rb, re);
  if (rb == re) return within(rb, b - rb * inner, e - rb * inner);
  if (b % inner) {
    within(rb, b - rb * inner, inner);
    ++rb;
  }
  if (rb < re) emit(rb, re);
  if (e % inner) within(re, 0, e - re * inner);
}

}  // namespace

int64_t Slice::numel() const { return prod(extent, 0, extent.size()); }

// Error messages print slices read from corrupt files, so this must not trust the ranks to agree or the ends to fit.
std::string Slice::str() const {
  if (start.size() != extent.size())
    return fmt::format("start [{}] extent [{}]", fmt::join(start, ", "), fmt::join(extent, ", "));
  std::vector<std::string> d;
  for (size_t i = 0; i < start.size(); ++i) {
    int64_t end = 0;
    const bool wraps = __builtin_add_overflow(start[i], extent[i], &end);
    d.push_back(wraps ? fmt::format("{}:{}+{}", start[i], start[i], extent[i]) : fmt::format("{}:{}", start[i], end));
  }
  return fmt::format("[{}]", fmt::join(d, ", "));
}

int64_t shape_numel(const std::vector<int64_t>& shape) { return prod(shape, 0, shape.size()); }

std::optional<int64_t> checked_numel(const std::vector<int64_t>& shape) {
  int64_t nonzero = 1;
  for (int64_t d : shape)
    if (d < 0 || (d > 0 && __builtin_mul_overflow(nonzero, d, &nonzero))) return std::nullopt;
  return shape_numel(shape);
}

Slice whole_slice(const std::vector<int64_t>& shape) { return Slice{std::vector<int64_t>(shape.size(), 0), shape}; }

std::optional<Slice> intersect(const Slice& a, const Slice& b) {
  MT_CHECK(a.start.size() == b.start.size(), "intersect: slices {} and {} differ in rank", a.str(), b.str());
  Slice s;
  for (size_t i = 0; i < a.start.size(); ++i) {
    const int64_t lo = std::max(a.start[i], b.start[i]);
    const int64_t hi = std::min(a.start[i] + a.extent[i], b.start[i] + b.extent[i]);
    if (hi <= lo) return std::nullopt;
    s.start.push_back(lo);
    s.extent.push_back(hi - lo);
  }
  return s;
}

std::string slice_problem(const Slice& s, const std::vector<int64_t>& shape) {
  const size_t n = shape.size();
  if (s.start.size() != n || s.extent.size() != n)
    return fmt::format("its start has rank {} and its extent rank {}, but the tensor has rank {}", s.start.size(),
                       s.extent.size(), n);
  for (size_t i = 0; i < n; ++i) {
    if (s.start[i] < 0 || s.extent[i] < 0) return fmt::format("it has a negative start or extent in dimension {}", i);
    // start + extent <= shape, rearranged so that a huge start cannot wrap around into range
    if (s.extent[i] > shape[i] || s.start[i] > shape[i] - s.extent[i])
      return fmt::format("it lies outside dimension {} (of size {}) of the tensor's shape [{}]", i, shape[i],
                         fmt::join(shape, ", "));
  }
  return "";
}

bool slice_within(const Slice& s, const std::vector<int64_t>& shape) { return slice_problem(s, shape).empty(); }

bool slice_contiguous(const Slice& s, const std::vector<int64_t>& shape) {
  size_t k = 0;
  while (k < shape.size() && s.extent[k] == 1) ++k;  // leading single indices
  for (size_t j = k + 1; j < shape.size(); ++j)
    if (s.start[j] != 0 || s.extent[j] != shape[j]) return false;
  return true;
}

int64_t flat_index(const std::vector<int64_t>& index, const std::vector<int64_t>& shape) {
  int64_t f = 0;
  for (size_t i = 0; i < shape.size(); ++i) f = f * shape[i] + index[i];
  return f;
}

std::string tiling_problem(const std::vector<int64_t>& shape, const std::vector<Slice>& pieces) {
  if (!checked_numel(shape))
    return fmt::format("the shape [{}] has a negative dimension or a size that overflows", fmt::join(shape, ", "));
  for (const Slice& p : pieces) {
    const std::string problem = slice_problem(p, shape);
    if (!problem.empty()) return fmt::format("piece {}: {}", p.str(), problem);
    if (p.numel() == 0) return fmt::format("piece {} is empty", p.str());
  }
  // Overlaps: sweep the pieces in order of their first-dimension start; only pieces whose first-dimension ranges
  // meet can overlap, which keeps this near-linear for the row-wise pieces of real checkpoints.
  std::vector<size_t> order(pieces.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto lo = [&](size_t i) { return shape.empty() ? 0 : pieces[i].start[0]; };
  auto hi = [&](size_t i) { return shape.empty() ? 1 : pieces[i].start[0] + pieces[i].extent[0]; };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return lo(a) < lo(b); });
  int64_t covered = 0;
  for (size_t a = 0; a < order.size(); ++a) {
    covered += pieces[order[a]].numel();
    for (size_t b = a + 1; b < order.size() && lo(order[b]) < hi(order[a]); ++b)
      if (shape.empty() || intersect(pieces[order[a]], pieces[order[b]]))
        return fmt::format("pieces {} and {} overlap", pieces[order[a]].str(), pieces[order[b]].str());
  }
  const int64_t n = shape_numel(shape);
  if (covered != n) return fmt::format("{} of {} elements are in no piece (a hole)", n - covered, n);
  return "";
}

std::vector<Slice> flat_range_slices(const std::vector<int64_t>& shape, int64_t begin, int64_t end) {
  const int64_t n = shape_numel(shape);
  MT_CHECK(0 <= begin && begin <= end && end <= n, "flat range [{}, {}) is outside a tensor of {} elements", begin, end,
           n);
  std::vector<Slice> out;
  if (begin == end) return out;
  if (shape.empty()) return {Slice{}};
  std::vector<int64_t> prefix;
  cover(shape, 0, begin, end, prefix, out);
  return out;
}

void copy_box(const void* src, const std::vector<int64_t>& src_shape, const std::vector<int64_t>& src_start, void* dst,
              const std::vector<int64_t>& dst_shape, const std::vector<int64_t>& dst_start,
              const std::vector<int64_t>& extent, size_t elem_bytes) {
  const size_t n = extent.size();
  MT_CHECK(src_shape.size() == n && dst_shape.size() == n && src_start.size() == n && dst_start.size() == n,
           "copy_box: shapes of different rank");
  MT_CHECK(slice_within({src_start, extent}, src_shape) && slice_within({dst_start, extent}, dst_shape),
           "copy_box: box {} does not fit its source or destination", Slice{src_start, extent}.str());
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  if (n == 0) {
    std::memcpy(d, s, elem_bytes);
    return;
  }
  if (shape_numel(extent) == 0) return;
  const std::vector<int64_t> ss = strides_of(src_shape), ds = strides_of(dst_shape);
  const size_t row = static_cast<size_t>(extent[n - 1]) * elem_bytes;
  std::vector<int64_t> idx(n, 0);  // odometer over every dimension but the last
  while (true) {
    int64_t so = 0, dof = 0;
    for (size_t i = 0; i < n; ++i) {
      so += (src_start[i] + idx[i]) * ss[i];
      dof += (dst_start[i] + idx[i]) * ds[i];
    }
    std::memcpy(d + dof * elem_bytes, s + so * elem_bytes, row);
    size_t k = n - 1;
    while (k > 0) {
      if (++idx[k - 1] < extent[k - 1]) break;
      idx[k - 1] = 0;
      --k;
    }
    if (k == 0) return;
  }
}

std::vector<Placement> shard_placements(const ShardSpec& spec, const Slice& local) {
  const std::vector<int64_t> lshape = spec.local_shape();
  MT_CHECK(slice_within(local, lshape), "shard_placements: {} is outside the shard of shape {}", local.str(),
           fmt::format("[{}]", fmt::join(lshape, ", ")));
  if (!spec.sharded()) return {Placement{local, local}};
  const size_t d = static_cast<size_t>(spec.dim());
  const int64_t lo = local.start[d], hi = lo + local.extent[d];
  std::vector<Placement> out;
  for (const ShardSpec::Piece& p : spec.pieces(spec.tp_rank)) {
    const int64_t a = std::max(lo, p.local_begin), b = std::min(hi, p.local_begin + p.len);
    if (a >= b) continue;
    Placement pl{local, local};
    pl.local.start[d] = a;
    pl.local.extent[d] = b - a;
    pl.full.start[d] = p.full_begin + (a - p.local_begin);
    pl.full.extent[d] = b - a;
    out.push_back(std::move(pl));
  }
  return out;
}

}  // namespace mt
