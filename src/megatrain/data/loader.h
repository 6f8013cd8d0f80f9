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
// A blend (several sources, each a directory of shards with a weight, as Megatron-LM's --data-path takes them): each
// source is a stream of windows as above, visited in its own epochs (a source's epoch e is its windows in the order
// of (seed + k * a constant, e) for source k), one after another with no remainder dropped. Global row n of the run
// comes from the source furthest below its share: the k maximising weight_k * (n + 1) - rows_k, the lowest k at a
// tie, computed in integers (weights scaled to 2^30 in all) so every rank and machine picks alike. Each source then
// stays within about one row of its share at every row, and a global batch is cut into the ranks' rows as above.
// Nothing in the rule depends on the batch size: the rows each source has given are the whole position.
//
// A background thread prepares the next `prefetch` batches. The position of the next batch ((epoch, cursor); for a
// blend, the rows each source has given) is the whole state of the loader: restore(state()) continues exactly where
// the saved run was.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "megatrain/data/shard.h"

namespace mt {

// One source of a blend: a directory of prepared shards and its weight (relative; the weights need not sum to 1).
struct DataSource {
  std::string dir;
  double weight = 1.0;
  bool operator==(const DataSource&) const = default;
};

struct LoaderState {
  LoaderState() = default;
  LoaderState(uint64_t e, uint64_t c) : epoch(e), cursor(c) {}  // one source's position
  uint64_t epoch = 0;
  uint64_t cursor = 0;  // index into the epoch's window order of the next global batch's first window
  // A blend: the rows each source has given (its position in its own stream of epochs), and the same counts when
  // the current weights took effect (shares are kept over the rows since then; equal to `taken` after a change).
  std::vector<uint64_t> taken, since;
  bool operator==(const LoaderState&) const = default;
};

struct Batch {
  std::vector<int32_t> x, y;  // [B, T] row-major: y[b, t] is the token after x[b, t]
  int B = 0, T = 0;
  uint64_t epoch = 0;
  uint64_t cursor = 0;  // this batch's position; state() after it is {epoch, cursor + world*B} (or the next epoch)
  std::vector<uint64_t> taken;  // a blend: this batch's position (the rows each source had given before it)
  LoaderState next;             // the position after this batch
};

// Where a rank's rows come from when its node shares one reader (data/node_loader.h). The rank's DataLoader still
// computes every batch's position (so state(), restore() and the blend's epochs are its own), but reads no shard.
class RowFeed {
 public:
  virtual ~RowFeed() = default;
  virtual void start(const LoaderState& from) = 0;  // once, before the first batch: the position the node begins at
  virtual void fill(Batch& b) = 0;  // b's rows (x and y, or none for a rank that needs no tokens), b's position set
};

class DataLoader {
 public:
  // Throws mt::Error for a missing directory, no shards of the split, a bad shard, too few tokens for one global
  // batch, or out-of-range B, T, rank, world, prefetch. id_limit > 0 (the model's vocabulary): a token read from a
  // shard that records no vocabulary (llm.c's) must be below it, else next() throws kind Data naming the shard;
  // shards that record one are held to it (ShardReader), and a caller compares it with its own.
  DataLoader(const std::string& dir, const std::string& split, int B, int T, bool shuffle, uint64_t seed, int rank = 0,
             int world = 1, int prefetch = 2, int id_limit = 0);
  // A blend of sources (one source: the same loader as above). Every source must hold the split, and the sources'
  // shards must record the same vocabulary and end-of-text token (a blend of two tokenizers' ids is nonsense); a
  // weight must be finite and > 0 and a directory appear once.
  DataLoader(const std::vector<DataSource>& sources, const std::string& split, int B, int T, bool shuffle,
             uint64_t seed, int rank = 0, int world = 1, int prefetch = 2, int id_limit = 0);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  Batch next();               // rethrows an error raised while the batch was prepared in the background
  LoaderState state() const;  // the position of the batch next() returns next
  // Discards prefetched batches; continues from s. A blend's state must have one count per source, since <= taken.
  void restore(const LoaderState& s);

  // The rows come from `feed` from now on (no prefetch thread, no reads of its own). Before the first next().
  void set_row_feed(std::unique_ptr<RowFeed> feed);
  // For a node's reader: the windows (T+1 tokens each) of the global batch at pos that data-parallel ranks `ranks`
  // take, ranks[j]'s row r at out + (j * B + r) * (T + 1); advances pos past the batch and returns the batch's own
  // position (epoch, cursor; a blend: taken). Not with a prefetch thread running (construct with prefetch 0).
  LoaderState read_windows(LoaderState& pos, const std::vector<int>& ranks, int32_t* out);
  int batch_rows() const { return B_; }
  int seq_len() const { return T_; }

  bool blended() const { return streams_.size() > 1; }
  // A blend at position s: the epochs each source has given (its rows over its windows). Empty for one source.
  std::vector<double> source_epochs(const LoaderState& s) const;
  uint64_t num_tokens() const;
  uint64_t windows_per_epoch() const;  // a blend: all sources' windows
  uint64_t batches_per_epoch() const { return windows_per_epoch() / global_rows(); }
  int vocab_size() const { return vocab_size_; }  // 0 when the shards do not record it (llm.c shards)
  int eot() const { return eot_; }                // -1 when not recorded
  const std::vector<std::string>& shard_paths() const { return streams_[0].paths; }  // the first source's
  // A blend: the source global row n of the run comes from, given the rows each source has given so far (taken, and
  // since: the counts when the weights took effect). Exposed for tests; the loader uses it for every row.
  size_t pick_source(const std::vector<uint64_t>& taken, const std::vector<uint64_t>& since) const;

 private:
  // One source's split: its shards as one token stream, cut into windows.
  struct Stream {
    std::string dir;
    std::vector<ShardReader> shards;
    std::vector<std::string> paths;
    std::vector<uint64_t> start;  // stream offset of each shard's first token
    uint64_t tokens = 0, windows = 0;
    uint64_t quota = 1;  // the weight in integer parts of quota_sum_
    uint64_t seed = 0;   // its window orders' key
  };
  uint64_t global_rows() const { return static_cast<uint64_t>(world_) * B_; }
  void open_stream(Stream& st, const std::string& split);
  LoaderState normalized(LoaderState s) const;
  // Walks the global batch at pos, calling row(g, stream, window) for its rows g of the ranks marked in `wanted`;
  // advances pos past the batch and returns the batch's position.
  using RowFn = std::function<void(uint64_t g, const Stream& st, uint64_t window)>;
  LoaderState walk_batch(LoaderState& pos, const std::vector<char>& wanted, const RowFn& row) const;
  Batch make_batch(LoaderState& pos, bool read);  // the batch at pos (its rows read when `read`); advances pos
  void read_stream(const Stream& st, uint64_t offset, uint64_t n, int32_t* out) const;
  void start_prefetch(LoaderState from);
  void stop_prefetch();
  void prefetch_loop(LoaderState pos);

  std::vector<Stream> streams_;
  uint64_t quota_sum_ = 1;
  int B_, T_, rank_, world_, prefetch_, id_limit_;
  bool shuffle_;
  int vocab_size_ = 0, eot_ = -1;
  std::string first_vocab_shard_;  // the shard that set vocab_size_ (named when another disagrees)

  // Used by whichever side makes batches: the prefetch thread, or next() when prefetch is 0.
  std::vector<int32_t> window_;

  LoaderState consumer_pos_;  // position of the batch next() returns next

  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> queue_;
  std::exception_ptr error_;
  bool stop_ = false;

  std::unique_ptr<RowFeed> feed_;
  bool feed_started_ = false;
};

}  // namespace mt
