#include "megatrain/data/loader.h"

#include <sys/resource.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
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
    : DataLoader(std::vector<DataSource>{{dir, 1.0}}, split, B, T, shuffle, seed, rank, world, prefetch, id_limit) {}

DataLoader::DataLoader(const std::vector<DataSource>& sources, const std::string& split, int B, int T, bool shuffle,
                       uint64_t seed, int rank, int world, int prefetch, int id_limit)
    : B_(B), T_(T), rank_(rank), world_(world), prefetch_(prefetch), id_limit_(id_limit), shuffle_(shuffle) {
  MT_CHECK(B > 0 && T > 0, "data loader: batch size B={} and sequence length T={} must be positive", B, T);
  MT_CHECK(world > 0 && rank >= 0 && rank < world, "data loader: rank {} is not in [0, world={})", rank, world);
  MT_CHECK(prefetch >= 0, "data loader: prefetch depth must be >= 0, got {}", prefetch);
  MT_CHECK(id_limit >= 0, "data loader: the token id limit must be >= 0 (0: none), got {}", id_limit);
  MT_CHECK(!sources.empty(), "data loader: no data source");
  double weights = 0;
  for (size_t k = 0; k < sources.size(); ++k) {
    const DataSource& src = sources[k];
    MT_CHECK(std::isfinite(src.weight) && src.weight > 0,
             "data blend: the weight of {} is {}; weights must be finite "
             "and > 0 (leave a source out to give it none)",
             src.dir, src.weight);
    for (size_t j = 0; j < k; ++j)
      MT_CHECK(sources[j].dir != src.dir, "data blend: {} is listed twice; give it one entry with the summed weight",
               src.dir);
    weights += src.weight;
  }
  streams_.resize(sources.size());
  for (size_t k = 0; k < sources.size(); ++k) {
    Stream& st = streams_[k];
    st.dir = sources[k].dir;
    // Integer shares of 2^30 in all: the source picked for a row is then exact integer arithmetic.
    st.quota = std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(sources[k].weight / weights * (1u << 30))));
    st.seed = seed + 0x9E3779B97F4A7C15ull * k;  // source 0 keeps the seed: a one-source loader is unchanged
    open_stream(st, split);
  }
  quota_sum_ = 0;
  for (const Stream& st : streams_) quota_sum_ += st.quota;
  if (!blended()) {
    const Stream& st = streams_[0];
    MT_CHECK(st.windows >= global_rows(),
             "split '{}' in {} has {} tokens, too few for one batch: world {} x B {} "
             "windows of T+1 = {} tokens need at least {} tokens",
             split, st.dir, st.tokens, world, B, T + 1, global_rows() * static_cast<uint64_t>(T) + 1);
  }
  if (blended()) consumer_pos_.taken = consumer_pos_.since = std::vector<uint64_t>(streams_.size(), 0);
  if (prefetch_ > 0) start_prefetch(consumer_pos_);
}

void DataLoader::open_stream(Stream& st, const std::string& split) {
  std::error_code ec;
  MT_CHECK(std::filesystem::is_directory(st.dir, ec), "data directory {} does not exist (or is not a directory)",
           st.dir);
  st.paths = list_shards(st.dir, split);
  MT_CHECK(!st.paths.empty(),
           "no shards of split '{}' in {} (expected files named {}_*.bin; run `megatrain "
           "prepare-data`)",
           split, st.dir, split);
  size_t open = st.paths.size();
  for (const Stream& other : streams_) open += other.shards.size();
  make_room_for_open_files(open);

  for (const std::string& p : st.paths) {
    ShardReader r(p);
    const ShardHeader& h = r.header();
    if (h.vocab_size > 0) {
      if (vocab_size_ == 0) {
        vocab_size_ = h.vocab_size;
        eot_ = h.eot;
        first_vocab_shard_ = p;
      }
      MT_CHECK(h.vocab_size == vocab_size_ && h.eot == eot_,
               "shard {} has vocab size {} / EOT {}, but {} has {} / {}: "
               "{} come from different tokenizers",
               p, h.vocab_size, h.eot, first_vocab_shard_, vocab_size_, eot_,
               blended() ? "the blended sources" : fmt::format("the shards of split '{}'", split));
    }
    st.start.push_back(st.tokens);
    st.tokens += h.num_tokens;
    if (shuffle_) r.expect_random_access();
    st.shards.push_back(std::move(r));
  }
  st.windows = st.tokens > 0 ? (st.tokens - 1) / static_cast<uint64_t>(T_) : 0;
  MT_CHECK(st.windows > 0 || !blended(), "data blend: split '{}' in {} has {} tokens, not one window of T+1 = {}",
           split, st.dir, st.tokens, T_ + 1);
}

DataLoader::~DataLoader() { stop_prefetch(); }

uint64_t DataLoader::num_tokens() const {
  uint64_t n = 0;
  for (const Stream& st : streams_) n += st.tokens;
  return n;
}

uint64_t DataLoader::windows_per_epoch() const {
  uint64_t n = 0;
  for (const Stream& st : streams_) n += st.windows;
  return n;
}

std::vector<double> DataLoader::source_epochs(const LoaderState& s) const {
  std::vector<double> out;
  if (!blended()) return out;
  for (size_t k = 0; k < streams_.size() && k < s.taken.size(); ++k)
    out.push_back(static_cast<double>(s.taken[k]) / static_cast<double>(streams_[k].windows));
  return out;
}

LoaderState DataLoader::normalized(LoaderState s) const {
  if (blended()) return s;
  if (s.cursor + global_rows() > streams_[0].windows) return {s.epoch + 1, 0};
  return s;
}

size_t DataLoader::pick_source(const std::vector<uint64_t>& taken, const std::vector<uint64_t>& since) const {
  uint64_t n = 0;
  for (size_t k = 0; k < taken.size(); ++k) n += taken[k] - since[k];
  // Source k's deficit after one more row: quota_k / quota_sum * (n + 1) - given_k, times quota_sum (exact: < 2^127).
  size_t best = 0;
  __int128 best_deficit = 0;
  for (size_t k = 0; k < streams_.size(); ++k) {
    const __int128 d = static_cast<__int128>(streams_[k].quota) * (n + 1) -
                       static_cast<__int128>(taken[k] - since[k]) * quota_sum_;
    if (k == 0 || d > best_deficit) best = k, best_deficit = d;
  }
  return best;
}

void DataLoader::read_stream(const Stream& st, uint64_t offset, uint64_t n, int32_t* out) const {
  size_t s = static_cast<size_t>(std::upper_bound(st.start.begin(), st.start.end(), offset) - st.start.begin()) - 1;
  while (n > 0) {
    MT_CHECK(s < st.shards.size(), "data loader: read past the end of the token stream of {} (offset {})", st.dir,
             offset);
    uint64_t local = offset - st.start[s];
    uint64_t take = std::min(n, st.shards[s].size() - local);
    st.shards[s].read(local, take, out, id_limit_);
    out += take;
    offset += take;
    n -= take;
    ++s;
  }
}

LoaderState DataLoader::walk_batch(LoaderState& pos, const std::vector<char>& wanted, const RowFn& row) const {
  pos = normalized(pos);
  LoaderState at = pos;
  at.since.clear();
  if (!blended()) {
    const Stream& st = streams_[0];
    const WindowOrder order(st.windows, st.seed, pos.epoch);
    for (int k = 0; k < world_; ++k) {
      if (!wanted[static_cast<size_t>(k)]) continue;
      const uint64_t first = pos.cursor + static_cast<uint64_t>(k) * B_;
      for (int r = 0; r < B_; ++r) row(first - pos.cursor + r, st, shuffle_ ? order(first + r) : first + r);
    }
    pos.cursor += global_rows();
  } else {
    // Every rank walks the whole global batch (the sources of the rows before its own move the counts it reads at).
    for (uint64_t g = 0; g < global_rows(); ++g) {
      const size_t k = pick_source(pos.taken, pos.since);
      if (wanted[static_cast<size_t>(g / B_)]) {
        const Stream& st = streams_[k];
        const uint64_t epoch = pos.taken[k] / st.windows, i = pos.taken[k] % st.windows;
        row(g, st, shuffle_ ? WindowOrder(st.windows, st.seed, epoch)(i) : i);
      }
      ++pos.taken[k];
    }
  }
  return at;
}

Batch DataLoader::make_batch(LoaderState& pos, bool read) {
  Batch b;
  b.B = B_;
  b.T = T_;
  std::vector<char> wanted(static_cast<size_t>(world_), 0);
  wanted[static_cast<size_t>(rank_)] = read;
  if (read) {
    b.x.resize(static_cast<size_t>(B_) * T_);
    b.y.resize(static_cast<size_t>(B_) * T_);
    window_.resize(static_cast<size_t>(T_) + 1);
  }
  const uint64_t mine = static_cast<uint64_t>(rank_) * B_;
  const LoaderState at = walk_batch(pos, wanted, [&](uint64_t g, const Stream& st, uint64_t window) {
    const size_t r = static_cast<size_t>(g - mine);
    read_stream(st, window * T_, static_cast<uint64_t>(T_) + 1, window_.data());
    std::copy(window_.begin(), window_.end() - 1, b.x.begin() + r * T_);
    std::copy(window_.begin() + 1, window_.end(), b.y.begin() + r * T_);
  });
  b.epoch = at.epoch;
  b.cursor = at.cursor;
  b.taken = at.taken;
  b.next = pos;
  return b;
}

LoaderState DataLoader::read_windows(LoaderState& pos, const std::vector<int>& ranks, int32_t* out) {
  std::vector<char> wanted(static_cast<size_t>(world_), 0);
  std::vector<int> index(static_cast<size_t>(world_), -1);
  for (size_t j = 0; j < ranks.size(); ++j) {
    MT_CHECK(ranks[j] >= 0 && ranks[j] < world_, "data loader: rank {} is not in [0, world={})", ranks[j], world_);
    wanted[static_cast<size_t>(ranks[j])] = 1;
    index[static_cast<size_t>(ranks[j])] = static_cast<int>(j);
  }
  const uint64_t row_tokens = static_cast<uint64_t>(T_) + 1;
  return walk_batch(pos, wanted, [&](uint64_t g, const Stream& st, uint64_t window) {
    const uint64_t k = g / B_, r = g % B_;
    const uint64_t at = (static_cast<uint64_t>(index[k]) * B_ + r) * row_tokens;
    read_stream(st, window * T_, row_tokens, out + at);
  });
}

Batch DataLoader::next() {
  if (feed_) {
    if (!feed_started_) feed_->start(normalized(consumer_pos_));
    feed_started_ = true;
    Batch b = make_batch(consumer_pos_, /*read=*/false);
    feed_->fill(b);
    return b;
  }
  if (prefetch_ == 0) return make_batch(consumer_pos_, true);
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return !queue_.empty() || error_; });
  if (queue_.empty()) std::rethrow_exception(error_);
  Batch b = std::move(queue_.front());
  queue_.pop_front();
  lk.unlock();
  cv_.notify_all();
  consumer_pos_ = b.next;
  return b;
}

LoaderState DataLoader::state() const { return normalized(consumer_pos_); }

void DataLoader::restore(const LoaderState& s) {
  if (blended()) {
    MT_CHECK(s.taken.size() == streams_.size() && s.since.size() == streams_.size(),
             "data loader: cannot restore a "
             "position of {} source(s) into a blend of {}",
             s.taken.size(), streams_.size());
    for (size_t k = 0; k < streams_.size(); ++k)
      MT_CHECK(s.since[k] <= s.taken[k],
               "data loader: source {} ({}): the rows since the weights took effect ({} "
               "given, {} at the change) cannot be negative",
               k, streams_[k].dir, s.taken[k], s.since[k]);
  } else {
    MT_CHECK(s.taken.empty(), "data loader: cannot restore a blend's position into a loader of one source");
    MT_CHECK(s.cursor <= streams_[0].windows,
             "data loader: cannot restore cursor {}: an epoch has only {} windows "
             "(was the state saved with another dataset or sequence length?)",
             s.cursor, streams_[0].windows);
  }
  MT_CHECK(!feed_started_, "data loader: a rank fed by its node's reader cannot move after its first batch");
  stop_prefetch();
  consumer_pos_ = s;
  if (prefetch_ > 0 && !feed_) start_prefetch(s);
}

void DataLoader::set_row_feed(std::unique_ptr<RowFeed> feed) {
  MT_CHECK(!feed_started_, "data loader: a row feed is set before the first batch");
  stop_prefetch();
  feed_ = std::move(feed);
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
      b = make_batch(pos, true);
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
