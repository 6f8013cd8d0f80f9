#include "megatrain/model/shard.h"

#include <fmt/format.h>

#include <cstring>

#include "megatrain/core/error.h"

namespace mt {

namespace {

int64_t prod(const std::vector<int64_t>& v, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to && i < v.size(); ++i) p *= v[i];
  return p;
}

// Calls f(full_offset, local_offset, n) for every contiguous run of floats of rank r's shard.
template <typename F>
void for_each_run(const ShardSpec& s, int r, F&& f) {
  const size_t d = static_cast<size_t>(s.dim());
  const int64_t outer = prod(s.full_shape, 0, d), inner = prod(s.full_shape, d + 1, s.full_shape.size());
  const int64_t full_len = s.full_shape[d], local_len = s.local_shape()[d];
  for (const ShardSpec::Piece& p : s.pieces(r))
    for (int64_t o = 0; o < outer; ++o)
      f((o * full_len + p.full_begin) * inner, (o * local_len + p.local_begin) * inner, p.len * inner);
}

}  // namespace

std::vector<int64_t> ShardSpec::local_shape() const {
  std::vector<int64_t> s = full_shape;
  if (sharded()) s[dim()] /= tp_size;
  return s;
}

int64_t ShardSpec::full_numel() const { return prod(full_shape, 0, full_shape.size()); }
int64_t ShardSpec::local_numel() const { return sharded() ? full_numel() / tp_size : full_numel(); }

std::vector<ShardSpec::Piece> ShardSpec::pieces(int rank) const {
  if (!sharded()) return {Piece{0, 0, full_shape.empty() ? 1 : full_shape[dim()]}};
  std::vector<Piece> out;
  int64_t full_at = 0, local_at = 0;
  for (int64_t p : parts) {
    const int64_t len = p / tp_size;
    out.push_back(Piece{full_at + rank * len, local_at, len});
    full_at += p;
    local_at += len;
  }
  return out;
}

std::string ShardSpec::describe() const {
  if (!sharded()) return "replicated";
  return fmt::format("{}{{{}}}/{}{}", kind == Kind::Rows ? "rows" : "cols", fmt::join(parts, ","),
                     axis == Axis::Ep ? "ep" : "", tp_size);
}

ShardSpec expert_spec(std::vector<int64_t> shape, int ep_size, int ep_rank, const std::string& what) {
  MT_CHECK(!shape.empty() && shape[0] % ep_size == 0, "{}: model.moe_experts = {} does not divide by parallel.ep = {}",
           what, shape.empty() ? 0 : shape[0], ep_size);
  const int64_t experts = shape[0];
  ShardSpec s = split_spec(ShardSpec::Kind::Rows, std::move(shape), {experts}, ep_size, ep_rank, what);
  s.axis = ShardSpec::Axis::Ep;
  return s;
}

ShardSpec replicated_spec(std::vector<int64_t> shape) {
  ShardSpec s;
  s.full_shape = std::move(shape);
  return s;
}

ShardSpec split_spec(ShardSpec::Kind kind, std::vector<int64_t> shape, std::vector<int64_t> parts, int tp_size,
                     int tp_rank, const std::string& what) {
  MT_CHECK(tp_size >= 1 && tp_rank >= 0 && tp_rank < tp_size, "{}: tensor-parallel rank {} of {} is invalid", what,
           tp_rank, tp_size);
  ShardSpec s;
  s.kind = kind;
  s.tp_size = tp_size;
  s.tp_rank = tp_rank;
  s.full_shape = std::move(shape);
  s.parts = std::move(parts);
  MT_CHECK(static_cast<int>(s.full_shape.size()) > s.dim(), "{}: cannot split dimension {} of a {}-D tensor", what,
           s.dim(), s.full_shape.size());
  int64_t total = 0;
  for (int64_t p : s.parts) {
    MT_CHECK(p % tp_size == 0, "{}: {} does not divide by parallel.tp = {}", what, p, tp_size);
    total += p;
  }
  MT_CHECK(total == s.full_shape[s.dim()], "{}: parts sum to {} but the split dimension is {}", what, total,
           s.full_shape[s.dim()]);
  return s;
}

void shard_slice(const ShardSpec& s, const float* full, float* local) {
  if (!s.sharded()) {
    std::memcpy(local, full, static_cast<size_t>(s.full_numel()) * sizeof(float));
    return;
  }
  for_each_run(s, s.tp_rank, [&](int64_t f, int64_t l, int64_t n) {
    std::memcpy(local + l, full + f, static_cast<size_t>(n) * sizeof(float));
  });
}

void shard_place(const ShardSpec& s, int rank, const float* local, float* full) {
  if (!s.sharded()) {
    std::memcpy(full, local, static_cast<size_t>(s.full_numel()) * sizeof(float));
    return;
  }
  for_each_run(s, rank, [&](int64_t f, int64_t l, int64_t n) {
    std::memcpy(full + f, local + l, static_cast<size_t>(n) * sizeof(float));
  });
}

}  // namespace mt
