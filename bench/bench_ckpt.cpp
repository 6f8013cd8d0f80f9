// Fast checkpoints (issue 13), measured with real `megatrain` runs, both sides of every comparison in this run:
//  * stall: how long a save stops the training thread, asynchronous (stage 1 only) against synchronous (the whole
//    save), at the GPT-2 124M shape (configs/gpt2-124m.toml), one process and dp2;
//  * throughput: seconds per step (the steps' own time plus the save stalls, over the run) with background
//    persisting against the same run without checkpoints;
//  * peer snapshots: the stall of a snapshot copied to a buddy every step (dp2);
//  * load: restoring a 124M checkpoint with one reader per dp group plus a broadcast against every rank reading,
//    at dp 2, 4 and 8 (page cache dropped before each restore when the bench may, else warm); --ranks 1 adds a
//    single process's restore, the host's read rate;
//  * per byte: the checkpoint's size on disk, stage 1's rate per rank, the persist rate (stage 2, the host's disk)
//    and the read rate - the rates configs/clusters/*.toml's [scale] constants scale by a model's byte counts.
// Prints one JSON object. Usage: bench_ckpt [--bin PATH] [--data DIR] [--work DIR] [--steps N] [--every N]
//                                          [--ranks 2,4,8] [--skip-load] [--skip-stall] [--reuse]
// (--reuse reads the runs already under --work instead of running them again; the load runs always run.)
#include <fmt/format.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string bin = "build/megatrain", data = "data/brown", work = "/tmp/mt_bench_ckpt";
int steps = 16, every = 5;
bool reuse = false;  // --reuse: a run whose metrics are already under --work is read, not run again

bool reusable(const std::string& out, int nsteps) {
  if (!reuse || !fs::exists(out + "/metrics.jsonl")) return false;
  std::ifstream f(out + "/metrics.jsonl");
  int n = 0;
  for (std::string line; std::getline(f, line);) n += line.find("\"kind\":\"train\"") != std::string::npos;
  return n == nsteps;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}
double sum(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }

// Bytes of the regular files under dir (0 when it does not exist).
double dir_bytes(const std::string& dir) {
  double b = 0;
  if (!fs::exists(dir)) return 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) b += static_cast<double>(e.file_size());
  return b;
}

std::string read_file(const std::string& p) {
  std::ifstream f(p);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

std::string cpu_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

// Runs a command; its output goes to log. Exits the bench when it fails.
void sh(const std::string& cmd, const std::string& log) {
  const int rc = std::system((cmd + " > " + log + " 2>&1").c_str());
  if (rc != 0) {
    fmt::print(stderr, "bench_ckpt: `{}` failed ({}); its output:\n{}\n", cmd, rc, read_file(log));
    std::exit(1);
  }
}

bool drop_caches() {
  ::sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  if (!f) return false;
  f << "3\n";
  return static_cast<bool>(f);
}

std::string train_cmd(int nproc) {
  return nproc == 1 ? bin + " train" : fmt::format("{} launch --nproc {} -- train", bin, nproc);
}

// The 124M shape on a short sequence (the saved state depends on the parameters, not on T): steps stay ~1 s.
std::string common(const std::string& out, int nproc, int nsteps) {
  return fmt::format(" --config configs/gpt2-124m.toml --data.dir={} --train.out_dir={} --data.batch_size=1"
                     " --data.seq_len=64 --train.steps={} --train.eval_every=0 --sample.tokens=0 --train.log_every=1000"
                     " --train.threads={} --train.peak_tflops=1 --optim.warmup_steps=2 --ckpt.keep_last=1"
                     " --ckpt.resume=none --parallel.dp={}",
                     data, out, nsteps, std::max(1, 2 / nproc), nproc);
}

struct RunMetrics {
  std::vector<double> step_s;                     // steps 2.. (step 1 warms up)
  std::map<std::string, std::vector<double>> ev;  // stage -> seconds, of the "periodic"/"snapshot" saves
};

RunMetrics metrics_of(const std::string& out) {
  RunMetrics m;
  std::ifstream f(out + "/metrics.jsonl");
  std::string line;
  while (std::getline(f, line)) {
    const json j = json::parse(line);
    if (j["kind"] == "train" && j["step"].get<int>() > 1) m.step_s.push_back(j["step_seconds"].get<double>());
    if (j["kind"] == "checkpoint_event" && j["why"] != "final")
      m.ev[j["stage"].get<std::string>()].push_back(j["seconds"].get<double>());
  }
  return m;
}

json stall_case(int nproc) {
  const std::string tag = nproc == 1 ? "single" : fmt::format("dp{}", nproc);
  json r = {{"layout", tag}, {"steps", steps}, {"every", every}};
  std::map<std::string, RunMetrics> m;
  for (const char* mode : {"none", "async", "sync"}) {
    const std::string out = fmt::format("{}/stall_{}_{}", work, tag, mode);
    if (reusable(out, steps)) {
      m[mode] = metrics_of(out);
      continue;
    }
    fs::remove_all(out);
    std::string flags = common(out, nproc, steps) + " --ckpt.snapshot_every=0 --ckpt.save_final=false";
    flags += std::string(mode) == "none"
                 ? " --ckpt.every=0"
                 : fmt::format(" --ckpt.every={} --ckpt.async={}", every, mode == std::string("async"));
    sh(train_cmd(nproc) + flags, out + ".log");
    m[mode] = metrics_of(out);
    if (std::string(mode) == "async") r["checkpoint_bytes"] = dir_bytes(out + "/ckpt");  // keep_last=1: one step
    fs::remove_all(out + "/ckpt");
  }
  // Async: the training thread stops for stage 1 (the "snapshot" event's seconds). Sync: for the whole save
  // (snapshot + write + fsync + commit: the "committed" event's seconds, counted from the same start).
  const double stall_async = median(m["async"].ev["snapshot"]), save_sync = median(m["sync"].ev["committed"]);
  const double step = median(m["none"].step_s);
  r["async_stall_s"] = m["async"].ev["snapshot"];
  r["async_committed_after_s"] = m["async"].ev["committed"];
  r["sync_save_s"] = m["sync"].ev["committed"];
  r["median_async_stall_s"] = stall_async;
  r["median_sync_save_s"] = save_sync;
  r["stall_ratio_async_over_sync"] = save_sync > 0 ? stall_async / save_sync : 0;
  r["median_step_s_no_ckpt"] = step;
  r["stall_over_step_every_10"] = step > 0 ? stall_async / (10 * step) : 0;
  // Throughput: the steps' time plus the stalls, per step, against the run without checkpoints.
  auto per_step = [&](const char* mode) {
    const RunMetrics& x = m[mode];
    const std::vector<double> stalls = std::string(mode) == "async"  ? x.ev.at("snapshot")
                                       : std::string(mode) == "sync" ? x.ev.at("committed")
                                                                     : std::vector<double>{};
    return (sum(x.step_s) + sum(stalls)) / static_cast<double>(x.step_s.size());
  };
  const double base = per_step("none"), with_async = per_step("async"), with_sync = per_step("sync");
  r["s_per_step"] = {{"no_checkpoints", base}, {"async_every", with_async}, {"sync_every", with_sync}};
  r["median_step_s_with_background_persist"] = median(m["async"].step_s);
  r["throughput_cost_async"] = with_async / base - 1;
  r["throughput_cost_sync"] = with_sync / base - 1;
  // Rates per byte (what the cluster model scales by a model's byte counts). Stage 1 here is a copy within host
  // memory (the CPU build has no device), per rank; stage 2 writes all ranks' files to this host's disk.
  const double bytes = r.value("checkpoint_bytes", 0.0);
  const double persist = median(m["async"].ev["committed"]) - stall_async;
  r["stage1_gbps_per_rank"] = stall_async > 0 ? bytes / nproc / stall_async * 1e-9 : 0;
  r["persist_seconds_median"] = persist;
  r["persist_gbps_per_host"] = persist > 0 ? bytes / persist * 1e-9 : 0;  // while training shares the cores
  // The synchronous save writes while training waits: the host's write rate (stage 1 + write + fsync + commit).
  r["sync_write_gbps_per_host"] = save_sync > 0 ? bytes / save_sync * 1e-9 : 0;
  return r;
}

json peer_case() {
  json r;
  std::map<std::string, RunMetrics> m;
  for (int snap : {0, 1}) {
    const std::string out = fmt::format("{}/peer_{}", work, snap);
    if (reusable(out, steps / 2)) {
      m[std::to_string(snap)] = metrics_of(out);
      continue;
    }
    fs::remove_all(out);
    sh(train_cmd(2) + common(out, 2, steps / 2) +
           fmt::format(" --ckpt.every=0 --ckpt.save_final=false --ckpt.snapshot_every={}", snap),
       out + ".log");
    m[std::to_string(snap)] = metrics_of(out);
  }
  r["layout"] = "dp2";
  r["snapshot_every"] = 1;
  r["peer_snapshot_stall_s"] = m["1"].ev["snapshot"];
  r["median_peer_snapshot_stall_s"] = median(m["1"].ev["snapshot"]);
  r["median_step_s_with_peer_copies"] = median(m["1"].step_s);
  r["median_step_s_without"] = median(m["0"].step_s);
  return r;
}

json load_case(const std::vector<int>& ranks) {
  // One checkpoint of the 124M model, from a single process with a global batch of 8 sequences: dp N restores it
  // with 8 / N per rank (a resume must keep the global batch).
  const std::string src = work + "/load_src";
  fs::remove_all(src);
  sh(train_cmd(1) + common(src, 1, 1) +
         " --data.batch_size=8 --ckpt.every=0 --ckpt.save_final=true"
         " --ckpt.snapshot_every=0",
     src + ".log");
  const std::string ckpt = src + "/ckpt/step_00000001";
  const double bytes = dir_bytes(ckpt);
  json r = json::array();
  const bool cold = drop_caches();
  for (int n : ranks) {
    json row = {{"dp", n}, {"page_cache", cold ? "dropped before each restore" : "warm (no permission to drop)"}};
    for (bool one : {true, false}) {
      std::vector<double> t;
      for (int rep = 0; rep < 2; ++rep) {
        const std::string out = fmt::format("{}/load_dp{}_{}_{}", work, n, one ? "one" : "all", rep);
        fs::remove_all(out);
        if (cold) drop_caches();
        sh(train_cmd(n) + common(out, n, 1) +
               fmt::format(" --data.batch_size={} --ckpt.every=0 --ckpt.save_final=false --ckpt.snapshot_every=0"
                           " --ckpt.one_reader={} --ckpt.resume={} --train.steps=2",
                           8 / n, one, ckpt),
           out + ".log");
        std::smatch mt;
        const std::string text = read_file(out + ".log");
        if (std::regex_search(text, mt, std::regex("restored in ([0-9.]+) s"))) t.push_back(std::stod(mt[1]));
        fs::remove_all(out);
      }
      row[one ? "one_reader_broadcast_s" : "all_readers_s"] = t;
      row[one ? "median_one_reader_broadcast_s" : "median_all_readers_s"] = median(t);
    }
    // dp 1: one process reads the whole checkpoint, nothing to broadcast - the host's read rate.
    row["checkpoint_bytes"] = bytes;
    row["read_gbps_one_reader"] = row["median_one_reader_broadcast_s"].get<double>() > 0
                                      ? bytes / row["median_one_reader_broadcast_s"].get<double>() * 1e-9
                                      : 0;
    row["speedup_one_reader"] = row["median_one_reader_broadcast_s"].get<double>() > 0
                                    ? row["median_all_readers_s"].get<double>() /
                                          row["median_one_reader_broadcast_s"].get<double>()
                                    : 0;
    r.push_back(row);
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> ranks = {2, 4, 8};
  bool skip_load = false, skip_stall = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--bin")
      bin = next();
    else if (a == "--data")
      data = next();
    else if (a == "--work")
      work = next();
    else if (a == "--steps")
      steps = std::stoi(next());
    else if (a == "--every")
      every = std::stoi(next());
    else if (a == "--skip-load")
      skip_load = true;
    else if (a == "--skip-stall")
      skip_stall = true;
    else if (a == "--reuse")
      reuse = true;
    else if (a == "--ranks") {
      ranks.clear();
      std::stringstream ss(next());
      for (std::string x; std::getline(ss, x, ',');) ranks.push_back(std::stoi(x));
    } else {
      fmt::print(stderr, "usage: bench_ckpt [--bin PATH] [--data DIR] [--work DIR] [--steps N] [--every N] "
                         "[--ranks 2,4,8] [--skip-load] [--skip-stall] [--reuse]\n");
      return 2;
    }
  }
  fs::create_directories(work);
  utsname u{};
  ::uname(&u);
  json out = {{"benchmark", "fast_checkpoints"},
              {"machine", {{"cpu", cpu_name()}, {"cores", ::sysconf(_SC_NPROCESSORS_ONLN)}, {"kernel", u.release}}},
              {"model", "configs/gpt2-124m.toml (124M parameters), data.seq_len=64, data.batch_size=1"},
              {"checkpoint_dir_fs", work}};
  if (!skip_stall) {
    out["stall"] = json::array({stall_case(1), stall_case(2)});
    out["peer_snapshots"] = peer_case();
  }
  if (!skip_load) out["load"] = load_case(ranks);
  fmt::print("{}\n", out.dump(2));
  return 0;
}
