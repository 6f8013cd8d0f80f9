// safetensors files (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length N, N bytes
// of JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}} padded with spaces,
// then the data region, every byte of which belongs to exactly one tensor. The format of our checkpoints and of
// HF weights.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "megatrain/core/tensor.h"

namespace mt {

// A tensor to write: the caller keeps `data` alive and unchanged until the write returns.
struct TensorRef {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};
TensorRef tensor_ref(std::string name, const Tensor& t);  // a host tensor as a TensorRef

struct SafetensorsWriteResult {
  uint64_t file_bytes = 0;
  uint32_t file_crc = 0;                       // CRC-32C of the whole file
  std::map<std::string, uint32_t> tensor_crc;  // CRC-32C of each tensor's bytes
};

// Writes `path` atomically (path.tmp-<pid>, fsync, rename, fsync the directory). Data is streamed from the
// callers' buffers, never copied whole. Output is deterministic: the header lists names sorted; the data region
// holds tensors by decreasing element size, then name, so every tensor is aligned to its element size.
SafetensorsWriteResult write_safetensors(const std::string& path, std::vector<TensorRef> tensors,
                                         const std::map<std::string, std::string>& metadata = {});

// One tensor of an open file. `data` points into the file's mapping (valid while the file is open) and may be
// unaligned in files written by others: copy it with memcpy.
struct TensorData {
  std::string name;
  std::string dtype_str;     // as in the file ("F32", "BF16", "F64", "BOOL", ...)
  DType dtype = DType::F32;  // meaningful only when supported
  bool supported = false;    // dtype_str is one of megatrain's DTypes
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
  uint64_t offset = 0;  // of the data, from the start of the file

  int64_t numel() const;
  std::string shape_str() const;  // "[768, 2304]"
};

std::string shape_str(const std::vector<int64_t>& shape);
// Converts the elements of an F32, F16 or BF16 tensor to float (dst holds numel() floats); throws otherwise.
void to_f32(const TensorData& t, float* dst);
// The same for elements [first, first + count) of the tensor (row-major), into dst[0, count).
void to_f32(const TensorData& t, int64_t first, int64_t count, float* dst);

class SafetensorsFile {
 public:
  // Maps the file and validates it completely; throws mt::Error naming the file (and the tensor) otherwise.
  static SafetensorsFile open(const std::string& path);

  SafetensorsFile() = default;
  SafetensorsFile(SafetensorsFile&& o) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& o) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;  // sorted
  bool has(const std::string& name) const { return tensors_.count(name) > 0; }
  // Throws when absent or when its dtype is not one megatrain handles.
  const TensorData& get(const std::string& name) const;
  const std::map<std::string, TensorData>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  uint64_t file_size() const { return size_; }
  uint64_t header_size() const { return data_start_; }  // 8 + N: where the data region begins
  const uint8_t* bytes() const { return base_; }        // the whole mapped file
  // The tensors in data-region order (they tile it exactly).
  std::vector<const TensorData*> in_file_order() const;

 private:
  void close();
  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  uint64_t data_start_ = 0;
  std::map<std::string, TensorData> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace mt
