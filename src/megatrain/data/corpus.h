// Corpus readers: turn input files into documents (one std::string each) for tokenization.
//   brown: the tagged Brown corpus (files ca01..cr09 of "word/TAG" tokens), restored to plain text; one document
//          per file.
//   text:  a file is one document, as is.
//   jsonl: one JSON object per line; the document is the string field `field` ("text" by default); blank
//          lines are skipped.
#pragma once
#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace mt {

enum class CorpusFormat { Brown, Text, Jsonl };

CorpusFormat parse_corpus_format(const std::string& name);  // "brown" | "text" | "jsonl"; throws otherwise
const char* corpus_format_name(CorpusFormat f);

// Plain text from one Brown corpus file: tags dropped (a tag follows the last '/' of a token), punctuation
// attached the way it is printed, `` and '' turned into ", paragraphs separated by a blank line. Headlines (lines
// tagged *-hl) become paragraphs of their own.
std::string brown_to_text(std::string_view tagged);
// True for the names of the Brown corpus' text files: 'c', a genre letter a..r, two digits (ca01 .. cr09).
bool is_brown_file_name(std::string_view name);

// Expands the inputs into the files to read, in a deterministic order: a file is taken as given; a directory
// contributes, recursively and sorted by path, its files that belong to the format (brown: Brown file names;
// text: *.txt; jsonl: *.jsonl, *.ndjson); hidden entries are skipped. A path that does not exist, or a
// directory without any such file, is an error.
std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs, CorpusFormat format);

// Reads documents one at a time, file after file, so a corpus never has to fit in memory.
class DocumentReader {
 public:
  DocumentReader(std::vector<std::string> files, CorpusFormat format, std::string field = "text");
  // The next document, or false at the end. Errors (unreadable file, bad JSON line, missing field) name the
  // file, and for jsonl the line.
  bool next(std::string& doc);
  // Where the last document came from: "path" or "path:line".
  std::string where() const;
  // Bytes of the input files consumed so far: the sum of their sizes once every document was read.
  uint64_t bytes_read();

 private:
  bool open_next_file();
  std::vector<std::string> files_;
  CorpusFormat format_;
  std::string field_;
  size_t file_index_ = 0;  // files_[file_index_ - 1] is the current file
  std::ifstream jsonl_;
  uint64_t line_ = 0;
  uint64_t done_bytes_ = 0;  // of the files read to the end (text, brown: each file at once)
};

// Convenience: every document of the files (for small corpora and tests).
std::vector<std::string> read_documents(const std::vector<std::string>& files, CorpusFormat format,
                                        const std::string& field = "text");

}  // namespace mt
