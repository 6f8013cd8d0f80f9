#include "megatrain/ckpt/snapshot.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>

#include "megatrain/core/error.h"

namespace mt {

using nlohmann::json;

namespace {

// Copies n floats and reports whether any is inf/NaN. The copy goes in cache-sized chunks and each chunk is
// tested right after it lands (still in cache), so the check adds no pass over memory: stage 1 reads each value
// once and writes it once.
bool copy_finite(float* dst, const float* src, size_t n) {
  constexpr size_t kChunk = 1 << 13;  // 32 KiB: fits L1 with room to spare
  uint32_t bad = 0;
  for (size_t b = 0; b < n; b += kChunk) {
    const size_t e = std::min(n, b + kChunk);
    std::memcpy(dst + b, src + b, (e - b) * sizeof(float));
    for (size_t i = b; i < e; ++i) bad |= (std::bit_cast<uint32_t>(dst[i]) & 0x7f800000u) == 0x7f800000u;
  }
  return bad == 0;
}

size_t align64(size_t n) { return (n + 63) & ~size_t{63}; }

}  // namespace

void ShardSnapshot::layout(const std::vector<ShardPiece>& pieces) {
  std::vector<size_t> offsets;
  size_t total = 0;
  for (const ShardPiece& p : pieces) {
    offsets.push_back(total);
    total += align64(static_cast<size_t>(p.slice.numel()) * dtype_size(p.dtype));
  }
  // The first layout allocates; the same layout again (every later step) reuses the memory as it is.
  if (total != bytes_ || buf_.size() < total) buf_.resize(std::max<size_t>(total, 64), false);
  bytes_ = total;
  offsets_ = offsets;
  pieces_ = pieces;
  for (size_t i = 0; i < pieces_.size(); ++i) pieces_[i].data = static_cast<char*>(buf_.data()) + offsets_[i];
}

void ShardSnapshot::reserve(const std::vector<ShardPiece>& pieces) {
  layout(pieces);
  std::memset(buf_.data(), 0, buf_.size());
}

bool ShardSnapshot::stage(int64_t step, const std::string& file, const std::vector<ShardPiece>& pieces, json extra) {
  layout(pieces);
  bool finite = true;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const size_t n = static_cast<size_t>(pieces[i].slice.numel());
    void* dst = const_cast<void*>(pieces_[i].data);
    if (pieces[i].dtype == DType::F32)
      finite &= copy_finite(static_cast<float*>(dst), static_cast<const float*>(pieces[i].data), n);
    else
      std::memcpy(dst, pieces[i].data, n * dtype_size(pieces[i].dtype));
  }
  step_ = step;
  file_ = file;
  extra_ = std::move(extra);
  return finite;
}

void ShardSnapshot::write_into(const std::string& dir) const {
  MT_CHECK(step_ >= 0, "shard snapshot: nothing staged to write into {}", dir);
  write_shard_into(dir, step_, file_, pieces_);
}

json ShardSnapshot::header() const {
  json pieces = json::array();
  for (const ShardPiece& p : pieces_)
    pieces.push_back({{"tensor", p.tensor},
                      {"group", p.group},
                      {"shape", p.full_shape},
                      {"start", p.slice.start},
                      {"extent", p.slice.extent},
                      {"dtype", dtype_name(p.dtype)}});
  return {{"step", step_}, {"file", file_}, {"extra", extra_}, {"bytes", bytes_}, {"pieces", pieces}};
}

void ShardSnapshot::receive_layout(const json& h) {
  try {
    std::vector<ShardPiece> pieces;
    for (const json& p : h.at("pieces")) {
      ShardPiece sp;
      sp.tensor = p.at("tensor").get<std::string>();
      sp.group = p.at("group").get<std::string>();
      sp.full_shape = p.at("shape").get<std::vector<int64_t>>();
      sp.slice = Slice{p.at("start").get<std::vector<int64_t>>(), p.at("extent").get<std::vector<int64_t>>()};
      sp.dtype = dtype_from_name(p.at("dtype").get<std::string>());
      MT_CHECK(slice_within(sp.slice, sp.full_shape), "piece {} of '{}' lies outside its shape", sp.slice.str(),
               sp.tensor);
      pieces.push_back(std::move(sp));
    }
    layout(pieces);
    MT_CHECK(bytes_ == h.at("bytes").get<size_t>(), "the header records {} bytes, its pieces need {}",
             h.at("bytes").get<size_t>(), bytes_);
    step_ = h.at("step").get<int64_t>();
    file_ = h.at("file").get<std::string>();
    extra_ = h.at("extra");
  } catch (const json::exception& e) {
    fail("a peer's shard snapshot header is malformed: {}", e.what());
  } catch (const Error& e) {
    fail("a peer's shard snapshot header is malformed: {}", e.what());
  }
}

}  // namespace mt
