// What a rank of a tensor- or pipeline-parallel job reads of an HF model it starts from (model.init_from):
// HfSliceReader maps the files and copies out only the rank's slices. Against the whole-model import
// (import_hf_model: one process, or `megatrain convert`) in the same run.
//
// A synthetic Llama in bf16 (GQA, untied head) is written to --dir, split into shard files with an index as
// transformers writes them. Then, each in a fresh child process so that nothing is mapped or cached in the process
// before: for every rank of each (tp, pp) layout, the rank's parameters (declare_gpt_params for its tp rank and its
// pipeline part) are read through HfSliceReader; and once, the whole model through import_hf_model. Measured per
// child: the file pages it touched (the Rss of its mappings of the weight files, /proc/self/smaps: page-cache
// warmth does not change it), as a share of the files' size, and the seconds (noisy: mostly page clearing). Which
// pages a rank touches depends only on the layout and the page size, not on the machine's speed.
// Prints one JSON object. Usage: bench_hf_slices [--dir DIR] [--layers L] [--width C] [--vocab V] [--keep]
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "megatrain/ckpt/hf_llama.h"
#include "megatrain/ckpt/hf_model.h"
#include "megatrain/ckpt/hf_model_files.h"
#include "megatrain/ckpt/slice.h"
#include "megatrain/core/bf16.h"
#include "megatrain/core/clock.h"
#include "megatrain/core/fs.h"
#include "megatrain/model/layout.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace mt;

namespace {

[[noreturn]] void die(const std::string& what) {
  fmt::print(stderr, "bench_hf_slices: {}\n", what);
  std::exit(1);
}

// Bytes of the files under `dir` that this process has mapped and touched (Rss of those mappings). smaps gives each
// mapping a header line "start-end perms offset dev inode path", then "Key: value kB" lines.
uint64_t touched_bytes(const std::string& dir) {
  std::ifstream f("/proc/self/smaps");
  uint64_t kb = 0;
  bool ours = false;
  for (std::string line; std::getline(f, line);) {
    const std::string first = line.substr(0, line.find(' '));
    const bool header = first.find('-') != std::string::npos &&
                        first.find_first_not_of("0123456789abcdef-") == std::string::npos;
    if (header)
      ours = line.find(dir) != std::string::npos;
    else if (ours && line.rfind("Rss:", 0) == 0)
      kb += std::stoull(line.substr(4));
  }
  return kb * 1024;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

ModelConfig model(int layers, int width, int vocab) {
  ModelConfig c;
  c.norm = NormKind::RmsNorm;
  c.mlp = MlpKind::SwiGlu;
  c.pos = PosKind::Rope;
  c.bias = false;
  c.tied_embeddings = false;
  c.vocab_size = vocab;
  c.d_model = width;
  c.n_layer = layers;
  c.n_head = width / 128;
  c.n_kv_head = std::max(1, c.n_head / 4);
  c.max_seq_len = 4096;
  c.validate();
  return c;
}

// The model of cfg as HF bf16 shard files of about 512 MB each, with their index and config.json.
uint64_t write_model(const std::string& dir, const ModelConfig& cfg) {
  ParamStore whole;
  declare_gpt_params(cfg, whole);
  struct Hf {
    std::string name;
    std::vector<int64_t> shape;
  };
  std::vector<Hf> tensors;
  for (const ParamInfo& p : whole.infos()) {
    const int64_t cols = p.shape.size() == 2 ? p.shape[1] : 1;
    for (const HfRowBlock& b : hf_llama_row_blocks(cfg, p.name))
      tensors.push_back({b.name,
                         p.shape.size() == 2 ? std::vector<int64_t>{b.rows, cols} : std::vector<int64_t>{b.rows}});
  }
  fs::create_directories(dir);
  json index = {{"weight_map", json::object()}};
  std::vector<std::vector<uint16_t>> data;
  std::vector<TensorRef> batch;
  uint64_t batch_bytes = 0, total = 0;
  int file = 0;
  auto flush = [&] {
    if (batch.empty()) return;
    const std::string name = fmt::format("model-{:05d}.safetensors", ++file);
    for (auto& r : batch) index["weight_map"][r.name] = name;
    write_safetensors(dir + "/" + name, batch, {{"format", "pt"}});
    total += fs::file_size(dir + "/" + name);
    batch.clear();
    data.clear();
    batch_bytes = 0;
  };
  for (const Hf& t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    std::vector<uint16_t>& v = data.emplace_back(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      v[static_cast<size_t>(i)] = float_to_bf16(static_cast<float>((i * 2654435761u) % 1000) * 1e-3f - 0.5f);
    batch.push_back({t.name, DType::BF16, t.shape, v.data()});
    batch_bytes += static_cast<uint64_t>(n) * 2;
    if (batch_bytes >= (uint64_t{512} << 20)) flush();
  }
  flush();
  write_file_atomic(dir + "/model.safetensors.index.json", index.dump());
  write_file_atomic(dir + "/config.json", hf_llama_config_json(cfg).dump(2));
  return total;
}

// Runs fn in a child process; returns the JSON it printed to the pipe.
json in_child(const std::function<json()>& fn) {
  int fds[2];
  if (::pipe(fds) != 0) die("pipe failed");
  const pid_t pid = ::fork();
  if (pid < 0) die("fork failed");
  if (pid == 0) {
    ::close(fds[0]);
    std::string out;
    try {
      out = fn().dump();
    } catch (const std::exception& e) {
      out = json{{"error", e.what()}}.dump();
    }
    const ssize_t w = ::write(fds[1], out.data(), out.size());
    (void)w;
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  json j = json::parse(got.empty() ? "{}" : got);
  if (j.contains("error")) die(j["error"].get<std::string>());
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/tmp/megatrain-bench-hf-slices";
  int layers = 16, width = 2048, vocab = 32000;
  bool keep = false;
  CLI::App app{"bench_hf_slices: what each rank of a tp x pp layout reads of a Hugging Face model; prints JSON"};
  app.add_option("--dir", dir, "where the model is written");
  app.add_option("--layers", layers, "layers of the Llama-shaped model");
  app.add_option("--width", width, "its d_model");
  app.add_option("--vocab", vocab, "its vocabulary");
  app.add_flag("--keep", keep, "keep the model files afterwards");
  CLI11_PARSE(app, argc, argv);
  const ModelConfig cfg = model(layers, width, vocab);
  fs::remove_all(dir);
  double t0 = now_seconds();
  const uint64_t file_bytes = write_model(dir, cfg);
  const double write_s = now_seconds() - t0;
  fmt::print(stderr, "bench_hf_slices: wrote {} params, {:.2f} GB of bf16 in {:.1f} s\n", cfg.num_params(),
             file_bytes / 1e9, write_s);

  json out = {{"bench", "hf_slices"},
              {"model",
               {{"n_layer", cfg.n_layer},
                {"d_model", cfg.d_model},
                {"n_head", cfg.n_head},
                {"n_kv_head", cfg.kv_heads()},
                {"d_ff", cfg.ff_dim()},
                {"vocab", cfg.vocab_size},
                {"params", cfg.num_params()}}},
              {"file_bytes", file_bytes}};

  // The peer: the whole model, as one process (or convert) imports it. Its seconds are mostly the kernel clearing
  // fresh pages for the parameters, which varies several-fold between runs on a shared machine: the median of 3.
  std::vector<double> whole_secs;
  json whole;
  for (int k = 0; k < 3; ++k) {
    whole = in_child([&] {
      const double s = now_seconds();
      const HfModelFiles m = HfModelFiles::open(dir);
      ParamStore store;
      import_hf_model(m, cfg, store);
      return json{{"seconds", now_seconds() - s}, {"touched_bytes", touched_bytes(dir)}};
    });
    whole_secs.push_back(whole["seconds"].get<double>());
  }
  std::sort(whole_secs.begin(), whole_secs.end());
  whole["seconds"] = whole_secs[1];
  whole["seconds_all"] = whole_secs;
  out["whole_import"] = whole;
  out["whole_import"]["touched_share"] = whole["touched_bytes"].get<double>() / double(file_bytes);

  json layouts = json::array();
  for (auto [tp, pp] : std::vector<std::pair<int, int>>{{1, 2}, {2, 1}, {4, 1}, {8, 1}, {2, 2}, {4, 4}, {8, 4}}) {
    if (cfg.n_head % tp || cfg.kv_heads() % tp || cfg.n_layer % pp) continue;
    std::vector<double> shares, secs;
    for (int p = 0; p < pp; ++p)
      for (int t = 0; t < tp; ++t) {
        const json r = in_child([&] {
          const double s = now_seconds();
          const HfModelFiles m = HfModelFiles::open(dir);
          HfSliceReader reader(m, cfg);
          ParamStore store;
          declare_gpt_params(cfg, store, tp, t, pipeline_part(cfg, pp, 1, p));
          store.allocate();
          for (int i = 0; i < static_cast<int>(store.size()); ++i) {
            const ParamInfo& info = store.info(i);
            for (const Placement& pl : shard_placements(info.shard, whole_slice(info.shape)))
              reader.read(info.name, pl.full, store.param(i).ptr, info.shape, pl.local.start);
          }
          return json{{"seconds", now_seconds() - s}, {"touched_bytes", touched_bytes(dir)}};
        });
        shares.push_back(r["touched_bytes"].get<double>() / double(file_bytes));
        secs.push_back(r["seconds"].get<double>());
      }
    const double sum = std::accumulate(shares.begin(), shares.end(), 0.0);
    layouts.push_back({{"tp", tp},
                       {"pp", pp},
                       {"ranks", tp * pp},
                       {"touched_share_max", *std::max_element(shares.begin(), shares.end())},
                       {"touched_share_sum", sum},
                       {"ideal_share", 1.0 / (tp * pp)},
                       {"seconds_max", *std::max_element(secs.begin(), secs.end())},
                       {"seconds_median", median(secs)}});
    fmt::print(stderr, "tp {} pp {}: a rank touches at most {:.3f} of the files (ideal {:.3f}), {:.2f} s\n", tp, pp,
               layouts.back()["touched_share_max"].get<double>(), 1.0 / (tp * pp),
               layouts.back()["seconds_max"].get<double>());
  }
  out["layouts"] = layouts;
  if (!keep) fs::remove_all(dir);
  fmt::print("{}\n", out.dump(2));
  return 0;
}
