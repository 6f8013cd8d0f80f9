#include "megatrain/ckpt/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>

#include "megatrain/ckpt/checksum.h"
#include "megatrain/ckpt/reader.h"
#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"

namespace mt {

namespace fs = std::filesystem;
using nlohmann::json;

std::string checkpoint_dir_name(int64_t step) { return fmt::format("step_{:08d}", step); }

// "step_<digits>" -> step; anything else (including "step_00000100.tmp-123") -> nullopt.
static std::optional<int64_t> parse_step_dir(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "step_") != 0 || name.size() > 5 + 18) return std::nullopt;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

static bool is_committed(const fs::path& dir) {
  std::error_code ec;
  return parse_step_dir(dir.filename().string()) && fs::is_regular_file(dir / "manifest.json", ec);
}

static void check_file_name(const std::string& f) {
  MT_CHECK(!f.empty() && f.find('/') == std::string::npos && f[0] != '.' && f != "manifest.json",
           "checkpoint file name '{}' is not allowed (plain names only, not manifest.json)", f);
}

// ---------------------------------------------------------------------------------------------- save

std::string save_checkpoint(const std::string& root, int64_t step, const CheckpointFiles& files, const json& extra,
                            const SaveOptions& opt) {
  MT_CHECK(!root.empty(), "save_checkpoint: empty checkpoint root");
  MT_CHECK(step >= 0, "save_checkpoint: negative step {}", step);
  MT_CHECK(!files.empty(), "save_checkpoint: no files to write");
  std::set<std::string> names;
  for (auto& [fname, refs] : files) {
    check_file_name(fname);
    for (auto& r : refs)
      MT_CHECK(names.insert(r.name).second, "save_checkpoint: tensor '{}' appears in more than one place", r.name);
  }
  auto hook = [&](const std::string& stage) {
    if (opt.fault_hook) opt.fault_hook(stage);
  };

  std::error_code ec;
  fs::create_directories(root, ec);
  MT_CHECK(fs::is_directory(root), "cannot create checkpoint directory {}: {}", root, ec.message());
  const std::string name = checkpoint_dir_name(step);
  const fs::path final_dir = fs::path(root) / name;
  const fs::path tmp_dir = fs::path(root) / (name + ".tmp-" + std::to_string(::getpid()));
  fs::remove_all(tmp_dir, ec);  // a leftover of an earlier attempt by a process with our pid
  MT_CHECK(fs::create_directory(tmp_dir, ec), "cannot create {}: {}", tmp_dir.string(), ec.message());

  try {
    json files_j = json::object(), tensors_j = json::object();
    for (auto& [fname, refs] : files) {
      auto res = write_safetensors((tmp_dir / fname).string(), refs,
                                   {{"megatrain", "checkpoint"}, {"step", std::to_string(step)}});
      files_j[fname] = {{"bytes", res.file_bytes}, {"checksum", format_checksum(res.file_crc)}};
      for (auto& r : refs)
        tensors_j[r.name] = {{"file", fname},
                             {"dtype", dtype_name(r.dtype)},
                             {"shape", r.shape},
                             {"checksum", format_checksum(res.tensor_crc.at(r.name))}};
      hook("file:" + fname);
    }
    json manifest = {{"format_version", kCheckpointFormatVersion},
                     {"step", step},
                     {"files", files_j},
                     {"tensors", tensors_j},
                     {"extra", extra}};
    write_file_atomic((tmp_dir / "manifest.json").string(), seal_manifest(manifest).dump(1) + "\n");
    return commit_checkpoint_dir(root, step, tmp_dir.string(), opt);
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp_dir, ec);
    fail("saving checkpoint {}: {}", final_dir.string(), e.what());
  } catch (...) {
    fs::remove_all(tmp_dir, ec);  // nothing once the directory was renamed into place
    throw;
  }
}

std::string commit_checkpoint_dir(const std::string& root, int64_t step, const std::string& staging_dir,
                                  const SaveOptions& opt) {
  auto hook = [&](const std::string& stage) {
    if (opt.fault_hook) opt.fault_hook(stage);
  };
  std::error_code ec;
  const std::string name = checkpoint_dir_name(step);
  const fs::path final_dir = fs::path(root) / name;
  try {
    hook("rename");
    // rename(2) cannot replace a non-empty directory: move an existing checkpoint of this step aside first.
    fs::path old_dir;
    if (fs::exists(final_dir)) {
      old_dir = fs::path(root) / (name + ".old-" + std::to_string(::getpid()));
      fs::remove_all(old_dir, ec);
      fs::rename(final_dir, old_dir);
    }
    fs::rename(staging_dir, final_dir);
    fsync_path(root);
    if (!old_dir.empty()) fs::remove_all(old_dir, ec);
  } catch (const fs::filesystem_error& e) {
    fail("saving checkpoint {}: {}", final_dir.string(), e.what());
  }

  hook("latest");
  write_file_atomic((fs::path(root) / "latest").string(), name + "\n");

  if (opt.keep_last > 0) {
    // Keep the newest keep_last by step, always including the one just written. Deleting is housekeeping:
    // a failure leaves old checkpoints behind, and the save still stands.
    std::vector<CheckpointEntry> others;
    const auto same = [](const std::string& a, const std::string& b) {
      std::error_code e;
      return !b.empty() && fs::equivalent(a, b, e);
    };
    for (auto& c : list_checkpoints(root))
      if (c.step != step && !same(c.dir, opt.protect)) others.push_back(c);
    int n_keep_others = std::max(0, opt.keep_last - 1);
    int n_drop = std::max(0, static_cast<int>(others.size()) - n_keep_others);
    for (int i = 0; i < n_drop; ++i) fs::remove_all(others[i].dir, ec);
  }
  return final_dir.string();
}

// ---------------------------------------------------------------------------------------------- find

std::vector<CheckpointEntry> list_checkpoints(const std::string& root) {
  std::vector<CheckpointEntry> out;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(root, ec)) {
    if (!e.is_directory(ec) || !is_committed(e.path())) continue;
    out.push_back({*parse_step_dir(e.path().filename().string()), e.path().string()});
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.step < b.step; });
  return out;
}

std::optional<std::string> find_latest(const std::string& root) {
  fs::path latest = fs::path(root) / "latest";
  if (file_exists(latest.string())) {
    std::string name = read_text_file(latest.string());
    while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
    fs::path dir = fs::path(root) / name;
    if (name.find('/') == std::string::npos && is_committed(dir)) return dir.string();
  }
  auto all = list_checkpoints(root);
  if (all.empty()) return std::nullopt;
  return all.back().dir;
}

// ---------------------------------------------------------------------------------------------- load

std::string resolve_checkpoint_dir(const std::string& path) {
  std::error_code ec;
  MT_CHECK(fs::exists(path, ec), "checkpoint path {} does not exist", path);
  MT_CHECK(fs::is_directory(path, ec), "{} is not a checkpoint directory", path);
  std::string base = fs::path(path).lexically_normal().filename().string();
  if (base.empty()) base = fs::path(path).lexically_normal().parent_path().filename().string();
  if (fs::is_regular_file(fs::path(path) / "manifest.json", ec)) {
    MT_CHECK(base.find(".tmp-") == std::string::npos && base.find(".old-") == std::string::npos,
             "{} is an incomplete checkpoint (a save that never committed)", path);
    return path;
  }
  auto latest = find_latest(path);
  MT_CHECK(latest.has_value(), "no checkpoint in {} (no 'latest' file and no step_* directory with a manifest.json)",
           path);
  return *latest;
}

// The checksum of a manifest: CRC-32C of its canonical dump without the checksum field.
static uint32_t manifest_crc(json manifest) {
  manifest.erase(kManifestChecksumKey);
  const std::string canonical = manifest.dump();
  return crc32c(canonical.data(), canonical.size());
}

json seal_manifest(json manifest) {
  MT_CHECK(manifest.is_object(), "seal_manifest: a manifest is a JSON object");
  manifest[kManifestChecksumKey] = format_checksum(manifest_crc(manifest));
  return manifest;
}

json read_manifest(const std::string& dir) {
  const std::string mpath = (fs::path(dir) / "manifest.json").string();
  MT_CHECK(file_exists(mpath), "checkpoint {} has no manifest.json (an incomplete save?)", dir);
  json m;
  try {
    m = json::parse(read_text_file(mpath));
  } catch (const json::exception& e) {
    fail("checkpoint {}: manifest.json is corrupt: {}", dir, e.what());
  }
  MT_CHECK(m.is_object(), "checkpoint {}: manifest.json is corrupt: it is {}, not a JSON object", dir, m.type_name());
  if (!m.contains(kManifestChecksumKey)) {
    // Written before manifests carried a checksum: accepted (every field is still validated before use).
    static std::mutex mu;
    static std::set<std::string> warned;
    std::lock_guard<std::mutex> lock(mu);
    if (warned.insert(mpath).second)
      fmt::print(stderr, "warning: {} has no {} (written by an older megatrain); its integrity cannot be checked\n",
                 mpath, kManifestChecksumKey);
    return m;
  }
  const json& rec = m[kManifestChecksumKey];
  MT_CHECK(rec.is_string(), "checkpoint {}: manifest.json: {} is {}, not a string", dir, kManifestChecksumKey,
           rec.dump());
  uint32_t want = 0;
  try {
    want = parse_checksum(rec.get<std::string>());
  } catch (const Error& e) {
    fail("checkpoint {}: manifest.json: {}: {}", dir, kManifestChecksumKey, e.what());
  }
  const uint32_t have = manifest_crc(m);
  MT_CHECK(have == want,
           "checkpoint {}: manifest.json fails its checksum ({} recorded, {} found): the manifest is "
           "corrupt or was edited",
           dir, format_checksum(want), format_checksum(have));
  return m;
}

Checkpoint Checkpoint::load(const std::string& path, bool verify_checksums) {
  std::error_code ec;
  Checkpoint c;
  c.dir_ = resolve_checkpoint_dir(path);
  const std::string& dir = c.dir_;
  c.manifest_ = read_manifest(dir);
  if (c.manifest_.is_object() && c.manifest_.contains("format_version") &&
      c.manifest_["format_version"] == kShardedCheckpointFormatVersion) {
    c.load_sharded(verify_checksums);
    return c;
  }
  const json& m = c.manifest_;
  auto need = [&](const char* key, bool ok) {
    MT_CHECK(ok, "checkpoint {}: manifest.json lacks a valid '{}'", dir, key);
  };
  need("format_version", m.is_object() && m.contains("format_version") && m["format_version"].is_number_integer());
  int version = m["format_version"].get<int>();
  MT_CHECK(version == kCheckpointFormatVersion,
           "checkpoint {}: format_version {} is not supported (this build reads {} and {})", dir, version,
           kCheckpointFormatVersion, kShardedCheckpointFormatVersion);
  need("step", m.contains("step") && m["step"].is_number_integer());
  need("files", m.contains("files") && m["files"].is_object());
  need("tensors", m.contains("tensors") && m["tensors"].is_object());
  if (!m.contains("extra")) c.manifest_["extra"] = json::object();
  c.step_ = m["step"].get<int64_t>();
  // A recorded checksum, parsed; a malformed one is an error naming the checkpoint and the entry.
  auto recorded = [&](const json& v, const std::string& what) {
    try {
      return parse_checksum(v.get<std::string>());
    } catch (const Error& e) {
      fail("checkpoint {}: manifest entry of {}: {}", dir, what, e.what());
    }
  };

  // Recorded checksum and dtype/shape of each tensor, checked against what each file holds.
  for (auto& [name, t] : m["tensors"].items()) {
    MT_CHECK(t.is_object() && t.contains("file") && t["file"].is_string() &&
                 m["files"].contains(t["file"].get<std::string>()),
             "checkpoint {}: manifest entry of tensor '{}' names no listed file", dir, name);
    c.tensor_file_[name] = t["file"].get<std::string>();
  }
  for (auto& [fname, fj] : m["files"].items()) {
    check_file_name(fname);
    MT_CHECK(fj.is_object() && fj.contains("bytes") && fj["bytes"].is_number_unsigned() && fj.contains("checksum") &&
                 fj["checksum"].is_string(),
             "checkpoint {}: manifest entry of file '{}' lacks bytes/checksum", dir, fname);
    fs::path fpath = fs::path(dir) / fname;
    MT_CHECK(fs::is_regular_file(fpath, ec), "checkpoint {}: file '{}' listed in the manifest is missing", dir, fname);
    uint64_t want_bytes = fj["bytes"].get<uint64_t>(), have = fs::file_size(fpath, ec);
    MT_CHECK(have == want_bytes, "checkpoint {}: file '{}' has {} bytes but the manifest records {} ({})", dir, fname,
             have, want_bytes, have < want_bytes ? "truncated" : "overwritten?");
    SafetensorsFile f = SafetensorsFile::open(fpath.string());

    uint32_t file_crc = verify_checksums ? crc32c(f.bytes(), f.header_size()) : 0;
    for (const TensorData* t : f.in_file_order()) {
      auto it = c.tensor_file_.find(t->name);
      MT_CHECK(it != c.tensor_file_.end() && it->second == fname,
               "checkpoint {}: file '{}' holds tensor '{}' which the manifest does not list there", dir, fname,
               t->name);
      const json& tj = m["tensors"][t->name];
      MT_CHECK(tj.contains("dtype") && tj["dtype"] == t->dtype_str,
               "checkpoint {}: tensor '{}' has dtype {} in '{}' but {} in the manifest", dir, t->name, t->dtype_str,
               fname, tj.contains("dtype") ? tj["dtype"].dump() : "none");
      MT_CHECK(tj.contains("shape") && tj["shape"] == json(t->shape),
               "checkpoint {}: tensor '{}' has shape {} in '{}' but {} in the manifest", dir, t->name, t->shape_str(),
               fname, tj.contains("shape") ? tj["shape"].dump() : "none");
      if (!verify_checksums) continue;
      MT_CHECK(tj.contains("checksum") && tj["checksum"].is_string(), "checkpoint {}: tensor '{}' has no checksum", dir,
               t->name);
      uint32_t crc = crc32c(t->data, t->nbytes);
      uint32_t want = recorded(tj["checksum"], "tensor '" + t->name + "'");
      MT_CHECK(crc == want,
               "checkpoint {}: tensor '{}' in '{}' fails its checksum ({} recorded, {} found): the file is corrupt",
               dir, t->name, fname, format_checksum(want), format_checksum(crc));
      file_crc = crc32c_combine(file_crc, crc, t->nbytes);
    }
    if (verify_checksums) {
      uint32_t want = recorded(fj["checksum"], "file '" + fname + "'");
      MT_CHECK(file_crc == want,
               "checkpoint {}: file '{}' fails its checksum ({} recorded, {} found): the file is corrupt", dir, fname,
               format_checksum(want), format_checksum(file_crc));
    }
    c.files_.emplace(fname, std::move(f));
  }
  for (auto& [name, fname] : c.tensor_file_)
    MT_CHECK(c.files_.at(fname).has(name), "checkpoint {}: tensor '{}' is listed in the manifest but missing from '{}'",
             dir, name, fname);
  return c;
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> v;
  for (auto& [n, _] : tensor_file_) v.push_back(n);
  return v;
}

std::vector<std::string> Checkpoint::tensor_names(const std::string& file) const {
  std::vector<std::string> v;
  for (auto& [n, f] : tensor_file_)
    if (f == file) v.push_back(n);
  return v;
}

const std::string& Checkpoint::file_of(const std::string& name) const {
  auto it = tensor_file_.find(name);
  MT_CHECK(it != tensor_file_.end(), "checkpoint {} has no tensor '{}'", dir_, name);
  return it->second;
}

const TensorData& Checkpoint::get(const std::string& name) const {
  const std::string& f = file_of(name);
  if (!assembled_.empty()) return assembled_.at(name);
  return files_.at(f).get(name);
}

void Checkpoint::load_sharded(bool verify_checksums) {
  CheckpointReader r = CheckpointReader::open(dir_, verify_checksums);
  step_ = r.step();
  if (!manifest_.contains("extra")) manifest_["extra"] = json::object();
  for (const std::string& name : r.tensor_names()) {
    tensor_file_[name] = r.group(name);
    const std::vector<int64_t>& shape = r.shape(name);
    const DType dt = r.dtype(name);
    HostBuffer& b = assembled_data_[name];
    const size_t nbytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dt);
    b.resize(std::max<size_t>(nbytes, 1), false);
    r.read(name, whole_slice(shape), b.data(), shape, std::vector<int64_t>(shape.size(), 0));
    TensorData t;
    t.name = name;
    t.dtype = dt;
    t.dtype_str = dtype_name(dt);
    t.supported = true;
    t.shape = shape;
    t.data = b.data();
    t.nbytes = nbytes;
    assembled_[name] = std::move(t);
  }
}

void Checkpoint::copy_into(const std::string& name, Tensor dst) const {
  const TensorData& t = get(name);
  MT_CHECK(dst.device == Device::CPU, "copy_into '{}': the destination must be a host tensor", name);
  MT_CHECK(t.dtype == dst.dtype, "checkpoint tensor {} has dtype {} but the model expects {}", name, t.dtype_str,
           dtype_name(dst.dtype));
  std::vector<int64_t> want(dst.dims.begin(), dst.dims.begin() + dst.ndim);
  MT_CHECK(t.shape == want, "checkpoint tensor {} has shape {} but the model expects {}", name, t.shape_str(),
           shape_str(want));
  if (t.nbytes) std::memcpy(dst.ptr, t.data, t.nbytes);
}

}  // namespace mt
