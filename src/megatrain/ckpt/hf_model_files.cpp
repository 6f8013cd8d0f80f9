#include "megatrain/ckpt/hf_model_files.h"

#include <cstring>
#include <deque>
#include <filesystem>
#include <set>

#include "megatrain/core/bf16.h"
#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"

namespace mt {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kHfWeights = "model.safetensors";
constexpr const char* kHfIndex = "model.safetensors.index.json";

bool is_index_path(const std::string& s) {
  const std::string suffix = ".index.json";
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

json read_json_file(const std::string& path) {
  try {
    return json::parse(read_text_file(path));
  } catch (const json::exception& e) {
    fail("{} is not valid JSON: {}", path, e.what());
  }
}

}  // namespace

bool HfModelFiles::is_model_dir(const std::string& path) {
  std::error_code ec;
  const fs::path d(path);
  return fs::is_directory(d, ec) && !fs::exists(d / "manifest.json", ec) &&
         (fs::is_regular_file(d / kHfWeights, ec) || fs::is_regular_file(d / kHfIndex, ec));
}

HfModelFiles HfModelFiles::open(const std::string& path) {
  std::error_code ec;
  MT_CHECK(fs::exists(path, ec), "{} does not exist", path);
  HfModelFiles m;
  m.source_ = path;
  fs::path folder, weights, index;
  if (fs::is_directory(path, ec)) {
    folder = path;
    if (fs::is_regular_file(folder / kHfIndex, ec))
      index = folder / kHfIndex;
    else if (fs::is_regular_file(folder / kHfWeights, ec))
      weights = folder / kHfWeights;
    else
      fail("{} holds neither {} nor {}: not an HF model directory", path, kHfWeights, kHfIndex);
  } else if (is_index_path(path)) {
    index = path;
    folder = index.parent_path();
  } else {
    weights = path;
    folder = weights.parent_path();
  }
  if (fs::is_regular_file(folder / "config.json", ec)) {
    m.config_path_ = (folder / "config.json").string();
    json c = read_json_file(m.config_path_);
    MT_CHECK(c.is_object(), "{}: expected a JSON object of settings (got {})", m.config_path_, c.type_name());
    m.config_ = std::move(c);
  }
  if (!weights.empty()) {
    m.files_.push_back(SafetensorsFile::open(weights.string()));
    for (auto& name : m.files_[0].names()) m.owner_[name] = 0;
    return m;
  }

  // Sharded: the index says which file holds each tensor.
  const std::string where = index.string();
  const json ix = read_json_file(where);
  MT_CHECK(ix.is_object() && ix.contains("weight_map") && ix["weight_map"].is_object(),
           "{}: expected an object with a weight_map object (tensor name -> file name)", where);
  std::map<std::string, size_t> file_index;  // file name -> index into files_
  std::map<size_t, std::set<std::string>> listed;
  for (auto& [name, file] : ix["weight_map"].items()) {
    MT_CHECK(file.is_string(), "{}: weight_map['{}'] must be a file name (got {})", where, name, file.dump());
    const std::string f = file.get<std::string>();
    // A name, not a path: an index must not reach outside its folder.
    MT_CHECK(!f.empty() && f.find('/') == std::string::npos && f != "." && f != "..",
             "{}: weight_map['{}'] = '{}' is not a file name in the index's folder", where, name, f);
    auto it = file_index.find(f);
    if (it == file_index.end()) {
      const fs::path p = folder / f;
      MT_CHECK(fs::is_regular_file(p, ec), "{}: weight_map names {} (for tensor '{}'), which does not exist", where,
               p.string(), name);
      m.files_.push_back(SafetensorsFile::open(p.string()));
      it = file_index.emplace(f, m.files_.size() - 1).first;
    }
    MT_CHECK(m.files_[it->second].has(name), "{}: weight_map puts tensor '{}' in {}, which does not hold it", where,
             name, m.files_[it->second].path());
    m.owner_[name] = it->second;
    listed[it->second].insert(name);
  }
  MT_CHECK(!m.files_.empty(), "{}: weight_map lists no tensors", where);
  // A tensor the index does not list would be dropped without a word by every reader that trusts the index.
  for (size_t i = 0; i < m.files_.size(); ++i)
    for (auto& name : m.files_[i].names())
      MT_CHECK(listed[i].count(name), "{}: {} holds tensor '{}', which the index does not list", where,
               m.files_[i].path(), name);
  return m;
}

bool HfModelFiles::has(const std::string& name) const { return owner_.count(name) > 0; }

const TensorData& HfModelFiles::tensor(const std::string& name) const {
  auto it = owner_.find(name);
  MT_CHECK(it != owner_.end(), "{}: no tensor '{}'", source_, name);
  return files_[it->second].tensors().at(name);
}

const std::string& HfModelFiles::file_of(const std::string& name) const {
  auto it = owner_.find(name);
  MT_CHECK(it != owner_.end(), "{}: no tensor '{}'", source_, name);
  return files_[it->second].path();
}

std::vector<std::string> HfModelFiles::names() const {
  std::vector<std::string> v;
  v.reserve(owner_.size());
  for (auto& [name, _] : owner_) v.push_back(name);
  return v;
}

const TensorData& HfModelFiles::float_tensor(const std::string& name) const {
  const TensorData& t = tensor(name);
  MT_CHECK(t.dtype_str == "F32" || t.dtype_str == "F16" || t.dtype_str == "BF16",
           "{}: tensor '{}' has dtype {}; expected F32, F16 or BF16", file_of(name), name, t.dtype_str);
  return t;
}

std::vector<float> HfModelFiles::read_f32(const std::string& name) const {
  const TensorData& t = float_tensor(name);
  std::vector<float> v(static_cast<size_t>(t.numel()));
  to_f32(t, v.data());
  return v;
}

bool HfModelFiles::same_values(const std::string& a, const std::string& b) const {
  const TensorData &x = float_tensor(a), &y = float_tensor(b);
  if (x.shape != y.shape) return false;
  if (x.dtype_str == y.dtype_str) return x.nbytes == y.nbytes && std::memcmp(x.data, y.data, x.nbytes) == 0;
  return read_f32(a) == read_f32(b);
}

const json* HfModelFiles::setting(const char* key) const {
  if (!config_ || !config_->contains(key) || (*config_)[key].is_null()) return nullptr;
  return &(*config_)[key];
}

const char* torch_dtype_name(DType d) {
  MT_CHECK(d == DType::F32 || d == DType::BF16, "HF weights are written as F32 or BF16, not {}", dtype_name(d));
  return d == DType::F32 ? "float32" : "bfloat16";
}

void write_hf_weights(const std::string& path, std::vector<TensorRef> refs, DType dtype) {
  torch_dtype_name(dtype);                   // checks it
  std::deque<std::vector<uint16_t>> halves;  // alive until the write returns
  if (dtype == DType::BF16)
    for (TensorRef& r : refs) {
      MT_CHECK(r.dtype == DType::F32, "write_hf_weights: tensor '{}' is not F32", r.name);
      int64_t n = 1;
      for (int64_t d : r.shape) n *= d;
      const float* src = static_cast<const float*>(r.data);
      std::vector<uint16_t>& h = halves.emplace_back(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) h[static_cast<size_t>(i)] = float_to_bf16(src[i]);
      r.dtype = DType::BF16;
      r.data = h.data();
    }
  write_safetensors(path, std::move(refs), {{"format", "pt"}});
}

}  // namespace mt
