// A shard snapshot: one rank's part of a checkpoint (the pieces it writes to its shard file, sharded.h), copied
// into memory it owns, with what the manifest will record besides the tensors (`extra`). It is the unit of the
// two-stage save and of the peer copies (train/checkpointing.h):
//   stage 1 (training thread): stage() copies the live tensors in; the step continues as soon as it returns;
//   stage 2 (background):      write_into() serialises it as the rank's shard file, exactly as a synchronous save;
//   peer copy:                 header() + data() travel to a buddy rank, which rebuilds it with receive_layout();
//   after a lost peer:         a survivor writes the snapshots it holds with write_into() (+ extra.json), and a
//                              restarted job commits a complete set of them like any sharded checkpoint.
// The buffer is allocated by the first stage() (or receive_layout()) and reused: the layout of a rank's pieces is
// the same at every step.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "megatrain/ckpt/sharded.h"
#include "megatrain/core/buffer.h"

namespace mt {

class ShardSnapshot {
 public:
  // Copies the pieces (data: the live tensors) into the snapshot; file: the shard file name it is written as.
  // Returns false when a copied value is not finite (the caller finds and names it: the copy is where the values
  // are read anyway, so the check costs no extra pass over memory).
  bool stage(int64_t step, const std::string& file, const std::vector<ShardPiece>& pieces, nlohmann::json extra);

  // Allocates and touches (page-faults in) the memory for these pieces without staging anything: the first
  // stage() then costs only the copy. Meant for a background thread at start-up.
  void reserve(const std::vector<ShardPiece>& pieces);

  int64_t step() const { return step_; }
  const std::string& file() const { return file_; }
  const nlohmann::json& extra() const { return extra_; }
  size_t bytes() const { return bytes_; }
  // Whether anything was staged (or received) yet. A rank may hold no pieces at all (a dp rank of a stage whose
  // ZeRO slices all fell to others): its snapshot is staged and empty, and its shard file holds no tensor.
  bool staged() const { return step_ >= 0; }
  // The pieces, pointing into the snapshot's own memory.
  const std::vector<ShardPiece>& pieces() const { return pieces_; }

  // Writes the shard file and its record into dir (sharded.h: write_shard_into).
  void write_into(const std::string& dir) const;

  // ---- peer copies: the description of the snapshot (step, file, extra, pieces) and its bytes.
  nlohmann::json header() const;
  void* data() { return buf_.data(); }
  // Lays the snapshot out as a header describes it (reusing the buffer when the size is unchanged); the caller
  // then fills data() with the header's bytes(). Throws mt::Error naming the field on a malformed header.
  void receive_layout(const nlohmann::json& header);

 private:
  void layout(const std::vector<ShardPiece>& pieces);

  int64_t step_ = -1;
  std::string file_;
  nlohmann::json extra_;
  std::vector<ShardPiece> pieces_;
  std::vector<size_t> offsets_;  // of each piece in buf_
  size_t bytes_ = 0;
  HostBuffer buf_;
};

}  // namespace mt
