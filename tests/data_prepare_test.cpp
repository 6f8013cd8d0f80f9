// prepare_data end to end: documents -> shards -> documents again. The oracle is the input corpus itself: the
// shards, split at EOT and decoded, must give back every document, in order, in the split the rule assigns.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "support/data_util.h"
#include "support/files.h"
#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"
#include "megatrain/data/assets.h"
#include "megatrain/data/loader.h"
#include "megatrain/data/prepare.h"
#include "megatrain/data/shard.h"
#include "megatrain/tokenizer/tokenizer.h"

namespace mt {
namespace {

using mt::test::ScratchDir;
using testing::write_bytes;

using testing::error_of;

// One token per byte, EOT = 256: decoding is trivial, so the test checks the pipeline, not a tokenizer.
TokenEncoder byte_encoder() {
  TokenEncoder e;
  e.encode = [](std::string_view s) {
    std::vector<int32_t> out;
    for (unsigned char c : s) out.push_back(c);
    return out;
  };
  e.vocab_size = 257;
  e.eot = 256;
  e.name = "bytes";
  return e;
}

// The split's token stream cut at EOT into documents (token lists).
std::vector<std::vector<int32_t>> split_documents(const std::string& dir, const std::string& split, int eot) {
  std::vector<std::vector<int32_t>> docs;
  for (const std::string& p : list_shards(dir, split)) {
    for (int32_t t : ShardReader(p).read_all()) {
      if (t == eot) {
        docs.emplace_back();
        continue;
      }
      EXPECT_FALSE(docs.empty()) << "stream of " << split << " does not start with EOT";
      if (!docs.empty()) docs.back().push_back(t);
    }
  }
  return docs;
}

std::vector<std::string> byte_documents(const std::string& dir, const std::string& split) {
  std::vector<std::string> out;
  for (auto& d : split_documents(dir, split, 256)) out.emplace_back(d.begin(), d.end());
  return out;
}

std::string doc_text(int i) {
  std::string s = "document " + std::to_string(i) + ":";
  for (int k = 0; k < (i * 13) % 29; ++k) s += " w" + std::to_string(k * i);
  return s;
}

TEST(DataPrepare, TextCorpusRoundTripsThroughShards) {
  ScratchDir dir;
  const int n = 40;
  for (int i = 0; i < n; ++i) write_bytes(dir / fmt::format("corpus/doc_{:02d}.txt", i), doc_text(i));
  write_bytes(dir / "corpus/doc_40_empty.txt", "");
  write_bytes(dir / "corpus/doc_41_blank.txt", " \n\t\n");
  PrepareOptions opt;
  opt.inputs = {dir / "corpus"};
  opt.out_dir = dir / "out";
  opt.val_fraction = 0.2;
  opt.shard_tokens = 500;
  opt.seed = 3;
  PrepareResult r = prepare_data(opt, byte_encoder());

  std::vector<std::string> want_train, want_val;
  for (int i = 0; i < n; ++i) (is_val_document(i, 3, 0.2) ? want_val : want_train).push_back(doc_text(i));
  ASSERT_FALSE(want_val.empty());
  ASSERT_FALSE(want_train.empty());
  EXPECT_EQ(byte_documents(opt.out_dir, "train"), want_train);
  EXPECT_EQ(byte_documents(opt.out_dir, "val"), want_val);
  EXPECT_EQ(r.train.documents, want_train.size());
  EXPECT_EQ(r.val.documents, want_val.size());
  EXPECT_EQ(r.skipped_empty, 2u);
  EXPECT_EQ(r.sources.size(), 42u);

  uint64_t train_tokens = 0;
  for (auto& d : want_train) train_tokens += d.size() + 1;
  EXPECT_EQ(r.train.tokens, train_tokens);
  ASSERT_GE(r.train.shards.size(), 3u);
  EXPECT_EQ(r.train.shards.size(), (train_tokens + 499) / 500);
  for (auto& p : r.train.shards) EXPECT_LE(ShardReader(p).size(), 500u);

  auto meta = nlohmann::json::parse(read_text_file(opt.out_dir + "/meta.json"));
  EXPECT_EQ(meta["vocab_size"], 257);
  EXPECT_EQ(meta["eot"], 256);
  EXPECT_EQ(meta["tokenizer"], "bytes");
  EXPECT_EQ(prepared_tokenizer(opt.out_dir), "bytes");  // what the sampler reads back
  EXPECT_EQ(prepared_tokenizer(dir / "corpus"), "");    // no meta.json: none recorded
  EXPECT_EQ(meta["token_dtype"], "uint16");
  EXPECT_EQ(meta["input_format"], "text");
  EXPECT_EQ(meta["sources"].size(), 42u);
  EXPECT_EQ(meta["skipped_empty_documents"], 2);
  EXPECT_EQ(meta["splits"]["train"]["documents"], want_train.size());
  EXPECT_EQ(meta["splits"]["train"]["tokens"], train_tokens);
  EXPECT_EQ(meta["splits"]["val"]["documents"], want_val.size());
  EXPECT_EQ(meta["splits"]["train"]["shards"].size(), r.train.shards.size());
  EXPECT_EQ(meta["splits"]["train"]["shards"][0], "train_000000.bin");

  // Same seed, same bytes; another seed, another split.
  opt.out_dir = dir / "again";
  prepare_data(opt, byte_encoder());
  for (auto& p : r.train.shards)
    EXPECT_EQ(read_text_file(p), read_text_file(opt.out_dir + "/" + std::filesystem::path(p).filename().string()));
  opt.out_dir = dir / "other_seed";
  opt.seed = 4;
  prepare_data(opt, byte_encoder());
  EXPECT_NE(byte_documents(opt.out_dir, "val"), want_val);
}

TEST(DataPrepare, ValSplitAlwaysExistsForTwoOrMoreDocuments) {
  ScratchDir dir;
  // A seed for which the hash rule puts neither document in val.
  uint64_t seed = 0;
  while (is_val_document(0, seed, 0.05) || is_val_document(1, seed, 0.05)) ++seed;
  write_bytes(dir / "a.txt", "first");
  write_bytes(dir / "b.txt", "second");
  PrepareOptions opt;
  opt.inputs = {dir / "a.txt", dir / "b.txt"};
  opt.out_dir = dir / "out";
  opt.seed = seed;
  PrepareResult r = prepare_data(opt, byte_encoder());
  EXPECT_EQ(byte_documents(opt.out_dir, "train"), std::vector<std::string>{"first"});
  EXPECT_EQ(byte_documents(opt.out_dir, "val"), std::vector<std::string>{"second"});
  EXPECT_EQ(r.val.documents, 1u);

  // One document: all of it is train. val_fraction 0: no val at all.
  opt.inputs = {dir / "a.txt"};
  opt.out_dir = dir / "one";
  r = prepare_data(opt, byte_encoder());
  EXPECT_EQ(r.train.documents, 1u);
  EXPECT_EQ(r.val.documents, 0u);
  EXPECT_TRUE(list_shards(opt.out_dir, "val").empty());
  opt.inputs = {dir / "a.txt", dir / "b.txt"};
  opt.out_dir = dir / "none";
  opt.val_fraction = 0;
  r = prepare_data(opt, byte_encoder());
  EXPECT_EQ(r.train.documents, 2u);
  EXPECT_EQ(r.val.documents, 0u);
}

TEST(DataPrepare, JsonLinesCorpus) {
  ScratchDir dir;
  std::vector<std::string> docs;
  std::string lines;
  for (int i = 0; i < 30; ++i) {
    docs.push_back(doc_text(i) + "\n\"quoted\"");
    lines += nlohmann::json{{"id", i}, {"content", docs.back()}}.dump() + "\n";
  }
  write_bytes(dir / "data/part1.jsonl", lines);
  PrepareOptions opt;
  opt.inputs = {dir / "data"};
  opt.format = CorpusFormat::Jsonl;
  opt.field = "content";
  opt.out_dir = dir / "out";
  opt.val_fraction = 0.3;
  prepare_data(opt, byte_encoder());
  auto train = byte_documents(opt.out_dir, "train"), val = byte_documents(opt.out_dir, "val");
  std::vector<std::string> want_train, want_val;
  for (int i = 0; i < 30; ++i) (is_val_document(i, 0, 0.3) ? want_val : want_train).push_back(docs[i]);
  EXPECT_EQ(train, want_train);
  EXPECT_EQ(val, want_val);
  auto meta = nlohmann::json::parse(read_text_file(opt.out_dir + "/meta.json"));
  EXPECT_EQ(meta["field"], "content");

  opt.field = "text";  // absent: the error names the line
  std::string m = error_of([&] { prepare_data(opt, byte_encoder()); });
  EXPECT_NE(m.find("part1.jsonl:1: no field 'text'"), std::string::npos) << m;
}

// Progress comes after every chunk (4,096 documents here): the bytes read grow to the input files' sizes, and the
// last report counts every document and the tokens the shards hold (one EOT per document included).
TEST(DataPrepare, ProgressReachesTheInputsSizeAndTheStoredTokens) {
  ScratchDir dir;
  std::string a, b;
  for (int i = 0; i < 6000; ++i) (i < 5000 ? a : b) += nlohmann::json{{"text", doc_text(i)}}.dump() + "\n";
  write_bytes(dir / "data/a.jsonl", a);
  write_bytes(dir / "data/b.jsonl", b);
  PrepareOptions opt;
  opt.inputs = {dir / "data"};
  opt.format = CorpusFormat::Jsonl;
  opt.out_dir = dir / "out";
  std::vector<PrepareProgress> seen;
  opt.on_progress = [&](const PrepareProgress& p) { seen.push_back(p); };
  const PrepareResult r = prepare_data(opt, byte_encoder());
  ASSERT_EQ(seen.size(), 2u);  // 4,096 documents, then the other 1,904
  EXPECT_EQ(seen[0].documents, 4096u);
  EXPECT_GT(seen[0].bytes_read, 0u);
  EXPECT_LT(seen[0].bytes_read, a.size());
  EXPECT_EQ(seen[1].bytes_read, a.size() + b.size());
  EXPECT_EQ(seen[1].bytes_total, a.size() + b.size());
  EXPECT_EQ(seen[1].documents, 6000u);
  EXPECT_EQ(seen[1].tokens, r.train.tokens + r.val.tokens);
  EXPECT_LE(seen[0].seconds, seen[1].seconds);
  // The line people see: 3 of 10 GB in 300 s is 10 MB/s, and the other 7 GB take 700 s more.
  const PrepareProgress p{3'000'000'000, 10'000'000'000, 1234, 2'500'000, 300};
  EXPECT_EQ(progress_line(p), "prepare-data: 3.00 of 10.00 GB read (30.0%), 1234 documents, 2.5M tokens, 10.0 MB/s, "
                              "about 12 min left");
}

TEST(DataPrepare, ClearErrors) {
  ScratchDir dir;
  PrepareOptions opt;
  opt.out_dir = dir / "out";
  EXPECT_NE(error_of([&] { prepare_data(opt, byte_encoder()); }).find("no input files"), std::string::npos);
  write_bytes(dir / "empty/a.txt", "");
  write_bytes(dir / "empty/b.txt", "\n\n");
  opt.inputs = {dir / "empty"};
  std::string m = error_of([&] { prepare_data(opt, byte_encoder()); });
  EXPECT_NE(m.find("no documents"), std::string::npos) << m;
  EXPECT_NE(m.find("2 empty document(s) skipped"), std::string::npos) << m;
  EXPECT_FALSE(std::filesystem::exists(opt.out_dir));  // nothing written
  write_bytes(dir / "ok/a.txt", "text");
  opt.inputs = {dir / "ok"};
  opt.val_fraction = 1;
  EXPECT_NE(error_of([&] { prepare_data(opt, byte_encoder()); }).find("--val-fraction"), std::string::npos);
  opt.val_fraction = 0.1;
  opt.shard_tokens = 0;
  EXPECT_NE(error_of([&] { prepare_data(opt, byte_encoder()); }).find("--shard-tokens"), std::string::npos);
  opt.shard_tokens = 100;
  TokenEncoder bad = byte_encoder();
  bad.encode = [](std::string_view) { return std::vector<int32_t>{300}; };  // outside the vocabulary
  m = error_of([&] { prepare_data(opt, bad); });
  EXPECT_NE(m.find("outside the vocabulary"), std::string::npos) << m;
  EXPECT_FALSE(file_exists(opt.out_dir + "/meta.json"));  // a failed run never leaves a meta.json
}

// The real GPT-2 tokenizer, as `megatrain prepare-data` uses it.
TokenEncoder gpt2_encoder(const Tokenizer& tok) {
  TokenEncoder e;
  e.encode = [&tok](std::string_view s) { return tok.encode(s, /*allow_special=*/false); };
  e.vocab_size = tok.vocab_size();
  e.eot = tok.eot();
  e.name = "gpt2";
  return e;
}

TEST(DataPrepare, Gpt2TokenizerEndToEnd) {
  ASSERT_TRUE(file_exists(default_gpt2_vocab_dir() + "/encoder.json")) << "run scripts/setup";
  Tokenizer tok = Tokenizer::load_gpt2(default_gpt2_vocab_dir());
  ScratchDir dir;
  std::vector<std::string> docs = {
      "Hello world! This is the first document.\n",
      "Caf\xC3\xA9 \xE2\x98\x83 and numbers 12345, with a literal <|endoftext|> that must stay text.",
      "  Leading spaces,\ttabs and\n\nparagraphs.",
      "The quick brown fox jumps over the lazy dog. " + std::string(200, 'x'),
  };
  for (size_t i = 0; i < docs.size(); ++i) write_bytes(dir / fmt::format("c/{}.txt", i), docs[i]);
  PrepareOptions opt;
  opt.inputs = {dir / "c"};
  opt.out_dir = dir / "out";
  opt.val_fraction = 0.25;
  PrepareResult r = prepare_data(opt, gpt2_encoder(tok));
  EXPECT_EQ(r.train.documents + r.val.documents, docs.size());
  EXPECT_GE(r.val.documents, 1u);

  std::vector<std::string> got;
  for (const char* split : {"train", "val"})
    for (auto& d : split_documents(opt.out_dir, split, tok.eot())) {
      EXPECT_EQ(d, tok.encode(tok.decode(d), false));
      got.push_back(tok.decode(d));
    }
  std::sort(got.begin(), got.end());
  std::sort(docs.begin(), docs.end());
  EXPECT_EQ(got, docs);  // every document back, the literal "<|endoftext|>" included (no forged boundary)
  ShardReader s(list_shards(opt.out_dir, "train").at(0));
  EXPECT_EQ(s.header().version, 1);
  EXPECT_EQ(s.header().vocab_size, 50257);
  EXPECT_EQ(s.header().eot, 50256);

  DataLoader dl(opt.out_dir, "train", 2, 8, true, 1);
  Batch b = dl.next();
  EXPECT_EQ(dl.vocab_size(), 50257);
  EXPECT_EQ(b.x.size(), 16u);
}

TEST(DataPrepare, BrownFilesWithGpt2) {
  ASSERT_TRUE(file_exists(default_brown_dir() + "/ca01")) << "run scripts/setup";
  Tokenizer tok = Tokenizer::load_gpt2(default_gpt2_vocab_dir());
  ScratchDir dir;
  PrepareOptions opt;
  opt.inputs = {default_brown_dir() + "/ca01", default_brown_dir() + "/ca02", default_brown_dir() + "/cr09"};
  opt.format = CorpusFormat::Brown;
  opt.out_dir = dir / "out";
  opt.val_fraction = 0.3;
  PrepareResult r = prepare_data(opt, gpt2_encoder(tok));
  EXPECT_EQ(r.train.documents + r.val.documents, 3u);
  std::string all;
  for (const char* split : {"train", "val"})
    for (auto& d : split_documents(opt.out_dir, split, tok.eot())) all += tok.decode(d);
  EXPECT_NE(all.find("The Fulton County Grand Jury said Friday"), std::string::npos);
  EXPECT_EQ(all.find("/at "), std::string::npos);
  EXPECT_GT(r.train.tokens + r.val.tokens, 3 * 2000u);
}

}  // namespace
}  // namespace mt
