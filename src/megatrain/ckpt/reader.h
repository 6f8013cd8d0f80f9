// Reads slices of a checkpoint's full tensors, whatever wrote it: a single process (format 1: one file per group,
// every tensor whole) or a parallel run (format 2: one file per rank, every tensor in pieces; see sharded.h).
// A rank of any layout asks for the slices it holds and reads only the pieces that overlap them; each file is
// opened, size-checked and CRC-verified the first time a piece in it is needed, so a rank touches only its files.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "megatrain/ckpt/safetensors.h"
#include "megatrain/ckpt/slice.h"

namespace mt {

class CheckpointReader {
 public:
  // `path`: a step directory or a root (its latest checkpoint). Checks the manifest completely (every tensor
  // tiled by its pieces, every piece in a listed file); throws mt::Error naming the file or tensor otherwise.
  static CheckpointReader open(const std::string& path, bool verify_checksums = true);

  const std::string& dir() const { return dir_; }
  int64_t step() const { return step_; }
  int format_version() const { return version_; }
  const nlohmann::json& manifest() const { return manifest_; }
  const nlohmann::json& extra() const { return manifest_["extra"]; }

  std::vector<std::string> tensor_names() const;  // sorted
  bool has(const std::string& name) const { return tensors_.count(name) > 0; }
  const std::vector<int64_t>& shape(const std::string& name) const { return entry(name).shape; }
  DType dtype(const std::string& name) const { return entry(name).dtype; }
  // "model.safetensors" (parameters) or "optim.safetensors" (moments): the file a format-1 checkpoint keeps it in.
  const std::string& group(const std::string& name) const { return entry(name).group; }

  // Copies the elements `src` of full tensor `name` into the box of the same extent at dst_start of dst (a host
  // array of dst_shape holding the tensor's dtype). Elements of src beyond the tensor's shape are zeroed (a
  // layout with a larger vocabulary padding reads the saved rows and zero padding).
  void read(const std::string& name, const Slice& src, void* dst, const std::vector<int64_t>& dst_shape,
            const std::vector<int64_t>& dst_start);

  // The files opened so far (sorted): what this reader has actually read.
  std::vector<std::string> files_read() const;

 private:
  struct Piece {
    std::string file, name;  // where it is stored
    Slice slice;             // where it belongs in the full tensor
  };
  struct Entry {
    std::string group;
    DType dtype = DType::F32;
    std::vector<int64_t> shape;
    std::vector<Piece> pieces;
  };
  const Entry& entry(const std::string& name) const;
  const SafetensorsFile& file(const std::string& fname);
  void parse_v1();
  void parse_v2();

  std::string dir_;
  int64_t step_ = 0;
  int version_ = 0;
  bool verify_ = true;
  nlohmann::json manifest_;
  std::map<std::string, Entry> tensors_;
  std::map<std::string, SafetensorsFile> open_;
};

}  // namespace mt
