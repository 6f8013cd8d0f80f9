// The data loader at scale: what a rank pays for a shuffled epoch over a large dataset, against the materialised
// order it replaced (an array of every window index shuffled by Fisher-Yates, built per rank and per epoch).
//
// Two parts, both sides of each comparison in this process:
//  * scale: N tokens (default 3e11, GPT-3's training set) in sparse shards (header + ftruncate: no disk blocks,
//    every id 0), so a huge dataset costs nothing to create. The loader: construction plus its first batch (the
//    start-up after every restart) and its private memory growth (RssAnon). The peer, the materialised order: the
//    seconds to fill and shuffle a W-entry array as the old loader's order_for did (same Rng, same swaps) and its
//    bytes; skipped when it would not fit in half of RAM.
//  * io: D tokens (default 1e9, 2 GB) of real random ids on disk, read cold (the page cache dropped first, when
//    this process may; the JSON says which). The loader's median next() over the first batches of a shuffled
//    epoch, against the same windows read through a plain mmap of the same shards without the random-access hint
//    (what the loader did before), cold again; then both again over the same windows, warm. With the device's
//    read-ahead window (read_ahead_kb, reported) a plain mapping reads that much around every 4 KB window.
// Prints one JSON object. Usage: bench_loader [--tokens N] [--io-tokens D] [--seq T] [--batch B] [--batches K]
//                                             [--dir DIR] [--skip-io]
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "megatrain/core/clock.h"
#include "megatrain/core/rng.h"
#include "megatrain/data/loader.h"
#include "megatrain/data/shard.h"
#include "megatrain/data/window_order.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kVocab = 50257;
constexpr uint64_t kPerShard = 1'000'000'000ull;  // tokens per shard (2 GB of uint16)

[[noreturn]] void die(const std::string& what) {
  fmt::print(stderr, "bench_loader: {}\n", what);
  std::exit(1);
}

long status_kb(const char* key) {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind(key, 0) == 0) return std::stol(line.substr(std::strlen(key)));
  return -1;
}

std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void write_header(int fd, uint64_t n, const std::string& path) {
  int32_t h[mt::kShardHeaderInts] = {};
  h[0] = mt::kShardMagic;
  h[1] = 1;  // uint16 tokens
  h[2] = static_cast<int32_t>(n);
  h[3] = kVocab;
  h[4] = kVocab - 1;
  h[5] = 1;
  if (::write(fd, h, sizeof h) != static_cast<ssize_t>(sizeof h))
    die("cannot write " + path + ": " + std::strerror(errno));
}

// A split of n tokens in shards of kPerShard: sparse (all ids 0, no disk blocks) or dense (random ids, written).
int write_split(const std::string& dir, uint64_t n, bool dense) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  mt::Rng rng(7);
  std::vector<uint16_t> buf(1 << 20);
  int shards = 0;
  for (uint64_t left = n; left > 0; ++shards) {
    const uint64_t k = std::min(left, kPerShard);
    const std::string path = mt::shard_path(dir, "train", shards);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) die("cannot create " + path + ": " + std::strerror(errno));
    write_header(fd, k, path);
    if (dense) {
      for (uint64_t done = 0; done < k;) {
        const size_t m = static_cast<size_t>(std::min<uint64_t>(buf.size(), k - done));
        for (size_t i = 0; i < m; ++i) buf[i] = static_cast<uint16_t>(rng.below(kVocab));
        if (::write(fd, buf.data(), 2 * m) != static_cast<ssize_t>(2 * m)) die("cannot write " + path);
        done += m;
      }
      ::fsync(fd);
    } else if (::ftruncate(fd, static_cast<off_t>(mt::kShardHeaderBytes + 2 * k)) != 0) {
      die("cannot size " + path + ": " + std::strerror(errno));
    }
    ::close(fd);
    left -= k;
  }
  return shards;
}

// Drops the page cache (needs root); false when this process may not.
bool drop_page_cache() {
  ::sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  if (!f) return false;
  f << "1\n";
  f.flush();
  return static_cast<bool>(f);
}

// The peer of the io part: the windows a shuffled epoch's first batches read, through plain mappings of the shards
// (no access hint), timed per batch.
std::vector<double> plain_mmap_batches(const std::string& dir, int B, int T, int batches, uint64_t seed) {
  struct Map {
    const uint8_t* p;
    size_t bytes;
    uint64_t tokens;
  };
  std::vector<Map> maps;
  std::vector<uint64_t> start;
  uint64_t total = 0;
  for (const std::string& path : mt::list_shards(dir, "train")) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    const size_t bytes = static_cast<size_t>(fs::file_size(path));
    void* m = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (m == MAP_FAILED) die("cannot map " + path);
    const uint64_t n = (bytes - mt::kShardHeaderBytes) / 2;
    maps.push_back({static_cast<const uint8_t*>(m), bytes, n});
    start.push_back(total);
    total += n;
  }
  const uint64_t W = (total - 1) / static_cast<uint64_t>(T);
  const mt::WindowOrder order(W, seed, 0);
  std::vector<int32_t> row(static_cast<size_t>(T) + 1);
  std::vector<double> ts;
  uint64_t sink = 0;
  for (int b = 0; b < batches; ++b) {
    const double t0 = mt::now_seconds();
    for (int r = 0; r < B; ++r) {
      // As the old loader read a row: find its shard once, copy tokens until the row ends or the shard does.
      uint64_t off = order(static_cast<uint64_t>(b) * B + r) * T;
      size_t s = static_cast<size_t>(std::upper_bound(start.begin(), start.end(), off) - start.begin()) - 1;
      for (int t = 0; t <= T; ++s) {
        const auto* src = reinterpret_cast<const uint16_t*>(maps[s].p + mt::kShardHeaderBytes) + (off - start[s]);
        const uint64_t take = std::min<uint64_t>(static_cast<uint64_t>(T + 1 - t), maps[s].tokens - (off - start[s]));
        for (uint64_t k = 0; k < take; ++k) row[t + k] = src[k];
        t += static_cast<int>(take);
        off += take;
      }
      sink += static_cast<uint64_t>(row[T]);
    }
    ts.push_back(mt::now_seconds() - t0);
  }
  for (const Map& m : maps) ::munmap(const_cast<uint8_t*>(m.p), m.bytes);
  if (sink == 42) fmt::print(stderr, " ");  // keeps the reads
  return ts;
}

}  // namespace

int main(int argc, char** argv) {
  double tokens_d = 300e9, io_tokens_d = 1e9;  // read as doubles: "3e11" is how one writes these sizes
  int T = 2048, B = 8, batches = 100;
  std::string dir = "/tmp/mt_bench_loader";
  bool skip_io = false;
  CLI::App app{"bench_loader: the data loader's start-up, memory and read speed; prints JSON"};
  app.add_option("--tokens", tokens_d, "tokens of the sparse dataset for the start-up and memory part");
  app.add_option("--io-tokens", io_tokens_d, "tokens of the dataset actually written and read");
  app.add_option("--seq", T, "sequence length");
  app.add_option("--batch", B, "batch size");
  app.add_option("--batches", batches, "batches read in the timed part");
  app.add_option("--dir", dir, "scratch folder");
  app.add_flag("--skip-io", skip_io, "leave out the read-speed part");
  CLI11_PARSE(app, argc, argv);
  const uint64_t tokens = static_cast<uint64_t>(tokens_d), io_tokens = static_cast<uint64_t>(io_tokens_d);
  const uint64_t seed = 1234;
  json out = {{"bench", "bench_loader"}, {"seq_len", T}, {"batch", B}};

  // Scale: start-up and memory over a huge sparse dataset, against the materialised order.
  {
    const std::string d = dir + "/sparse";
    const int shards = write_split(d, tokens, false);
    fmt::print(stderr, "bench_loader: {:.3g} tokens in {} sparse shards under {}\n", double(tokens), shards, d);
    const long anon0 = status_kb("RssAnon:");
    const double t0 = mt::now_seconds();
    mt::DataLoader loader(d, "train", B, T, /*shuffle=*/true, seed, 0, 1, /*prefetch=*/0);
    mt::Batch first = loader.next();
    const double startup = mt::now_seconds() - t0;
    const long anon1 = status_kb("RssAnon:");
    const uint64_t W = loader.windows_per_epoch();
    json scale = {{"tokens", tokens},
                  {"shards", shards},
                  {"windows", W},
                  {"loader", {{"startup_s", startup}, {"private_memory_growth_bytes", (anon1 - anon0) * 1024}}}};
    const double ram = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
    if (8.0 * static_cast<double>(W) > ram / 2) {
      scale["materialised"] = {{"skipped", "needs more than half of RAM"}, {"bytes", 8 * W}};
    } else {
      const long m0 = status_kb("RssAnon:");
      const double s0 = mt::now_seconds();
      std::vector<uint64_t> order(W);
      std::iota(order.begin(), order.end(), uint64_t{0});
      mt::Rng rng(mt::mix_seed(seed, 0));
      for (uint64_t i = W - 1; i > 0; --i) std::swap(order[i], order[rng.below(i + 1)]);
      const double build = mt::now_seconds() - s0;
      const long m1 = status_kb("RssAnon:");
      // What finding one row's window costs each way: an array lookup against computing the permutation.
      const mt::WindowOrder wo(W, seed, 0);
      const uint64_t probes = 10'000'000;
      uint64_t sink = 0;
      double s = mt::now_seconds();
      for (uint64_t i = 0; i < probes; ++i) sink += order[(i * 2654435761ull) % W];
      const double lookup = (mt::now_seconds() - s) / probes;
      s = mt::now_seconds();
      for (uint64_t i = 0; i < probes; ++i) sink += wo((i * 2654435761ull) % W);
      const double computed = (mt::now_seconds() - s) / probes;
      scale["materialised"] = {
          {"startup_s", build}, {"private_memory_growth_bytes", (m1 - m0) * 1024}, {"row_s", lookup}};
      scale["loader"]["row_s"] = computed;
      scale["startup_ratio_materialised_over_loader"] = build / startup;
      if (sink == 42) fmt::print(stderr, " ");
    }
    out["scale"] = scale;
    fs::remove_all(d);
  }

  // I/O: a shuffled epoch's first batches read cold, the loader against a plain mapping.
  if (!skip_io) {
    const std::string d = dir + "/dense";
    fmt::print(stderr, "bench_loader: writing {:.3g} random tokens under {} ...\n", double(io_tokens), d);
    write_split(d, io_tokens, true);
    // The read-ahead of the block device holding the data (a partition's is its disk's).
    std::string dev_ra = "unknown";
    struct stat st;
    if (::stat(d.c_str(), &st) == 0) {
      const std::string sys = fmt::format("/sys/dev/block/{}:{}", major(st.st_dev), minor(st.st_dev));
      for (const std::string& q : {sys + "/queue/read_ahead_kb", sys + "/../queue/read_ahead_kb"}) {
        const std::string ra = read_line(q);
        if (!ra.empty()) {
          dev_ra = fs::canonical(sys).filename().string() + ": " + ra + " KB";
          break;
        }
      }
    }
    // The seconds of each of a fresh loader's first batches.
    auto loader_batches = [&] {
      std::vector<double> ts;
      mt::DataLoader loader(d, "train", B, T, true, seed, 0, 1, 0);
      for (int i = 0; i < batches; ++i) {
        const double t0 = mt::now_seconds();
        mt::Batch b = loader.next();
        ts.push_back(mt::now_seconds() - t0);
      }
      return ts;
    };
    const bool cold = drop_page_cache();
    const std::vector<double> loader_ts = loader_batches();
    if (cold) drop_page_cache();
    const std::vector<double> plain_ts = plain_mmap_batches(d, B, T, batches, seed);
    // Warm: the same windows again, now in the page cache (a fresh loader and a fresh mapping).
    const std::vector<double> loader_warm = loader_batches();
    const std::vector<double> plain_warm = plain_mmap_batches(d, B, T, batches, seed);
    out["io"] = {{"tokens", io_tokens},
                 {"cache", cold ? "dropped before each side" : "warm (cannot drop the page cache)"},
                 {"read_ahead", dev_ra},
                 {"batches", batches},
                 {"loader_next_median_s", median(loader_ts)},
                 {"plain_mmap_batch_median_s", median(plain_ts)},
                 {"ratio_plain_over_loader", median(plain_ts) / median(loader_ts)},
                 {"warm_loader_next_median_s", median(loader_warm)},
                 {"warm_plain_mmap_batch_median_s", median(plain_warm)}};
    fs::remove_all(d);
  }
  fs::remove_all(dir);
  fmt::print("{}\n", out.dump(1));
  return 0;
}
