// The flags of a small training job, the one end-to-end test file after another trains: a very small GPT on the
// Brown shards, a step in a fraction of a second on one core. A test names only what it changes:
//   SmallJob(out).steps(5).batch(2).with("--parallel.dp=2")       -> args() for a launcher, line() for a shell
//   SmallJob::gpt2(out).threads(2).args()                          -> parse_run_config("", "test", ...)
// The flags are `--key=value`, one per key in the order first set, then the with() flags as given: a with() flag
// that names a key again wins (the last of a key counts), as the flags a test appends always did.
#pragma once
#include <algorithm>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "megatrain.h"
#include "test_util.h"

namespace mt::test {

class SmallJob {
 public:
  // On the small-vocabulary Brown shards (kSmallBrown, model.vocab_size = kSmallVocab): 2 layers, d_model 64, 2
  // heads, 64 positions; 4 rows of 32 tokens a step; lr 3e-3 after 2 warm-up steps; no evaluation, no sample; a
  // log line every 1000 steps; one thread. Writes to `out` (no train.out_dir flag when empty).
  explicit SmallJob(const std::string& out = "") {
    set("data.dir", kSmallBrown).set("train.out_dir", out).set("model.vocab_size", kSmallVocab);
    set("model.n_layer", 2).set("model.d_model", 64).set("model.n_head", 2).set("model.max_seq_len", 64);
    set("data.seq_len", 32).set("data.batch_size", 4).set("optim.lr", "3e-3").set("optim.warmup_steps", 2);
    set("train.eval_every", 0).set("sample.tokens", 0).set("train.log_every", 1000).set("train.threads", 1);
    if (out.empty()) unset("train.out_dir");
  }
  // The same job on the Brown shards in GPT-2's vocabulary (kGpt2Brown; no model.vocab_size flag).
  static SmallJob gpt2(const std::string& out = "") {
    SmallJob j(out);
    return std::move(j.set("data.dir", kGpt2Brown).unset("model.vocab_size"));
  }

  // --key=value: in its place when the key is set already, else after the others.
  SmallJob& set(const std::string& key, const std::string& value) {
    for (auto& kv : flags_)
      if (kv.first == key) {
        kv.second = value;
        return *this;
      }
    flags_.emplace_back(key, value);
    return *this;
  }
  SmallJob& set(const std::string& key, const char* value) { return set(key, std::string(value)); }
  SmallJob& set(const std::string& key, int value) { return set(key, std::to_string(value)); }
  // No flag for the key: the config's default.
  SmallJob& unset(const std::string& key) {
    flags_.erase(std::remove_if(flags_.begin(), flags_.end(), [&](const auto& kv) { return kv.first == key; }),
                 flags_.end());
    return *this;
  }

  SmallJob& out(const std::string& dir) { return set("train.out_dir", dir); }
  SmallJob& data(const std::string& dir) { return set("data.dir", dir); }
  SmallJob& steps(int n) { return set("train.steps", n); }
  SmallJob& batch(int rows) { return set("data.batch_size", rows); }
  SmallJob& threads(int n) { return set("train.threads", n); }
  SmallJob& log_every(int n) { return set("train.log_every", n); }
  // The model's shape: layers, width, heads and positions.
  SmallJob& model(int n_layer, int d_model, int n_head, int max_seq_len) {
    return set("model.n_layer", n_layer)
        .set("model.d_model", d_model)
        .set("model.n_head", n_head)
        .set("model.max_seq_len", max_seq_len);
  }

  // Flags after the keyed ones, in order: one flag a string, or for with(string) several separated by spaces
  // ("--parallel.dp=2 --parallel.tp=2").
  SmallJob& with(const std::vector<std::string>& flags) {
    extra_.insert(extra_.end(), flags.begin(), flags.end());
    return *this;
  }
  SmallJob& with(std::initializer_list<std::string> flags) {
    extra_.insert(extra_.end(), flags.begin(), flags.end());
    return *this;
  }
  SmallJob& with(const std::string& flags) {
    for (size_t b = 0, e; b < flags.size(); b = e + 1) {
      e = flags.find(' ', b);
      if (e == std::string::npos) e = flags.size();
      if (e > b) extra_.push_back(flags.substr(b, e - b));
    }
    return *this;
  }
  SmallJob& with(const char* flags) { return with(std::string(flags)); }

  // The flags, one string each (for parse_run_config, or a launcher's argv after "train").
  std::vector<std::string> args() const {
    std::vector<std::string> a;
    for (const auto& [k, v] : flags_) a.push_back("--" + k + "=" + v);
    a.insert(a.end(), extra_.begin(), extra_.end());
    return a;
  }
  // The flags for a shell command line, each after a space: kMegatrain + " train" + job.line(). (No flag here holds a
  // space or a shell character.)
  std::string line() const { return joined(args()); }

  // " a b c": each string after a space.
  static std::string joined(const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& x : v) s += " " + x;
    return s;
  }

 private:
  std::vector<std::pair<std::string, std::string>> flags_;
  std::vector<std::string> extra_;
};

}  // namespace mt::test
