// The run configuration: one TOML file with sections [model] [data] [optim] [train] [ckpt] [sample] [parallel], plus
// `--section.key=value` overrides from the command line. Every key is known: a mistyped or unknown key is an error
// that names it (and the closest known key).
#pragma once
#include <array>
#include <string>
#include <utility>
#include <vector>

#include "megatrain/core/kind.h"
#include "megatrain/core/tensor.h"
#include "megatrain/data/loader.h"
#include "megatrain/model/config.h"
#include "megatrain/optim/optimizer.h"
#include "megatrain/parallel/straggler_code.h"

namespace mt {

struct DataConfig {
  std::string dir = "data/brown";  // directory of train_*.bin / val_*.bin shards (prepare-data output)
  // Several such directories, each with a weight (DataLoader's blend: rows by the largest-deficit rule). Empty: dir
  // alone. Set, it replaces dir (which a config file may still carry: the start line names what is read).
  std::vector<DataSource> blend;
  int batch_size = 8;  // micro-batch B per data-parallel rank
  int seq_len = 128;   // T
  bool shuffle = true;
  uint64_t seed = 1234;
  int prefetch = 2;  // batches prefetched by a background thread; 0 = synchronous
  // One reader per node (local rank 0's thread) feeds the node's ranks through shared memory (data/node_loader.h);
  // false: every rank reads its own rows with its own prefetch thread.
  bool node_loader = true;
  // What the loaders read: the blend, or dir with weight 1.
  std::vector<DataSource> sources() const { return blend.empty() ? std::vector<DataSource>{{dir, 1.0}} : blend; }
};

// "data/brown", or "the blend of data/web, data/code": the data a message is about.
std::string data_dirs(const DataConfig& d);
// "a blend of data/web 70%, data/code 30%; data.dir is not read" (the start line of a blended run).
std::string blend_description(const DataConfig& d);

// train.attention on a GPU: auto (cuDNN where this build has it, else flash), flash (our kernels) or cudnn (cuDNN's
// fused attention); the CUDA backend takes the spelling (CudaOptions::attention).
enum class AttentionChoice { Auto, Flash, Cudnn };
inline constexpr std::array<const char*, 3> kAttentionChoiceNames = {"auto", "flash", "cudnn"};
inline const std::array<const char*, 3>& kind_names(AttentionChoice) { return kAttentionChoiceNames; }

struct TrainConfig {
  int steps = 200;
  int grad_accum = 1;  // micro-batches per optimizer step
  int log_every = 10;
  int eval_every = 50;  // 0 disables periodic validation
  int eval_batches = 8;
  uint64_t seed = 42;  // weight init
  std::string out_dir = "runs/default";
  double peak_tflops = 0;       // MFU denominator; 0 = measure the backend's matmul peak at start-up
  int threads = 0;              // OpenMP threads; 0 = all cores
  Device device = Device::CPU;  // cpu (fp32) | cuda (bf16; with several ranks, one GPU per local rank)
  AttentionChoice attention = AttentionChoice::Auto;  // cuda only (CudaOptions::attention)
  int gemm_tuning = 0;  // cuda only: 0 = cuBLASLt's heuristic; N in 2..64 = time N candidates per GEMM
                        // shape on its first call and keep the fastest (CudaOptions::gemm_tuning)
  // GPU runs that repeat bit for bit (CudaOptions::deterministic; docs/cuda.md): no float atomics in the backward,
  // cuDNN only through deterministic engines. With gemm_tuning > 0 it is refused (validate). The CPU backend is
  // deterministic anyway: there it changes nothing.
  bool deterministic = false;
  // Robust training (docs/robust-training.md). skip_steps: steps whose batches are read and dropped unused (no
  // forward, backward or optimizer step), e.g. after a NaN that repeats on the same data.
  std::vector<int> skip_steps;
  // The timeline (docs/observability.md): steps [first, last] are recorded and each rank writes
  // <out_dir>/trace/rank<R>.json; the job's merged trace is <out_dir>/trace.json. [] = off.
  std::vector<int> trace_steps;
  // Loss-spike warning: a step's loss above mean + spike_sigmas x std, or above spike_factor x median, of the
  // previous spike_window steps' losses (spike_window 0: off; spike_factor 0: no ratio rule).
  int spike_window = 50;
  double spike_sigmas = 6;
  double spike_factor = 2;
  // Silent data corruption (train/sdc_check.h): every sdc_check_every steps, and at every checkpoint step, the
  // data-parallel replicas compare a hash of their parameters after the update (0: never; no effect with dp = 1).
  int sdc_check_every = 20;
  // Transient silent data corruption (train/sdc_rerun.h): a step whose loss or global gradient norm spikes (the
  // spike_* rule above, applied to each) runs its forward and backward again before its update; a rank that does not
  // reproduce its own gradients bit for bit fails the step (kind Sdc) and is named.
  bool sdc_rerun_on_spike = true;
};

// ckpt.resume: "auto", "none", or any other string, which is a checkpoint's path.
enum class ResumeMode { Auto, None, Path };
struct ResumeFrom {
  ResumeMode mode = ResumeMode::Auto;
  std::string path;  // mode Path only
  // How the config spells it: "auto", "none" or the path.
  std::string spelling() const { return mode == ResumeMode::Auto ? "auto" : mode == ResumeMode::None ? "none" : path; }
};

struct CkptConfig {
  int every = 0;  // steps between checkpoints; 0 = only at the end
  int keep_last = 3;
  std::string dir;    // default <train.out_dir>/ckpt
  ResumeFrom resume;  // auto (latest under dir if any) | none | path to a checkpoint
  bool save_final = true;
  bool sharded = true;      // a parallel run: each rank writes its own shard file (false: gather to rank 0)
  bool async = true;        // two-stage save: snapshot to memory, write in the background (false: wait)
  int snapshot_every = 10;  // steps between in-memory snapshots copied to a buddy rank; 0 = none
  bool one_reader = true;   // restore: one rank per dp group reads, broadcasts to the rest (false: all read)
};

struct SampleConfig {
  // Directory with encoder.json and vocab.bpe to encode the prompt and decode the sample; "" = the tokenizer the
  // training data was prepared with (data.dir/meta.json), else GPT-2's (installed by scripts/setup).
  std::string tokenizer;
  std::string prompt = "The";
  int tokens = 64;
  float temperature = 0.8f;
  int top_k = 40;
  uint64_t seed = 7;
};

// How a GPU run's device plane moves device memory (train/device_plane.h): NCCL (one GPU per rank), staged through
// host memory over Gloo (ranks that share a GPU), or whichever fits the node.
enum class DevicePlane { Auto, Nccl, Staged };
inline constexpr std::array<const char*, 3> kDevicePlaneNames = {"auto", "nccl", "staged"};
inline const std::array<const char*, 3>& kind_names(DevicePlane) { return kDevicePlaneNames; }

struct ParallelConfig {
  int dp = 1, pp = 1, tp = 1;     // dp x pp x tp must equal WORLD_SIZE
  int ep = 1;                     // expert parallelism (MoE): ep of the dp ranks shard the experts; divides dp
  bool ep_overlap = true;         // overlap the expert all-to-alls with the shared experts' compute
  bool ep_interleave = false;     // run the step's micro-batches in pairs, one's attention behind the other's dispatch
  int bucket_mb = 16;             // data-parallel gradient bucket size (MiB of fp32)
  bool overlap = true;            // overlap communication with compute
  int virtual_stages = 1;         // pipeline: model chunks per pp rank (interleaved 1F1B when > 1)
  std::vector<int> stage_layers;  // pipeline: layers of each virtual stage, pp * virtual_stages counts in stage
                                  // order (model/layout.h); [] = an even split
  int microbatches = 0;           // pipeline: micro-batches of data.batch_size rows per step; 0 = parallel.pp
  int tp_chunks = 4;              // tensor parallel: row chunks of each fused all-gather+GEMM / GEMM+reduce-scatter
  int timeout_s = 120;            // rendezvous / collective timeout
  DevicePlane device_plane = DevicePlane::Auto;  // cuda only: nccl, staged, or auto (staged where ranks share a GPU)
  // Straggler-tolerant data parallelism (parallel/straggler_code.h, train/coded_forward_backward.h): none (the plain
  // step), gc (tolerates straggler_s slow replicas per round), sr-sgc or m-sgc (bursts inside the
  // (straggler_burst, straggler_window, straggler_lambda)-bursty model). A replica later than straggler_deadline x
  // the median round time is a straggler for that round.
  StragglerScheme straggler_coding = StragglerScheme::None;
  int straggler_s = 1;
  int straggler_burst = 1;
  int straggler_window = 3;
  int straggler_lambda = 1;
  double straggler_deadline = 2.0;
  // The core's settings from the keys above.
  StragglerCodeConfig straggler_code() const {
    StragglerCodeConfig c;
    c.scheme = straggler_coding;
    c.s = straggler_s;
    c.bursty = {straggler_burst, straggler_window, straggler_lambda};
    return c;
  }
};

struct RunConfig {
  ModelConfig model;
  std::string
      init_from;  // model.init_from: an HF GPT-2 or Llama model, or a megatrain checkpoint (tp/pp > 1: a checkpoint)
  DataConfig data;
  OptimConfig optim;
  TrainConfig train;
  CkptConfig ckpt;
  SampleConfig sample;
  ParallelConfig parallel;
  std::string source;  // the config file path, for messages
  // Every key as "section.key" with its value after defaults and overrides, in parse order: the effective config
  // the ranks of a job must agree on (train/config_agreement.h).
  std::vector<std::pair<std::string, std::string>> effective;

  void validate() const { validate(true); }
  void validate_straggler_coding() const;  // part of validate()
  void validate_moe() const;  // the parallelism and device MoE trains with so far (part of validate for training)
  // What a config must satisfy: every key's rule and the rules across keys; with for_training, also what
  // `megatrain train` can run (validate_moe). `megatrain simulate` models jobs the trainer cannot run yet.
  void validate(bool for_training) const;
  void validate_ep() const;             // parallel.ep against the model and parallel.dp (part of validate)
  void validate_ep_interleave() const;  // parallel.ep_interleave against ep, pp, tp, train.grad_accum, recompute
  // Micro-batches per pipeline step (1 without pipeline parallelism).
  int pipeline_microbatches() const {
    return parallel.pp > 1 ? (parallel.microbatches > 0 ? parallel.microbatches : parallel.pp) : 1;
  }
};

// One key of the settings table (run_config.cpp), for `megatrain train --help-config` and docs/configuration.md.
struct ConfigKeyDoc {
  std::string section, key;
  std::string type;           // integer, number, bool, string, word (one of a closed set), list of integers, ...
  std::string default_value;  // as TOML spells it
  std::string range;          // the allowed range or spellings ("" = any)
  std::string doc;            // one line
};
// Every key, in the table's order.
std::vector<ConfigKeyDoc> run_config_keys();
// The table as text (`--help-config`) or as Markdown tables, one per section (docs/configuration.md).
std::string run_config_help(bool markdown);

// Parses TOML text (source names it in errors) and applies overrides of the form "section.key=value"
// (value in TOML syntax; bare words are taken as strings).
// ConfigUse::Simulate skips what only the trainer needs (RunConfig::validate_moe): a job to model, not to run.
enum class ConfigUse { Train, Simulate };
RunConfig parse_run_config(const std::string& toml_text, const std::string& source,
                           const std::vector<std::string>& overrides = {}, ConfigUse use = ConfigUse::Train);
RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides = {},
                          ConfigUse use = ConfigUse::Train);

}  // namespace mt
