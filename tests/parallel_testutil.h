// Shared by the end-to-end parallelism tests (parallel_dp_test, parallel_tp_test, parallel_pp_test): the Brown
// shards, the common training flags, running `megatrain` and reading its metrics, and the comparison of two runs
// (per-step losses, then the final checkpoints tensor by tensor).
#pragma once
#include "test_util.h"
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "megatrain/ckpt/checkpoint.h"
#include "megatrain/core/error.h"

namespace ptest {

namespace fs = std::filesystem;

inline const std::string kBin = std::string(MT_BINARY_DIR) + "/megatrain";
inline const std::string kData = std::string(MT_BINARY_DIR) + "/test-data/brown-dp";

// c_attn rows of the common config (d_model 64, plain multi-head): [q | k | v], 64 each.
inline constexpr size_t kQkvWidth = 3 * 64;

// The Brown shards, prepared once per build tree (shared by all three tests).
inline void prepare() { mt::test::prepare_brown_once(kBin, kData); }

// The flags every run of these tests shares: a small GPT (n_layer layers, d_model 64, 4 heads) for 5 steps on the
// Brown shards, writing to `out`; `extra` is appended (e.g. " --optim.eps=1e-6").
inline std::string common_args(const std::string& out, int batch, int n_layer, const std::string& extra = "") {
  return " --data.dir=" + kData + " --train.out_dir=" + out + " --model.n_layer=" + std::to_string(n_layer) +
         " --model.d_model=64 --model.n_head=4 --model.max_seq_len=32 --data.seq_len=32"
         " --data.batch_size=" + std::to_string(batch) +
         " --optim.lr=3e-3 --optim.warmup_steps=2 --train.eval_every=0 --sample.tokens=0 --train.steps=5"
         " --train.log_every=100 --train.threads=1 --ckpt.resume=none --parallel.bucket_mb=1" + extra;
}

// `::testing::TempDir()/name`, removed first so a run starts from nothing.
inline std::string fresh_dir(const std::string& name) {
  std::string d = ::testing::TempDir() + "/" + name;
  fs::remove_all(d);
  return d;
}

// The two output folders of a comparison, `<prefix>_single_<name>` and `<prefix>_multi_<name>`, both fresh.
inline std::pair<std::string, std::string> fresh_pair(const std::string& prefix, const std::string& name) {
  std::string single = fresh_dir(prefix + "_single_" + name);
  return {single, fresh_dir(prefix + "_multi_" + name)};
}

// The step-3 checkpoint of a run with --ckpt.every=3.
inline std::string step3(const std::string& out) { return out + "/ckpt/step_00000003"; }

// Runs a command (output discarded); it must succeed.
inline void run(const std::string& cmd) { ASSERT_EQ(std::system((cmd + " > /dev/null 2>&1").c_str()), 0) << cmd; }

// Runs a command that must fail and returns what it printed (stdout and stderr, kept in `log`).
inline std::string failing_output(const std::string& cmd, const std::string& log, const std::string& what) {
  int rc = std::system((cmd + " > " + log + " 2>&1").c_str());
  EXPECT_NE(rc, 0) << what;
  std::ifstream f(log);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

using mt::test::error_of;

// The per-step training losses of a run, from its metrics.jsonl.
inline std::vector<double> losses(const std::string& out) {
  std::vector<double> l;
  std::ifstream f(out + "/metrics.jsonl");
  std::string line;
  while (std::getline(f, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["kind"] == "train") l.push_back(j["loss"].get<double>());
  }
  return l;
}

// A run resumed at step 3 of 5 logs steps 4 and 5: each must match steps 4 and 5 of the uninterrupted run `full`.
inline void expect_resumed_tail(const std::vector<double>& full, std::initializer_list<std::vector<double>> resumed) {
  for (const auto& r : resumed) ASSERT_EQ(r.size(), 2u);
  for (int i = 0; i < 2; ++i)
    for (const auto& r : resumed) EXPECT_NEAR(full[3 + i], r[i], 1e-5 * full[3 + i]);
}

// How expect_same_run compares the final checkpoints. The key bias (the k part of attn.c_attn.bias) has an
// exactly zero true gradient (softmax ignores a constant added to every score), so what Adam makes of its rounding
// noise differs with any change of summation order; the two modes treat it differently.
enum class Compare {
  // Parameters only (model.safetensors), each tensor within 1e-5 relative by the norm of the difference with the
  // key bias left out; the key bias counts only in a whole-model check (1e-5 relative).
  kParamsWholeModel,
  // Parameters (1e-5 relative) and optimizer moments (1e-3 relative: the second moment of a ~0 gradient element
  // is dominated by rounding), tensor names and shapes equal; the key bias is checked in absolute terms (1e-4).
  kParamsAndMoments,
};

// Two runs of 5 steps agree: per-step losses within 1e-5 relative, then the final checkpoints as `mode` says.
inline void expect_same_run(const std::string& a, const std::string& b, Compare mode) {
  using mt::Checkpoint;
  using mt::TensorData;
  std::vector<double> la = losses(a), lb = losses(b);
  ASSERT_EQ(la.size(), 5u);
  ASSERT_EQ(lb.size(), la.size());
  for (size_t i = 0; i < la.size(); ++i) EXPECT_NEAR(la[i], lb[i], 1e-5 * std::abs(la[i])) << "step " << i + 1;
  Checkpoint ca = Checkpoint::load(a + "/ckpt"), cb = Checkpoint::load(b + "/ckpt");
  const size_t k0 = kQkvWidth / 3, k1 = 2 * kQkvWidth / 3;  // the key part of c_attn.bias

  if (mode == Compare::kParamsWholeModel) {
    double all_d = 0, all_s = 0;
    for (const std::string& n : ca.tensor_names("model.safetensors")) {
      const TensorData& x = ca.get(n);
      const TensorData& y = cb.get(n);
      ASSERT_EQ(x.nbytes, y.nbytes) << n;
      const float* p = static_cast<const float*>(x.data);
      const float* q = static_cast<const float*>(y.data);
      size_t skip_begin = 0, skip_end = 0;
      if (n.size() > 16 && n.compare(n.size() - 16, 16, "attn.c_attn.bias") == 0) skip_begin = k0, skip_end = k1;
      double d = 0, s = 0;
      for (size_t i = 0; i < x.nbytes / 4; ++i) {
        double e = double(p[i]) - q[i];
        all_d += e * e;
        all_s += double(p[i]) * p[i];
        if (i >= skip_begin && i < skip_end) continue;
        d += e * e, s += double(p[i]) * p[i];
      }
      EXPECT_LE(std::sqrt(d), 1e-5 * std::sqrt(s) + 1e-12) << n;
    }
    EXPECT_LE(std::sqrt(all_d), 1e-5 * std::sqrt(all_s)) << "whole model";
    return;
  }

  for (const std::string& file : {std::string("model.safetensors"), std::string("optim.safetensors")}) {
    auto names = ca.tensor_names(file);
    ASSERT_EQ(names, cb.tensor_names(file));
    for (const std::string& n : names) {
      const TensorData& x = ca.get(n);
      const TensorData& y = cb.get(n);
      ASSERT_EQ(x.shape, y.shape) << n;
      const float* p = static_cast<const float*>(x.data);
      const float* q = static_cast<const float*>(y.data);
      const bool kbias = n.ends_with("attn.c_attn.bias");
      const size_t b0 = kbias ? k0 : 0, b1 = kbias ? k1 : 0;
      double d = 0, s = 0, dk = 0;
      for (size_t i = 0; i < x.nbytes / 4; ++i) {
        const double e = (p[i] - q[i]) * double(p[i] - q[i]);
        if (i >= b0 && i < b1)
          dk += e;
        else
          d += e, s += p[i] * double(p[i]);
      }
      EXPECT_LE(std::sqrt(dk), 1e-4) << n << " (key bias part)";
      const double tol = file == "model.safetensors" ? 1e-5 : 1e-3;
      EXPECT_LE(std::sqrt(d), tol * std::sqrt(s) + 1e-12) << n;
    }
  }
}

// INSTANTIATE_TEST_SUITE_P name generator for parameter structs with a `name`.
struct CaseName {
  template <class P>
  std::string operator()(const ::testing::TestParamInfo<P>& info) const {
    return info.param.name;
  }
};

}  // namespace ptest
