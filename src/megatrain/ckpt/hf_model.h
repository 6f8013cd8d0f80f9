// An HF model of either family megatrain converts (GPT-2: hf_gpt2.h; Llama: hf_llama.h), behind one interface:
// which family it is, the model config it describes, the whole model into a ParamStore, a ParamStore out to HF,
// and slices of single tensors for a rank that holds only part of the model.
#pragma once
#include <string>
#include <vector>

#include "megatrain/ckpt/hf_model_files.h"
#include "megatrain/ckpt/slice.h"
#include "megatrain/model/config.h"
#include "megatrain/model/params.h"

namespace mt {

enum class HfFamily { Gpt2, Llama };

// The family of the files: Llama by config.json's model_type or its tensor names, else GPT-2 (one file); another
// model_type, a split GPT-2 or a megatrain checkpoint's file is an error naming it.
HfFamily hf_family(const HfModelFiles& m);
// The family a model config exports to; an error giving both reasons when it has neither layout.
HfFamily hf_family(const ModelConfig& cfg);

// The config the model describes (GPT-2: n_head as in infer_hf_gpt2_config; Llama: n_head > 0 must agree with
// config.json).
ModelConfig hf_model_config(const HfModelFiles& m, int n_head = 0);
// The whole model into store (declared for cfg and allocated, or empty: declared and allocated here).
void import_hf_model(const HfModelFiles& m, const ModelConfig& cfg, ParamStore& store);
// store as one HF file (and config.json beside it) of the family cfg exports to.
void export_hf_model(const ModelConfig& cfg, const ParamStore& store, const std::string& path, DType dtype);

// Slices of our parameters' full tensors, read straight from an HF model: what a rank that holds only part of the
// model (tensor or pipeline parallel) needs from it. The files are mapped, so only the pages of the slices asked for
// are read: the rank's own rows of a tensor split by rows, and the pages its columns cross of one split by columns
// (the row-parallel layers), rather than the whole model. The same signature as CheckpointReader::read.
class HfSliceReader {
 public:
  // Checks that the files hold the model of cfg (check_same_architecture), that every tensor our layout maps has
  // its HF shape, and that the files hold nothing else (a tied head saved anyway must equal the embedding);
  // each failure names the file and the tensor.
  HfSliceReader(const HfModelFiles& m, const ModelConfig& cfg);

  // Copies the elements `src` of our full tensor `ours` (float) into the box of the same extent at dst_start of dst
  // (a float array of dst_shape). Rows of the vocabulary past vocab_size (the padding) read as zero. A tensor of rank
  // 3 (the experts' [E, R, C]) takes slices that span its middle dimension whole.
  void read(const std::string& ours, const Slice& src, void* dst, const std::vector<int64_t>& dst_shape,
            const std::vector<int64_t>& dst_start);

 private:
  struct Rows {  // one run of our rows: [begin, begin + count) come from rows [hf_row, ...) of tensor t
    const TensorData* t = nullptr;
    int64_t begin = 0, count = 0, hf_row = 0;
    bool transposed = false;  // GPT-2's Conv1D: our (r, c) is HF's (c, r)
  };
  const std::vector<Rows>& rows_of(const std::string& ours);
  void read_as_rows(const std::string& ours, const Slice& src, void* dst, const std::vector<int64_t>& dst_shape,
                    const std::vector<int64_t>& dst_start);

  const HfModelFiles& m_;
  ModelConfig cfg_;
  HfFamily family_;
  std::map<std::string, std::vector<Rows>> rows_;
  std::map<std::string, std::vector<int64_t>> full_shape_;  // our full tensors' shapes
};

}  // namespace mt
