// prepare_data: a corpus of documents -> token shards split into train and val, plus meta.json.
//
// Documents are read in order (see corpus.h), tokenized in parallel in chunks and streamed to the shard
// writers, so the corpus never has to fit in memory. Document i goes to val when a hash of (seed, i) falls
// below val_fraction; when that picks no document at all (and there are >= 2 documents and val_fraction > 0),
// the last document goes to val instead, so a val split always exists. Empty (all-whitespace) documents are
// skipped and counted.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "megatrain/data/corpus.h"

namespace mt {

// What prepare_data needs of a tokenizer. encode is called from several threads at once.
struct TokenEncoder {
  std::function<std::vector<int32_t>(std::string_view)> encode;
  int vocab_size = 0;
  int eot = -1;
  std::string name;  // recorded in meta.json (e.g. the vocabulary directory)
};

// How far prepare_data has got, for a progress line: a large corpus takes minutes to hours.
struct PrepareProgress {
  uint64_t bytes_read = 0, bytes_total = 0;  // of the input files
  uint64_t documents = 0;                    // tokenized so far (empty ones not counted)
  uint64_t tokens = 0;                       // as they will be stored: one EOT per document included
  double seconds = 0;                        // since prepare_data started
};

struct PrepareOptions {
  std::vector<std::string> inputs;  // files or directories (expanded by expand_inputs)
  CorpusFormat format = CorpusFormat::Text;
  std::string field = "text";  // jsonl: the field holding the document
  std::string out_dir;
  double val_fraction = 0.05;
  uint64_t shard_tokens = 100'000'000;  // maximum tokens per shard
  uint64_t seed = 0;
  // Called after each chunk of documents (32 MiB or 4,096 documents) is tokenized, on the calling thread.
  std::function<void(const PrepareProgress&)> on_progress;
};

struct SplitStats {
  uint64_t documents = 0;
  uint64_t tokens = 0;  // as stored: including one EOT per document
  std::vector<std::string> shards;
};

struct PrepareResult {
  SplitStats train, val;
  uint64_t skipped_empty = 0;
  std::vector<std::string> sources;  // the files read
  double seconds = 0;
};

// "prepare-data: 1.21 of 10.40 GB read (11.6%), 2340000 documents, 310.2M tokens, 14.2 MB/s, about 11 min left".
std::string progress_line(const PrepareProgress& p);

// The split rule for document i (without the at-least-one-val fallback).
bool is_val_document(uint64_t doc_index, uint64_t seed, double val_fraction);

// Writes <out_dir>/train_*.bin, val_*.bin and meta.json (the latter last, and removed first: a directory with a
// meta.json holds a complete dataset). Throws for no inputs, no documents, or bad options.
PrepareResult prepare_data(const PrepareOptions& opt, const TokenEncoder& enc);

// The tokenizer a prepared dataset was made with, as prepare_data recorded it in <dir>/meta.json (TokenEncoder::
// name: for `megatrain prepare-data`, the vocabulary directory); "" when meta.json has none.
std::string prepared_tokenizer(const std::string& dir);

}  // namespace mt
