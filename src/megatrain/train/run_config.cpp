#include "megatrain/train/run_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <fmt/format.h>
#include <toml++/toml.h>

#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"
#include "megatrain/tokenizer/tokenizer.h"
#include "megatrain/model/layout.h"

namespace mt {

namespace {

// train.threads: more threads than cores only slows the kernels down, and libgomp crashes creating ~10^5 threads;
// 1024 is more hardware threads than the hosts megatrain targets have (0 takes them all, whatever their number).
constexpr int kMaxThreads = 1024;

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
      auto v = n->value_exact<bool>();  // exact: toml++ would read an integer as a bool
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
    } else if constexpr (std::is_enum_v<T>) {  // a kind (core/kind.h), spelt as a word
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
          MT_CHECK(std::isfinite(ds.weight) && ds.weight > 0,
                   "{}: {}: the weight of {} is {}: weights must be finite "
                   "and > 0",
                   src_, full, ds.dir, ds.weight);
          for (const DataSource& o : out) MT_CHECK(o.dir != ds.dir, "{}: {} lists {} twice", src_, full, ds.dir);
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
  // ckpt.resume: "auto", "none", or a checkpoint's path (any other non-empty string).
  void get_resume(const char* key, ResumeFrom& out) {
    std::string spelt = out.spelling();
    read(key, spelt);
    MT_CHECK(!spelt.empty(), "{}: {}.{} must be \"auto\", \"none\" or a checkpoint's path (got \"\")", src_, name_,
             key);
    out = spelt == "auto"   ? ResumeFrom{ResumeMode::Auto, ""}
          : spelt == "none" ? ResumeFrom{ResumeMode::None, ""}
                            : ResumeFrom{ResumeMode::Path, spelt};
    effective_.emplace_back(name_ + "." + key, spelt);
  }
  const std::string& name() const { return name_; }
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


// ---- The settings table -------------------------------------------------------------------------------------
// Every key of the run config is one row below: the section and key, the member it sets, its range or spellings, and
// one line of doc. Parsing (in the rows' order, which is also the order of RunConfig::effective), the per-key checks
// of validate(), `megatrain train --help-config` and docs/configuration.md all come from it. The default is the
// member's initial value in the structs of run_config.h, model/config.h and optim/optimizer.h (written once, where
// C++ needs it); the table prints it from a default-constructed RunConfig.
//
// The model's and the optimizer's keys are checked by ModelConfig::validate and OptimConfig::validate, because
// checkpoint manifests and Hugging Face imports fill those structs without a run config; their rows state the same
// bounds (the model's from its kMax* constants) as words. Rules across keys (data.seq_len against
// model.max_seq_len, the pipeline's and tensor parallelism's divisibility, train.trace_steps as a pair) stay in
// validate() as code, after the rows.

// The range of one key. Numeric kinds are checked here; Words is a range checked elsewhere, printed as it is.
struct Rule {
  enum Kind { Any, Positive, AtLeast, InRange, FiniteAtLeast, FinitePositive, ZeroOrRange, ZeroOrAbove, Words };
  Kind kind = Any;
  double lo = 0, hi = 0;
  std::string note;  // appended to the message and the printed range, e.g. " (0: all cores)"; Words: the range

  std::string text() const {
    switch (kind) {
      case Any: return "";
      case Positive: return "> 0" + note;
      case AtLeast: return fmt::format(">= {}{}", lo, note);
      case InRange: return fmt::format("[{}, {}]{}", lo, hi, note);
      case FiniteAtLeast: return fmt::format("finite, >= {}{}", lo, note);
      case FinitePositive: return "finite, > 0" + note;
      case ZeroOrRange: return fmt::format("0{} or [{}, {}]", note, lo, hi);
      case ZeroOrAbove: return fmt::format("0{} or > {}", note, lo);
      case Words: return note;
    }
    return "";
  }
  // Throws kind Config (through validate's caller) naming the key and the value when v is outside the range.
  template <typename T>
  void check(const std::string& src, const std::string& key, T v) const {
    const double x = static_cast<double>(v);
    switch (kind) {
      case Any:
      case Words: return;
      case Positive: MT_CHECK(x > 0, "{}: {} must be positive (got {})", src, key, v); return;
      case AtLeast: MT_CHECK(x >= lo, "{}: {} = {} must be >= {}{}", src, key, v, lo, note); return;
      case InRange:
        MT_CHECK(x >= lo && x <= hi, "{}: {} = {} is out of range: it must be in [{}, {}]{}", src, key, v, lo, hi,
                 note);
        return;
      case FiniteAtLeast:
        MT_CHECK(std::isfinite(x) && x >= lo, "{}: {} = {} is out of range: it must be finite and >= {}{}", src, key, v,
                 lo, note);
        return;
      case FinitePositive:
        MT_CHECK(std::isfinite(x) && x > 0, "{}: {} = {} must be finite and > 0{}", src, key, v, note);
        return;
      case ZeroOrRange:
        MT_CHECK(x == 0 || (x >= lo && x <= hi), "{}: {} = {} is out of range: it must be 0{} or in [{}, {}]", src, key,
                 v, note, lo, hi);
        return;
      case ZeroOrAbove: MT_CHECK(x == 0 || x > lo, "{}: {} = {} must be > {} (or 0{})", src, key, v, lo, note); return;
    }
  }
};

Rule any() { return {Rule::Any, 0, 0, ""}; }
Rule positive(std::string note = "") { return {Rule::Positive, 0, 0, std::move(note)}; }
Rule at_least(double lo, std::string note = "") { return {Rule::AtLeast, lo, 0, std::move(note)}; }
Rule in_range(double lo, double hi, std::string note = "") { return {Rule::InRange, lo, hi, std::move(note)}; }
Rule finite_at_least(double lo, std::string note = "") { return {Rule::FiniteAtLeast, lo, 0, std::move(note)}; }
Rule finite_positive() { return {Rule::FinitePositive, 0, 0, ""}; }
Rule zero_or_range(double lo, double hi, std::string zero) { return {Rule::ZeroOrRange, lo, hi, std::move(zero)}; }
Rule zero_or_above(double lo, std::string zero) { return {Rule::ZeroOrAbove, lo, 0, std::move(zero)}; }
Rule words(std::string range) { return {Rule::Words, 0, 0, std::move(range)}; }

struct Row {
  const char* section;
  const char* key;
  std::string type;   // integer, number, bool, string, one word, list, ...
  std::string range;  // the rule's text, or an enum's spellings
  const char* doc;
  std::function<void(Section&, RunConfig&)> read;     // parses the key into its member (and RunConfig::effective)
  std::function<std::string(const RunConfig&)> show;  // the member's value as a TOML value
  std::function<void(const RunConfig&)> check;        // the rule; empty when there is none here
};

template <typename T>
std::string toml_value(const T& v) {
  if constexpr (std::is_same_v<T, bool>)
    return v ? "true" : "false";
  else if constexpr (std::is_enum_v<T>)
    return fmt::format("\"{}\"", kind_name(v));
  else if constexpr (std::is_same_v<T, std::string>)
    return fmt::format("\"{}\"", v);
  else
    return fmt::format("{}", v);
}

// A row for a scalar member; get(c) returns the member of c (const or not).
template <typename Get>
Row row(const char* section, const char* key, Get get, Rule rule, const char* doc) {
  using T = std::remove_cvref_t<decltype(get(std::declval<RunConfig&>()))>;
  Row r{section, key, "", rule.text(), doc, {}, {}, {}};
  if constexpr (std::is_same_v<T, bool>)
    r.type = "bool";
  else if constexpr (std::is_integral_v<T>)
    r.type = "integer";
  else if constexpr (std::is_floating_point_v<T>)
    r.type = "number";
  else if constexpr (std::is_enum_v<T>)
    r.type = "word", r.range = kind_spellings(T{});
  else
    r.type = "string";
  r.read = [get, key](Section& s, RunConfig& c) { s.get(key, get(c)); };
  r.show = [get](const RunConfig& c) { return toml_value(get(c)); };
  if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
    if (rule.kind != Rule::Any && rule.kind != Rule::Words) {
      const std::string full = fmt::format("{}.{}", section, key);
      r.check = [get, rule, full](const RunConfig& c) { rule.check(c.source, full, get(c)); };
    }
  }
  return r;
}

// A list of integers, each >= lo (train.skip_steps, train.trace_steps, parallel.stage_layers).
template <typename Get>
Row int_list_row(const char* section, const char* key, Get get, int lo, const char* doc) {
  Row r{section, key, "list of integers", fmt::format("each >= {}", lo), doc, {}, {}, {}};
  r.read = [get, key, lo](Section& s, RunConfig& c) { s.get_int_list(key, get(c), lo); };
  r.show = [get](const RunConfig& c) { return fmt::format("[{}]", fmt::join(get(c), ", ")); };
  return r;
}

#define MT_MEMBER(m) \
  [](auto& c) -> auto& { return c.m; }

// [model] moe_*: the mixture of experts (docs/moe.md).
void add_moe_rows(std::vector<Row>& t) {
  t.push_back(row("model", "moe_experts", MT_MEMBER(model.moe_experts),
                  words(fmt::format("[0, {}] (0: dense)", kMaxExperts)),
                  "routed experts in each MoE layer; 0 = a dense model"));
  t.push_back(row("model", "moe_top_k", MT_MEMBER(model.moe_top_k), words("[1, model.moe_experts]"),
                  "experts each token is routed to"));
  t.push_back(row("model", "moe_d_ff", MT_MEMBER(model.moe_d_ff), words(fmt::format("[1, {}] with MoE", kMaxFf)),
                  "each expert's (SwiGLU) hidden width"));
  t.push_back(row("model", "moe_shared_experts", MT_MEMBER(model.moe_shared_experts),
                  words(fmt::format("[0, {}]", kMaxExperts)),
                  "always-on shared experts of width moe_d_ff (DeepSeek, Qwen)"));
  t.push_back(row("model", "moe_every", MT_MEMBER(model.moe_every), words("[1, model.n_layer]"),
                  "every n-th layer (from moe_first_dense on) is a MoE layer"));
  t.push_back(row("model", "moe_first_dense", MT_MEMBER(model.moe_first_dense), words("[0, model.n_layer)"),
                  "the first n layers stay dense"));
  t.push_back(row("model", "moe_router", MT_MEMBER(model.moe_router), any(),
                  "softmax (Mixtral, Qwen) or sigmoid_bias (DeepSeek-V3: sigmoid scores, bias-balanced choice)"));
  t.push_back(row("model", "moe_bias_rate", MT_MEMBER(model.moe_bias_rate), words("finite, >= 0"),
                  "sigmoid_bias: the per-step change of an expert's selection bias"));
  t.push_back(row("model", "moe_aux_loss", MT_MEMBER(model.moe_aux_loss), words("finite, >= 0"),
                  "load-balancing loss coefficient (Switch/GShard: E x sum_e f_e P_e)"));
  t.push_back(row("model", "moe_z_loss", MT_MEMBER(model.moe_z_loss), words("finite, >= 0"),
                  "router z-loss coefficient (mean logsumexp(logits)^2)"));
  t.push_back(row("model", "moe_capacity_factor", MT_MEMBER(model.moe_capacity_factor), words("finite, >= 0"),
                  "0 = dropless; else an expert takes at most ceil(cf x tokens x k / E) assignments"));
}

// [model]
void add_model_rows(std::vector<Row>& t) {
  t.push_back(row("model", "vocab_size", MT_MEMBER(model.vocab_size), words(fmt::format("[1, {}]", kMaxVocab)),
                  "tokens in the vocabulary"));
  t.push_back(row("model", "vocab_pad_to", MT_MEMBER(model.vocab_pad_to),
                  words(fmt::format("[0, {}] (0 or 1: no padding)", kMaxVocabPad)),
                  "the embedding and LM head get a multiple of this many rows (GEMM speed)"));
  t.push_back(row("model", "n_layer", MT_MEMBER(model.n_layer), words(fmt::format("[1, {}]", kMaxLayers)),
                  "transformer layers"));
  t.push_back(row("model", "n_head", MT_MEMBER(model.n_head), words("[1, model.d_model], dividing model.d_model"),
                  "attention heads"));
  t.push_back(row("model", "n_kv_head", MT_MEMBER(model.n_kv_head), words("[0, model.n_head] (0: model.n_head)"),
                  "key/value heads; fewer than n_head is grouped-query attention"));
  t.push_back(row("model", "d_model", MT_MEMBER(model.d_model), words(fmt::format("[1, {}]", kMaxWidth)),
                  "the residual stream's width"));
  t.push_back(row("model", "d_ff", MT_MEMBER(model.d_ff), words(fmt::format("[0, {}] (0: derived)", kMaxFf)),
                  "the MLP's width; 0 = 4 x d_model (gelu) or 8/3 x d_model rounded to 64 (swiglu)"));
  t.push_back(row("model", "max_seq_len", MT_MEMBER(model.max_seq_len), words(fmt::format("[1, {}]", kMaxSeqLen)),
                  "the longest sequence (learned position embeddings have this many rows)"));
  t.push_back(row("model", "norm", MT_MEMBER(model.norm), any(), "LayerNorm (GPT-2) or RMSNorm (Llama)"));
  t.push_back(row("model", "mlp", MT_MEMBER(model.mlp), any(), "GeLU MLP (GPT-2) or SwiGLU (Llama)"));
  t.push_back(row("model", "pos", MT_MEMBER(model.pos), any(), "learned position embeddings (GPT-2) or RoPE (Llama)"));
  t.push_back(row("model", "rope_theta", MT_MEMBER(model.rope_theta), words("finite, > 0"), "RoPE's base frequency"));
  t.push_back(row("model", "rope_scaling", MT_MEMBER(model.rope_scaling), words("0 (none) or finite, > 0"),
                  "RoPE's long-context factor as in Llama 3.1 (8) and 3.2 (32); needs pos = \"rope\""));
  t.push_back(row("model", "rope_low_freq_factor", MT_MEMBER(model.rope_low_freq_factor), words("finite, > 0"),
                  "with rope_scaling: the wavelength band's upper edge is rope_original_max_len / this"));
  t.push_back(row("model", "rope_high_freq_factor", MT_MEMBER(model.rope_high_freq_factor),
                  words("finite, > rope_low_freq_factor"),
                  "with rope_scaling: the band's lower edge is rope_original_max_len / this"));
  t.push_back(row("model", "rope_original_max_len", MT_MEMBER(model.rope_original_max_len),
                  words(fmt::format("[1, {}]", kMaxSeqLen)),
                  "with rope_scaling: the context length the model was first trained at"));
  t.push_back(row("model", "block", MT_MEMBER(model.block), any(),
                  "sequential: x += Attn(LN1 x); x += MLP(LN2 x); parallel (MegaScale): x += Attn(LN x) + MLP(LN x)"));
  t.push_back(row("model", "window", MT_MEMBER(model.window), words("[0, model.max_seq_len]"),
                  "sliding-window attention: token t attends to t-W+1 .. t; 0 = full causal"));
  t.push_back(row("model", "tied_embeddings", MT_MEMBER(model.tied_embeddings), any(),
                  "the LM head shares the token embedding"));
  t.push_back(row("model", "bias", MT_MEMBER(model.bias), any(), "biases in the linear layers and LayerNorm"));
  t.push_back(row("model", "norm_eps", MT_MEMBER(model.norm_eps), words("finite, > 0"),
                  "the epsilon added to the variance in LayerNorm/RMSNorm"));
  t.push_back(row("model", "init_std", MT_MEMBER(model.init_std), words("finite, > 0"),
                  "the standard deviation of the initial weights"));
  {
    Row r{"model",
          "recompute",
          "\"none\", \"all\" or list",
          "layer indices in [0, n_layer)",
          "layers that keep only their input and rerun their forward pass in backward",
          {},
          {},
          {}};
    r.read = [](Section& s, RunConfig& c) { s.get_recompute("recompute", c.model.recompute, c.model.n_layer); };
    r.show = [](const RunConfig& c) { return c.model.recompute.empty() ? std::string("\"none\"") : "[...]"; };
    t.push_back(r);
  }
  t.push_back(row("model", "recompute_act", MT_MEMBER(model.recompute_act), any(),
                  "a GeLU MLP keeps its pre-activation only and recomputes the GeLU output in backward"));
  t.push_back(row("model", "recompute_norm", MT_MEMBER(model.recompute_norm), any(),
                  "each norm keeps its input and statistics and rebuilds its output in backward"));
  add_moe_rows(t);
  t.push_back(row("model", "init_from", MT_MEMBER(init_from), any(),
                  "weights to start from: an HF GPT-2 or Llama model, or a megatrain checkpoint; \"\" = random"));
}

// [data]
void add_data_rows(std::vector<Row>& t) {
  t.push_back(row("data", "dir", MT_MEMBER(data.dir), any(),
                  "a directory of train_*.bin / val_*.bin shards (megatrain prepare-data)"));
  {
    Row r{"data",
          "blend",
          "list of {dir, weight}",
          "weights finite, > 0",
          "several data directories with weights, e.g. [{dir = \"data/web\", weight = 0.7}]; replaces dir",
          {},
          {},
          {}};
    r.read = [](Section& s, RunConfig& c) { s.get_blend("blend", c.data.blend); };
    r.show = [](const RunConfig& c) { return c.data.blend.empty() ? std::string("[]") : "[...]"; };
    t.push_back(r);
  }
  t.push_back(row("data", "batch_size", MT_MEMBER(data.batch_size), positive(),
                  "sequences per micro-batch per data-parallel rank"));
  t.push_back(row("data", "seq_len", MT_MEMBER(data.seq_len), positive(" (at most model.max_seq_len)"),
                  "tokens per sequence"));
  t.push_back(row("data", "shuffle", MT_MEMBER(data.shuffle), any(), "read the windows in a shuffled order"));
  t.push_back(row("data", "seed", MT_MEMBER(data.seed), any(), "the shuffle's seed"));
  t.push_back(row("data", "prefetch", MT_MEMBER(data.prefetch), at_least(0, " (0: synchronous)"),
                  "batches a background thread reads ahead"));
  t.push_back(row("data", "node_loader", MT_MEMBER(data.node_loader), any(),
                  "one reader per node feeds its ranks through shared memory (false: a loader per rank)"));
}

// [optim]
void add_optim_rows(std::vector<Row>& t) {
  t.push_back(row("optim", "name", MT_MEMBER(optim.name), any(), "the optimizer"));
  t.push_back(row("optim", "lr", MT_MEMBER(optim.lr), words("finite, > 0"), "the peak learning rate"));
  t.push_back(row("optim", "min_lr", MT_MEMBER(optim.min_lr), words("finite, in [0, optim.lr]"),
                  "the floor the schedule decays to"));
  t.push_back(row("optim", "schedule", MT_MEMBER(optim.schedule), any(), "the decay after warm-up"));
  t.push_back(row("optim", "warmup_steps", MT_MEMBER(optim.warmup_steps), words(">= 0"), "steps of linear warm-up"));
  t.push_back(row("optim", "beta1", MT_MEMBER(optim.beta1), words("[0, 1)"), "Adam's first-moment decay"));
  t.push_back(row("optim", "beta2", MT_MEMBER(optim.beta2), words("[0, 1)"), "Adam's second-moment decay"));
  t.push_back(row("optim", "eps", MT_MEMBER(optim.eps), words("finite, > 0"), "Adam's epsilon"));
  t.push_back(row("optim", "weight_decay", MT_MEMBER(optim.weight_decay), words("finite, >= 0"),
                  "decoupled weight decay, on matrices and embeddings only"));
  t.push_back(row("optim", "grad_clip", MT_MEMBER(optim.grad_clip), words("finite, >= 0 (0: no clipping)"),
                  "the largest global L2 norm of the gradients"));
}

// [train]
void add_train_rows(std::vector<Row>& t) {
  t.push_back(row("train", "steps", MT_MEMBER(train.steps), positive(), "optimizer steps"));
  t.push_back(row("train", "grad_accum", MT_MEMBER(train.grad_accum), positive(),
                  "micro-batches accumulated per step"));
  t.push_back(row("train", "log_every", MT_MEMBER(train.log_every), positive(), "steps between progress lines"));
  t.push_back(row("train", "eval_every", MT_MEMBER(train.eval_every), at_least(0, " (0: no periodic validation)"),
                  "steps between validation losses"));
  t.push_back(row("train", "eval_batches", MT_MEMBER(train.eval_batches), at_least(0),
                  "global batches per validation"));
  t.push_back(row("train", "seed", MT_MEMBER(train.seed), any(), "the weights' initialisation seed"));
  t.push_back(row("train", "out_dir", MT_MEMBER(train.out_dir), any(),
                  "where metrics.jsonl, checkpoints (by default) and traces go"));
  t.push_back(row("train", "peak_tflops", MT_MEMBER(train.peak_tflops), finite_at_least(0, " (0: measure)"),
                  "the MFU denominator; 0 = measure the backend's matmul peak at start-up"));
  t.push_back(row("train", "threads", MT_MEMBER(train.threads), in_range(0, kMaxThreads, " (0: all cores)"),
                  "OpenMP threads per rank"));
  t.push_back(
      row("train", "device", MT_MEMBER(train.device), any(),
          "cpu (fp32) or cuda (bf16; with several ranks, a GPU per local rank, or shared: parallel.device_plane)"));
  t.push_back(row("train", "attention", MT_MEMBER(train.attention), any(),
                  "cuda only: auto (cuDNN where built with it, else flash), flash (our kernels) or cudnn"));
  t.push_back(row("train", "gemm_tuning", MT_MEMBER(train.gemm_tuning),
                  zero_or_range(2, 64, " (cuBLASLt's heuristic choice)"),
                  "cuda only: time this many cuBLASLt candidates per GEMM shape on its first call, keep the fastest"));
  t.push_back(row("train", "deterministic", MT_MEMBER(train.deterministic), any(),
                  "cuda: runs repeat bit for bit (no float atomics in the backward, deterministic cuDNN engines; "
                  "slower; needs gemm_tuning = 0); cpu: accepted, changes nothing (already deterministic)"));
  t.push_back(int_list_row("train", "skip_steps", MT_MEMBER(train.skip_steps), 1,
                           "steps whose batches are read and dropped unused (e.g. after a NaN that repeats)"));
  t.push_back(int_list_row("train", "trace_steps", MT_MEMBER(train.trace_steps), 1,
                           "[first, last]: steps recorded in the timeline; [] = off"));
  t.push_back(row("train", "spike_window", MT_MEMBER(train.spike_window), at_least(0, " (0: no loss-spike warning)"),
                  "steps whose losses a loss-spike warning compares with"));
  t.push_back(row("train", "spike_sigmas", MT_MEMBER(train.spike_sigmas), finite_positive(),
                  "a loss above mean + this many standard deviations of the window is a spike"));
  t.push_back(row("train", "spike_factor", MT_MEMBER(train.spike_factor), zero_or_above(1, ": no ratio rule"),
                  "a loss above this many times the window's median is a spike"));
  t.push_back(row("train", "sdc_check_every", MT_MEMBER(train.sdc_check_every),
                  at_least(0, " (0: no silent-data-corruption check)"),
                  "steps between checks that the data-parallel replicas hold the same parameters (and at every "
                  "checkpoint step)"));
  t.push_back(row("train", "sdc_rerun_on_spike", MT_MEMBER(train.sdc_rerun_on_spike), any(),
                  "a step whose loss or gradient norm spikes (the spike_* rule, on each) runs again before its "
                  "update; a rank whose gradients differ the second time is a transient fault (kind sdc); cuda: needs "
                  "deterministic"));
}

// [ckpt]
void add_ckpt_rows(std::vector<Row>& t) {
  t.push_back(row("ckpt", "every", MT_MEMBER(ckpt.every), at_least(0, " (0: only at the end)"),
                  "steps between checkpoints"));
  t.push_back(row("ckpt", "keep_last", MT_MEMBER(ckpt.keep_last), at_least(1), "checkpoints kept"));
  t.push_back(row("ckpt", "dir", MT_MEMBER(ckpt.dir), any(), "where checkpoints go; \"\" = <train.out_dir>/ckpt"));
  {
    Row r{"ckpt",
          "resume",
          "string",
          "\"auto\", \"none\" or a checkpoint's path",
          "auto: the newest checkpoint under ckpt.dir, if any; none: start afresh",
          {},
          {},
          {}};
    r.read = [](Section& s, RunConfig& c) { s.get_resume("resume", c.ckpt.resume); };
    r.show = [](const RunConfig& c) { return toml_value(c.ckpt.resume.spelling()); };
    t.push_back(r);
  }
  t.push_back(row("ckpt", "save_final", MT_MEMBER(ckpt.save_final), any(), "write a checkpoint after the last step"));
  t.push_back(row("ckpt", "sharded", MT_MEMBER(ckpt.sharded), any(),
                  "a parallel run writes per-rank shards (false: gather to rank 0)"));
  t.push_back(row("ckpt", "async", MT_MEMBER(ckpt.async), any(),
                  "two-stage save: snapshot to memory, write in the background (false: wait)"));
  t.push_back(row("ckpt", "snapshot_every", MT_MEMBER(ckpt.snapshot_every), at_least(0, " (0: no peer copies)"),
                  "steps between in-memory snapshots copied to a buddy rank"));
  t.push_back(row("ckpt", "one_reader", MT_MEMBER(ckpt.one_reader), any(),
                  "on restore one rank per dp group reads and broadcasts (false: every rank reads)"));
}

// [sample]
void add_sample_rows(std::vector<Row>& t) {
  t.push_back(row("sample", "tokenizer", MT_MEMBER(sample.tokenizer), any(),
                  "a tokenizer directory for the sample; \"\" = the one data.dir was prepared with, else GPT-2's"));
  t.push_back(row("sample", "prompt", MT_MEMBER(sample.prompt), any(), "the sample's prompt"));
  t.push_back(row("sample", "tokens", MT_MEMBER(sample.tokens), at_least(0, " (0: no sample)"),
                  "tokens sampled after training"));
  t.push_back(row("sample", "temperature", MT_MEMBER(sample.temperature), finite_at_least(0),
                  "the sampling temperature"));
  t.push_back(row("sample", "top_k", MT_MEMBER(sample.top_k), at_least(0, " (0: all)"),
                  "sample among the k likeliest tokens"));
  t.push_back(row("sample", "seed", MT_MEMBER(sample.seed), any(), "the sampling seed"));
}

// [parallel]
void add_parallel_rows(std::vector<Row>& t) {
  t.push_back(row("parallel", "dp", MT_MEMBER(parallel.dp), at_least(1), "data-parallel ranks (ZeRO-2)"));
  t.push_back(row("parallel", "pp", MT_MEMBER(parallel.pp), at_least(1), "pipeline stages"));
  t.push_back(row("parallel", "tp", MT_MEMBER(parallel.tp), at_least(1),
                  "tensor-parallel ranks (with sequence parallelism); dp x pp x tp = WORLD_SIZE"));
  t.push_back(row("parallel", "ep", MT_MEMBER(parallel.ep), at_least(1),
                  "expert-parallel ranks (MoE): the experts sharded over ep of the dp ranks; divides parallel.dp"));
  t.push_back(row("parallel", "ep_overlap", MT_MEMBER(parallel.ep_overlap), any(),
                  "overlap the expert all-to-alls with the shared experts' compute"));
  t.push_back(row("parallel", "ep_interleave", MT_MEMBER(parallel.ep_interleave), any(),
                  "run micro-batches in pairs: one's attention while the other's expert dispatch is in flight "
                  "(ep > 1, pp = 1, tp = 1, an even train.grad_accum; keeps two micro-batches' activations)"));
  t.push_back(row("parallel", "bucket_mb", MT_MEMBER(parallel.bucket_mb), at_least(1),
                  "data-parallel gradient bucket size, MiB of fp32"));
  t.push_back(row("parallel", "overlap", MT_MEMBER(parallel.overlap), any(), "overlap communication with compute"));
  t.push_back(row("parallel", "virtual_stages", MT_MEMBER(parallel.virtual_stages), at_least(1),
                  "model chunks per pipeline rank (interleaved 1F1B when > 1)"));
  t.push_back(int_list_row("parallel", "stage_layers", MT_MEMBER(parallel.stage_layers), 1,
                           "layers of each virtual stage, pp x virtual_stages counts; [] = an even split"));
  t.push_back(row("parallel", "microbatches", MT_MEMBER(parallel.microbatches), at_least(0, " (0: parallel.pp)"),
                  "pipeline micro-batches of data.batch_size rows per step"));
  t.push_back(row("parallel", "tp_chunks", MT_MEMBER(parallel.tp_chunks), at_least(1),
                  "row chunks of each overlapped all-gather + GEMM and GEMM + reduce-scatter"));
  t.push_back(row("parallel", "timeout_s", MT_MEMBER(parallel.timeout_s), at_least(1),
                  "seconds a rendezvous or collective may take"));
  t.push_back(row("parallel", "device_plane", MT_MEMBER(parallel.device_plane), any(),
                  "cuda only: nccl (a GPU per local rank), staged (device memory through host memory over Gloo, "
                  "so local ranks may share a GPU) or auto (staged when there are more local ranks than GPUs)"));
  t.push_back(row("parallel", "straggler_coding", MT_MEMBER(parallel.straggler_coding), any(),
                  "straggler-tolerant data parallelism by gradient coding: none, gc (straggler_s slow replicas per "
                  "round), sr-sgc or m-sgc (bursts of the straggler_burst/_window/_lambda model); needs dp >= 2"));
  t.push_back(row("parallel", "straggler_s", MT_MEMBER(parallel.straggler_s), at_least(0),
                  "gc: slow replicas tolerated per round; (s+1) must divide parallel.dp"));
  t.push_back(row("parallel", "straggler_burst", MT_MEMBER(parallel.straggler_burst), at_least(1),
                  "sr-sgc, m-sgc: B, the longest burst of rounds one replica straggles inside a window"));
  t.push_back(row("parallel", "straggler_window", MT_MEMBER(parallel.straggler_window), at_least(2),
                  "sr-sgc, m-sgc: W, the window of rounds (W > straggler_burst)"));
  t.push_back(row("parallel", "straggler_lambda", MT_MEMBER(parallel.straggler_lambda), at_least(1),
                  "sr-sgc, m-sgc: the most distinct straggling replicas inside a window"));
  t.push_back(row("parallel", "straggler_deadline", MT_MEMBER(parallel.straggler_deadline), finite_at_least(1),
                  "with straggler_coding: a replica later than this x the median round time straggles that round"));
}

const std::vector<Row>& settings() {
  static const std::vector<Row> rows = [] {
    std::vector<Row> t;
    add_model_rows(t);
    add_data_rows(t);
    add_optim_rows(t);
    add_train_rows(t);
    add_ckpt_rows(t);
    add_sample_rows(t);
    add_parallel_rows(t);
    return t;
  }();
  return rows;
}

#undef MT_MEMBER

}  // namespace

RunConfig parse_run_config(const std::string& text, const std::string& src, const std::vector<std::string>& overrides,
                           ConfigUse use) {
  toml::table root;
  try {
    root = toml::parse(text, src);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    fail("{}:{}:{}: malformed TOML: {}", src, b.line, b.column, e.description());
  }
  for (auto& ov : overrides) apply_override(root, ov, src);

  std::set<std::string> sections;
  for (const Row& r : settings()) sections.insert(r.section);
  for (auto& [k, v] : root) {
    std::string key(k.str());
    MT_CHECK(sections.count(key), "{}: unknown config section '{}'{}", src, key, suggestion(key, sections));
    MT_CHECK(v.is_table(), "{}: '{}' must be a section ([{}])", src, key, key);
  }
  RunConfig c;
  c.source = src;
  // The rows of a section are adjacent: each section is read in one go, then checked for keys no row knows.
  std::optional<Section> sec;
  for (const Row& r : settings()) {
    if (!sec || sec->name() != r.section) {
      if (sec) sec->check_unknown();
      sec.emplace(root[r.section].as_table(), r.section, src, c.effective);
    }
    r.read(*sec, c);
  }
  if (sec) sec->check_unknown();

  if (c.ckpt.dir.empty()) c.ckpt.dir = c.train.out_dir + "/ckpt";
  c.validate(use == ConfigUse::Train);
  return c;
}

std::vector<ConfigKeyDoc> run_config_keys() {
  const RunConfig defaults;
  std::vector<ConfigKeyDoc> keys;
  for (const Row& r : settings()) keys.push_back({r.section, r.key, r.type, r.show(defaults), r.range, r.doc});
  return keys;
}

std::string run_config_help(bool markdown) {
  std::string out, section;
  for (const ConfigKeyDoc& k : run_config_keys()) {
    if (k.section != section) {
      section = k.section;
      out +=
          markdown
              ? fmt::format("{}### [{}]\n\n| key | default | type | allowed | what it sets |\n|---|---|---|---|---|\n",
                            out.empty() ? "" : "\n", section)
              : fmt::format("{}[{}]\n", out.empty() ? "" : "\n", section);
    }
    if (markdown) {
      auto cell = [](std::string s) {  // a table cell: | would end it
        for (size_t i = 0; (i = s.find('|', i)) != std::string::npos; i += 2) s.replace(i, 1, "\\|");
        return s;
      };
      out += fmt::format("| `{}.{}` | `{}` | {} | {} | {} |\n", k.section, k.key, k.default_value, k.type,
                         cell(k.range), cell(k.doc));
    } else {
      out += fmt::format("  {} = {}\n      {}{}{}: {}\n", k.key, k.default_value, k.type, k.range.empty() ? "" : ", ",
                         k.range, k.doc);
    }
  }
  return out;
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

// Straggler coding's layouts: the core checks the code against dp and train.grad_accum (its errors name the keys);
// here what the training loop does not compose with yet.
void RunConfig::validate_straggler_coding() const {
  if (parallel.straggler_coding == StragglerScheme::None) return;
  const char* scheme = kind_name(parallel.straggler_coding);
  MT_CHECK(parallel.dp >= 2,
           "{}: parallel.straggler_coding = \"{}\" needs parallel.dp >= 2 data-parallel replicas (got {})", source,
           scheme, parallel.dp);
  MT_CHECK(train.device == Device::CPU,
           "{}: parallel.straggler_coding = \"{}\" runs with train.device = \"cpu\" only for now", source, scheme);
  try {
    StragglerCode code(parallel.straggler_code(), parallel.dp, train.grad_accum);
  } catch (const Error& e) {
    fail("{}: parallel.straggler_coding = \"{}\" with parallel.dp = {} and train.grad_accum = {}: {}", source, scheme,
         parallel.dp, train.grad_accum, e.what());
  }
}

RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides, ConfigUse use) {
  MT_CHECK(file_exists(path), "config file {} does not exist", path);
  MT_CHECK(!std::filesystem::is_directory(path), "config file {} is a directory, not a TOML file", path);
  return parse_run_config(read_text_file(path), path, overrides, use);
}

// Expert parallelism (docs/moe.md): the experts sharded over ep of the dp ranks.
void RunConfig::validate_ep() const {
  MT_CHECK(model.moe(),
           "{}: parallel.ep = {} shards the experts of a mixture-of-experts model, and this one has none "
           "(set model.moe_experts, or parallel.ep = 1)",
           source, parallel.ep);
  MT_CHECK(parallel.dp % parallel.ep == 0,
           "{}: parallel.ep = {} must divide parallel.dp = {} (the expert-parallel ranks are carved out of the "
           "data-parallel ones)",
           source, parallel.ep, parallel.dp);
  MT_CHECK(model.moe_experts % parallel.ep == 0,
           "{}: model.moe_experts = {} must be divisible by parallel.ep = {} (each expert-parallel rank holds "
           "model.moe_experts / parallel.ep experts)",
           source, model.moe_experts, parallel.ep);
  MT_CHECK(ckpt.sharded, "{}: parallel.ep = {} saves sharded checkpoints only (set ckpt.sharded = true)", source,
           parallel.ep);
  // Coded replicas skip rounds independently, while an ep group's ranks must run every MoE forward together.
  MT_CHECK(parallel.straggler_coding == StragglerScheme::None,
           "{}: parallel.ep = {} cannot be combined with parallel.straggler_coding (the ranks of an ep group run every "
           "MoE layer together; a replica that skips a round would leave the others waiting)",
           source, parallel.ep);
}

// The interleave of two micro-batches' MoE layers (docs/moe.md): the plain form (no pipeline, no token group) over
// pairs of the step's micro-batches, each layer's activations kept (a recomputed layer's shared buffer would be
// overwritten by the other micro-batch's forward).
void RunConfig::validate_ep_interleave() const {
  MT_CHECK(parallel.ep > 1 && parallel.pp == 1 && parallel.tp == 1,
           "{}: parallel.ep_interleave needs parallel.ep > 1, parallel.pp = 1 and parallel.tp = 1 (got ep = {}, pp = "
           "{}, tp = {})",
           source, parallel.ep, parallel.pp, parallel.tp);
  MT_CHECK(train.grad_accum >= 2 && train.grad_accum % 2 == 0,
           "{}: parallel.ep_interleave runs micro-batches in pairs: train.grad_accum = {} must be even and >= 2",
           source, train.grad_accum);
  MT_CHECK(!model.recompute_norm,
           "{}: parallel.ep_interleave cannot be combined with model.recompute_norm (the norms' outputs live in "
           "scratch the other micro-batch's attention overwrites)",
           source);
  for (bool r : model.recompute)
    MT_CHECK(!r,
             "{}: parallel.ep_interleave cannot be combined with model.recompute (the two micro-batches of a pair "
             "would share the recomputed layers' activations)",
             source);
}

// What MoE (docs/moe.md) trains on so far: the CPU, under any of dp, ep, tp (the experts replicated over tp, each rank
// routing its sequence-parallel rows) and pp; CUDA in one process or under plain dp (the layer's tp and ep exchanges
// are host ones, and pp with MoE has not run on the device).
void RunConfig::validate_moe() const {
  if (train.device == Device::CPU) return;
  MT_CHECK(parallel.ep == 1 && parallel.tp == 1 && parallel.pp == 1,
           "{}: model.moe_experts = {} on train.device = \"cuda\" runs in one process or under data parallelism "
           "(parallel.dp) only for now; parallel.ep ({}), parallel.tp ({}) and parallel.pp ({}) must be 1 there "
           "(they run with MoE on train.device = \"cpu\")",
           source, model.moe_experts, parallel.ep, parallel.tp, parallel.pp);
}

void RunConfig::validate(bool for_training) const {
  try {
    model.validate();
    optim.validate();
  } catch (const Error& e) {
    fail("{}: {}", source, e.what());
  }
  for (const Row& r : settings())
    if (r.check) r.check(*this);
  // Rules across keys.
  MT_CHECK(data.seq_len <= model.max_seq_len, "{}: data.seq_len ({}) exceeds model.max_seq_len ({})", source,
           data.seq_len, model.max_seq_len);
  MT_CHECK(train.trace_steps.empty() || (train.trace_steps.size() == 2 && train.trace_steps[0] <= train.trace_steps[1]),
           "{}: train.trace_steps must be [first, last] with first <= last (e.g. [5, 7]), or [] for no timeline",
           source);
  // Tuning picks each GEMM's algorithm by timing it, so the choice (and its rounding) may differ between runs.
  MT_CHECK(!train.deterministic || train.gemm_tuning == 0,
           "{}: train.deterministic = true and train.gemm_tuning = {} cannot be combined: tuning chooses each GEMM's "
           "algorithm by timing it, so two runs may round differently; set train.gemm_tuning = 0",
           source, train.gemm_tuning);
  if (parallel.ep > 1) validate_ep();
  if (parallel.ep_interleave) validate_ep_interleave();
  if (model.moe() && for_training) validate_moe();
  if (parallel.pp == 1) {
    MT_CHECK(parallel.virtual_stages == 1 && parallel.microbatches <= 1 && parallel.stage_layers.empty(),
             "{}: parallel.virtual_stages ({}), parallel.microbatches ({}) and parallel.stage_layers need "
             "parallel.pp > 1 (use train.grad_accum to accumulate micro-batches)",
             source, parallel.virtual_stages, parallel.microbatches);
  } else {
    const int v = parallel.virtual_stages, m = parallel.microbatches > 0 ? parallel.microbatches : parallel.pp;
    try {
      stage_layer_counts(model, parallel.pp, v, parallel.stage_layers);  // even, or as parallel.stage_layers says
    } catch (const Error& e) {
      fail("{}: {}", source, e.what());
    }
    MT_CHECK(v == 1 || m % parallel.pp == 0,
             "{}: interleaved 1F1B (parallel.virtual_stages = {}) runs micro-batches "
             "in groups of parallel.pp: parallel.microbatches = {} must be a multiple of parallel.pp = {}",
             source, v, m, parallel.pp);
  }
  if (parallel.tp > 1) {
    model.validate_tp(parallel.tp);
    const int64_t rows = static_cast<int64_t>(data.batch_size) * data.seq_len;
    MT_CHECK(
        rows % parallel.tp == 0,
        "{}: sequence parallelism splits the data.batch_size * data.seq_len = {} rows over parallel.tp = {} ranks: "
        "they must divide evenly",
        source, rows, parallel.tp);
  }
  validate_straggler_coding();
  if (!sample.tokenizer.empty()) {
    const std::string missing = Tokenizer::missing_files(sample.tokenizer);
    MT_CHECK(missing.empty(),
             "{}: sample.tokenizer = \"{}\": {} (or set \"\" for the tokenizer data.dir was "
             "prepared with)",
             source, sample.tokenizer, missing);
  }
}

}  // namespace mt
