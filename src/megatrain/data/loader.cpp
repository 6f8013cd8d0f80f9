#include "megatrain/data/loader.h"

#include <sys/resource.h>

#include <algorithm>
#include <filesystem>

#include "megatrain/core/error.h"
#include "megatrain/data/window_order.h"

namespace mt {
namespace {

// A loader keeps every shard of its split open (ShardReader), and a large dataset has thousands of shards: raise the
// soft limit on open files towards the hard one when they would not fit under it with room to spare. A hard limit
// too low still fails, with ShardReader's error saying what to do.
void make_room_for_open_files(size_t shards) {
  struct rlimit lim {};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  const rlim_t want = static_cast<rlim_t>(shards) + 1024;  // sockets, logs, checkpoints and the other split
  if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < want) {
    lim.rlim_cur = lim.rlim_max == RLIM_INFINITY ? want : std::min(want, lim.rlim_max);
    (void)::setrlimit(RLIMIT_NOFILE, &lim);
  }
}

}  // namespace

DataLoader::DataLoader(const std::string& dir, const std::string& split, int B, int T, bool shuffle, uint64_t seed,
                       int rank, int world, int prefetch, int id_limit)
    : B_(B), T_(T), rank_(rank), world_(world), prefetch_(prefetch), id_limit_(id_limit), shuffle_(shuffle),
      seed_(seed) {
  MT_CHECK(B > 0 && T > 0, "data loader: batch size B={} and sequence length T={} must be positive", B, T);
  MT_CHECK(world > 0 && rank >= 0 && rank < world, "data loader: rank {} is not in [0, world={})", rank, world);
  MT_CHECK(prefetch >= 0, "data loader: prefetch depth must be >= 0, got {}", prefetch);
  MT_CHECK(id_limit >= 0, "data loader: the token id limit must be >= 0 (0: none), got {}", id_limit);
  std::error_code ec;
  MT_CHECK(std::filesystem::is_directory(dir, ec), "data directory {} does not exist (or is not a directory)", dir);
  paths_ = list_shards(dir, split);
  MT_CHECK(!paths_.empty(), "no shards of split '{}' in {} (expected files named {}_*.bin; run `megatrain prepare-data`)",
           split, dir, split);
  make_room_for_open_files(paths_.size());

  for (const std::string& p : paths_) {
    ShardReader r(p);
    const ShardHeader& h = r.header();
    if (h.vocab_size > 0) {
      if (vocab_size_ == 0) {
        vocab_size_ = h.vocab_size;
        eot_ = h.eot;
      }
      MT_CHECK(h.vocab_size == vocab_size_ && h.eot == eot_, "shard {} has vocab size {} / EOT {}, but {} has {} / {}: "
               "the shards of split '{}' come from different tokenizers", p, h.vocab_size, h.eot, paths_[0],
               vocab_size_, eot_, split);
    }
    shard_start_.push_back(total_tokens_);
    total_tokens_ += h.num_tokens;
    if (shuffle_) r.expect_random_access();
    shards_.push_back(std::move(r));
  }
  num_windows_ = total_tokens_ > 0 ? (total_tokens_ - 1) / static_cast<uint64_t>(T) : 0;
  MT_CHECK(num_windows_ >= global_rows(), "split '{}' in {} has {} tokens, too few for one batch: world {} x B {} "
           "windows of T+1 = {} tokens need at least {} tokens", split, dir, total_tokens_, world, B, T + 1,
           global_rows() * static_cast<uint64_t>(T) + 1);
  window_.resize(static_cast<size_t>(T) + 1);
  if (prefetch_ > 0) start_prefetch(consumer_pos_);
}

DataLoader::~DataLoader() { stop_prefetch(); }

LoaderState DataLoader::normalized(LoaderState s) const {
  if (s.cursor + global_rows() > num_windows_) return {s.epoch + 1, 0};
  return s;
}

void DataLoader::read_stream(uint64_t offset, uint64_t n, int32_t* out) const {
  size_t s = static_cast<size_t>(std::upper_bound(shard_start_.begin(), shard_start_.end(), offset) -
                                 shard_start_.begin()) - 1;
  while (n > 0) {
    MT_CHECK(s < shards_.size(), "data loader: read past the end of the token stream (offset {})", offset);
    uint64_t local = offset - shard_start_[s];
    uint64_t take = std::min(n, shards_[s].size() - local);
    shards_[s].read(local, take, out, id_limit_);
    out += take;
    offset += take;
    n -= take;
    ++s;
  }
}

Batch DataLoader::make_batch(LoaderState& pos) {
  pos = normalized(pos);
  Batch b;
  b.B = B_;
  b.T = T_;
  b.epoch = pos.epoch;
  b.cursor = pos.cursor;
  b.x.resize(static_cast<size_t>(B_) * T_);
  b.y.resize(static_cast<size_t>(B_) * T_);
  const uint64_t first = pos.cursor + static_cast<uint64_t>(rank_) * B_;
  const WindowOrder order(num_windows_, seed_, pos.epoch);
  for (int r = 0; r < B_; ++r) {
    uint64_t w = shuffle_ ? order(first + r) : first + r;
    read_stream(w * T_, static_cast<uint64_t>(T_) + 1, window_.data());
    std::copy(window_.begin(), window_.end() - 1, b.x.begin() + static_cast<size_t>(r) * T_);
    std::copy(window_.begin() + 1, window_.end(), b.y.begin() + static_cast<size_t>(r) * T_);
  }
  pos.cursor += global_rows();
  return b;
}

Batch DataLoader::next() {
  if (prefetch_ == 0) return make_batch(consumer_pos_);
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return !queue_.empty() || error_; });
  if (queue_.empty()) std::rethrow_exception(error_);
  Batch b = std::move(queue_.front());
  queue_.pop_front();
  lk.unlock();
  cv_.notify_all();
  consumer_pos_ = {b.epoch, b.cursor + global_rows()};
  return b;
}

LoaderState DataLoader::state() const { return normalized(consumer_pos_); }

void DataLoader::restore(const LoaderState& s) {
  MT_CHECK(s.cursor <= num_windows_, "data loader: cannot restore cursor {}: an epoch has only {} windows (was the "
           "state saved with another dataset or sequence length?)", s.cursor, num_windows_);
  stop_prefetch();
  consumer_pos_ = s;
  if (prefetch_ > 0) start_prefetch(s);
}

void DataLoader::start_prefetch(LoaderState from) {
  worker_ = std::thread([this, from] { prefetch_loop(from); });
}

void DataLoader::stop_prefetch() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  std::lock_guard lk(mu_);
  queue_.clear();
  error_ = nullptr;
  stop_ = false;
}

void DataLoader::prefetch_loop(LoaderState pos) {
  for (;;) {
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || queue_.size() < static_cast<size_t>(prefetch_); });
      if (stop_) return;
    }
    Batch b;
    try {
      b = make_batch(pos);
    } catch (...) {
      std::lock_guard lk(mu_);
      error_ = std::current_exception();
      cv_.notify_all();
      return;
    }
    {
      std::lock_guard lk(mu_);
      if (stop_) return;
      queue_.push_back(std::move(b));
    }
    cv_.notify_all();
  }
}

}  // namespace mt
