// Checkpoint directories: root/step_00000100/{model.safetensors, optim.safetensors, ..., manifest.json} and
// root/latest naming the newest committed one.
//
// A save writes into root/step_XXXXXXXX.tmp-<pid>/ (each file fsynced, the manifest last), renames the directory
// into place, and only then rewrites root/latest (atomically): a crash at any point leaves the previous
// checkpoint current, and a *.tmp-* directory never counts as a checkpoint. A load verifies the manifest's
// format version, every file's size and CRC-32C, and every tensor's checksum, dtype and shape.
//
// manifest.json: {format_version: 1, step, files: {file: {bytes, checksum}},
//                 tensors: {name: {file, dtype, shape, checksum}}, extra: <the caller's JSON>, manifest_checksum}
// manifest_checksum (both formats) is the CRC-32C of the manifest's canonical serialisation without that field
// (nlohmann::json::dump(): compact, keys sorted). It is verified before anything in the manifest is used, so a
// corrupted manifest that is still valid JSON (a flipped digit in a piece's start, a changed extra.model) is an
// error naming the file, not a silently wrong load. Manifests written before it existed have none: they load,
// with a warning on stderr (refusing them would strand every existing run's checkpoints).
// A parallel run writes format 2 instead (one file per rank, tensors assembled from pieces; see sharded.h).
// Checkpoint::load reads both and always presents full tensors.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "megatrain/ckpt/safetensors.h"
#include "megatrain/core/buffer.h"

namespace mt {

// file name ("model.safetensors") -> its tensors. Tensor names must be unique across all files.
using CheckpointFiles = std::map<std::string, std::vector<TensorRef>>;

struct SaveOptions {
  int keep_last = 0;    // after a successful save, delete all but the newest N checkpoints (0 = keep all);
                        // the one just written is never deleted
  std::string protect;  // a checkpoint directory never deleted by the pruning (the one this run resumed from)
  // Fault injection for tests: called at each stage of a save ("file:<name>" after each file, "rename" before
  // the directory is committed, "latest" before root/latest is rewritten). Throwing aborts the save there.
  std::function<void(const std::string& stage)> fault_hook;
};

constexpr int kCheckpointFormatVersion = 1;
constexpr int kShardedCheckpointFormatVersion = 2;

std::string checkpoint_dir_name(int64_t step);  // "step_00000100"

// Writes a checkpoint of `step` under root (created if needed) and returns its directory. Saving a step that
// already exists replaces it.
std::string save_checkpoint(const std::string& root, int64_t step, const CheckpointFiles& files,
                            const nlohmann::json& extra, const SaveOptions& opt = {});

struct CheckpointEntry {
  int64_t step = 0;
  std::string dir;
};
// Committed checkpoints under root (step_N directories holding a manifest.json), by increasing step.
std::vector<CheckpointEntry> list_checkpoints(const std::string& root);
// The directory root/latest names; without a usable latest file, the highest committed step; nullopt if none.
std::optional<std::string> find_latest(const std::string& root);

// The checkpoint directory `path` denotes (a step directory, or a root: its latest), or a clear mt::Error.
std::string resolve_checkpoint_dir(const std::string& path);
// dir/manifest.json, parsed and its manifest_checksum verified; throws naming the file when it is missing, not
// JSON or fails its checksum.
nlohmann::json read_manifest(const std::string& dir);
// The manifest with manifest_checksum set (what writers store).
nlohmann::json seal_manifest(nlohmann::json manifest);
constexpr const char* kManifestChecksumKey = "manifest_checksum";
// Commits staging_dir (every file written, manifest.json last) as checkpoint `step` of root: renames it into
// place (replacing an existing step), rewrites root/latest, prunes to opt.keep_last. Returns the step directory.
std::string commit_checkpoint_dir(const std::string& root, int64_t step, const std::string& staging_dir,
                                  const SaveOptions& opt);

class Checkpoint {
 public:
  // `path` is a step directory or a root (then its latest checkpoint). Throws mt::Error when nothing is there,
  // or when anything is missing, truncated, corrupt, or disagrees with the manifest. verify_checksums = false
  // skips reading the data (sizes, dtypes and shapes are still checked).
  static Checkpoint load(const std::string& path, bool verify_checksums = true);

  const std::string& dir() const { return dir_; }
  int64_t step() const { return step_; }
  const nlohmann::json& extra() const { return manifest_["extra"]; }
  const nlohmann::json& manifest() const { return manifest_; }

  std::vector<std::string> tensor_names() const;  // sorted
  // Tensors of one file ("model.safetensors", "optim.safetensors"); of a sharded checkpoint: of that group.
  std::vector<std::string> tensor_names(const std::string& file) const;
  bool has(const std::string& name) const { return tensor_file_.count(name) > 0; }
  const TensorData& get(const std::string& name) const;  // points into the mapped file
  const std::string& file_of(const std::string& name) const;
  // Copies tensor `name` into dst (a contiguous host tensor) after checking dtype and shape, e.g.
  // "checkpoint tensor h.0.attn.c_attn.weight has shape [96, 32] but the model expects [192, 64]".
  void copy_into(const std::string& name, Tensor dst) const;

 private:
  void load_sharded(bool verify_checksums);

  std::string dir_;
  int64_t step_ = 0;
  nlohmann::json manifest_;
  std::map<std::string, SafetensorsFile> files_;
  std::map<std::string, std::string> tensor_file_;
  // A sharded checkpoint's tensors, assembled from their pieces at load.
  std::map<std::string, HostBuffer> assembled_data_;
  std::map<std::string, TensorData> assembled_;
};

inline Checkpoint load_checkpoint(const std::string& path) { return Checkpoint::load(path); }

}  // namespace mt
