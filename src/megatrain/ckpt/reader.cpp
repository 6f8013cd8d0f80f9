#include "megatrain/ckpt/reader.h"

#include <fmt/format.h>

#include <filesystem>
#include <optional>

#include "megatrain/ckpt/checkpoint.h"
#include "megatrain/ckpt/checksum.h"
#include "megatrain/core/error.h"

namespace mt {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A JSON value for a message: short, however large the value.
std::string brief(const json& j) {
  std::string s = j.dump();
  return s.size() <= 40 ? s : s.substr(0, 37) + "...";
}

// Reads the fields of the manifest's entries, each checked before use: a corrupt manifest is an mt::Error naming
// the checkpoint, the entry and the key, never a json::type_error, a crash or a silently wrong tensor.
struct Fields {
  const std::string& dir;

  const json& get(const json& obj, const char* key, const std::string& what) const {
    MT_CHECK(obj.is_object(), "checkpoint {}: manifest.json: {} is {}, not an object", dir, what, brief(obj));
    MT_CHECK(obj.contains(key), "checkpoint {}: manifest.json: {} has no '{}'", dir, what, key);
    return obj[key];
  }
  std::string str(const json& obj, const char* key, const std::string& what) const {
    const json& v = get(obj, key, what);
    MT_CHECK(v.is_string(), "checkpoint {}: manifest.json: '{}' of {} is {}, not a string", dir, key, what, brief(v));
    return v.get<std::string>();
  }
  const json& array(const json& obj, const char* key, const std::string& what) const {
    const json& v = get(obj, key, what);
    MT_CHECK(v.is_array(), "checkpoint {}: manifest.json: '{}' of {} is {}, not a list", dir, key, what, brief(v));
    return v;
  }
  // A shape, start or extent: non-negative integers that fit int64.
  std::vector<int64_t> indices(const json& obj, const char* key, const std::string& what) const {
    std::vector<int64_t> out;
    for (const json& d : array(obj, key, what)) {
      MT_CHECK(d.is_number_integer(), "checkpoint {}: manifest.json: '{}' of {} holds {}, not an integer", dir, key,
               what, brief(d));
      MT_CHECK(!d.is_number_unsigned() || d.get<uint64_t>() <= uint64_t{INT64_MAX},
               "checkpoint {}: manifest.json: '{}' of {} holds {}, which overflows int64", dir, key, what, brief(d));
      MT_CHECK(d.get<int64_t>() >= 0, "checkpoint {}: manifest.json: '{}' of {} holds {}, a negative value", dir, key,
               what, brief(d));
      out.push_back(d.get<int64_t>());
    }
    return out;
  }
  DType dtype(const json& obj, const std::string& what) const {
    const std::string name = str(obj, "dtype", what);
    try {
      return dtype_from_name(name);
    } catch (const Error&) {
      fail("checkpoint {}: manifest.json: {} has dtype '{}', which megatrain does not know", dir, what, name);
    }
  }
  // A tensor's shape, whose size in elements and in bytes fits int64 (the reader and Checkpoint::load compute both).
  std::vector<int64_t> shape(const json& obj, DType dt, const std::string& what) const {
    std::vector<int64_t> s = indices(obj, "shape", what);
    const std::optional<int64_t> n = checked_numel(s);
    int64_t bytes = 0;
    MT_CHECK(n && !__builtin_mul_overflow(*n, static_cast<int64_t>(dtype_size(dt)), &bytes),
             "checkpoint {}: manifest.json: the size of {} (shape {}) overflows", dir, what, shape_str(s));
    return s;
  }
};

}  // namespace

CheckpointReader CheckpointReader::open(const std::string& path, bool verify_checksums) {
  CheckpointReader r;
  r.dir_ = resolve_checkpoint_dir(path);
  r.verify_ = verify_checksums;
  r.manifest_ = read_manifest(r.dir_);
  const json& m = r.manifest_;
  const std::string& dir = r.dir_;
  auto need = [&](const char* key, bool ok) {
    MT_CHECK(ok, "checkpoint {}: manifest.json lacks a valid '{}'", dir, key);
  };
  need("format_version", m.is_object() && m.contains("format_version") && m["format_version"].is_number_integer());
  const int64_t version = m["format_version"].get<int64_t>();
  MT_CHECK(version == kCheckpointFormatVersion || version == kShardedCheckpointFormatVersion,
           "checkpoint {}: format_version {} is not supported (this build reads {} and {})", dir, version,
           kCheckpointFormatVersion, kShardedCheckpointFormatVersion);
  r.version_ = static_cast<int>(version);
  need("step", m.contains("step") && m["step"].is_number_integer());
  need("files", m.contains("files") && m["files"].is_object());
  need("tensors", m.contains("tensors") && m["tensors"].is_object());
  if (!m.contains("extra")) r.manifest_["extra"] = json::object();
  r.step_ = m["step"].get<int64_t>();
  for (auto& [fname, fj] : m["files"].items()) {
    MT_CHECK(!fname.empty() && fname.find('/') == std::string::npos && fname[0] != '.',
             "checkpoint {}: file name '{}' in the manifest is not a plain name", dir, fname);
    MT_CHECK(fj.is_object() && fj.contains("bytes") && fj["bytes"].is_number_unsigned() && fj.contains("checksum") &&
                 fj["checksum"].is_string(),
             "checkpoint {}: manifest entry of file '{}' lacks bytes/checksum", dir, fname);
    try {
      parse_checksum(fj["checksum"].get<std::string>());
    } catch (const Error& e) {
      fail("checkpoint {}: manifest entry of file '{}': {}", dir, fname, e.what());
    }
  }
  if (r.version_ == kCheckpointFormatVersion)
    r.parse_v1();
  else
    r.parse_v2();
  return r;
}

// Format 1: every tensor whole, in the file its entry names.
void CheckpointReader::parse_v1() {
  const Fields f{dir_};
  for (auto& [name, t] : manifest_["tensors"].items()) {
    const std::string what = fmt::format("tensor '{}'", name);
    Entry e;
    e.group = f.str(t, "file", what);
    MT_CHECK(manifest_["files"].contains(e.group),
             "checkpoint {}: tensor '{}' is in file '{}', which the manifest does not list", dir_, name, e.group);
    e.dtype = f.dtype(t, what);
    e.shape = f.shape(t, e.dtype, what);
    e.pieces.push_back({e.group, name, whole_slice(e.shape)});
    tensors_[name] = std::move(e);
  }
}

// Format 2: tensors in pieces, each a slice of the full tensor stored under its own name in a rank's file. Every
// piece is checked to lie inside its tensor before the tiling check sees it, and the pieces in a file must fit in
// the bytes the manifest records for it (a hugely overstated shape cannot make a load allocate without bound).
void CheckpointReader::parse_v2() {
  const Fields f{dir_};
  std::map<std::string, uint64_t> piece_bytes;  // per file
  for (auto& [name, t] : manifest_["tensors"].items()) {
    const std::string what = fmt::format("tensor '{}'", name);
    Entry e;
    e.group = f.str(t, "group", what);
    e.dtype = f.dtype(t, what);
    e.shape = f.shape(t, e.dtype, what);
    const json& pieces = f.array(t, "pieces", what);
    std::vector<Slice> slices;
    for (size_t i = 0; i < pieces.size(); ++i) {
      const std::string pwhat = fmt::format("piece {} of tensor '{}'", i, name);
      Piece pc{f.str(pieces[i], "file", pwhat), f.str(pieces[i], "name", pwhat),
               Slice{f.indices(pieces[i], "start", pwhat), f.indices(pieces[i], "extent", pwhat)}};
      MT_CHECK(manifest_["files"].contains(pc.file),
               "checkpoint {}: piece '{}' of tensor '{}' is in file '{}', which the manifest does not list", dir_,
               pc.name, name, pc.file);
      const std::string problem = slice_problem(pc.slice, e.shape);
      MT_CHECK(problem.empty(), "checkpoint {}: piece '{}' {} of tensor '{}' (shape {}) is malformed: {}", dir_,
               pc.name, pc.slice.str(), name, shape_str(e.shape), problem);
      // Inside the shape, whose byte size fits int64: the product cannot overflow.
      uint64_t& used = piece_bytes[pc.file];
      const uint64_t have = manifest_["files"][pc.file]["bytes"].get<uint64_t>();
      MT_CHECK(!__builtin_add_overflow(used, static_cast<uint64_t>(pc.slice.numel()) * dtype_size(e.dtype), &used) &&
                   used <= have,
               "checkpoint {}: the pieces the manifest places in file '{}' (up to piece '{}' of tensor '{}', shape {}) "
               "need more than its {} bytes",
               dir_, pc.file, pc.name, name, shape_str(pc.slice.extent), have);
      slices.push_back(pc.slice);
      e.pieces.push_back(std::move(pc));
    }
    const std::string problem = tiling_problem(e.shape, slices);
    MT_CHECK(problem.empty(), "checkpoint {}: the pieces of tensor '{}' do not make up its shape {}: {}", dir_, name,
             shape_str(e.shape), problem);
    tensors_[name] = std::move(e);
  }
}

std::vector<std::string> CheckpointReader::tensor_names() const {
  std::vector<std::string> v;
  for (auto& [n, _] : tensors_) v.push_back(n);
  return v;
}

std::vector<std::string> CheckpointReader::files_read() const {
  std::vector<std::string> v;
  for (auto& [n, _] : open_) v.push_back(n);
  return v;
}

const CheckpointReader::Entry& CheckpointReader::entry(const std::string& name) const {
  auto it = tensors_.find(name);
  MT_CHECK(it != tensors_.end(), "checkpoint {} has no tensor '{}'", dir_, name);
  return it->second;
}

const SafetensorsFile& CheckpointReader::file(const std::string& fname) {
  auto it = open_.find(fname);
  if (it != open_.end()) return it->second;
  const json& fj = manifest_["files"][fname];
  const fs::path fpath = fs::path(dir_) / fname;
  std::error_code ec;
  MT_CHECK(fs::is_regular_file(fpath, ec), "checkpoint {}: file '{}' listed in the manifest is missing", dir_, fname);
  const uint64_t want = fj["bytes"].get<uint64_t>(), have = fs::file_size(fpath, ec);
  MT_CHECK(have == want, "checkpoint {}: file '{}' has {} bytes but the manifest records {} ({})", dir_, fname, have,
           want, have < want ? "truncated" : "overwritten?");
  SafetensorsFile f = SafetensorsFile::open(fpath.string());
  if (verify_) {
    const uint32_t crc = crc32c(f.bytes(), f.file_size());
    const uint32_t rec = parse_checksum(fj["checksum"].get<std::string>());
    MT_CHECK(crc == rec, "checkpoint {}: file '{}' fails its checksum ({} recorded, {} found): the file is corrupt",
             dir_, fname, format_checksum(rec), format_checksum(crc));
  }
  return open_.emplace(fname, std::move(f)).first->second;
}

void CheckpointReader::read(const std::string& name, const Slice& src, void* dst, const std::vector<int64_t>& dst_shape,
                            const std::vector<int64_t>& dst_start) {
  const Entry& e = entry(name);
  const size_t n = e.shape.size(), elem = dtype_size(e.dtype);
  MT_CHECK(src.start.size() == n && src.extent.size() == n && dst_shape.size() == n && dst_start.size() == n,
           "reading {} of checkpoint tensor '{}' (shape {}): the slice or destination has another rank", src.str(),
           name, shape_str(e.shape));
  MT_CHECK(slice_within({dst_start, src.extent}, dst_shape),
           "reading {} of checkpoint tensor '{}': the destination {} cannot hold it at {}", src.str(), name,
           shape_str(dst_shape), shape_str(dst_start));
  for (int64_t s : src.start) MT_CHECK(s >= 0, "reading {} of checkpoint tensor '{}': negative start", src.str(), name);
  if (!slice_within(src, e.shape)) {  // the part beyond the saved shape reads as zeros
    std::vector<uint8_t> zeros(static_cast<size_t>(src.numel()) * elem, 0);
    copy_box(zeros.data(), src.extent, std::vector<int64_t>(n, 0), dst, dst_shape, dst_start, src.extent, elem);
  }
  for (const Piece& p : e.pieces) {
    const std::optional<Slice> in = intersect(p.slice, src);
    if (!in) continue;
    const SafetensorsFile& f = file(p.file);
    MT_CHECK(f.has(p.name), "checkpoint {}: file '{}' lacks '{}', a piece of tensor '{}'", dir_, p.file, p.name, name);
    const TensorData& t = f.tensors().at(p.name);
    MT_CHECK(t.dtype_str == dtype_name(e.dtype) && t.shape == p.slice.extent,
             "checkpoint {}: '{}' in file '{}' is {} {} but the manifest records {} {} for this piece of '{}'", dir_,
             p.name, p.file, t.dtype_str, t.shape_str(), dtype_name(e.dtype), shape_str(p.slice.extent), name);
    std::vector<int64_t> from(n), to(n);
    for (size_t i = 0; i < n; ++i) {
      from[i] = in->start[i] - p.slice.start[i];
      to[i] = dst_start[i] + in->start[i] - src.start[i];
    }
    copy_box(t.data, t.shape, from, dst, dst_shape, to, in->extent, elem);
  }
}

}  // namespace mt
