// DataLoader: batches of (input, target) token windows from the shards of one split.
//
// The split's shards (<split>_*.bin in a directory, sorted by name) are one token stream of N tokens. It is
// cut into W = floor((N-1)/T) windows of T+1 tokens; window k starts at offset k*T, so consecutive windows
// share their boundary token (x = the first T tokens, y = the last T). An epoch visits the windows in order
// (shuffle off) or in a permutation that depends only on (seed, epoch). A global batch is world*B consecutive
// entries of the epoch's order and rank r takes rows [r*B, (r+1)*B); an epoch's remainder that cannot fill a
// global batch is dropped and the next epoch begins. The shuffled order is computed per row (WindowOrder), never
// stored, so a loader's memory and start-up time do not grow with the dataset.
//
// A background thread prepares the next `prefetch` batches. The position (epoch, cursor) of the next batch is
// the whole state of the loader: restore(state()) continues exactly where the saved run was.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "megatrain/data/shard.h"

namespace mt {

struct LoaderState {
  uint64_t epoch = 0;
  uint64_t cursor = 0;  // index into the epoch's window order of the next global batch's first window
  bool operator==(const LoaderState&) const = default;
};

struct Batch {
  std::vector<int32_t> x, y;  // [B, T] row-major: y[b, t] is the token after x[b, t]
  int B = 0, T = 0;
  uint64_t epoch = 0;
  uint64_t cursor = 0;  // this batch's position; state() after it is {epoch, cursor + world*B} (or the next epoch)
};

class DataLoader {
 public:
  // Throws mt::Error for a missing directory, no shards of the split, a bad shard, too few tokens for one global
  // batch, or out-of-range B, T, rank, world, prefetch. id_limit > 0 (the model's vocabulary): a token read from a
  // shard that records no vocabulary (llm.c's) must be below it, else next() throws kind Data naming the shard;
  // shards that record one are held to it (ShardReader), and a caller compares it with its own.
  DataLoader(const std::string& dir, const std::string& split, int B, int T, bool shuffle, uint64_t seed,
             int rank = 0, int world = 1, int prefetch = 2, int id_limit = 0);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  Batch next();                       // rethrows an error raised while the batch was prepared in the background
  LoaderState state() const;          // the position of the batch next() returns next
  void restore(const LoaderState& s); // discards prefetched batches; continues from s

  uint64_t num_tokens() const { return total_tokens_; }
  uint64_t windows_per_epoch() const { return num_windows_; }
  uint64_t batches_per_epoch() const { return num_windows_ / global_rows(); }
  int vocab_size() const { return vocab_size_; }  // 0 when the shards do not record it (llm.c shards)
  int eot() const { return eot_; }                // -1 when not recorded
  const std::vector<std::string>& shard_paths() const { return paths_; }

 private:
  uint64_t global_rows() const { return static_cast<uint64_t>(world_) * B_; }
  LoaderState normalized(LoaderState s) const;
  Batch make_batch(LoaderState& pos);  // the batch at pos; advances pos past it
  void read_stream(uint64_t offset, uint64_t n, int32_t* out) const;
  void start_prefetch(LoaderState from);
  void stop_prefetch();
  void prefetch_loop(LoaderState pos);

  std::vector<ShardReader> shards_;
  std::vector<std::string> paths_;
  std::vector<uint64_t> shard_start_;  // stream offset of each shard's first token
  uint64_t total_tokens_ = 0, num_windows_ = 0;
  int B_, T_, rank_, world_, prefetch_, id_limit_;
  bool shuffle_;
  uint64_t seed_;
  int vocab_size_ = 0, eot_ = -1;

  // Used by whichever side makes batches: the prefetch thread, or next() when prefetch is 0.
  std::vector<int32_t> window_;

  LoaderState consumer_pos_;  // position of the batch next() returns next

  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> queue_;
  std::exception_ptr error_;
  bool stop_ = false;
};

}  // namespace mt
