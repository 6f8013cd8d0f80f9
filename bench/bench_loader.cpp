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
//  * node: one node's 4 ranks (dp2 x tp2, and dp2 x pp2 with 2 micro-batches a step) as 4 forked processes, each
//    taking --node-steps batches with --compute-ms of pretend compute (a sleep) after each, from per-rank loaders
//    (data.node_loader = false: a loader and a prefetch thread per rank) and from one reader per node
//    (data/node_loader.h), over --node-tokens random tokens in the page cache (written just before: warm). Per
//    node: shard bytes read per step (the ranks' read syscalls, /proc/<pid>/io rchar, construction included),
//    loader threads (the ranks' threads but their main ones, sampled during the run), resident memory the loaders
//    added (the sum of the ranks' proportional set sizes, Pss: a page shared by 4 counts a quarter in each), and the
//    time a rank waits in next() for its batch: the first batch apart (the node's reader starts there, a per-rank
//    loader's prefetch at construction), then the mean and median over ranks and the worst rank's 99th percentile.
// Prints one JSON object. Usage: bench_loader [--tokens N] [--io-tokens D] [--seq T] [--batch B] [--batches K]
//                                             [--dir DIR] [--skip-io] [--skip-scale] [--node-tokens D]
//                                             [--node-steps S] [--compute-ms C] [--skip-node]
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <thread>
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
#include "megatrain/train/node_data.h"

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


long proc_value(const std::string& file, const char* key) {  // a "key: value" line of /proc/self/<file>
  std::ifstream f("/proc/self/" + file);
  for (std::string line; std::getline(f, line);)
    if (line.rfind(key, 0) == 0) return std::stol(line.substr(std::strlen(key)));
  return -1;
}

long thread_count() {
  long n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// What one rank of the node part measured.
struct RankFigures {
  double read_bytes = 0, loader_threads = 0, pss_bytes = 0;
  double first_wait_s = 0;                                    // the first batch (the node's reader starts there)
  double wait_mean_s = 0, wait_median_s = 0, wait_p99_s = 0;  // the batches after it
};

// Local rank `local` of a 4-rank node (layout: "dp2_tp2" or "dp2_pp2"): its loader, per rank or fed by the node's
// reader, `steps` batches with `compute_ms` after each. Runs in a forked process.
RankFigures node_rank(const std::string& dir, const std::string& layout, bool node, int local, int B, int T, int steps,
                      int compute_ms) {
  mt::RunConfig cfg;
  cfg.data.dir = dir;
  cfg.data.batch_size = B;
  cfg.data.seq_len = T;
  cfg.data.node_loader = node;
  cfg.model.vocab_size = kVocab;
  cfg.parallel.dp = 2;
  (layout == "dp2_tp2" ? cfg.parallel.tp : cfg.parallel.pp) = 2;
  mt::Topology topo;
  topo.rank_info.rank = topo.rank_info.local_rank = local;
  topo.rank_info.world_size = topo.rank_info.local_world_size = 4;
  topo.rank_info.store_url = fmt::format("bench-{}", ::getppid());
  topo.shape = {cfg.parallel.dp, cfg.parallel.pp, cfg.parallel.tp};
  topo.coord = mt::mesh_coord(topo.shape, local);
  const long rchar0 = proc_value("io", "rchar: "), pss0 = proc_value("smaps_rollup", "Pss:"), threads0 = thread_count();
  std::unique_ptr<mt::DataLoader> loader = mt::open_train_loader(cfg, topo);
  RankFigures f;
  long threads = 0;
  std::vector<double> waits;
  for (int s = 0; s < steps; ++s) {
    const double t0 = mt::now_seconds();
    mt::Batch b = loader->next();
    const double w = mt::now_seconds() - t0;
    if (s == 0)
      f.first_wait_s = w;
    else
      waits.push_back(w);
    threads = std::max(threads, thread_count() - threads0);
    std::this_thread::sleep_for(std::chrono::milliseconds(compute_ms));
  }
  std::sort(waits.begin(), waits.end());
  if (!waits.empty()) {
    f.wait_mean_s = std::accumulate(waits.begin(), waits.end(), 0.0) / static_cast<double>(waits.size());
    f.wait_median_s = waits[waits.size() / 2];
    f.wait_p99_s = waits[std::min(waits.size() - 1, waits.size() * 99 / 100)];
  }
  f.read_bytes = static_cast<double>(proc_value("io", "rchar: ") - rchar0);
  f.pss_bytes = static_cast<double>(proc_value("smaps_rollup", "Pss:") - pss0) * 1024;
  f.loader_threads = static_cast<double>(threads);
  return f;
}

// The node part for one layout and one kind of loader: 4 forked ranks, their figures summed (per node) or combined.
json node_run(const std::string& dir, const std::string& layout, bool node, int B, int T, int steps, int compute_ms) {
  std::vector<pid_t> kids;
  std::vector<int> pipes;
  for (int local = 0; local < 4; ++local) {
    int fd[2];
    if (::pipe(fd) != 0) die("pipe failed");
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fd[0]);
      RankFigures f;
      try {
        f = node_rank(dir, layout, node, local, B, T, steps, compute_ms);
      } catch (const std::exception& e) {
        fmt::print(stderr, "bench_loader: local rank {}: {}\n", local, e.what());
        ::_exit(1);
      }
      if (::write(fd[1], &f, sizeof f) != static_cast<ssize_t>(sizeof f)) ::_exit(1);
      ::_exit(0);
    }
    ::close(fd[1]);
    kids.push_back(pid);
    pipes.push_back(fd[0]);
  }
  RankFigures sum;
  for (int local = 0; local < 4; ++local) {
    RankFigures f;
    if (::read(pipes[size_t(local)], &f, sizeof f) != static_cast<ssize_t>(sizeof f)) die("a rank failed");
    ::close(pipes[size_t(local)]);
    int status = 0;
    ::waitpid(kids[size_t(local)], &status, 0);
    sum.read_bytes += f.read_bytes;
    sum.loader_threads += f.loader_threads;
    sum.pss_bytes += f.pss_bytes;
    sum.wait_mean_s += f.wait_mean_s / 4;
    sum.wait_median_s += f.wait_median_s / 4;
    sum.wait_p99_s = std::max(sum.wait_p99_s, f.wait_p99_s);
    sum.first_wait_s = std::max(sum.first_wait_s, f.first_wait_s);
  }
  return {{"shard_bytes_read_per_step_per_node", sum.read_bytes / steps},
          {"loader_threads_per_node", sum.loader_threads},
          {"loader_resident_bytes_per_node", sum.pss_bytes},
          {"rank_wait_first_batch_max_s", sum.first_wait_s},
          {"rank_wait_per_batch_mean_s", sum.wait_mean_s},
          {"rank_wait_per_batch_median_s", sum.wait_median_s},
          {"rank_wait_per_batch_p99_max_s", sum.wait_p99_s}};
}

}  // namespace

int main(int argc, char** argv) {
  double tokens_d = 300e9, io_tokens_d = 1e9;  // read as doubles: "3e11" is how one writes these sizes
  int T = 2048, B = 8, batches = 100;
  std::string dir = "/tmp/mt_bench_loader";
  bool skip_io = false, skip_scale = false, skip_node = false;
  double node_tokens_d = 5e7;
  int node_steps = 200, compute_ms = 5, node_batch = 8;
  CLI::App app{"bench_loader: the data loader's start-up, memory and read speed; prints JSON"};
  app.add_option("--tokens", tokens_d, "tokens of the sparse dataset for the start-up and memory part");
  app.add_option("--io-tokens", io_tokens_d, "tokens of the dataset actually written and read");
  app.add_option("--seq", T, "sequence length");
  app.add_option("--batch", B, "batch size");
  app.add_option("--batches", batches, "batches read in the timed part");
  app.add_option("--dir", dir, "scratch folder");
  app.add_flag("--skip-io", skip_io, "leave out the read-speed part");
  app.add_flag("--skip-scale", skip_scale, "leave out the start-up and memory part");
  app.add_flag("--skip-node", skip_node, "leave out the per-rank against per-node loader part");
  app.add_option("--node-tokens", node_tokens_d, "tokens of the node part's dataset");
  app.add_option("--node-steps", node_steps, "batches each rank takes in the node part");
  app.add_option("--node-batch", node_batch, "rows per micro-batch per data-parallel rank in the node part");
  app.add_option("--compute-ms", compute_ms, "pretend compute after each batch in the node part");
  CLI11_PARSE(app, argc, argv);
  const uint64_t tokens = static_cast<uint64_t>(tokens_d), io_tokens = static_cast<uint64_t>(io_tokens_d);
  const uint64_t seed = 1234;
  json out = {{"bench", "bench_loader"}, {"seq_len", T}, {"batch", B}};

  // Scale: start-up and memory over a huge sparse dataset, against the materialised order.
  if (!skip_scale) {
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
  // Node: per-rank loaders against one reader per node, 4 ranks, both layouts.
  if (!skip_node) {
    const std::string d = dir + "/node";
    write_split(d, static_cast<uint64_t>(node_tokens_d), true);
    json node = {{"tokens", static_cast<uint64_t>(node_tokens_d)},
                 {"ranks", 4},
                 {"steps", node_steps},
                 {"compute_ms", compute_ms},
                 {"rows_per_replica_micro_batch", node_batch},
                 {"cache", "warm (written just before)"},
                 {"load_average_1min_before", read_line("/proc/loadavg")}};
    for (const std::string layout : {"dp2_tp2", "dp2_pp2"}) {
      json per_rank = node_run(d, layout, false, node_batch, T, node_steps, compute_ms);
      json one = node_run(d, layout, true, node_batch, T, node_steps, compute_ms);
      node[layout] = {{"per_rank_loaders", per_rank},
                      {"node_loader", one},
                      {"bytes_ratio_per_rank_over_node", per_rank["shard_bytes_read_per_step_per_node"].get<double>() /
                                                             one["shard_bytes_read_per_step_per_node"].get<double>()}};
    }
    out["node"] = node;
    fs::remove_all(d);
  }
  fs::remove_all(dir);
  fmt::print("{}\n", out.dump(1));
  return 0;
}
