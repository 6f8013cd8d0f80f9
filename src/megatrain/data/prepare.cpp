#include "megatrain/data/prepare.h"

#include <algorithm>
#include <cctype>
#include <exception>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"
#include "megatrain/core/rng.h"
#include "megatrain/data/shard.h"

namespace fs = std::filesystem;

namespace mt {

bool is_val_document(uint64_t doc_index, uint64_t seed, double val_fraction) {
  // A hash of the index, not a running random stream: the split of a document does not depend on the others.
  double u = static_cast<double>(mix_seed(seed, doc_index, 0x76616c /* "val" */) >> 11) * 0x1p-53;
  return u < val_fraction;
}

namespace {

// Documents are tokenized in chunks this large: big enough to keep every thread busy, small enough that the
// corpus is streamed rather than held.
constexpr size_t kChunkBytes = 32 << 20;
constexpr size_t kChunkDocs = 4096;

bool is_blank(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c); });
}

std::vector<std::vector<int32_t>> encode_all(const std::vector<std::string>& docs, const TokenEncoder& enc) {
  std::vector<std::vector<int32_t>> out(docs.size());
  std::exception_ptr err;
  const int64_t n = static_cast<int64_t>(docs.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < n; ++i) {
    try {
      out[i] = enc.encode(docs[i]);
    } catch (...) {
#pragma omp critical(mt_prepare_encode_error)
      if (!err) err = std::current_exception();
    }
  }
  if (err) std::rethrow_exception(err);
  return out;
}

nlohmann::json split_json(const SplitStats& s) {
  nlohmann::json names = nlohmann::json::array();
  for (const std::string& p : s.shards) names.push_back(fs::path(p).filename().string());
  return {{"documents", s.documents}, {"tokens", s.tokens}, {"shards", names}};
}

}  // namespace

std::string progress_line(const PrepareProgress& p) {
  const bool gb = p.bytes_total >= 1'000'000'000;
  const double unit = gb ? 1e9 : 1e6;
  const double rate = p.seconds > 0 ? double(p.bytes_read) / p.seconds : 0;  // bytes/s
  std::string left;
  if (rate > 0 && p.bytes_read < p.bytes_total) {
    const double s = double(p.bytes_total - p.bytes_read) / rate;
    left = s < 90     ? fmt::format(", about {:.0f} s left", s)
           : s < 5400 ? fmt::format(", about {:.0f} min left", s / 60)
                      : fmt::format(", about {:.1f} h left", s / 3600);
  }
  return fmt::format("prepare-data: {:.2f} of {:.2f} {} read ({:.1f}%), {} documents, {:.1f}M tokens, {:.1f} MB/s{}",
                     p.bytes_read / unit, p.bytes_total / unit, gb ? "GB" : "MB",
                     p.bytes_total ? 100.0 * double(p.bytes_read) / double(p.bytes_total) : 100.0, p.documents,
                     p.tokens / 1e6, rate / 1e6, left);
}

PrepareResult prepare_data(const PrepareOptions& opt, const TokenEncoder& enc) {
  const double t0 = now_seconds();
  MT_CHECK(enc.encode != nullptr, "prepare-data: no tokenizer");
  MT_CHECK(enc.vocab_size > 0 && enc.eot >= 0 && enc.eot < enc.vocab_size,
           "prepare-data: tokenizer has vocab size {} and EOT id {}; need 0 <= EOT < vocab size", enc.vocab_size,
           enc.eot);
  MT_CHECK(opt.val_fraction >= 0 && opt.val_fraction < 1, "prepare-data: --val-fraction must be in [0, 1), got {}",
           opt.val_fraction);
  MT_CHECK(opt.shard_tokens >= 1 && opt.shard_tokens <= static_cast<uint64_t>(std::numeric_limits<int32_t>::max()),
           "prepare-data: --shard-tokens must be in [1, 2147483647] (llm.c headers count tokens in an int32), got {}",
           opt.shard_tokens);
  MT_CHECK(!opt.out_dir.empty(), "prepare-data: no output directory given");

  PrepareResult res;
  res.sources = expand_inputs(opt.inputs, opt.format);
  DocumentReader reader(res.sources, opt.format, opt.field);
  PrepareProgress progress;
  for (const std::string& f : res.sources) {
    std::error_code ec;
    progress.bytes_total += fs::file_size(f, ec);
  }

  // Created once the first document is in hand: a run that finds nothing to write leaves the directory alone.
  std::optional<ShardWriter> train, val;
  const std::string meta_path = opt.out_dir + "/meta.json";
  const bool guarantee_val = opt.val_fraction > 0;
  uint64_t index = 0;  // of the next non-empty document
  bool any_val = false;
  // Until a document lands in val, the latest train document is held back so that it can become the val
  // document if no other does. Holding one document keeps the train stream in corpus order.
  std::optional<std::vector<int32_t>> held;

  for (;;) {
    std::vector<std::string> docs;
    size_t bytes = 0;
    std::string doc;
    while (bytes < kChunkBytes && docs.size() < kChunkDocs && reader.next(doc)) {
      if (is_blank(doc)) {
        ++res.skipped_empty;
        continue;
      }
      bytes += doc.size();
      docs.push_back(std::move(doc));
    }
    if (docs.empty()) break;
    if (!train) {
      std::error_code ec;
      fs::create_directories(opt.out_dir, ec);
      MT_CHECK(!ec, "cannot create output directory {}: {}", opt.out_dir, ec.message());
      fs::remove(meta_path, ec);
      train.emplace(opt.out_dir, "train", enc.vocab_size, enc.eot, opt.shard_tokens);
      val.emplace(opt.out_dir, "val", enc.vocab_size, enc.eot, opt.shard_tokens);
    }
    std::vector<std::vector<int32_t>> tokens = encode_all(docs, enc);
    if (opt.on_progress) {
      progress.bytes_read = reader.bytes_read();
      progress.documents += tokens.size();
      for (const auto& t : tokens) progress.tokens += t.size() + 1;
      progress.seconds = now_seconds() - t0;
      opt.on_progress(progress);
    }
    for (auto& t : tokens) {
      if (is_val_document(index++, opt.seed, opt.val_fraction)) {
        if (held) {
          train->add_document(*held);
          held.reset();
        }
        val->add_document(t);
        any_val = true;
      } else if (guarantee_val && !any_val) {
        if (held) train->add_document(*held);
        held = std::move(t);
      } else {
        train->add_document(t);
      }
    }
  }
  MT_CHECK(index > 0, "prepare-data: no documents in the input ({} file(s) read{})", res.sources.size(),
           res.skipped_empty ? fmt::format(", {} empty document(s) skipped", res.skipped_empty) : std::string());
  if (held) (index >= 2 ? val : train)->add_document(*held);

  for (auto [w, s] : {std::pair{&*train, &res.train}, std::pair{&*val, &res.val}}) {
    s->shards = w->finish();
    s->documents = w->num_documents();
    s->tokens = w->num_tokens();
  }

  nlohmann::json meta = {
      {"format", "megatrain token shards (llm.c layout, magic 20240520)"},
      {"tokenizer", enc.name},
      {"vocab_size", enc.vocab_size},
      {"eot", enc.eot},
      {"token_dtype", shard_version_for_vocab(enc.vocab_size) == 1 ? "uint16" : "uint32"},
      {"input_format", corpus_format_name(opt.format)},
      {"sources", res.sources},
      {"seed", opt.seed},
      {"val_fraction", opt.val_fraction},
      {"shard_tokens", opt.shard_tokens},
      {"skipped_empty_documents", res.skipped_empty},
      {"splits", {{"train", split_json(res.train)}, {"val", split_json(res.val)}}},
  };
  if (opt.format == CorpusFormat::Jsonl) meta["field"] = opt.field;
  write_file_atomic(meta_path, meta.dump(2) + "\n");
  res.seconds = now_seconds() - t0;
  return res;
}

std::string prepared_tokenizer(const std::string& dir) {
  const std::string path = dir + "/meta.json";
  std::ifstream f(path);
  if (!f) return "";
  nlohmann::json meta = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  MT_CHECK(!meta.is_discarded(), "{}: not valid JSON (rerun prepare-data for {})", path, dir);
  auto it = meta.find("tokenizer");
  return it != meta.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace mt
