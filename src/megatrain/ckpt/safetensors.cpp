#include "megatrain/ckpt/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "megatrain/ckpt/checksum.h"
#include "megatrain/ckpt/slice.h"
#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"

namespace mt {

using nlohmann::json;

// A header larger than this is surely corrupt (HF's reader uses the same bound).
static constexpr uint64_t kMaxHeader = 100ull << 20;

// Element sizes of every safetensors dtype, so files holding dtypes we never compute in still open.
static int st_dtype_size(const std::string& d) {
  static const std::map<std::string, int> sizes = {{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
                                                   {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
                                                   {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
  auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", shape[i]);
  return s + "]";
}

int64_t TensorData::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::string TensorData::shape_str() const { return mt::shape_str(shape); }

static float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (man << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);  // rebias 15 -> 127
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal half: normalise into a float
    int e = -1;
    do {
      ++e;
      man <<= 1;
    } while (!(man & 0x400));
    bits = sign | ((112 - e) << 23) | ((man & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

void to_f32(const TensorData& t, float* dst) { to_f32(t, 0, t.numel(), dst); }

void to_f32(const TensorData& t, int64_t first, int64_t count, float* dst) {
  MT_CHECK(first >= 0 && count >= 0 && first + count <= t.numel(), "tensor '{}': elements [{}, {}) of {} asked for",
           t.name, first, first + count, t.numel());
  const size_t n = static_cast<size_t>(count);
  const auto* base = static_cast<const uint8_t*>(t.data);
  if (t.dtype_str == "F32") {
    std::memcpy(dst, base + 4 * first, n * 4);
  } else if (t.dtype_str == "BF16" || t.dtype_str == "F16") {
    const bool bf = t.dtype_str == "BF16";
    const uint8_t* src = base + 2 * first;
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      if (bf) {
        uint32_t bits = static_cast<uint32_t>(h) << 16;
        std::memcpy(dst + i, &bits, 4);
      } else {
        dst[i] = f16_to_f32(h);
      }
    }
  } else {
    fail("tensor '{}' has dtype {}; expected a float tensor (F32, F16 or BF16)", t.name, t.dtype_str);
  }
}

TensorRef tensor_ref(std::string name, const Tensor& t) {
  MT_CHECK(t.device == Device::CPU, "tensor '{}' is on the GPU; copy it to host memory before writing", name);
  TensorRef r;
  r.name = std::move(name);
  r.dtype = t.dtype;
  r.shape.assign(t.dims.begin(), t.dims.begin() + t.ndim);
  r.data = t.ptr;
  return r;
}

// ---------------------------------------------------------------------------------------------- writer

namespace {

// Owns a file descriptor being written; on destruction without commit() the temporary file is removed.
class TmpFile {
 public:
  TmpFile(std::string tmp, std::string final_path) : tmp_(std::move(tmp)), final_(std::move(final_path)) {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    MT_CHECK(fd_ >= 0, "cannot create {}: {}", tmp_, std::strerror(errno));
  }
  ~TmpFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  void write_all(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      MT_CHECK(w > 0, "writing {} failed: {}", final_, w < 0 ? std::strerror(errno) : "no progress");
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
  void commit() {
    MT_CHECK(::fsync(fd_) == 0, "fsync {} failed: {}", tmp_, std::strerror(errno));
    int rc = ::close(fd_);
    fd_ = -1;
    MT_CHECK(rc == 0, "closing {} failed: {}", tmp_, std::strerror(errno));
    MT_CHECK(::rename(tmp_.c_str(), final_.c_str()) == 0, "rename {} -> {} failed: {}", tmp_, final_,
             std::strerror(errno));
    committed_ = true;
    std::string dir = std::filesystem::path(final_).parent_path().string();
    fsync_path(dir.empty() ? "." : dir);
  }

 private:
  std::string tmp_, final_;
  int fd_ = -1;
  bool committed_ = false;
};

uint64_t checked_nbytes(const std::string& name, DType dt, const std::vector<int64_t>& shape) {
  unsigned __int128 n = dtype_size(dt);
  for (auto d : shape) {
    MT_CHECK(d >= 0, "tensor '{}' has a negative dimension in shape {}", name, shape_str(shape));
    n *= static_cast<uint64_t>(d);
    MT_CHECK(n < (static_cast<unsigned __int128>(1) << 62), "tensor '{}' of shape {} is too large", name,
             shape_str(shape));
  }
  return static_cast<uint64_t>(n);
}

}  // namespace

SafetensorsWriteResult write_safetensors(const std::string& path, std::vector<TensorRef> tensors,
                                         const std::map<std::string, std::string>& metadata) {
  std::set<std::string> seen;
  std::vector<uint64_t> nbytes;
  for (auto& t : tensors) {
    MT_CHECK(!t.name.empty(), "writing {}: a tensor has an empty name", path);
    MT_CHECK(t.name != "__metadata__", "writing {}: '__metadata__' is reserved and cannot name a tensor", path);
    MT_CHECK(seen.insert(t.name).second, "writing {}: tensor '{}' appears twice", path, t.name);
  }
  std::sort(tensors.begin(), tensors.end(), [](const TensorRef& a, const TensorRef& b) {
    size_t sa = dtype_size(a.dtype), sb = dtype_size(b.dtype);
    return sa != sb ? sa > sb : a.name < b.name;
  });

  json header = json::object();
  uint64_t off = 0;
  for (auto& t : tensors) {
    uint64_t n = checked_nbytes(t.name, t.dtype, t.shape);
    MT_CHECK(t.data != nullptr || n == 0, "writing {}: tensor '{}' has no data", path, t.name);
    header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {off, off + n}}};
    nbytes.push_back(n);
    off += n;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // the data region starts 8-byte aligned
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(h.size()) >> (8 * i));

  SafetensorsWriteResult res;
  TmpFile f(path + ".tmp-" + std::to_string(::getpid()), path);
  f.write_all(len, 8);
  f.write_all(h.data(), h.size());
  res.file_crc = crc32c_update(crc32c(len, 8), h.data(), h.size());
  // Checksum each chunk just before writing it, while it is in cache; the file CRC is combined from the
  // tensors' CRCs rather than computed in a second pass.
  constexpr size_t kChunk = 8u << 20;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto* p = static_cast<const uint8_t*>(tensors[i].data);
    uint32_t crc = 0;
    for (uint64_t done = 0; done < nbytes[i];) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, nbytes[i] - done));
      crc = crc32c_update(crc, p + done, n);
      f.write_all(p + done, n);
      done += n;
    }
    res.tensor_crc[tensors[i].name] = crc;
    res.file_crc = crc32c_combine(res.file_crc, crc, nbytes[i]);
  }
  f.commit();
  res.file_bytes = 8 + h.size() + off;
  return res;
}

// ---------------------------------------------------------------------------------------------- reader

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept { *this = std::move(o); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    close();
    path_ = std::move(o.path_);
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
    data_start_ = o.data_start_;
    tensors_ = std::move(o.tensors_);
    metadata_ = std::move(o.metadata_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { close(); }

void SafetensorsFile::close() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
  base_ = nullptr;
  size_ = 0;
}

namespace {

// Maps the whole of path read-only; size gets the file's length (at least the 8 bytes of the header's length).
const uint8_t* map_safetensors(const std::string& path, uint64_t& size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MT_CHECK(fd >= 0, "cannot open {}: {}", path, std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{} is not a regular file", path);
  }
  size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    fail("{}: file too short ({} bytes) to be safetensors", path, size);
  }
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);
  MT_CHECK(m != MAP_FAILED, "cannot map {}: {}", path, std::strerror(err));
  return static_cast<const uint8_t*>(m);
}

// The header's length (the file's first 8 bytes, little-endian), checked against the file's size.
uint64_t safetensors_header_length(const std::string& path, const uint8_t* base, uint64_t size) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(base[i]) << (8 * i);
  MT_CHECK(n <= kMaxHeader, "{}: header length {} is implausible (corrupt file, or not safetensors)", path, n);
  MT_CHECK(n <= size - 8, "{}: header length {} exceeds the file size {} (truncated file?)", path, n, size);
  return n;
}

json parse_safetensors_header(const std::string& path, const uint8_t* base, uint64_t n) {
  json h;
  try {
    h = json::parse(base + 8, base + 8 + n);
  } catch (const json::exception& e) {
    fail("{}: corrupt header (not JSON): {}", path, e.what());
  }
  MT_CHECK(h.is_object(), "{}: corrupt header: expected a JSON object", path);
  return h;
}

void read_safetensors_metadata(const std::string& path, const json& v, std::map<std::string, std::string>& metadata) {
  MT_CHECK(v.is_object(), "{}: __metadata__ must be an object of strings", path);
  for (auto& [k, s] : v.items()) {
    MT_CHECK(s.is_string(), "{}: __metadata__ entry '{}' is not a string", path, k);
    metadata[k] = s.get<std::string>();
  }
}

// The header's entry for tensor `name`, checked against the data region of data_len bytes at base + data_start.
TensorData safetensors_entry(const std::string& path, const std::string& name, const json& v, const uint8_t* base,
                             uint64_t data_start, uint64_t data_len) {
  auto bad = [&path, &name](const std::string& why) { fail("{}: tensor '{}': {}", path, name, why); };
  if (!v.is_object()) bad("entry is not an object");
  if (!v.contains("dtype") || !v["dtype"].is_string()) bad("missing or non-string 'dtype'");
  if (!v.contains("shape") || !v["shape"].is_array()) bad("missing or non-array 'shape'");
  if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
    bad("missing 'data_offsets' (expected [begin, end])");
  TensorData t;
  t.name = name;
  t.dtype_str = v["dtype"].get<std::string>();
  int esize = st_dtype_size(t.dtype_str);
  if (esize == 0) bad(fmt::format("unknown dtype '{}'", t.dtype_str));
  for (auto& d : v["shape"]) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > (1ull << 62))
      bad(fmt::format("shape {} has a non-integer, negative or absurd entry", v["shape"].dump()));
    t.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
  }
  auto& offs = v["data_offsets"];
  if (!offs[0].is_number_unsigned() || !offs[1].is_number_unsigned()) bad("data_offsets must be non-negative integers");
  uint64_t b = offs[0].get<uint64_t>(), e = offs[1].get<uint64_t>();
  if (b > e) bad(fmt::format("data_offsets [{}, {}] are reversed", b, e));
  if (e > data_len)
    bad(fmt::format("data_offsets [{}, {}] run past the data region of {} bytes (truncated file?)", b, e, data_len));
  // Bytes the dtype and shape need, saturated at 2^64 (a corrupt shape may overflow any integer type). The
  // product of the non-zero dimensions must fit int64 even when a zero one makes the tensor empty: callers count
  // elements (shape_numel) left to right, and [2^62, 2^62, 0] overflows before the zero is reached.
  const unsigned __int128 kSat = static_cast<unsigned __int128>(1) << 64;
  unsigned __int128 nonzero = 1;
  bool zero = false;
  for (auto d : t.shape) {
    zero |= d == 0;
    if (d != 0) nonzero = std::min(nonzero * static_cast<uint64_t>(d), kSat);
  }
  const unsigned __int128 want = zero ? 0 : std::min(nonzero * static_cast<unsigned>(esize), kSat);
  if (want != e - b)
    bad(fmt::format("data_offsets [{}, {}] hold {} bytes but {} {} needs {}", b, e, e - b, t.dtype_str, t.shape_str(),
                    want == kSat ? std::string("more than 2^64") : std::to_string(static_cast<uint64_t>(want))));
  // An empty tensor's (the size check passed it) other dimensions must multiply within int64: readers compute
  // numel() and strides.
  if (!checked_numel(t.shape)) bad(fmt::format("shape {} has more elements than int64 can count", t.shape_str()));
  t.nbytes = e - b;
  t.offset = data_start + b;
  t.data = base + t.offset;
  static const std::set<std::string> ours = {"F32", "BF16", "F16", "I32", "I64", "U16", "U8"};
  t.supported = ours.count(t.dtype_str) > 0;
  if (t.supported) t.dtype = dtype_from_name(t.dtype_str);
  return t;
}

// The tensors must tile the data region [data_start, size): no overlaps, no holes, no trailing bytes.
void check_safetensors_tiling(const std::string& path, std::vector<TensorData*> order, uint64_t data_start,
                              uint64_t size) {
  std::sort(order.begin(), order.end(), [](const TensorData* a, const TensorData* b) {
    return a->offset != b->offset ? a->offset < b->offset : a->nbytes < b->nbytes;
  });
  uint64_t pos = data_start;
  for (auto* t : order) {
    MT_CHECK(t->offset >= pos, "{}: tensor '{}' overlaps the previous tensor's data", path, t->name);
    MT_CHECK(t->offset == pos, "{}: {} unused bytes before tensor '{}' (the data region must be fully indexed)", path,
             t->offset - pos, t->name);
    pos += t->nbytes;
  }
  MT_CHECK(pos == size, "{}: {} bytes after the last tensor's data (the file is longer than its header says)", path,
           size - pos);
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  f.base_ = map_safetensors(path, f.size_);
  const uint64_t n = safetensors_header_length(path, f.base_, f.size_);
  f.data_start_ = 8 + n;
  const uint64_t data_len = f.size_ - f.data_start_;
  const json h = parse_safetensors_header(path, f.base_, n);
  std::vector<TensorData*> order;
  for (auto& [name, v] : h.items()) {
    if (name == "__metadata__") {
      read_safetensors_metadata(path, v, f.metadata_);
      continue;
    }
    TensorData t = safetensors_entry(path, name, v, f.base_, f.data_start_, data_len);
    order.push_back(&f.tensors_.emplace(name, std::move(t)).first->second);
  }
  check_safetensors_tiling(path, std::move(order), f.data_start_, f.size_);
  return f;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> v;
  for (auto& [k, _] : tensors_) v.push_back(k);
  return v;
}

const TensorData& SafetensorsFile::get(const std::string& name) const {
  auto it = tensors_.find(name);
  MT_CHECK(it != tensors_.end(), "{}: no tensor '{}'", path_, name);
  MT_CHECK(it->second.supported, "{}: tensor '{}' has dtype {}, which megatrain does not handle", path_, name,
           it->second.dtype_str);
  return it->second;
}

std::vector<const TensorData*> SafetensorsFile::in_file_order() const {
  std::vector<const TensorData*> v;
  for (auto& [_, t] : tensors_) v.push_back(&t);
  std::sort(v.begin(), v.end(), [](const TensorData* a, const TensorData* b) {
    return a->offset != b->offset ? a->offset < b->offset : a->nbytes < b->nbytes;
  });
  return v;
}

}  // namespace mt
