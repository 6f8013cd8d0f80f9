// Corpus readers: Brown corpus detokenisation (a hand-written snippet with its known text, and the real ca01),
// input expansion, plain text and JSON-lines documents, and the errors for bad input.
#include <gtest/gtest.h>

#include <filesystem>

#include "support/data_util.h"
#include "support/files.h"
#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"
#include "megatrain/data/assets.h"
#include "megatrain/data/corpus.h"

namespace mt {
namespace {

using mt::test::ScratchDir;
using testing::write_bytes;

using testing::error_of;

TEST(DataBrown, SnippetBecomesKnownText) {
  const std::string tagged =
      "\n\n\tThe/at Jury/nn-tl said/vbd ``/`` no/at evidence/nn ''/'' was/bedz found/vbn ./.\n"
      "It/pps cost/vbd $5/nns (/( 1/2/cd of/in it/ppo )/) ,/, he/pps said/vbd ;/. ;/. Mr./np Allen/np Jr./np ./.\n"
      "\n\n"
      "Merger/nn-hl proposed/vbn-hl\n"
      "``/`` Why/wrb ''/'' ?/. ?/. she/pps asked/vbd ./.\n"
      "\n\n\tHe/pps said/vbd '/' pro/jj '/' and/cc didn't/dod* say/vb ``/`` yes/rb ''/'' ./.\n";
  const std::string expect =
      "The Jury said \"no evidence\" was found. It cost $5 (1/2 of it), he said; Mr. Allen Jr.\n\n"
      "Merger proposed\n\n"
      "\"Why?\" she asked.\n\n"
      "He said 'pro' and didn't say \"yes.\"";
  EXPECT_EQ(brown_to_text(tagged), expect);
  EXPECT_EQ(brown_to_text(""), "");
  EXPECT_EQ(brown_to_text("\n\n\t\n"), "");
}

TEST(DataBrown, FileNames) {
  EXPECT_TRUE(is_brown_file_name("ca01"));
  EXPECT_TRUE(is_brown_file_name("cr09"));
  EXPECT_FALSE(is_brown_file_name("cs01"));
  EXPECT_FALSE(is_brown_file_name("CONTENTS"));
  EXPECT_FALSE(is_brown_file_name("README"));
  EXPECT_FALSE(is_brown_file_name("cats.txt"));
  EXPECT_FALSE(is_brown_file_name("ca1"));
}

TEST(DataBrown, RealCorpusFiles) {
  const std::string dir = default_brown_dir();
  ASSERT_TRUE(file_exists(dir + "/ca01")) << dir << " is missing: run scripts/setup";
  std::vector<std::string> files = expand_inputs({dir}, CorpusFormat::Brown);
  ASSERT_EQ(files.size(), 500u);  // the Brown corpus has 500 samples; CONTENTS, README, cats.txt... are skipped
  EXPECT_EQ(std::filesystem::path(files.front()).filename(), "ca01");
  EXPECT_EQ(std::filesystem::path(files.back()).filename(), "cr09");
  EXPECT_TRUE(std::is_sorted(files.begin(), files.end()));

  DocumentReader reader({files[0]}, CorpusFormat::Brown);
  std::string doc;
  ASSERT_TRUE(reader.next(doc));
  std::string more;
  EXPECT_FALSE(reader.next(more));  // one document per file
  EXPECT_EQ(doc.rfind("The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary election "
                      "produced \"no evidence\" that any irregularities took place.\n\nThe jury further said",
                      0),
            0u)
      << doc.substr(0, 300);
  EXPECT_NE(doc.find("the City Executive Committee, which had over-all charge of the election, \"deserves the praise"),
            std::string::npos);
  EXPECT_NE(doc.find("\n\nMerger proposed\n\n"), std::string::npos);
  for (const char* tag : {"/at ", "/nn", "/vbd", "/in ", "/np", "/.", "``", "''", "\t"})
    EXPECT_EQ(doc.find(tag), std::string::npos) << "found " << tag;
  EXPECT_GT(doc.size(), 10000u);
}

TEST(DataCorpus, TextFilesAndDirectoryExpansion) {
  ScratchDir dir;
  write_bytes(dir / "in/b.txt", "second document\n");
  write_bytes(dir / "in/a.txt", "\xEF\xBB\xBF"
                                "first document");  // a UTF-8 byte order mark is dropped
  write_bytes(dir / "in/sub/c.txt", "third, in a subfolder");
  write_bytes(dir / "in/notes.md", "not a .txt file");
  write_bytes(dir / "in/.hidden.txt", "hidden");
  write_bytes(dir / "in/.git/x.txt", "hidden folder");
  write_bytes(dir / "extra.md", "named explicitly, so taken");
  auto files = expand_inputs({dir / "in", dir / "extra.md"}, CorpusFormat::Text);
  std::vector<std::string> expect_files = {dir / "in/a.txt", dir / "in/b.txt", dir / "in/sub/c.txt", dir / "extra.md"};
  EXPECT_EQ(files, expect_files);
  std::vector<std::string> expect = {"first document", "second document\n", "third, in a subfolder",
                                     "named explicitly, so taken"};
  EXPECT_EQ(read_documents(files, CorpusFormat::Text), expect);

  EXPECT_NE(error_of([&] { expand_inputs({dir / "nope"}, CorpusFormat::Text); }).find("does not exist"),
            std::string::npos);
  std::string msg = error_of([&] { expand_inputs({dir / "in"}, CorpusFormat::Jsonl); });
  EXPECT_NE(msg.find("contains no *.jsonl"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { expand_inputs({}, CorpusFormat::Text); }).find("no input files"), std::string::npos);
  EXPECT_EQ(parse_corpus_format("jsonl"), CorpusFormat::Jsonl);
  EXPECT_NE(error_of([&] { parse_corpus_format("csv"); }).find("unknown corpus format 'csv'"), std::string::npos);
}

TEST(DataCorpus, JsonLines) {
  ScratchDir dir;
  write_bytes(dir / "a.jsonl", "{\"text\": \"hello\\nworld\", \"id\": 1}\n"
                               "\n"
                               "{\"id\": 2, \"text\": \"caf\\u00e9 \\u2603\"}\r\n"
                               "{\"text\": \"\"}\n");
  write_bytes(dir / "b.ndjson", "{\"body\": \"x\", \"text\": \"from b\"}");  // no final newline
  auto files = expand_inputs({dir.path}, CorpusFormat::Jsonl);
  ASSERT_EQ(files.size(), 2u);
  std::vector<std::string> expect = {"hello\nworld", "caf\xC3\xA9 \xE2\x98\x83", "", "from b"};
  EXPECT_EQ(read_documents(files, CorpusFormat::Jsonl), expect);
  EXPECT_EQ(read_documents({dir / "b.ndjson"}, CorpusFormat::Jsonl, "body"), std::vector<std::string>{"x"});

  DocumentReader reader(files, CorpusFormat::Jsonl);
  std::string doc;
  ASSERT_TRUE(reader.next(doc));
  ASSERT_TRUE(reader.next(doc));
  EXPECT_EQ(reader.where(), dir / "a.jsonl:3");
}

TEST(DataCorpus, BadJsonLinesNameFileAndLine) {
  ScratchDir dir;
  write_bytes(dir / "bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"ok\"}\n{\"text\": broken}\n");
  std::string msg = error_of([&] { read_documents({dir / "bad.jsonl"}, CorpusFormat::Jsonl); });
  EXPECT_NE(msg.find(dir / "bad.jsonl:3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not valid JSON"), std::string::npos) << msg;

  write_bytes(dir / "nofield.jsonl", "{\"text\": \"ok\"}\n{\"content\": \"no text field\"}\n");
  msg = error_of([&] { read_documents({dir / "nofield.jsonl"}, CorpusFormat::Jsonl); });
  EXPECT_NE(msg.find(dir / "nofield.jsonl:2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no field 'text'"), std::string::npos) << msg;

  write_bytes(dir / "number.jsonl", "{\"text\": 42}\n");
  msg = error_of([&] { read_documents({dir / "number.jsonl"}, CorpusFormat::Jsonl); });
  EXPECT_NE(msg.find("number.jsonl:1: field 'text' is a number, not a string"), std::string::npos) << msg;

  write_bytes(dir / "array.jsonl", "[\"text\"]\n");
  msg = error_of([&] { read_documents({dir / "array.jsonl"}, CorpusFormat::Jsonl); });
  EXPECT_NE(msg.find("array.jsonl:1: expected a JSON object"), std::string::npos) << msg;

  msg = error_of([&] { read_documents({dir / "missing.txt"}, CorpusFormat::Text); });
  EXPECT_NE(msg.find("cannot open"), std::string::npos) << msg;
}

}  // namespace
}  // namespace mt
