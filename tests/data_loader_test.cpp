// DataLoader against a naive oracle: the split's token stream read shard by shard and sliced by hand.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <set>

#include "support/data_util.h"
#include "support/files.h"
#include "megatrain/core/error.h"
#include "megatrain/data/loader.h"
#include "megatrain/data/shard.h"

namespace mt {
namespace {

using mt::test::ScratchDir;

using testing::error_of;

// A split whose stream is EOT followed by distinct ids, spread over shards of 149 tokens (so windows cross shard
// boundaries). Distinct ids let a window be recognised by its first token.
struct Dataset {
  ScratchDir dir;
  std::vector<int32_t> stream;  // the oracle: all shards' tokens, concatenated naively

  explicit Dataset(int ntokens, uint64_t shard_tokens = 149) {
    const int vocab = ntokens + 1;
    ShardWriter w(dir.path, "train", vocab, ntokens, shard_tokens);
    std::vector<int32_t> doc(ntokens - 1);
    for (int i = 0; i < ntokens - 1; ++i) doc[i] = (i * 7919) % (ntokens - 1);  // a permutation (7919 is prime)
    w.add_document(doc);
    for (const std::string& p : w.finish()) {
      auto t = ShardReader(p).read_all();
      stream.insert(stream.end(), t.begin(), t.end());
    }
  }
  const std::string& path() const { return dir.path; }
  // Window k of the stream, split into x and y.
  void window(uint64_t k, int T, const int32_t** x, const int32_t** y) const {
    *x = stream.data() + k * T;
    *y = stream.data() + k * T + 1;
  }
  uint64_t window_of(int32_t first_token, int T) const {
    auto it = std::find(stream.begin(), stream.end(), first_token);
    uint64_t pos = static_cast<uint64_t>(it - stream.begin());
    EXPECT_EQ(pos % T, 0u) << "row starts inside a window";
    return pos / T;
  }
};

// Each row of b is window w_r of the oracle; returns the windows.
std::vector<uint64_t> check_rows(const Dataset& d, const Batch& b) {
  std::vector<uint64_t> ws;
  for (int r = 0; r < b.B; ++r) {
    uint64_t w = d.window_of(b.x[static_cast<size_t>(r) * b.T], b.T);
    const int32_t *x, *y;
    d.window(w, b.T, &x, &y);
    for (int t = 0; t < b.T; ++t) {
      EXPECT_EQ(b.x[r * b.T + t], x[t]) << "row " << r << " t " << t;
      EXPECT_EQ(b.y[r * b.T + t], y[t]) << "row " << r << " t " << t;
    }
    ws.push_back(w);
  }
  return ws;
}

bool same(const Batch& a, const Batch& b) {
  return a.x == b.x && a.y == b.y && a.epoch == b.epoch && a.cursor == b.cursor;
}

TEST(DataLoad, SequentialWindowsMatchNaiveSlicing) {
  Dataset d(1000);
  ASSERT_EQ(d.stream.size(), 1000u);
  ASSERT_GT(ShardReader(shard_path(d.path(), "train", 1)).size(), 0u);
  const int B = 4, T = 8;
  DataLoader dl(d.path(), "train", B, T, /*shuffle=*/false, 0, 0, 1, /*prefetch=*/0);
  EXPECT_EQ(dl.num_tokens(), 1000u);
  EXPECT_EQ(dl.windows_per_epoch(), 999u / 8);  // floor((N-1)/T)
  EXPECT_EQ(dl.batches_per_epoch(), 124u / 4);
  EXPECT_EQ(dl.vocab_size(), 1001);
  EXPECT_EQ(dl.eot(), 1000);
  for (uint64_t i = 0; i < 31; ++i) {
    Batch b = dl.next();
    EXPECT_EQ(b.epoch, 0u);
    EXPECT_EQ(b.cursor, i * B);
    // Row r of batch i is window i*B + r: x = stream[k*T, k*T+T), y shifted by one.
    for (int r = 0; r < B; ++r) {
      uint64_t k = i * B + r;
      for (int t = 0; t < T; ++t) {
        ASSERT_EQ(b.x[r * T + t], d.stream[k * T + t]);
        ASSERT_EQ(b.y[r * T + t], d.stream[k * T + t + 1]);
      }
    }
  }
  EXPECT_EQ(dl.state(), (LoaderState{1, 0}));
  Batch again = dl.next();  // epoch 1 starts over, in the same order
  EXPECT_EQ(again.epoch, 1u);
  EXPECT_EQ(again.x[0], d.stream[0]);
}

TEST(DataLoad, ShuffleVisitsEveryWindowOncePerEpoch) {
  Dataset d(1001);
  const int B = 4, T = 8;  // 125 windows: 31 batches use 124 of them, one is dropped per epoch
  DataLoader dl(d.path(), "train", B, T, /*shuffle=*/true, 42, 0, 1, 2);
  std::vector<std::vector<uint64_t>> epochs(2);
  for (int e = 0; e < 2; ++e) {
    for (int i = 0; i < 31; ++i) {
      Batch b = dl.next();
      ASSERT_EQ(b.epoch, static_cast<uint64_t>(e));
      for (uint64_t w : check_rows(d, b)) epochs[e].push_back(w);
    }
  }
  for (auto& ws : epochs) {
    std::set<uint64_t> uniq(ws.begin(), ws.end());
    EXPECT_EQ(uniq.size(), 124u);  // no window twice
    EXPECT_LT(*uniq.rbegin(), 125u);
    EXPECT_FALSE(std::is_sorted(ws.begin(), ws.end()));
  }
  EXPECT_NE(epochs[0], epochs[1]);  // a new permutation per epoch
}

TEST(DataLoad, ShuffleIsDeterministicInSeedAndEpoch) {
  Dataset d(700);
  auto run = [&](uint64_t seed, int n) {
    DataLoader dl(d.path(), "train", 3, 16, true, seed, 0, 1, 1);
    std::vector<int32_t> firsts;
    for (int i = 0; i < n; ++i) {
      Batch b = dl.next();
      for (int r = 0; r < 3; ++r) firsts.push_back(b.x[r * 16]);
    }
    return firsts;
  };
  const int per_epoch = 699 / 16 / 3;  // 14 batches
  auto a = run(7, 2 * per_epoch + 3), b = run(7, 2 * per_epoch + 3), c = run(8, 2 * per_epoch + 3);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(DataLoad, RanksSliceTheGlobalBatch) {
  Dataset d(2000);
  const int B = 2, T = 8, world = 3;  // 249 windows -> 41 global batches of 6, 3 dropped per epoch
  for (bool shuffle : {false, true}) {
    DataLoader global(d.path(), "train", B * world, T, shuffle, 5, 0, 1, 0);
    std::vector<std::unique_ptr<DataLoader>> ranks;
    for (int r = 0; r < world; ++r)
      ranks.push_back(std::make_unique<DataLoader>(d.path(), "train", B, T, shuffle, 5, r, world, 2));
    EXPECT_EQ(ranks[1]->batches_per_epoch(), 41u);
    for (int i = 0; i < 45; ++i) {  // crosses into epoch 1
      Batch g = global.next();
      std::vector<int32_t> x, y;
      for (auto& rl : ranks) {
        Batch b = rl->next();
        EXPECT_EQ(b.epoch, g.epoch);
        EXPECT_EQ(b.cursor, g.cursor);
        x.insert(x.end(), b.x.begin(), b.x.end());
        y.insert(y.end(), b.y.begin(), b.y.end());
      }
      ASSERT_EQ(x, g.x) << "batch " << i << " shuffle " << shuffle;
      ASSERT_EQ(y, g.y);
    }
  }
}

TEST(DataLoad, PrefetchMatchesSynchronous) {
  Dataset d(900);
  DataLoader sync(d.path(), "train", 4, 8, true, 3, 0, 1, 0);
  DataLoader pre(d.path(), "train", 4, 8, true, 3, 0, 1, 4);
  for (int i = 0; i < 70; ++i) {
    Batch a = sync.next(), b = pre.next();
    ASSERT_TRUE(same(a, b)) << "batch " << i;
    EXPECT_EQ(sync.state(), pre.state());
  }
}

TEST(DataLoad, ResumesExactlyAtAnyPoint) {
  Dataset d(800);
  const int B = 4, T = 8;  // 99 windows -> 24 batches per epoch
  std::vector<Batch> ref;
  {
    DataLoader dl(d.path(), "train", B, T, true, 11, 0, 1, 0);
    for (int i = 0; i < 80; ++i) ref.push_back(dl.next());
  }
  for (int k : {0, 1, 13, 23, 24, 25, 47, 48, 71}) {
    LoaderState saved;
    {
      DataLoader dl(d.path(), "train", B, T, true, 11, 0, 1, 2);
      for (int i = 0; i < k; ++i) ASSERT_TRUE(same(dl.next(), ref[i]));
      saved = dl.state();
    }  // destroyed with prefetched batches in flight
    if (k == 24) {
      EXPECT_EQ(saved, (LoaderState{1, 0}));  // the end of an epoch reads as the next epoch's start
    }
    DataLoader resumed(d.path(), "train", B, T, true, 11, 0, 1, 3);
    resumed.restore(saved);
    for (int i = k; i < k + 8; ++i) ASSERT_TRUE(same(resumed.next(), ref[i])) << "resume at " << k << ", batch " << i;
  }

  // Restoring a running loader discards what it had prefetched.
  DataLoader dl(d.path(), "train", B, T, true, 11, 0, 1, 3);
  for (int i = 0; i < 20; ++i) dl.next();
  LoaderState at20 = dl.state();
  EXPECT_EQ(at20, (LoaderState{0, 80}));
  for (int i = 20; i < 30; ++i) ASSERT_TRUE(same(dl.next(), ref[i]));  // crosses the epoch boundary
  dl.restore(at20);
  for (int i = 20; i < 30; ++i) ASSERT_TRUE(same(dl.next(), ref[i]));
  dl.restore({2, 8});
  ASSERT_TRUE(same(dl.next(), ref[50]));
  EXPECT_THROW(dl.restore({0, 100}), Error);  // beyond an epoch of 99 windows
}

// ---- blends -------------------------------------------------------------------------------------------------

// A source of a blend: one document of `n` distinct ids from `base` on (vocabulary 4096, EOT 4095 before it), so a
// row's second token names its source (its first, its window: every source's window 0 starts with the EOT). Shards of 97 tokens: windows cross shard boundaries.
struct BlendSource {
  ScratchDir dir;
  std::vector<int32_t> stream;
  BlendSource(int base, int n, const std::string& split = "train") {
    ShardWriter w(dir.path, split, 4096, 4095, 97);
    std::vector<int32_t> doc(n);
    for (int i = 0; i < n; ++i) doc[i] = base + i;
    w.add_document(doc);
    for (const std::string& p : w.finish()) {
      auto t = ShardReader(p).read_all();
      stream.insert(stream.end(), t.begin(), t.end());
    }
  }
  uint64_t windows(int T) const { return (stream.size() - 1) / T; }
};

// The naive oracle of a blend: the rule of loader.h written out with doubles over the whole run (largest deficit,
// lowest index at a tie), each source's window visits generated epoch by epoch from the one-source loader's order.
struct NaiveBlend {
  std::vector<double> w;
  std::vector<uint64_t> given;
  explicit NaiveBlend(std::vector<double> weights) : w(std::move(weights)), given(w.size(), 0) {
    double sum = 0;
    for (double x : w) sum += x;
    for (double& x : w) x /= sum;
  }
  size_t next() {
    uint64_t n = 0;
    for (uint64_t g : given) n += g;
    size_t best = 0;
    double best_d = -1e300;
    for (size_t k = 0; k < w.size(); ++k) {
      const double d = w[k] * static_cast<double>(n + 1) - static_cast<double>(given[k]);
      if (d > best_d) best = k, best_d = d;
    }
    ++given[best];
    return best;
  }
};

TEST(DataBlend, RowsFollowTheLargestDeficitRuleAndStayWithinARowOfTheirShare) {
  BlendSource a(0, 900), b(1000, 400), c(2000, 300);
  const int B = 3, T = 8;
  // Dyadic weights: the loader's integer shares of 2^30 are then exact, and so are the oracle's doubles, so the two
  // meet the same ties (frequent here) and break them alike.
  const std::vector<double> weights = {0.5, 0.375, 0.125};
  DataLoader dl({{a.dir.path, 4}, {b.dir.path, 3}, {c.dir.path, 1}}, "train", B, T, true, 7, 0, 1, 2);
  EXPECT_TRUE(dl.blended());
  NaiveBlend oracle(weights);
  std::vector<uint64_t> rows(3, 0);
  std::vector<std::vector<int32_t>> firsts(3);  // each source's rows, by first token
  for (int i = 0; i < 400; ++i) {
    const Batch bt = dl.next();
    for (int r = 0; r < B; ++r) {
      const int32_t first = bt.x[static_cast<size_t>(r) * T];
      const size_t k = static_cast<size_t>(bt.x[static_cast<size_t>(r) * T + 1] / 1000);  // (window 0 starts with EOT)
      ASSERT_EQ(k, oracle.next()) << "batch " << i << " row " << r;
      firsts[k].push_back(first);
      ++rows[k];
    }
    const double n = static_cast<double>((i + 1) * B);
    for (size_t k = 0; k < 3; ++k) EXPECT_LE(std::abs(static_cast<double>(rows[k]) - weights[k] * n), 1.0);
  }
  // Each source visits every one of its windows once per its own epoch, each epoch in another order.
  for (size_t k = 0; k < 3; ++k) {
    const BlendSource& src = k == 0 ? a : k == 1 ? b : c;
    const uint64_t W = src.windows(T);
    ASSERT_GE(firsts[k].size(), 2 * W) << "source " << k << " should wrap at least once";
    for (int e = 0; e < 2; ++e) {
      std::set<int32_t> seen(firsts[k].begin() + e * W, firsts[k].begin() + (e + 1) * W);
      EXPECT_EQ(seen.size(), W) << "source " << k << " epoch " << e;
    }
    EXPECT_FALSE(std::equal(firsts[k].begin(), firsts[k].begin() + W, firsts[k].begin() + W));
  }
}

// Ranks slice each global batch; the rows they read together are the single process's, batch by batch, and so are
// the positions, whatever the world and prefetch.
TEST(DataBlend, RanksSliceTheGlobalBatchOfOneProcess) {
  BlendSource a(0, 700), b(1000, 500);
  const std::vector<DataSource> src = {{a.dir.path, 2.0}, {b.dir.path, 1.0}};
  const int B = 2, T = 8, world = 3;
  DataLoader one(src, "train", B * world, T, true, 5, 0, 1, 0);
  std::vector<std::unique_ptr<DataLoader>> ranks;
  for (int r = 0; r < world; ++r)
    ranks.push_back(std::make_unique<DataLoader>(src, "train", B, T, true, 5, r, world, r));
  for (int i = 0; i < 60; ++i) {
    const Batch whole = one.next();
    for (int r = 0; r < world; ++r) {
      const Batch part = ranks[r]->next();
      const size_t n = static_cast<size_t>(B) * T;
      ASSERT_TRUE(std::equal(part.x.begin(), part.x.end(), whole.x.begin() + r * n)) << "batch " << i << " rank " << r;
      ASSERT_TRUE(std::equal(part.y.begin(), part.y.end(), whole.y.begin() + r * n));
      EXPECT_EQ(part.taken, whole.taken);
      EXPECT_EQ(ranks[r]->state(), one.state());
    }
  }
}

TEST(DataBlend, ResumesExactlyAndCarriesOverAnyReadSize) {
  BlendSource a(0, 500), b(1000, 300);
  const std::vector<DataSource> src = {{a.dir.path, 0.7}, {b.dir.path, 0.3}};
  const int B = 4, T = 8;
  std::vector<Batch> ref;
  {
    DataLoader dl(src, "train", B, T, true, 9, 0, 1, 0);
    for (int i = 0; i < 60; ++i) ref.push_back(dl.next());
  }
  for (int k : {0, 1, 17, 31, 59}) {
    LoaderState saved;
    {
      DataLoader dl(src, "train", B, T, true, 9, 0, 1, 2);
      for (int i = 0; i < k; ++i) ASSERT_EQ(dl.next().x, ref[i].x);
      saved = dl.state();
    }
    DataLoader resumed(src, "train", B, T, true, 9, 0, 1, 3);
    resumed.restore(saved);
    for (int i = k; i < std::min(k + 8, 60); ++i) ASSERT_EQ(resumed.next().x, ref[i].x) << "resume at " << k;
  }
  // Half the rows per read: the same rows, two reads per batch (a job that halved dp and accumulates twice).
  DataLoader half(src, "train", B / 2, T, true, 9, 0, 1, 1);
  half.restore(ref[10].next.taken.empty() ? LoaderState{} : ref[10].next);
  for (int i = 11; i < 20; ++i) {
    std::vector<int32_t> x = half.next().x;
    const std::vector<int32_t> x2 = half.next().x;
    x.insert(x.end(), x2.begin(), x2.end());
    ASSERT_EQ(x, ref[i].x) << "batch " << i;
  }
  DataLoader dl(src, "train", B, T, true, 9, 0, 1, 0);
  EXPECT_NE(error_of([&] { dl.restore(LoaderState{0, 0}); }).find("a blend of 2"), std::string::npos);
  LoaderState bad;
  bad.taken = {1, 2};
  bad.since = {2, 0};
  EXPECT_NE(error_of([&] { dl.restore(bad); }).find("cannot be negative"), std::string::npos);
}

// New weights from a position on (`since` = `taken`): the shares hold over the rows after it, not over the run.
TEST(DataBlend, NewWeightsHoldFromWhereTheyTookEffect) {
  BlendSource a(0, 600), b(1000, 600);
  const int B = 4, T = 8;
  DataLoader first({{a.dir.path, 0.9}, {b.dir.path, 0.1}}, "train", B, T, false, 0, 0, 1, 0);
  for (int i = 0; i < 25; ++i) first.next();
  LoaderState at = first.state();
  EXPECT_EQ(at.taken, (std::vector<uint64_t>{90, 10}));
  at.since = at.taken;
  DataLoader second({{a.dir.path, 0.5}, {b.dir.path, 0.5}}, "train", B, T, false, 0, 0, 1, 0);
  second.restore(at);
  std::vector<int> rows(2, 0);
  for (int i = 0; i < 10; ++i) {
    const Batch bt = second.next();
    for (int r = 0; r < B; ++r) {
      ++rows[bt.x[static_cast<size_t>(r) * T + 1] / 1000];
    }
  }
  EXPECT_EQ(rows, (std::vector<int>{20, 20}));  // without the rebase, b would take 40 of the 40 rows to catch up
  EXPECT_EQ(second.state().taken, (std::vector<uint64_t>{110, 30}));
}

TEST(DataBlend, ClearErrors) {
  BlendSource a(0, 300), b(1000, 300);
  ScratchDir other;
  {
    ShardWriter w(other.path, "train", 8192, 8191, 97);
    w.add_document(std::vector<int32_t>(200, 5));
    w.finish();
  }
  auto err = [](const std::vector<DataSource>& s) {
    return error_of([&] { DataLoader dl(s, "train", 2, 8, true, 1, 0, 1, 0); });
  };
  EXPECT_NE(err({{a.dir.path, 1}, {other.path, 1}}).find("the blended sources come from different tokenizers"),
            std::string::npos);
  EXPECT_NE(err({{a.dir.path, 1}, {a.dir.path, 2}}).find("listed twice"), std::string::npos);
  EXPECT_NE(err({{a.dir.path, 1}, {b.dir.path, 0}}).find("must be finite and > 0"), std::string::npos);
  EXPECT_NE(err({{a.dir.path, 1}, {b.dir.path, NAN}}).find("must be finite and > 0"), std::string::npos);
  EXPECT_NE(err({{a.dir.path, 1}, {b.dir.path + "/nope", 1}}).find("does not exist"), std::string::npos);
  EXPECT_NE(error_of([&] {
              DataLoader dl({{a.dir.path, 1}, {b.dir.path, 1}}, "val", 2, 8, true, 1, 0, 1, 0);
            }).find("no shards of split 'val'"),
            std::string::npos);
}

TEST(DataLoad, ReadsLlmcShardsByTheirNames) {
  ScratchDir dir;
  std::vector<uint32_t> toks;
  for (uint32_t i = 0; i < 300; ++i) toks.push_back(i % 2 ? 50256 - i : i);
  testing::write_bytes(dir / "tiny_shakespeare_val.bin", testing::llmc_shard_bytes({20240520, 1, 300}, toks, 2));
  DataLoader dl(dir.path, "val", 2, 32, false, 0, 0, 1, 0);
  EXPECT_EQ(dl.vocab_size(), 0);
  Batch b = dl.next();
  Batch c = dl.next();
  for (int t = 0; t < 32; ++t) {
    EXPECT_EQ(b.x[t], static_cast<int32_t>(toks[t]));
    EXPECT_EQ(b.y[32 + t], static_cast<int32_t>(toks[32 + t + 1]));
    EXPECT_EQ(c.x[32 + t], static_cast<int32_t>(toks[96 + t]));
  }
}

TEST(DataLoad, ClearErrors) {
  Dataset d(100);
  auto msg = [&](auto f) { return error_of(f); };
  EXPECT_NE(msg([&] { DataLoader(d.path() + "/nope", "train", 1, 8, false, 0); }).find("does not exist"),
            std::string::npos);
  std::string m = msg([&] { DataLoader(d.path(), "val", 1, 8, false, 0); });
  EXPECT_NE(m.find("no shards of split 'val'"), std::string::npos) << m;
  m = msg([&] { DataLoader(d.path(), "train", 4, 32, false, 0); });  // 99/32 = 3 windows < 4
  EXPECT_NE(m.find("too few for one batch"), std::string::npos) << m;
  EXPECT_NO_THROW(DataLoader(d.path(), "train", 3, 32, false, 0));
  EXPECT_NE(msg([&] { DataLoader(d.path(), "train", 1, 8, false, 0, 2, 2); }).find("rank 2"), std::string::npos);
  EXPECT_THROW(DataLoader(d.path(), "train", 0, 8, false, 0), Error);
  EXPECT_THROW(DataLoader(d.path(), "train", 1, 8, false, 0, 0, 1, -1), Error);

  // A corrupt shard among good ones is named.
  testing::write_bytes(d.path() + "/train_000099.bin", "garbage");
  m = msg([&] { DataLoader(d.path(), "train", 1, 8, false, 0); });
  EXPECT_NE(m.find("train_000099.bin"), std::string::npos) << m;
}

TEST(DataLoad, BackgroundErrorsReachNext) {
  ScratchDir dir;
  // The header records a vocabulary of 100 but the shard holds id 150 at index 40: found only when read.
  std::vector<uint32_t> toks(64, 1);
  toks[40] = 150;
  testing::write_bytes(dir / "train_000000.bin", testing::llmc_shard_bytes({20240520, 1, 64, 100, 0, 1}, toks, 2));
  DataLoader dl(dir.path, "train", 1, 16, false, 0, 0, 1, 2);
  EXPECT_NO_THROW(dl.next());  // windows 0 and 1 are fine
  EXPECT_NO_THROW(dl.next());
  std::string m = error_of([&] { dl.next(); });
  EXPECT_NE(m.find("token 150 at index 40"), std::string::npos) << m;
  EXPECT_THROW(dl.next(), Error);  // stays failed
  dl.restore({0, 0});              // and can be restarted
  EXPECT_NO_THROW(dl.next());
}

// llm.c's shards record no vocabulary, so the shard cannot hold its ids to one; the model's can. Ids at or above
// it were caught only inside the model's forward, as an internal error (exit 1) naming no file. With the model's
// vocabulary as the loader's limit, the batch that holds one fails as kind Data naming the shard and index.
TEST(DataLoad, IdsOfShardsWithoutAVocabularyAreHeldToTheModels) {
  ScratchDir dir;
  std::vector<uint32_t> toks(64, 1);
  toks[40] = 150;
  testing::write_bytes(dir / "train_000000.bin", testing::llmc_shard_bytes({20240520, 1, 64}, toks, 2));
  for (int limit : {0, 151}) {  // no limit, or one above every id: all 3 batches read
    DataLoader dl(dir.path, "train", 1, 16, false, 0, 0, 1, 0, limit);
    for (int i = 0; i < 3; ++i) EXPECT_NO_THROW(dl.next()) << "limit " << limit << " batch " << i;
  }
  DataLoader dl(dir.path, "train", 1, 16, false, 0, 0, 1, 0, 150);
  EXPECT_NO_THROW(dl.next());  // windows 0 and 1 hold only id 1
  EXPECT_NO_THROW(dl.next());
  try {
    dl.next();
    FAIL() << "read id 150 under a limit of 150";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind, ErrorKind::Data);
    EXPECT_NE(std::string(e.what()).find("train_000000.bin: token 150 at index 40 is outside the model's vocabulary "
                                         "[0, 150)"),
              std::string::npos)
        << e.what();
  }
}

// A split of more shards than the soft limit on open files allows (1,500 shards of 2 tokens against a limit of
// 256): the loader keeps every shard open, so it raises the soft limit towards the hard one and reads them all.
// Under a hard limit too low for them, it fails with an error that says which limit to raise. Both in a child
// process (a death test), so the limits of the test binary stay as they were.
TEST(DataLoad, ASplitOfMoreShardsThanTheOpenFileLimitReadsOrSaysWhatToRaise) {
  ScratchDir dir;
  const int shards = 1500;
  {
    ShardWriter w(dir.path, "train", 100, 99, 2);
    std::vector<int32_t> one = {5};
    for (int i = 0; i < shards; ++i) w.add_document(one);  // EOT 5 per document: one shard each
    ASSERT_EQ(w.finish().size(), static_cast<size_t>(shards));
  }
  auto load_all = [&] {
    DataLoader dl(dir.path, "train", 1, 2, false, 0, 0, 1, 0);
    for (uint64_t i = 0; i < dl.batches_per_epoch(); ++i) {
      Batch b = dl.next();
      if (b.x[0] != 99 || b.x[1] != 5) std::_Exit(4);  // every window is "EOT 5"
    }
  };
  auto raised = [&] {
    struct rlimit lim {};
    getrlimit(RLIMIT_NOFILE, &lim);
    if (lim.rlim_max != RLIM_INFINITY && lim.rlim_max < shards + 1024u) std::_Exit(0);  // nothing to raise to
    lim.rlim_cur = 256;
    setrlimit(RLIMIT_NOFILE, &lim);
    load_all();
    std::_Exit(0);
  };
  auto too_low = [&] {
    struct rlimit lim {};
    lim.rlim_cur = lim.rlim_max = 256;
    setrlimit(RLIMIT_NOFILE, &lim);
    try {
      load_all();
    } catch (const Error& e) {
      fprintf(stderr, "%s\n", e.what());
      std::_Exit(e.kind == ErrorKind::IO ? 3 : 5);
    }
    std::_Exit(0);
  };
  EXPECT_EXIT(raised(), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(too_low(), ::testing::ExitedWithCode(3),
              "Too many open files \\(a loader keeps every shard of a split open: raise the limit");
}

}  // namespace
}  // namespace mt
