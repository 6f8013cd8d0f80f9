#include "megatrain/ckpt/reader.h"

#include <filesystem>

#include "megatrain/ckpt/checkpoint.h"
#include "megatrain/ckpt/checksum.h"
#include "megatrain/core/error.h"

namespace mt {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bool is_shape(const json& j) {
  if (!j.is_array()) return false;
  for (const json& d : j)
    if (!d.is_number_integer() || d.get<int64_t>() < 0) return false;
  return true;
}

}  // namespace

CheckpointReader CheckpointReader::open(const std::string& path, bool verify_checksums) {
  CheckpointReader r;
  r.dir_ = resolve_checkpoint_dir(path);
  r.verify_ = verify_checksums;
  r.manifest_ = read_manifest(r.dir_);
  const json& m = r.manifest_;
  const std::string& dir = r.dir_;
  auto need = [&](const char* key, bool ok) { MT_CHECK(ok, "checkpoint {}: manifest.json lacks a valid '{}'", dir, key); };
  need("format_version", m.is_object() && m.contains("format_version") && m["format_version"].is_number_integer());
  r.version_ = m["format_version"].get<int>();
  MT_CHECK(r.version_ == kCheckpointFormatVersion || r.version_ == kShardedCheckpointFormatVersion,
           "checkpoint {}: format_version {} is not supported (this build reads {} and {})", dir, r.version_,
           kCheckpointFormatVersion, kShardedCheckpointFormatVersion);
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
  }
  if (r.version_ == kCheckpointFormatVersion)
    r.parse_v1();
  else
    r.parse_v2();
  return r;
}

// Format 1: every tensor whole, in the file its entry names.
void CheckpointReader::parse_v1() {
  for (auto& [name, t] : manifest_["tensors"].items()) {
    MT_CHECK(t.is_object() && t.contains("file") && t["file"].is_string() &&
                 manifest_["files"].contains(t["file"].get<std::string>()),
             "checkpoint {}: manifest entry of tensor '{}' names no listed file", dir_, name);
    MT_CHECK(t.contains("dtype") && t["dtype"].is_string() && t.contains("shape") && is_shape(t["shape"]),
             "checkpoint {}: manifest entry of tensor '{}' lacks dtype/shape", dir_, name);
    Entry e;
    e.group = t["file"].get<std::string>();
    e.dtype = dtype_from_name(t["dtype"].get<std::string>());
    e.shape = t["shape"].get<std::vector<int64_t>>();
    e.pieces.push_back({e.group, name, whole_slice(e.shape)});
    tensors_[name] = std::move(e);
  }
}

// Format 2: tensors in pieces, each a slice of the full tensor stored under its own name in a rank's file.
void CheckpointReader::parse_v2() {
  for (auto& [name, t] : manifest_["tensors"].items()) {
    MT_CHECK(t.is_object() && t.contains("group") && t["group"].is_string() && t.contains("dtype") &&
                 t["dtype"].is_string() && t.contains("shape") && is_shape(t["shape"]) && t.contains("pieces") &&
                 t["pieces"].is_array(),
             "checkpoint {}: manifest entry of tensor '{}' lacks group/dtype/shape/pieces", dir_, name);
    Entry e;
    e.group = t["group"].get<std::string>();
    e.dtype = dtype_from_name(t["dtype"].get<std::string>());
    e.shape = t["shape"].get<std::vector<int64_t>>();
    std::vector<Slice> slices;
    for (const json& p : t["pieces"]) {
      MT_CHECK(p.is_object() && p.contains("file") && p["file"].is_string() && p.contains("name") &&
                   p["name"].is_string() && p.contains("start") && is_shape(p["start"]) && p.contains("extent") &&
                   is_shape(p["extent"]),
               "checkpoint {}: a piece of tensor '{}' lacks file/name/start/extent", dir_, name);
      Piece pc{p["file"].get<std::string>(), p["name"].get<std::string>(),
               Slice{p["start"].get<std::vector<int64_t>>(), p["extent"].get<std::vector<int64_t>>()}};
      MT_CHECK(manifest_["files"].contains(pc.file), "checkpoint {}: piece '{}' of tensor '{}' is in file '{}', which the manifest does not list",
               dir_, pc.name, name, pc.file);
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
