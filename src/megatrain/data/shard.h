// Token shards: pre-tokenized training data on disk, in llm.c's format so either tool reads the other's files.
//
// A shard is a header of 256 little-endian int32 followed by the tokens:
//   header[0] = 20240520                 magic
//   header[1] = 1 | 2                    version: 1 = tokens are uint16, 2 = tokens are uint32
//   header[2] = number of tokens N       (so a shard holds at most 2^31-1 tokens)
//   header[3] = vocabulary size          } megatrain's additions in slots llm.c leaves 0;
//   header[4] = end-of-text (EOT) id     } header[3] == 0 means "not recorded" (a shard written by llm.c),
//   header[5] = documents starting here  } and then header[4..5] mean nothing
//   header[6..255] = 0
//   N tokens (2 or 4 bytes each, little-endian); the file is exactly 1024 + N * token_bytes long.
// Every document is preceded by the EOT token (as llm.c does), so a split's shards read in order form one
// stream "EOT doc0 EOT doc1 ...". Shards are named <split>_000000.bin, <split>_000001.bin, ...; a document may
// continue from one shard into the next, so readers must treat a split's shards as one stream.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace mt {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int kShardHeaderInts = 256;
inline constexpr size_t kShardHeaderBytes = kShardHeaderInts * sizeof(int32_t);

struct ShardHeader {
  int version = 1;  // 1 = uint16 tokens, 2 = uint32 tokens
  uint64_t num_tokens = 0;
  int vocab_size = 0;          // 0 = not recorded
  int eot = -1;                // -1 = not recorded
  int64_t num_documents = -1;  // -1 = not recorded

  size_t token_bytes() const { return version == 1 ? 2 : 4; }
};

// The shard version that can hold ids of this vocabulary: 1 (uint16) when they fit, else 2.
int shard_version_for_vocab(int vocab_size);
// "<dir>/<split>_<index, 6 digits>.bin"
std::string shard_path(const std::string& dir, const std::string& split, int index);
// The shards of a split in dir (<split>_*.bin), sorted by name. Empty when there are none.
std::vector<std::string> list_shards(const std::string& dir, const std::string& split);

// Streams documents into shards of at most max_tokens_per_shard tokens each. Each shard is written to a
// temporary file, fsynced and renamed into place when full (or at finish()), so a reader never sees a partial
// shard. Existing <split>_*.bin files in dir are removed when the writer starts: they belong to an older run.
class ShardWriter {
 public:
  ShardWriter(std::string dir, std::string split, int vocab_size, int eot, uint64_t max_tokens_per_shard);
  ~ShardWriter();  // without finish(): the partial shard is discarded (no half-written data is left behind)
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Appends EOT followed by the document's tokens. Throws on ids outside [0, vocab_size).
  void add_document(std::span<const int32_t> tokens);
  // Commits the last shard. Returns the paths of all shards written (none when no document was added).
  const std::vector<std::string>& finish();

  uint64_t num_tokens() const { return total_tokens_; }
  uint64_t num_documents() const { return total_docs_; }
  const std::vector<std::string>& shards() const { return done_; }

 private:
  void open_shard();
  void flush_buffer();
  void close_shard();
  void append(int32_t token);

  std::string dir_, split_;
  int vocab_size_, eot_, version_;
  uint64_t max_tokens_;
  int fd_ = -1;  // the open temporary file, or -1
  std::string tmp_path_;
  std::vector<uint8_t> buf_;  // tokens not yet written to fd_
  uint64_t shard_tokens_ = 0, shard_docs_ = 0;
  uint64_t total_tokens_ = 0, total_docs_ = 0;
  std::vector<std::string> done_;
  bool finished_ = false;
};

// A shard opened and validated: bad magic, unknown version, or a file size that disagrees with the header's token
// count throw mt::Error naming the file and the problem. Reads are pread()s through the page cache (which the ranks
// of a node share), not a memory mapping: a mapped file that shrinks, or a device that fails, under a read kills the
// process with SIGBUS and no word of which file; here either is an mt::Error naming the shard (kind Data for a
// file that changed after it was checked, IO for a failed read). The file stays open for the reader's life, so a
// shard replaced on disk (renamed over) is still read as it was.
class ShardReader {
 public:
  explicit ShardReader(const std::string& path);
  ~ShardReader();
  ShardReader(ShardReader&& o) noexcept;
  ShardReader& operator=(ShardReader&& o) noexcept;
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  const std::string& path() const { return path_; }
  const ShardHeader& header() const { return h_; }
  uint64_t size() const { return h_.num_tokens; }
  int64_t token(uint64_t i) const;  // one token (a read() of one)
  // Copies tokens [begin, begin + n) as int32. Throws when the range is outside the shard, when an id is outside
  // the vocabulary (the shard's if it records one, else id_limit if > 0: the model's) or does not fit int32 (kind
  // Data), or when the read fails (see above).
  void read(uint64_t begin, uint64_t n, int32_t* out, int id_limit = 0) const;
  std::vector<int32_t> read_all() const;
  // Tells the kernel reads will jump around (a shuffled epoch): a read then fetches what it asks for, not the
  // device's read-ahead window around it (8 MB on some machines, for a 4 KB window of tokens). Only a hint: it
  // changes no result.
  void expect_random_access() const;

 private:
  void close_fd();
  std::string path_;
  ShardHeader h_;
  int fd_ = -1;
  uint64_t file_bytes_ = 0;  // the size it had when it was checked
};

}  // namespace mt
