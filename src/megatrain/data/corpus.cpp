#include "megatrain/data/corpus.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>

#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"

namespace fs = std::filesystem;

namespace mt {

CorpusFormat parse_corpus_format(const std::string& name) {
  if (name == "brown") return CorpusFormat::Brown;
  if (name == "text") return CorpusFormat::Text;
  if (name == "jsonl") return CorpusFormat::Jsonl;
  fail("unknown corpus format '{}' (expected brown, text or jsonl)", name);
}

const char* corpus_format_name(CorpusFormat f) {
  switch (f) {
    case CorpusFormat::Brown: return "brown";
    case CorpusFormat::Text: return "text";
    case CorpusFormat::Jsonl: return "jsonl";
  }
  return "?";
}

static bool belongs_to_format(const fs::path& p, CorpusFormat format) {
  std::string name = p.filename().string();
  std::string ext = p.extension().string();
  switch (format) {
    case CorpusFormat::Brown: return is_brown_file_name(name);
    case CorpusFormat::Text: return ext == ".txt";
    case CorpusFormat::Jsonl: return ext == ".jsonl" || ext == ".ndjson";
  }
  return false;
}

static const char* format_files(CorpusFormat format) {
  switch (format) {
    case CorpusFormat::Brown: return "Brown corpus files (ca01 .. cr09)";
    case CorpusFormat::Text: return "*.txt files";
    case CorpusFormat::Jsonl: return "*.jsonl / *.ndjson files";
  }
  return "?";
}

std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs, CorpusFormat format) {
  MT_CHECK(!inputs.empty(), "no input files given");
  std::vector<std::string> files;
  for (const std::string& in : inputs) {
    std::error_code ec;
    auto st = fs::status(in, ec);
    MT_CHECK(!ec && fs::exists(st), "input {} does not exist", in);
    if (!fs::is_directory(st)) {
      files.push_back(in);
      continue;
    }
    std::vector<std::string> found;
    auto it = fs::recursive_directory_iterator(in, fs::directory_options::follow_directory_symlink, ec);
    MT_CHECK(!ec, "cannot list {}: {}", in, ec.message());
    for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
      MT_CHECK(!ec, "cannot list {}: {}", in, ec.message());
      std::string name = it->path().filename().string();
      if (!name.empty() && name[0] == '.') {
        if (it->is_directory()) it.disable_recursion_pending();
        continue;
      }
      if (it->is_regular_file() && belongs_to_format(it->path(), format)) found.push_back(it->path().string());
    }
    MT_CHECK(!found.empty(), "input directory {} contains no {} (format {})", in, format_files(format),
             corpus_format_name(format));
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

DocumentReader::DocumentReader(std::vector<std::string> files, CorpusFormat format, std::string field)
    : files_(std::move(files)), format_(format), field_(std::move(field)) {
  MT_CHECK(format_ != CorpusFormat::Jsonl || !field_.empty(), "jsonl reader: empty field name");
}

std::string DocumentReader::where() const {
  if (file_index_ == 0) return "<no file>";
  const std::string& f = files_[file_index_ - 1];
  return format_ == CorpusFormat::Jsonl ? fmt::format("{}:{}", f, line_) : f;
}

bool DocumentReader::open_next_file() {
  if (file_index_ >= files_.size()) return false;
  const std::string& path = files_[file_index_++];
  if (format_ == CorpusFormat::Jsonl) {
    jsonl_ = std::ifstream(path, std::ios::binary);
    MT_CHECK(jsonl_.good(), "cannot open {}", path);
    line_ = 0;
  }
  return true;
}

static void strip_bom(std::string& s) {
  if (s.size() >= 3 && s.compare(0, 3, "\xEF\xBB\xBF") == 0) s.erase(0, 3);
}

bool DocumentReader::next(std::string& doc) {
  if (format_ != CorpusFormat::Jsonl) {
    if (!open_next_file()) return false;
    const std::string& path = files_[file_index_ - 1];
    std::string raw = read_text_file(path);
    done_bytes_ += raw.size();
    strip_bom(raw);
    doc = format_ == CorpusFormat::Brown ? brown_to_text(raw) : std::move(raw);
    return true;
  }
  for (;;) {
    if (!jsonl_.is_open() && !open_next_file()) return false;
    std::string line;
    if (!std::getline(jsonl_, line)) {
      MT_CHECK(jsonl_.eof(), "error reading {}", where());
      jsonl_.close();
      std::error_code ec;
      done_bytes_ += std::filesystem::file_size(files_[file_index_ - 1], ec);
      continue;
    }
    ++line_;
    if (line_ == 1) strip_bom(line);
    if (std::all_of(line.begin(), line.end(), [](unsigned char c) { return std::isspace(c); })) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      fail("{}: not valid JSON: {}", where(), e.what());
    }
    MT_CHECK(j.is_object(), "{}: expected a JSON object, got {}", where(), j.type_name());
    auto it = j.find(field_);
    MT_CHECK(it != j.end(), "{}: no field '{}'", where(), field_);
    MT_CHECK(it->is_string(), "{}: field '{}' is a {}, not a string", where(), field_, it->type_name());
    doc = it->get<std::string>();
    return true;
  }
}

uint64_t DocumentReader::bytes_read() {
  if (format_ != CorpusFormat::Jsonl || !jsonl_.is_open()) return done_bytes_;
  const std::streamoff at = jsonl_.tellg();  // -1 once the stream hit the end of the file
  if (at >= 0) return done_bytes_ + uint64_t(at);
  std::error_code ec;
  return done_bytes_ + std::filesystem::file_size(files_[file_index_ - 1], ec);
}

std::vector<std::string> read_documents(const std::vector<std::string>& files, CorpusFormat format,
                                        const std::string& field) {
  DocumentReader reader(files, format, field);
  std::vector<std::string> docs;
  std::string doc;
  while (reader.next(doc)) docs.push_back(std::move(doc));
  return docs;
}

}  // namespace mt
