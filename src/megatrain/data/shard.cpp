#include "megatrain/data/shard.h"

#include <fcntl.h>
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
                std::all_of(name.begin() + split_.size() + 1, name.end() - 4,
                            [](char c) { return c >= '0' && c <= '9'; });
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
    MT_CHECK(tokens[i] >= 0 && tokens[i] < vocab_size_,
             "document {} of split '{}': token {} at position {} is outside "
             "the vocabulary [0, {})",
             total_docs_, split_, tokens[i], i, vocab_size_);
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

namespace {

// Reads exactly n bytes at off, or says why not: an I/O error is kind IO (a restart may find the file system well
// again); a file that ends early changed after it was opened and checked, which no restart mends: kind Data.
void pread_exactly(int fd, void* buf, size_t n, uint64_t off, const std::string& path, uint64_t expected_bytes) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, static_cast<off_t>(off));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) fail_as(ErrorKind::IO, "cannot read shard {} at byte {}: {}", path, off, std::strerror(errno));
    if (got == 0) {
      struct stat st {};
      const long long now = ::fstat(fd, &st) == 0 ? static_cast<long long>(st.st_size) : -1;
      fail_as(ErrorKind::Data,
              "shard {} changed while it was read: it now ends at byte {}, but it had {} bytes when "
              "it was opened and checked (was it rewritten in place, e.g. by prepare-data or rsync --inplace, "
              "during the run?)",
              path, now, expected_bytes);
    }
    p += got;
    n -= static_cast<size_t>(got);
    off += static_cast<uint64_t>(got);
  }
}

}  // namespace

ShardReader::ShardReader(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0 && errno == EMFILE)
    fail_as(ErrorKind::IO,
            "cannot open shard {}: {} (a loader keeps every shard of a split open: raise the limit, "
            "`ulimit -n`, or prepare the data in fewer, larger shards with --shard-tokens)",
            path, std::strerror(errno));
  MT_CHECK(fd_ >= 0, "cannot open shard {}: {}", path, std::strerror(errno));
  try {
    struct stat st;
    MT_CHECK(::fstat(fd_, &st) == 0, "cannot stat shard {}: {}", path, std::strerror(errno));
    file_bytes_ = static_cast<uint64_t>(st.st_size);
    MT_CHECK(file_bytes_ >= kShardHeaderBytes, "shard {} is truncated: {} bytes, shorter than the {}-byte header", path,
             file_bytes_, kShardHeaderBytes);
    int32_t hdr[kShardHeaderInts];
    pread_exactly(fd_, hdr, sizeof(hdr), 0, path, file_bytes_);
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
    const uint64_t expected = kShardHeaderBytes + h_.num_tokens * h_.token_bytes();
    MT_CHECK(file_bytes_ >= expected,
             "shard {} is truncated: the header says {} tokens ({} bytes with the header) "
             "but the file has {} bytes",
             path, h_.num_tokens, expected, file_bytes_);
    MT_CHECK(file_bytes_ == expected, "shard {} has {} unexpected bytes after its {} tokens", path,
             file_bytes_ - expected, h_.num_tokens);
  } catch (...) {
    close_fd();
    throw;
  }
}

ShardReader::~ShardReader() { close_fd(); }

void ShardReader::expect_random_access() const {
  (void)::posix_fadvise(fd_, 0, 0, POSIX_FADV_RANDOM);  // a hint: failure changes nothing
}

ShardReader::ShardReader(ShardReader&& o) noexcept
    : path_(std::move(o.path_)), h_(o.h_), fd_(std::exchange(o.fd_, -1)), file_bytes_(o.file_bytes_) {}

ShardReader& ShardReader::operator=(ShardReader&& o) noexcept {
  if (this != &o) {
    close_fd();
    path_ = std::move(o.path_);
    h_ = o.h_;
    fd_ = std::exchange(o.fd_, -1);
    file_bytes_ = o.file_bytes_;
  }
  return *this;
}

void ShardReader::close_fd() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

int64_t ShardReader::token(uint64_t i) const {
  int32_t v;
  read(i, 1, &v);
  return v;
}

void ShardReader::read(uint64_t begin, uint64_t n, int32_t* out, int id_limit) const {
  MT_CHECK(begin <= h_.num_tokens && n <= h_.num_tokens - begin,
           "shard {}: read of tokens [{}, {}) is outside its {} "
           "tokens",
           path_, begin, begin + n, h_.num_tokens);
  // The shard's own vocabulary when it records one, else the caller's (the model's), else what int32 holds.
  const bool callers = h_.vocab_size == 0 && id_limit > 0;
  const int64_t limit = h_.vocab_size > 0 ? h_.vocab_size
                        : callers         ? id_limit
                                          : std::numeric_limits<int32_t>::max() + int64_t{1};
  const size_t tb = h_.token_bytes();
  // In chunks, so read_all of a 2^31-token shard needs no second copy of it; the raw ids land in out's own memory
  // first when they are as wide as int32, else in a small buffer.
  constexpr uint64_t kChunk = 1 << 20;
  thread_local std::vector<uint16_t> narrow;  // reused: a loader reads a row at a time
  for (uint64_t done = 0; done < n;) {
    const uint64_t k = std::min(kChunk, n - done);
    const uint64_t off = kShardHeaderBytes + (begin + done) * tb;
    int32_t* dst = out + done;
    if (h_.version == 1) {
      narrow.resize(static_cast<size_t>(k));
      pread_exactly(fd_, narrow.data(), static_cast<size_t>(k) * 2, off, path_, file_bytes_);
      for (uint64_t i = 0; i < k; ++i) dst[i] = narrow[i];
    } else {
      pread_exactly(fd_, dst, static_cast<size_t>(k) * 4, off, path_, file_bytes_);
    }
    for (uint64_t i = 0; i < k; ++i) {
      const int64_t t = h_.version == 1 ? int64_t{dst[i]} : int64_t{static_cast<uint32_t>(dst[i])};
      if (t >= limit)
        fail_as(ErrorKind::Data, "shard {}: token {} at index {} is outside the {}vocabulary [0, {}){}", path_, t,
                begin + done + i, callers ? "model's " : "", limit,
                callers ? " (the shard records no vocabulary of its own: llm.c's format?)" : "");
    }
    done += k;
  }
}

std::vector<int32_t> ShardReader::read_all() const {
  std::vector<int32_t> out(h_.num_tokens);
  read(0, h_.num_tokens, out.data());
  return out;
}

}  // namespace mt
