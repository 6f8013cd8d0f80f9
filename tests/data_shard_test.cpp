// Token shards: writer/reader round trip, the llm.c header as raw bytes, multi-shard splits, reading a shard
// built by hand the way llm.c writes it, and clear errors for corrupt files.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "support/data_util.h"
#include "support/files.h"
#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"
#include "megatrain/data/shard.h"

namespace mt {
namespace {

using mt::test::ScratchDir;

// The header read straight from the file's bytes (not through ShardReader).
std::vector<int32_t> raw_header(const std::string& path) {
  std::vector<uint8_t> b = read_binary_file(path);
  EXPECT_GE(b.size(), 1024u);
  std::vector<int32_t> h(256);
  for (int i = 0; i < 256; ++i)
    h[i] = static_cast<int32_t>(b[4 * i] | b[4 * i + 1] << 8 | b[4 * i + 2] << 16 |
                                static_cast<uint32_t>(b[4 * i + 3]) << 24);
  return h;
}

using testing::error_of;

TEST(DataShard, RoundTripSingleShardWithLlmcHeader) {
  ScratchDir dir;
  std::vector<std::vector<int32_t>> docs = {{1, 2, 3}, {}, {50255, 0, 7, 7}};
  ShardWriter w(dir.path, "train", 50257, 50256, 1000);
  for (auto& d : docs) w.add_document(d);
  auto paths = w.finish();
  ASSERT_EQ(paths.size(), 1u);
  EXPECT_EQ(paths[0], dir / "train_000000.bin");
  EXPECT_EQ(w.num_tokens(), 10u);
  EXPECT_EQ(w.num_documents(), 3u);

  auto h = raw_header(paths[0]);
  EXPECT_EQ(h[0], 20240520);
  EXPECT_EQ(h[1], 1);  // uint16 tokens
  EXPECT_EQ(h[2], 10);
  EXPECT_EQ(h[3], 50257);
  EXPECT_EQ(h[4], 50256);
  EXPECT_EQ(h[5], 3);
  for (int i = 6; i < 256; ++i) EXPECT_EQ(h[i], 0) << i;
  EXPECT_EQ(std::filesystem::file_size(paths[0]), 1024u + 10 * 2);

  ShardReader r(paths[0]);
  EXPECT_EQ(r.header().version, 1);
  EXPECT_EQ(r.header().vocab_size, 50257);
  EXPECT_EQ(r.header().eot, 50256);
  EXPECT_EQ(r.header().num_documents, 3);
  std::vector<int32_t> expect = {50256, 1, 2, 3, 50256, 50256, 50255, 0, 7, 7};
  EXPECT_EQ(r.read_all(), expect);
  // No temporary file is left behind.
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
}

TEST(DataShard, MultiShardSplitKeepsOneStream) {
  ScratchDir dir;
  const uint64_t max_tokens = 7;
  std::vector<int32_t> stream;
  std::vector<uint64_t> doc_starts;
  ShardWriter w(dir.path, "val", 1000, 999, max_tokens);
  for (int d = 0; d < 9; ++d) {
    std::vector<int32_t> doc;
    for (int i = 0; i < (d * 5) % 11; ++i) doc.push_back(d * 100 + i);
    w.add_document(doc);
    doc_starts.push_back(stream.size());
    stream.push_back(999);
    stream.insert(stream.end(), doc.begin(), doc.end());
  }
  auto paths = w.finish();
  const size_t want_shards = (stream.size() + max_tokens - 1) / max_tokens;
  ASSERT_EQ(paths.size(), want_shards);
  EXPECT_EQ(list_shards(dir.path, "val"), paths);
  EXPECT_TRUE(list_shards(dir.path, "train").empty());

  std::vector<int32_t> joined;
  for (size_t s = 0; s < paths.size(); ++s) {
    EXPECT_EQ(paths[s], shard_path(dir.path, "val", static_cast<int>(s)));
    ShardReader r(paths[s]);
    auto h = raw_header(paths[s]);
    uint64_t begin = s * max_tokens, end = std::min<uint64_t>(begin + max_tokens, stream.size());
    EXPECT_EQ(static_cast<uint64_t>(h[2]), end - begin) << "shard " << s;
    int64_t starts_here = 0;
    for (uint64_t p : doc_starts) starts_here += p >= begin && p < end;
    EXPECT_EQ(h[5], starts_here) << "shard " << s;
    auto t = r.read_all();
    joined.insert(joined.end(), t.begin(), t.end());
  }
  EXPECT_EQ(joined, stream);
}

TEST(DataShard, LargeVocabUsesUint32Tokens) {
  ScratchDir dir;
  ShardWriter w(dir.path, "train", 128256, 128001, 100);
  std::vector<int32_t> doc = {0, 65535, 65536, 128255};
  w.add_document(doc);
  auto paths = w.finish();
  auto h = raw_header(paths.at(0));
  EXPECT_EQ(h[1], 2);
  EXPECT_EQ(std::filesystem::file_size(paths[0]), 1024u + 5 * 4);
  std::vector<int32_t> expect = {128001, 0, 65535, 65536, 128255};
  EXPECT_EQ(ShardReader(paths[0]).read_all(), expect);
}

TEST(DataShard, ReadsHandBuiltLlmcShards) {
  ScratchDir dir;
  // llm.c leaves header[3..255] zero; tokens are GPT-2 ids as uint16.
  std::vector<uint32_t> toks = {50256, 464, 2068, 7586, 21831, 50256, 15496};
  testing::write_bytes(dir / "tinyshakespeare_val.bin", testing::llmc_shard_bytes({20240520, 1, 7}, toks, 2));
  auto found = list_shards(dir.path, "val");
  ASSERT_EQ(found.size(), 1u);  // llm.c's <dataset>_<split>.bin naming is found too
  ShardReader r(found[0]);
  EXPECT_EQ(r.header().version, 1);
  EXPECT_EQ(r.size(), 7u);
  EXPECT_EQ(r.header().vocab_size, 0);
  EXPECT_EQ(r.header().eot, -1);
  EXPECT_EQ(r.header().num_documents, -1);
  std::vector<int32_t> expect(toks.begin(), toks.end());
  EXPECT_EQ(r.read_all(), expect);
  int32_t mid[3];
  r.read(2, 3, mid);
  EXPECT_EQ(mid[0], 2068);
  EXPECT_EQ(mid[2], 21831);

  // Version 2 (uint32, llm.c's Llama 3 shards).
  std::vector<uint32_t> big = {128000, 9906, 1917, 128001};
  testing::write_bytes(dir / "fineweb_train_000001.bin", testing::llmc_shard_bytes({20240520, 2, 4}, big, 4));
  ShardReader r2(list_shards(dir.path, "train").at(0));
  EXPECT_EQ(r2.header().version, 2);
  EXPECT_EQ(r2.read_all(), std::vector<int32_t>(big.begin(), big.end()));
}

TEST(DataShard, CorruptShardsFailWithTheReason) {
  ScratchDir dir;
  std::vector<uint32_t> toks = {1, 2, 3, 4, 5};
  auto check = [&](const std::string& name, const std::string& bytes, const std::string& what) {
    std::string path = dir / name;
    testing::write_bytes(path, bytes);
    std::string msg = error_of([&] { ShardReader r(path); });
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  };
  check("magic.bin", testing::llmc_shard_bytes({20240519, 1, 5}, toks, 2), "bad magic");
  check("version.bin", testing::llmc_shard_bytes({20240520, 3, 5}, toks, 2), "unknown version 3");
  check("truncated.bin", testing::llmc_shard_bytes({20240520, 1, 9}, toks, 2), "truncated");
  check("short.bin", std::string(100, '\0'), "truncated");
  check("wrong_width.bin", testing::llmc_shard_bytes({20240520, 2, 5}, toks, 2), "truncated");
  check("trailing.bin", testing::llmc_shard_bytes({20240520, 1, 4}, toks, 2), "unexpected bytes");
  check("negative.bin", testing::llmc_shard_bytes({20240520, 1, -5}, toks, 2), "negative");
  check("eot.bin", testing::llmc_shard_bytes({20240520, 1, 5, 100, 100}, toks, 2), "EOT id 100");
  EXPECT_NE(error_of([&] { ShardReader r(dir / "missing.bin"); }).find("cannot open"), std::string::npos);

  // A token outside the recorded vocabulary is caught when read.
  std::string path = dir / "oov.bin";
  testing::write_bytes(path, testing::llmc_shard_bytes({20240520, 1, 5, 4, 0}, toks, 2));
  ShardReader r(path);
  std::string msg = error_of([&] { r.read_all(); });
  EXPECT_NE(msg.find("outside the vocabulary"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] {
              int32_t x[4];
              r.read(3, 4, x);
            }).find("outside its 5 tokens"),
            std::string::npos);
}

TEST(DataShard, WriterValidatesAndCleansUp) {
  ScratchDir dir;
  {
    ShardWriter w(dir.path, "train", 100, 99, 10);
    std::vector<int32_t> bad = {5, 100};
    EXPECT_NE(error_of([&] { w.add_document(bad); }).find("outside the vocabulary"), std::string::npos);
    std::vector<int32_t> neg = {-1};
    EXPECT_THROW(w.add_document(neg), Error);
    std::vector<int32_t> ok = {1, 2, 3};
    w.add_document(ok);
    // Destroyed without finish(): nothing (not even a temporary file) is left.
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path));
  EXPECT_THROW(ShardWriter(dir.path, "train", 100, 100, 10), Error);         // EOT outside vocab
  EXPECT_THROW(ShardWriter(dir.path, "train", 100, 99, 0), Error);           // empty shards
  EXPECT_THROW(ShardWriter(dir.path, "train", 100, 99, 1ull << 31), Error);  // int32 header overflow

  // Shards of an older, longer run are removed, so they cannot join the new split's stream.
  for (int i = 0; i < 3; ++i) testing::write_bytes(shard_path(dir.path, "train", i), "old");
  testing::write_bytes(dir / "train_notes.txt", "keep");
  ShardWriter w(dir.path, "train", 100, 99, 10);
  std::vector<int32_t> doc = {1};
  w.add_document(doc);
  w.finish();
  EXPECT_EQ(list_shards(dir.path, "train").size(), 1u);
  EXPECT_TRUE(file_exists(dir / "train_notes.txt"));
  EXPECT_EQ(ShardReader(shard_path(dir.path, "train", 0)).read_all(), (std::vector<int32_t>{99, 1}));
}

// A shard that shrinks under an open reader (rewritten in place by a second prepare-data, rsync --inplace, a
// network file system losing data): a memory-mapped reader dies of SIGBUS with no word of which file, so this test
// would crash the test binary. The reader must throw instead, kind Data, naming the shard and what changed; and a
// shard renamed over (what ShardWriter does) goes on being read as it was when opened.
TEST(DataShard, AShardThatChangesUnderAReaderIsAnErrorNamingIt) {
  ScratchDir dir;
  std::vector<int32_t> doc(5000);
  for (int i = 0; i < 5000; ++i) doc[i] = i % 1000;
  ShardWriter w(dir.path, "train", 1001, 1000, 100000);
  w.add_document(doc);
  const std::string path = w.finish().at(0);
  const std::vector<int32_t> before = ShardReader(path).read_all();

  ShardReader renamed_over(path);
  std::vector<int32_t> other(5000);
  for (int i = 0; i < 5000; ++i) other[i] = (3 * i) % 1000;
  {
    ShardWriter again(dir.path, "train", 1001, 1000, 100000);  // removes the old shard, renames a new one in
    again.add_document(other);
    again.finish();
  }
  EXPECT_EQ(renamed_over.read_all(), before);  // the open file is the old one

  ShardReader shrunk(path);
  ASSERT_EQ(shrunk.size(), 5001u);                                  // 11,026 bytes with the header: three pages
  std::filesystem::resize_file(path, kShardHeaderBytes + 2 * 100);  // the first 100 tokens remain
  std::vector<int32_t> x(100);
  shrunk.read(0, 100, x.data());  // what is still there reads
  EXPECT_EQ(x[0], 1000);
  EXPECT_EQ(x[99], other[98]);
  try {
    shrunk.read(4000, 10, x.data());  // two pages past the new end: a mapping would raise SIGBUS here
    FAIL() << "read past the new end of a shrunk shard";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.kind, ErrorKind::Data);
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("changed while it was read: it now ends at byte 1224, but it had 11026 bytes"),
              std::string::npos)
        << msg;
  }
}

}  // namespace
}  // namespace mt
