#include "megatrain/train/run_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <fmt/format.h>
#include <toml++/toml.h>

#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"
#include "megatrain/data/tokenizer.h"
#include "megatrain/model/layout.h"

namespace mt {

namespace {

constexpr int kMaxThreads = 1024;  // train.threads

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string suggestion(const std::string& key, const std::set<std::string>& known) {
  std::string best;
  size_t best_d = 4;
  for (auto& k : known) {
    size_t d = edit_distance(key, k);
    if (d < best_d) best_d = d, best = k;
  }
  return best.empty() ? "" : " (did you mean '" + best + "'?)";
}

// A TOML integer's value; nullopt for any other node. Never node::value<int64_t>() on a float: toml++ converts it
// with a plain cast, undefined behaviour for 1.5e19 (found by tests/fuzz/fuzz_run_config).
std::optional<int64_t> integer_of(const toml::node& n) {
  if (!n.is_integer()) return std::nullopt;
  return n.value<int64_t>();
}

// Reads typed values out of one [section], remembering which keys it consumed and, in `effective`, every key's
// value after defaults and overrides (what the ranks of a job compare at start-up).
class Section {
 public:
  Section(const toml::table* t, std::string name, const std::string& src,
          std::vector<std::pair<std::string, std::string>>& effective)
      : t_(t), name_(std::move(name)), src_(src), effective_(effective) {}

  template <typename T>
  void get(const char* key, T& out) {
    read(key, out);
    if constexpr (std::is_enum_v<T>)
      effective_.emplace_back(name_ + "." + key, kind_name(out));
    else
      effective_.emplace_back(name_ + "." + key, fmt::format("{}", out));  // {} of a double round-trips exactly
  }
  template <typename T>
  void read(const char* key, T& out) {
    known_.insert(key);
    if (!t_) return;
    const toml::node* n = t_->get(key);
    if (!n) return;
    std::string full = name_ + "." + key;
    if constexpr (std::is_same_v<T, bool>) {
      auto v = n->value<bool>();
      MT_CHECK(v.has_value(), "{}: {} must be true or false", src_, full);
      out = *v;
    } else if constexpr (std::is_integral_v<T>) {
      auto v = integer_of(*n);
      MT_CHECK(v.has_value(), "{}: {} must be an integer", src_, full);
      // (A negative value is compared as signed: cast to uint64 it would exceed every maximum.)
      MT_CHECK(*v >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                   (*v < 0 || static_cast<uint64_t>(*v) <= static_cast<uint64_t>(std::numeric_limits<T>::max())),
               "{}: {} = {} is out of range: it must be an integer in [{}, {}]", src_, full, *v,
               std::numeric_limits<T>::min(), std::numeric_limits<T>::max());
      out = static_cast<T>(*v);
    } else if constexpr (std::is_floating_point_v<T>) {
      auto v = n->value<double>();
      MT_CHECK(v.has_value() && (n->is_floating_point() || n->is_integer()), "{}: {} must be a number", src_, full);
      out = static_cast<T>(*v);
    } else if constexpr (std::is_enum_v<T>) {  // a model kind (norm, mlp, pos, block), spelt as a string
      auto v = n->value<std::string>();
      MT_CHECK(v.has_value(), "{}: {} must be a string", src_, full);
      parse_kind(src_ + ": " + full, *v, out);
    } else {
      auto v = n->value<std::string>();
      MT_CHECK(v.has_value(), "{}: {} must be a string", src_, full);
      out = *v;
    }
  }
  // data.blend: a list of {dir = "...", weight = w} tables (inline, or [[data.blend]] entries).
  void get_blend(const char* key, std::vector<DataSource>& out) {
    known_.insert(key);
    if (t_) {
      if (const toml::node* n = t_->get(key)) {
        const std::string full = name_ + "." + key;
        const char* form = "a list of {dir = \"...\", weight = w} tables, e.g. [{dir = \"data/web\", weight = 0.7}, "
                           "{dir = \"data/code\", weight = 0.3}]";
        const toml::array* arr = n->as_array();
        MT_CHECK(arr, "{}: {} must be {}", src_, full, form);
        out.clear();
        for (auto& e : *arr) {
          const toml::table* t = e.as_table();
          MT_CHECK(t, "{}: {} must be {}", src_, full, form);
          DataSource ds;
          for (auto& [k, v] : *t) {
            const std::string kk(k.str());
            if (kk == "dir") {
              auto d = v.value<std::string>();
              MT_CHECK(d && !d->empty(), "{}: {}: dir must be a non-empty string", src_, full);
              ds.dir = *d;
            } else if (kk == "weight") {
              auto w = v.value<double>();
              MT_CHECK(w && (v.is_floating_point() || v.is_integer()), "{}: {}: weight must be a number", src_, full);
              ds.weight = *w;
            } else {
              fail("{}: {}: unknown key '{}' in an entry (an entry has dir and weight)", src_, full, kk);
            }
          }
          MT_CHECK(!ds.dir.empty(), "{}: {}: an entry has no dir", src_, full);
          MT_CHECK(std::isfinite(ds.weight) && ds.weight > 0, "{}: {}: the weight of {} is {}: weights must be finite "
                   "and > 0", src_, full, ds.dir, ds.weight);
          for (const DataSource& o : out)
            MT_CHECK(o.dir != ds.dir, "{}: {} lists {} twice", src_, full, ds.dir);
          out.push_back(ds);
        }
      }
    }
    std::vector<std::string> shown;
    for (const DataSource& d : out) shown.push_back(fmt::format("{}:{}", d.dir, d.weight));
    effective_.emplace_back(name_ + "." + key, fmt::format("[{}]", fmt::join(shown, ",")));
  }
  // A list of integers, each in [lo, INT_MAX] (train.skip_steps).
  void get_int_list(const char* key, std::vector<int>& out, int lo) {
    known_.insert(key);
    if (t_) {
      if (const toml::node* n = t_->get(key)) {
        const std::string full = name_ + "." + key;
        const toml::array* arr = n->as_array();
        MT_CHECK(arr, "{}: {} must be a list of integers (e.g. [3, 7])", src_, full);
        out.clear();
        for (auto& e : *arr) {
          auto v = integer_of(e);
          MT_CHECK(v.has_value(), "{}: {} must hold integers only", src_, full);
          MT_CHECK(*v >= lo && *v <= std::numeric_limits<int>::max(), "{}: {} holds {}: each must be in [{}, {}]", src_,
                   full, *v, lo, std::numeric_limits<int>::max());
          out.push_back(static_cast<int>(*v));
        }
      }
    }
    effective_.emplace_back(name_ + "." + key, fmt::format("[{}]", fmt::join(out, ",")));
  }
  // model.recompute: "none" | "all" | [layer indices]
  void get_recompute(const char* key, std::vector<bool>& out, int n_layer) {
    read_recompute(key, out, n_layer);
    std::vector<size_t> layers;
    for (size_t i = 0; i < out.size(); ++i)
      if (out[i]) layers.push_back(i);
    effective_.emplace_back(name_ + "." + key, fmt::format("[{}]", fmt::join(layers, ",")));
  }
  void read_recompute(const char* key, std::vector<bool>& out, int n_layer) {
    known_.insert(key);
    if (!t_) return;
    const toml::node* n = t_->get(key);
    if (!n) return;
    std::string full = name_ + "." + key;
    if (n_layer < 1 || n_layer > (1 << 16)) return;  // model validation names the bad n_layer; nothing to index here
    out.assign(n_layer, false);
    if (auto s = n->value<std::string>()) {
      MT_CHECK(*s == "none" || *s == "all", "{}: {} must be \"none\", \"all\" or a list of layer indices (got \"{}\")",
               src_, full, *s);
      if (*s == "all") out.assign(n_layer, true);
      if (*s == "none") out.clear();
      return;
    }
    const toml::array* arr = n->as_array();
    MT_CHECK(arr, "{}: {} must be \"none\", \"all\" or a list of layer indices", src_, full);
    for (auto& e : *arr) {
      auto v = integer_of(e);
      MT_CHECK(v && *v >= 0 && *v < n_layer, "{}: {} has an invalid layer index (layers are 0..{})", src_, full,
               n_layer - 1);
      out[*v] = true;
    }
  }
  void check_unknown() const {
    if (!t_) return;
    for (auto& [k, v] : *t_) {
      std::string key(k.str());
      MT_CHECK(known_.count(key), "{}: unknown config key '{}.{}'{}", src_, name_, key, suggestion(key, known_));
    }
  }

 private:
  const toml::table* t_;
  std::string name_, src_;
  std::set<std::string> known_;
  std::vector<std::pair<std::string, std::string>>& effective_;
};

void apply_override(toml::table& root, const std::string& ov, const std::string& src) {
  std::string s = ov;
  if (s.rfind("--", 0) == 0) s = s.substr(2);
  auto eq = s.find('=');
  MT_CHECK(eq != std::string::npos, "override '{}' must look like --section.key=value", ov);
  std::string path = s.substr(0, eq), value = s.substr(eq + 1);
  auto dot = path.find('.');
  MT_CHECK(dot != std::string::npos && dot > 0 && dot + 1 < path.size() && path.find('.', dot + 1) == std::string::npos,
           "override '{}' must name section.key", ov);
  std::string section = path.substr(0, dot), key = path.substr(dot + 1);
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    parsed = toml::table{{"v", value}};  // a bare word: take it as a string
  }
  if (!root.contains(section)) root.insert(section, toml::table{});
  toml::table* sec = root[section].as_table();
  MT_CHECK(sec, "{}: '{}' is not a section", src, section);
  sec->insert_or_assign(key, *parsed.get("v"));
}

}  // namespace

RunConfig parse_run_config(const std::string& text, const std::string& src, const std::vector<std::string>& overrides) {
  toml::table root;
  try {
    root = toml::parse(text, src);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    fail("{}:{}:{}: malformed TOML: {}", src, b.line, b.column, e.description());
  }
  for (auto& ov : overrides) apply_override(root, ov, src);

  static const std::set<std::string> kSections = {"model", "data", "optim", "train", "ckpt", "sample", "parallel"};
  for (auto& [k, v] : root) {
    std::string key(k.str());
    MT_CHECK(kSections.count(key), "{}: unknown config section '{}'{}", src, key, suggestion(key, kSections));
    MT_CHECK(v.is_table(), "{}: '{}' must be a section ([{}])", src, key, key);
  }
  RunConfig c;
  c.source = src;
  auto sec = [&](const char* n) { return Section(root[n].as_table(), n, src, c.effective); };

  Section m = sec("model");
  ModelConfig& mc = c.model;
  m.get("vocab_size", mc.vocab_size);
  m.get("vocab_pad_to", mc.vocab_pad_to);
  m.get("n_layer", mc.n_layer);
  m.get("n_head", mc.n_head);
  m.get("n_kv_head", mc.n_kv_head);
  m.get("d_model", mc.d_model);
  m.get("d_ff", mc.d_ff);
  m.get("max_seq_len", mc.max_seq_len);
  m.get("norm", mc.norm);
  m.get("mlp", mc.mlp);
  m.get("pos", mc.pos);
  m.get("rope_theta", mc.rope_theta);
  m.get("rope_scaling", mc.rope_scaling);
  m.get("rope_low_freq_factor", mc.rope_low_freq_factor);
  m.get("rope_high_freq_factor", mc.rope_high_freq_factor);
  m.get("rope_original_max_len", mc.rope_original_max_len);
  m.get("block", mc.block);
  m.get("window", mc.window);
  m.get("tied_embeddings", mc.tied_embeddings);
  m.get("bias", mc.bias);
  m.get("norm_eps", mc.norm_eps);
  m.get("init_std", mc.init_std);
  m.get_recompute("recompute", mc.recompute, mc.n_layer);
  m.get("recompute_act", mc.recompute_act);
  m.get("recompute_norm", mc.recompute_norm);
  m.get("init_from", c.init_from);
  m.check_unknown();

  Section d = sec("data");
  d.get("dir", c.data.dir);
  d.get_blend("blend", c.data.blend);  // when set, it is what the loaders read (data.dir is not: the start line says so)
  d.get("batch_size", c.data.batch_size);
  d.get("seq_len", c.data.seq_len);
  d.get("shuffle", c.data.shuffle);
  d.get("seed", c.data.seed);
  d.get("prefetch", c.data.prefetch);
  d.check_unknown();

  Section o = sec("optim");
  o.get("name", c.optim.name);
  o.get("lr", c.optim.lr);
  o.get("min_lr", c.optim.min_lr);
  o.get("schedule", c.optim.schedule);
  o.get("warmup_steps", c.optim.warmup_steps);
  o.get("beta1", c.optim.beta1);
  o.get("beta2", c.optim.beta2);
  o.get("eps", c.optim.eps);
  o.get("weight_decay", c.optim.weight_decay);
  o.get("grad_clip", c.optim.grad_clip);
  o.check_unknown();

  Section t = sec("train");
  t.get("steps", c.train.steps);
  t.get("grad_accum", c.train.grad_accum);
  t.get("log_every", c.train.log_every);
  t.get("eval_every", c.train.eval_every);
  t.get("eval_batches", c.train.eval_batches);
  t.get("seed", c.train.seed);
  t.get("out_dir", c.train.out_dir);
  t.get("peak_tflops", c.train.peak_tflops);
  t.get("threads", c.train.threads);
  t.get("device", c.train.device);
  t.get("attention", c.train.attention);
  t.get("gemm_tuning", c.train.gemm_tuning);
  t.get_int_list("skip_steps", c.train.skip_steps, 1);
  t.get_int_list("trace_steps", c.train.trace_steps, 1);
  t.get("spike_window", c.train.spike_window);
  t.get("spike_sigmas", c.train.spike_sigmas);
  t.get("spike_factor", c.train.spike_factor);
  t.check_unknown();

  Section k = sec("ckpt");
  k.get("every", c.ckpt.every);
  k.get("keep_last", c.ckpt.keep_last);
  k.get("dir", c.ckpt.dir);
  k.get("resume", c.ckpt.resume);
  k.get("save_final", c.ckpt.save_final);
  k.get("sharded", c.ckpt.sharded);
  k.get("async", c.ckpt.async);
  k.get("snapshot_every", c.ckpt.snapshot_every);
  k.get("one_reader", c.ckpt.one_reader);
  k.check_unknown();

  Section s = sec("sample");
  s.get("tokenizer", c.sample.tokenizer);
  s.get("prompt", c.sample.prompt);
  s.get("tokens", c.sample.tokens);
  s.get("temperature", c.sample.temperature);
  s.get("top_k", c.sample.top_k);
  s.get("seed", c.sample.seed);
  s.check_unknown();

  Section par = sec("parallel");
  par.get("dp", c.parallel.dp);
  par.get("pp", c.parallel.pp);
  par.get("tp", c.parallel.tp);
  par.get("bucket_mb", c.parallel.bucket_mb);
  par.get("overlap", c.parallel.overlap);
  par.get("virtual_stages", c.parallel.virtual_stages);
  par.get_int_list("stage_layers", c.parallel.stage_layers, 1);
  par.get("microbatches", c.parallel.microbatches);
  par.get("tp_chunks", c.parallel.tp_chunks);
  par.get("timeout_s", c.parallel.timeout_s);
  par.check_unknown();

  if (c.ckpt.dir.empty()) c.ckpt.dir = c.train.out_dir + "/ckpt";
  c.validate();
  return c;
}

std::string blend_description(const DataConfig& d) {
  double sum = 0;
  for (const DataSource& s : d.blend) sum += s.weight;
  std::vector<std::string> parts;
  for (const DataSource& s : d.blend) parts.push_back(fmt::format("{} {:.3g}%", s.dir, 100 * s.weight / sum));
  return fmt::format("a blend of {}; data.dir is not read", fmt::join(parts, ", "));
}

std::string data_dirs(const DataConfig& d) {
  if (d.blend.empty()) return d.dir;
  std::vector<std::string> dirs;
  for (const DataSource& s : d.blend) dirs.push_back(s.dir);
  return fmt::format("the blend of {}", fmt::join(dirs, ", "));
}

RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides) {
  MT_CHECK(file_exists(path), "config file {} does not exist", path);
  MT_CHECK(!std::filesystem::is_directory(path), "config file {} is a directory, not a TOML file", path);
  return parse_run_config(read_text_file(path), path, overrides);
}

void RunConfig::validate() const {
  try {
    model.validate();
    optim.validate();
  } catch (const Error& e) {
    fail("{}: {}", source, e.what());
  }
  MT_CHECK(data.batch_size > 0, "{}: data.batch_size must be positive (got {})", source, data.batch_size);
  MT_CHECK(data.seq_len > 0, "{}: data.seq_len must be positive (got {})", source, data.seq_len);
  MT_CHECK(data.seq_len <= model.max_seq_len, "{}: data.seq_len ({}) exceeds model.max_seq_len ({})", source,
           data.seq_len, model.max_seq_len);
  MT_CHECK(data.prefetch >= 0, "{}: data.prefetch must be >= 0", source);
  MT_CHECK(train.steps > 0, "{}: train.steps must be positive (got {})", source, train.steps);
  MT_CHECK(train.grad_accum > 0, "{}: train.grad_accum must be positive (got {})", source, train.grad_accum);
  MT_CHECK(train.log_every > 0, "{}: train.log_every must be positive", source);
  MT_CHECK(train.eval_every >= 0 && train.eval_batches >= 0, "{}: train.eval_every/eval_batches must be >= 0", source);
  MT_CHECK(std::isfinite(train.peak_tflops) && train.peak_tflops >= 0,
           "{}: train.peak_tflops = {} is out of range: it must be finite and >= 0 (0: measure)", source,
           train.peak_tflops);
  // More threads than cores only slows the kernels down, and libgomp crashes creating ~10^5 threads; 1024 is more
  // hardware threads than the hosts megatrain targets have (0 takes them all, whatever their number).
  MT_CHECK(train.threads >= 0 && train.threads <= kMaxThreads,
           "{}: train.threads = {} is out of range: it must be in [0, {}] (0: all cores)", source, train.threads,
           kMaxThreads);
  MT_CHECK(train.device == "cpu" || train.device == "cuda", "{}: train.device must be \"cpu\" or \"cuda\" (got \"{}\")",
           source, train.device);
  MT_CHECK(train.attention == "auto" || train.attention == "flash" || train.attention == "cudnn",
           "{}: train.attention must be \"auto\" (cuDNN where built with it, else flash), \"flash\" (our kernels) or "
           "\"cudnn\" (cuDNN's fused attention) (got \"{}\")", source, train.attention);
  MT_CHECK(train.gemm_tuning == 0 || (train.gemm_tuning >= 2 && train.gemm_tuning <= 64),
           "{}: train.gemm_tuning = {} is out of range: 0 (cuBLASLt's heuristic choice) or the number of candidate "
           "algorithms to time per GEMM shape, 2 to 64", source, train.gemm_tuning);
  MT_CHECK(train.trace_steps.empty() || (train.trace_steps.size() == 2 && train.trace_steps[0] <= train.trace_steps[1]),
           "{}: train.trace_steps must be [first, last] with first <= last (e.g. [5, 7]), or [] for no timeline",
           source);
  MT_CHECK(train.spike_window >= 0, "{}: train.spike_window = {} must be >= 0 (0: no loss-spike warning)", source,
           train.spike_window);
  MT_CHECK(std::isfinite(train.spike_sigmas) && train.spike_sigmas > 0,
           "{}: train.spike_sigmas = {} must be finite and > 0", source, train.spike_sigmas);
  MT_CHECK(std::isfinite(train.spike_factor) && (train.spike_factor == 0 || train.spike_factor > 1),
           "{}: train.spike_factor = {} must be > 1 (or 0: no ratio rule)", source, train.spike_factor);
  MT_CHECK(ckpt.every >= 0 && ckpt.keep_last >= 1, "{}: ckpt.every must be >= 0 and ckpt.keep_last >= 1", source);
  MT_CHECK(ckpt.snapshot_every >= 0, "{}: ckpt.snapshot_every = {} is out of range: it must be >= 0 (0: no peer copies)",
           source, ckpt.snapshot_every);
  MT_CHECK(parallel.dp >= 1 && parallel.pp >= 1 && parallel.tp >= 1,
           "{}: parallel.dp, parallel.pp and parallel.tp must be >= 1 (got {}, {}, {})", source, parallel.dp,
           parallel.pp, parallel.tp);
  MT_CHECK(parallel.virtual_stages >= 1 && parallel.microbatches >= 0,
           "{}: parallel.virtual_stages must be >= 1 and parallel.microbatches >= 0 (got {}, {})", source,
           parallel.virtual_stages, parallel.microbatches);
  if (parallel.pp == 1) {
    MT_CHECK(parallel.virtual_stages == 1 && parallel.microbatches <= 1 && parallel.stage_layers.empty(),
             "{}: parallel.virtual_stages ({}), parallel.microbatches ({}) and parallel.stage_layers need "
             "parallel.pp > 1 (use train.grad_accum to accumulate micro-batches)", source, parallel.virtual_stages,
             parallel.microbatches);
  } else {
    const int v = parallel.virtual_stages, m = parallel.microbatches > 0 ? parallel.microbatches : parallel.pp;
    try {
      stage_layer_counts(model, parallel.pp, v, parallel.stage_layers);  // even, or as parallel.stage_layers says
    } catch (const Error& e) {
      fail("{}: {}", source, e.what());
    }
    MT_CHECK(v == 1 || m % parallel.pp == 0, "{}: interleaved 1F1B (parallel.virtual_stages = {}) runs micro-batches "
             "in groups of parallel.pp: parallel.microbatches = {} must be a multiple of parallel.pp = {}", source, v,
             m, parallel.pp);
  }
  MT_CHECK(parallel.tp_chunks >= 1, "{}: parallel.tp_chunks must be >= 1 (got {})", source, parallel.tp_chunks);
  if (parallel.tp > 1) {
    model.validate_tp(parallel.tp);
    const int64_t rows = static_cast<int64_t>(data.batch_size) * data.seq_len;
    MT_CHECK(rows % parallel.tp == 0,
             "{}: sequence parallelism splits the data.batch_size * data.seq_len = {} rows over parallel.tp = {} ranks: "
             "they must divide evenly", source, rows, parallel.tp);
  }
  MT_CHECK(parallel.bucket_mb >= 1 && parallel.timeout_s >= 1, "{}: parallel.bucket_mb and parallel.timeout_s must be >= 1",
           source);
  if (!sample.tokenizer.empty()) {
    const std::string missing = Tokenizer::missing_files(sample.tokenizer);
    MT_CHECK(missing.empty(), "{}: sample.tokenizer = \"{}\": {} (or set \"\" for the tokenizer data.dir was "
             "prepared with)", source, sample.tokenizer, missing);
  }
  MT_CHECK(sample.tokens >= 0 && sample.top_k >= 0 && sample.temperature >= 0,
           "{}: sample.tokens/top_k/temperature must be >= 0", source);
  MT_CHECK(std::isfinite(sample.temperature), "{}: sample.temperature = {} is out of range: it must be finite and >= 0",
           source, sample.temperature);
}

}  // namespace mt
