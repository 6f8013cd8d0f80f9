#include "megatrain/data/shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"

namespace fs = std::filesystem;

namespace mt {

// The format is little-endian; reading and writing it with plain memcpy is only right on such a machine.
static_assert(std::endian::native == std::endian::little, "token shards are little-endian; port the byte order");

int shard_version_for_vocab(int vocab_size) { return vocab_size <= 65536 ? 1 : 2; }

std::string shard_path(const std::string& dir, const std::string& split, int index) {
  return fmt::format("{}/{}_{:06d}.bin", dir, split, index);
}

static bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<std::string> list_shards(const std::string& dir, const std::string& split) {
  std::vector<std::string> ours, llmc;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_regular_file()) continue;
    std::string name = e.path().filename().string();
    if (!ends_with(name, ".bin")) continue;
    if (name.rfind(split + "_", 0) == 0) ours.push_back(e.path().string());
    // llm.c names its shards <dataset>_<split>_NNNNNN.bin (or <dataset>_<split>.bin).
    else if (name.find("_" + split + "_") != std::string::npos || ends_with(name, "_" + split + ".bin"))
      llmc.push_back(e.path().string());
  }
  MT_CHECK(!ec, "cannot list {}: {}", dir, ec.message());
  std::vector<std::string>& found = ours.empty() ? llmc : ours;
  std::sort(found.begin(), found.end());
  return found;
}

// ---------------------------------------------------------------------------------------------- writer

static constexpr size_t kWriteBufferBytes = 1 << 20;

ShardWriter::ShardWriter(std::string dir, std::string split, int vocab_size, int eot, uint64_t max_tokens_per_shard)
    : dir_(std::move(dir)), split_(std::move(split)), vocab_size_(vocab_size), eot_(eot),
      version_(shard_version_for_vocab(vocab_size)), max_tokens_(max_tokens_per_shard) {
  MT_CHECK(vocab_size_ > 0, "shard writer: vocab size must be positive, got {}", vocab_size_);
  MT_CHECK(eot_ >= 0 && eot_ < vocab_size_, "shard writer: EOT id {} is outside the vocabulary [0, {})", eot_,
           vocab_size_);
  MT_CHECK(max_tokens_ >= 1 && max_tokens_ <= static_cast<uint64_t>(std::numeric_limits<int32_t>::max()),
           "shard writer: tokens per shard must be in [1, 2^31-1] (the header stores an int32), got {}", max_tokens_);
  MT_CHECK(!split_.empty(), "shard writer: empty split name");
  std::error_code ec;
  fs::create_directories(dir_, ec);
  MT_CHECK(!ec, "cannot create directory {}: {}", dir_, ec.message());
  // Shards of an older run under the same names would otherwise be read as part of this split.
  for (const auto& e : fs::directory_iterator(dir_)) {
    std::string name = e.path().filename().string();
    bool ours = name.size() == split_.size() + 11 && name.rfind(split_ + "_", 0) == 0 && ends_with(name, ".bin") &&
                std::all_of(name.begin() + split_.size() + 1, name.end() - 4, [](char c) { return c >= '0' && c <= '9'; });
    if (ours) fs::remove(e.path());
  }
  buf_.reserve(kWriteBufferBytes + 8);
}

ShardWriter::~ShardWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
  }
}

void ShardWriter::open_shard() {
  std::string path = shard_path(dir_, split_, static_cast<int>(done_.size()));
  tmp_path_ = path + ".tmp." + std::to_string(::getpid());
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  MT_CHECK(fd_ >= 0, "cannot create {}: {}", tmp_path_, std::strerror(errno));
  // Room for the header, filled in at close when the counts are known.
  buf_.assign(kShardHeaderBytes, 0);
  shard_tokens_ = shard_docs_ = 0;
}

static void write_all(int fd, const uint8_t* p, size_t n, off_t offset, const std::string& path) {
  while (n > 0) {
    ssize_t w = offset >= 0 ? ::pwrite(fd, p, n, offset) : ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    MT_CHECK(w > 0, "write to {} failed: {}", path, std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
    if (offset >= 0) offset += w;
  }
}

void ShardWriter::flush_buffer() {
  write_all(fd_, buf_.data(), buf_.size(), -1, tmp_path_);
  buf_.clear();
}

void ShardWriter::close_shard() {
  flush_buffer();
  int32_t header[kShardHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = version_;
  header[2] = static_cast<int32_t>(shard_tokens_);
  header[3] = vocab_size_;
  header[4] = eot_;
  header[5] = static_cast<int32_t>(std::min<uint64_t>(shard_docs_, std::numeric_limits<int32_t>::max()));
  write_all(fd_, reinterpret_cast<const uint8_t*>(header), sizeof(header), 0, tmp_path_);
  int rc = ::fsync(fd_);
  int err = errno;
  ::close(fd_);
  fd_ = -1;
  std::string path = shard_path(dir_, split_, static_cast<int>(done_.size()));
  if (rc != 0 || ::rename(tmp_path_.c_str(), path.c_str()) != 0) {
    if (rc == 0) err = errno;
    ::unlink(tmp_path_.c_str());
    fail("committing shard {} failed: {}", path, std::strerror(err));
  }
  fsync_path(dir_);
  done_.push_back(path);
}

void ShardWriter::append(int32_t token) {
  if (fd_ < 0) open_shard();
  uint8_t bytes[4];
  std::memcpy(bytes, &token, 4);  // little-endian: the low 2 bytes are the uint16 value
  buf_.insert(buf_.end(), bytes, bytes + (version_ == 1 ? 2 : 4));
  ++shard_tokens_;
  ++total_tokens_;
  if (buf_.size() >= kWriteBufferBytes) flush_buffer();
  if (shard_tokens_ == max_tokens_) close_shard();
}

void ShardWriter::add_document(std::span<const int32_t> tokens) {
  MT_CHECK(!finished_, "shard writer for {}/{}: add_document after finish", dir_, split_);
  for (size_t i = 0; i < tokens.size(); ++i)
    MT_CHECK(tokens[i] >= 0 && tokens[i] < vocab_size_, "document {} of split '{}': token {} at position {} is outside "
             "the vocabulary [0, {})", total_docs_, split_, tokens[i], i, vocab_size_);
  if (fd_ < 0) open_shard();
  ++shard_docs_;
  ++total_docs_;
  append(eot_);
  for (int32_t t : tokens) append(t);
}

const std::vector<std::string>& ShardWriter::finish() {
  if (!finished_ && fd_ >= 0) close_shard();
  finished_ = true;
  return done_;
}

// ---------------------------------------------------------------------------------------------- reader

ShardReader::ShardReader(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  MT_CHECK(fd >= 0, "cannot open shard {}: {}", path, std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail("cannot stat shard {}: {}", path, std::strerror(err));
  }
  size_t file_bytes = static_cast<size_t>(st.st_size);
  if (file_bytes < kShardHeaderBytes) {
    ::close(fd);
    fail("shard {} is truncated: {} bytes, shorter than the {}-byte header", path, file_bytes, kShardHeaderBytes);
  }
  void* m = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);  // the mapping keeps the file alive
  MT_CHECK(m != MAP_FAILED, "cannot mmap shard {}: {}", path, std::strerror(err));
  map_ = static_cast<const uint8_t*>(m);
  map_bytes_ = file_bytes;

  try {
    int32_t hdr[kShardHeaderInts];
    std::memcpy(hdr, map_, sizeof(hdr));
    MT_CHECK(hdr[0] == kShardMagic, "shard {} has bad magic {} (expected {}): not a token shard", path, hdr[0],
             kShardMagic);
    MT_CHECK(hdr[1] == 1 || hdr[1] == 2, "shard {} has unknown version {} (1 = uint16 tokens, 2 = uint32 tokens)", path,
             hdr[1]);
    MT_CHECK(hdr[2] >= 0, "shard {} has a negative token count {} in its header", path, hdr[2]);
    h_.version = hdr[1];
    h_.num_tokens = static_cast<uint64_t>(hdr[2]);
    if (hdr[3] != 0) {
      MT_CHECK(hdr[3] > 0, "shard {} has a negative vocab size {} in its header", path, hdr[3]);
      MT_CHECK(hdr[4] >= 0 && hdr[4] < hdr[3], "shard {}: EOT id {} is outside its vocabulary [0, {})", path, hdr[4],
               hdr[3]);
      MT_CHECK(hdr[1] == 2 || hdr[3] <= 65536, "shard {}: vocab size {} does not fit version 1 (uint16) tokens", path,
               hdr[3]);
      h_.vocab_size = hdr[3];
      h_.eot = hdr[4];
      h_.num_documents = hdr[5];
    }
    size_t expected = kShardHeaderBytes + h_.num_tokens * h_.token_bytes();
    MT_CHECK(map_bytes_ >= expected, "shard {} is truncated: the header says {} tokens ({} bytes with the header) but "
             "the file has {} bytes", path, h_.num_tokens, expected, map_bytes_);
    MT_CHECK(map_bytes_ == expected, "shard {} has {} unexpected bytes after its {} tokens", path,
             map_bytes_ - expected, h_.num_tokens);
  } catch (...) {
    unmap();
    throw;
  }
}

ShardReader::~ShardReader() { unmap(); }

void ShardReader::expect_random_access() const {
  if (map_) ::madvise(const_cast<uint8_t*>(map_), map_bytes_, MADV_RANDOM);  // a hint: failure changes nothing
}

ShardReader::ShardReader(ShardReader&& o) noexcept
    : path_(std::move(o.path_)), h_(o.h_), map_(std::exchange(o.map_, nullptr)),
      map_bytes_(std::exchange(o.map_bytes_, 0)) {}

ShardReader& ShardReader::operator=(ShardReader&& o) noexcept {
  if (this != &o) {
    unmap();
    path_ = std::move(o.path_);
    h_ = o.h_;
    map_ = std::exchange(o.map_, nullptr);
    map_bytes_ = std::exchange(o.map_bytes_, 0);
  }
  return *this;
}

void ShardReader::unmap() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
}

int64_t ShardReader::token(uint64_t i) const {
  const uint8_t* p = map_ + kShardHeaderBytes + i * h_.token_bytes();
  if (h_.version == 1) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
  }
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

void ShardReader::read(uint64_t begin, uint64_t n, int32_t* out) const {
  MT_CHECK(begin <= h_.num_tokens && n <= h_.num_tokens - begin, "shard {}: read of tokens [{}, {}) is outside its {} "
           "tokens", path_, begin, begin + n, h_.num_tokens);
  const int64_t limit = h_.vocab_size > 0 ? h_.vocab_size : std::numeric_limits<int32_t>::max() + int64_t{1};
  for (uint64_t i = 0; i < n; ++i) {
    int64_t t = token(begin + i);
    MT_CHECK(t < limit, "shard {}: token {} at index {} is outside the vocabulary [0, {})", path_, t, begin + i, limit);
    out[i] = static_cast<int32_t>(t);
  }
}

std::vector<int32_t> ShardReader::read_all() const {
  std::vector<int32_t> out(h_.num_tokens);
  read(0, h_.num_tokens, out.data());
  return out;
}

}  // namespace mt
