// Sharded checkpoints (format 2): every rank of a parallel run writes only what it uniquely holds, as pieces
// (slices) of the full tensors, into its own file; one process then writes the manifest, last, which makes the
// checkpoint complete. Nothing is gathered, and no rank ever holds more than its own shard.
//
//   root/step_N/shard-pp{p}-tp{t}-dp{d}.safetensors   one per writing rank
//   root/step_N/manifest.json  {format_version: 2, step, files: {file: {bytes, checksum}},
//                               tensors: {name: {group, dtype, shape, pieces: [{file, name, start, extent}]}},
//                               extra}
// A piece's start/extent place it in the full tensor; the pieces of a tensor tile it exactly (checked when the
// checkpoint is committed and again when it is read). CheckpointReader reads any slice of it; Checkpoint::load
// assembles full tensors (single-process tools).
//
// Protocol (the caller provides the barriers):
//   1. one process:       begin_sharded_checkpoint   (an empty staging directory root/step_N.tmp-sharded)
//   2. every writer:      write_checkpoint_shard      (its file, and beside it a record of its pieces)
//   3. one process:       commit_sharded_checkpoint   (records -> manifest.json; rename into place; root/latest)
// A crash before step 3 ends leaves only the staging directory, which is never taken for a checkpoint.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "megatrain/ckpt/checkpoint.h"
#include "megatrain/ckpt/slice.h"

namespace mt {

// One piece a rank writes: `data` (contiguous, shape slice.extent, alive until the write returns) is `slice` of
// full tensor `tensor` of shape full_shape, kept in `group` ("model.safetensors" or "optim.safetensors").
struct ShardPiece {
  std::string tensor, group;
  std::vector<int64_t> full_shape;
  Slice slice;
  DType dtype = DType::F32;
  const void* data = nullptr;
};

std::string shard_file_name(int pp, int tp, int dp);  // "shard-pp0-tp1-dp0.safetensors"
std::string sharded_staging_dir(const std::string& root, int64_t step);

// Step 1: (re)creates the empty staging directory of `step` under root; returns it.
std::string begin_sharded_checkpoint(const std::string& root, int64_t step);
// Step 2: writes `file` (a plain name) with the pieces into the staging directory of `step`.
void write_checkpoint_shard(const std::string& root, int64_t step, const std::string& file,
                            const std::vector<ShardPiece>& pieces);
// Step 2 into any directory (a peer snapshot persisted by a survivor, see train/checkpointing.h): `dir`/`file`
// and its record, exactly as write_checkpoint_shard leaves them in the staging directory.
void write_shard_into(const std::string& dir, int64_t step, const std::string& file,
                      const std::vector<ShardPiece>& pieces);

// ---- asynchronous saves: the commit without a barrier
// A writer's record (written atomically after its file is fsynced) is its "done" marker; a writer that failed
// leaves "<file>.failed" holding its error instead. The committing process waits for one or the other of every
// file before step 3, so no collective is needed between writing and committing.
void write_shard_failure(const std::string& root, int64_t step, const std::string& file, const std::string& why);
// Waits up to timeout_s for every file's record or failure marker. Returns "" when all were written, else what
// went wrong (the failed writers' messages, or the files still missing at the deadline).
std::string wait_for_shards(const std::string& root, int64_t step, const std::vector<std::string>& files,
                            double timeout_s);

// Step 3: after every writer finished, checks that each of `files` was written whole and that the pieces tile
// every tensor, writes the manifest and commits the checkpoint; returns its directory. Throws mt::Error naming
// the missing file or the tensor with a hole.
std::string commit_sharded_checkpoint(const std::string& root, int64_t step, const std::vector<std::string>& files,
                                      const nlohmann::json& extra, const SaveOptions& opt = {});

}  // namespace mt
