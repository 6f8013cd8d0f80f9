// An HF model on disk, as transformers' save_pretrained writes it: a config.json beside either one
// model.safetensors or a model.safetensors.index.json whose weight_map names the shard file of every tensor
// (models over ~5 GB: Llama-3-8B ships four). Opening one validates all of it, so the converters see one set of
// tensors whichever way it was split, and a broken index is an error naming the index and the tensor or file.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "megatrain/ckpt/safetensors.h"

namespace mt {

class HfModelFiles {
 public:
  // path: the model's directory (config.json + model.safetensors or model.safetensors.index.json), a .safetensors
  // file (config.json beside it is read when present), or an .index.json (shard files and config.json beside it).
  // The index must be a JSON object whose weight_map maps each tensor name to a plain file name in its folder;
  // every listed file must exist and hold its tensors, and no file may hold a tensor the index does not list.
  static HfModelFiles open(const std::string& path);

  // True when path looks like an HF model directory: model.safetensors or its index, and no megatrain
  // manifest.json (what tells it from a checkpoint step directory; a checkpoint root holds neither file).
  static bool is_model_dir(const std::string& path);

  const std::string& source() const { return source_; }  // what was opened, for messages
  // The parsed config.json (an object) and its path; nullopt / "" when there is none.
  const std::optional<nlohmann::json>& config() const { return config_; }
  const std::string& config_path() const { return config_path_; }

  bool has(const std::string& name) const;
  const TensorData& tensor(const std::string& name) const;    // throws naming the name and the source
  const std::string& file_of(const std::string& name) const;  // the shard file holding it
  std::vector<std::string> names() const;                     // every tensor, sorted
  // The tensor, checked to be F32, F16 or BF16 (what megatrain reads as float); another dtype is an error naming it.
  const TensorData& float_tensor(const std::string& name) const;
  // Its elements as float.
  std::vector<float> read_f32(const std::string& name) const;
  // Whether two float tensors hold the same values (a tied head saved beside its embedding): the bytes when both
  // have one dtype, else the values.
  bool same_values(const std::string& a, const std::string& b) const;

  size_t num_files() const { return files_.size(); }
  const SafetensorsFile& file(size_t i) const { return files_.at(i); }

  // config()'s value at key, or nullptr when there is no config or no such key (a JSON null counts as absent).
  const nlohmann::json* setting(const char* key) const;

 private:
  std::string source_, config_path_;
  std::optional<nlohmann::json> config_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> owner_;  // tensor name -> index into files_
};

// The dtypes megatrain writes HF weights in: F32 (exact) or BF16 (half the bytes, rounded to nearest even).
// torch_dtype_name(F32) = "float32", (BF16) = "bfloat16": config.json's torch_dtype.
const char* torch_dtype_name(DType d);

// Writes F32 tensors as an HF weights file in `dtype` (F32 or BF16; anything else is an error), converting a copy
// when BF16. The file says "format": "pt", as transformers' files do.
void write_hf_weights(const std::string& path, std::vector<TensorRef> refs, DType dtype);

}  // namespace mt
