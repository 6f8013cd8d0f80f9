// Shared by the end-to-end parallelism tests (parallel_dp_test, parallel_tp_test, parallel_pp_test): the Brown
// shards, the common training flags (a SmallJob), running `megatrain` and reading its metrics, and the comparison of a layout's
// run with one process up to a noise floor measured in the same test (see "equivalence" below).
#pragma once
#include "files.h"
#include "megatrain.h"
#include "noise_floor.h"
#include "small_job.h"
#include "test_util.h"
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "megatrain/ckpt/checkpoint.h"
#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"

namespace ptest {

namespace fs = std::filesystem;

using mt::test::fresh_dir;
using mt::test::kMegatrain;
using mt::test::kSmallBrown;

// The Brown shards, prepared once per build tree (shared by all three tests).
inline void prepare() { mt::test::prepare_small_brown(); }

// The flags every run of these tests shares: a small GPT (n_layer layers, d_model 64, 4 heads, the small test
// vocabulary) for 5 steps on the Brown shards, writing to `out`; `extra` is appended (e.g. " --optim.eps=1e-6").
inline std::string common_args(const std::string& out, int batch, int n_layer, const std::string& extra = "") {
  return mt::test::SmallJob(out)
      .model(n_layer, 64, 4, 32)
      .batch(batch)
      .steps(5)
      .log_every(100)
      .set("ckpt.resume", "none")
      .set("parallel.bucket_mb", 1)
      .set("train.peak_tflops", 1)  // a set peak: no matmul benchmark at start-up (0.7 s of CPU per rank)
      .with(extra)
      .line();
}

// The step-3 checkpoint of a run with --ckpt.every=3.
inline std::string step3(const std::string& out) { return out + "/ckpt/step_00000003"; }

// Runs a command (output discarded); it must succeed.
inline void run(const std::string& cmd) { ASSERT_EQ(std::system((cmd + " > /dev/null 2>&1").c_str()), 0) << cmd; }

// A Llama-style model: RMSNorm, SwiGLU, RoPE, GQA, no biases, an untied head, a vocabulary whose tp padding differs.
inline const std::string kLlama =
    " --model.norm=rmsnorm --model.mlp=swiglu --model.pos=rope --model.n_kv_head=2 --model.bias=false"
    " --model.tied_embeddings=false --model.vocab_pad_to=1";

// A synthetic Mixtral for model.init_from: one process trains the MoE Llama of `train_flags` (kLlama and the MoE
// flags) for 2 steps into `src`, and `convert --to-hf` writes it to `hf` (model.safetensors, config.json of
// model_type mixtral: per-expert block_sparse_moe.experts.{e}.w1/w2/w3).
inline void make_hf_mixtral(const std::string& train_flags, const std::string& src, const std::string& hf) {
  run(kMegatrain + " train" + train_flags + " --train.steps=2");
  run(kMegatrain + " convert --to-hf " + src + "/ckpt --out " + hf + "/model.safetensors");
  ASSERT_NE(mt::read_text_file(hf + "/config.json").find("\"mixtral\""), std::string::npos);
}

// Runs the reordered twin (noise_floor.h, reordered) of the one-process run with these flags: the noise floor of
// that run's numbers. It must succeed.
inline void run_twin(int batch, const std::string& flags, int parts = 2) {
  run(kMegatrain + " train" + flags + reordered(batch, flags, parts));
}

// Runs a command that must fail and returns what it printed (stdout and stderr, kept in `log`).
inline std::string failing_output(const std::string& cmd, const std::string& log, const std::string& what) {
  int rc = std::system((cmd + " > " + log + " 2>&1").c_str());
  EXPECT_NE(rc, 0) << what;
  return mt::test::slurp(log);
}

using mt::test::error_of;

// ---- equivalence up to a measured noise floor (noise_floor.h) -------------------------------------------------

// The three output folders of a comparison: `<prefix>_single_<name>`, `<prefix>_alt_<name>` (the reordered single
// run) and `<prefix>_multi_<name>`, all fresh.
struct Trio {
  std::string single, alt, multi;
};
inline Trio fresh_trio(const std::string& prefix, const std::string& name) {
  return {fresh_dir(prefix + "_single_" + name), fresh_dir(prefix + "_alt_" + name),
          fresh_dir(prefix + "_multi_" + name)};
}

// Norm-relative deviation of tensor y from the reference x.
inline double tensor_rel(const mt::TensorData& x, const mt::TensorData& y) {
  const float* p = static_cast<const float*>(x.data);
  const float* q = static_cast<const float*>(y.data);
  double d = 0, s = 0;
  for (size_t i = 0; i < x.nbytes / 4; ++i) {
    const double e = double(q[i]) - p[i];
    d += e * e, s += double(p[i]) * p[i];
  }
  return std::sqrt(d) / std::max(std::sqrt(s), 1e-300);
}

// The deviations of a 5-step run `multi` from the single-process `single`, floors from `alt`: per-step loss and
// gradient norm, and each tensor of the final checkpoints (classes "param", "moment1", "moment2").
inline std::vector<Deviation> run_deviations(const Trio& t) {
  std::vector<Deviation> devs;
  for (const char* field : {"loss", "grad_norm"}) {
    const std::vector<double> ref = series(t.single, field);
    EXPECT_EQ(ref.size(), 5u) << field;
    add_series(devs, field, ref, series(t.alt, field), series(t.multi, field));
  }
  using mt::Checkpoint;
  Checkpoint cr = Checkpoint::load(t.single + "/ckpt"), ca = Checkpoint::load(t.alt + "/ckpt"),
             cm = Checkpoint::load(t.multi + "/ckpt");
  for (const std::string file : {"model.safetensors", "optim.safetensors"}) {
    const auto names = cr.tensor_names(file);
    EXPECT_EQ(names, cm.tensor_names(file)) << file;
    EXPECT_EQ(names, ca.tensor_names(file)) << file;
    for (const std::string& n : names) {
      const mt::TensorData &x = cr.get(n), &a = ca.get(n), &y = cm.get(n);
      EXPECT_EQ(x.shape, y.shape) << n;
      if (x.shape != y.shape || x.shape != a.shape) continue;
      const std::string cls = file == "model.safetensors" ? "param" : n.starts_with("m.") ? "moment1" : "moment2";
      devs.push_back({cls, n, tensor_rel(x, a), tensor_rel(x, y)});
    }
  }
  return devs;
}

// A 5-step run under a parallel layout equals the single process up to rounding (see above).
inline void expect_equivalent(const Trio& t, const std::string& what) { expect_within_floor(run_deviations(t), what); }

// Runs resumed at step 3 of 5 log steps 4 and 5: each must match steps 4 and 5 of the uninterrupted run `full`, up
// to the noise floor that `alt` (the reordered twin of `full`) measures.
inline void expect_resumed_tail(const std::string& full, const std::string& alt,
                                std::initializer_list<std::string> resumed, const std::string& what) {
  const std::vector<double> lf = losses(full), la = losses(alt);
  ASSERT_EQ(lf.size(), 5u);
  std::vector<Deviation> devs;
  for (const std::string& r : resumed) add_series(devs, "loss", lf, la, losses(r), /*first_step=*/4);
  expect_within_floor(devs, what);
}

// INSTANTIATE_TEST_SUITE_P name generator for parameter structs with a `name`.
struct CaseName {
  template <class P>
  std::string operator()(const ::testing::TestParamInfo<P>& info) const {
    return info.param.name;
  }
};

}  // namespace ptest

namespace ptest {

// The MoE metrics (docs/moe.md) of a layout's run `got` against the single process `ref` on the same batches: every
// step's train line lists the same MoE layers (all pipeline stages' layers, in order), with the same routing counts
// (tokens_per_expert, dropped: integers, equal unless a top-k choice sits within rounding (~1e-6) of a tie: with
// the few thousand routing decisions of these 5-step runs and O(1) gaps between probabilities, a chance of the
// order of 1e-3 per run), and the losses aux and z within rel_tol (the caller states it from the arithmetic).
inline void expect_same_moe_metrics(const std::string& ref, const std::string& got, double rel_tol,
                                    const std::string& what) {
  const auto a = mt::test::metrics_of(ref + "/metrics.jsonl", "train"),
             b = mt::test::metrics_of(got + "/metrics.jsonl", "train");
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t s = 0; s < a.size(); ++s) {
    ASSERT_TRUE(a[s].contains("moe") && b[s].contains("moe")) << what << " step " << s + 1;
    const nlohmann::json &x = a[s]["moe"], &y = b[s]["moe"];
    ASSERT_EQ(x.size(), y.size()) << what << " step " << s + 1 << ": " << y.dump();
    for (size_t l = 0; l < x.size(); ++l) {
      const std::string at = what + " step " + std::to_string(s + 1) + " layer " + x[l]["layer"].dump();
      EXPECT_EQ(x[l]["layer"], y[l]["layer"]) << at;
      EXPECT_EQ(x[l]["tokens_per_expert"], y[l]["tokens_per_expert"]) << at;
      EXPECT_EQ(x[l]["dropped"], y[l]["dropped"]) << at;
      for (const char* loss : {"aux", "z"}) {
        const double r = x[l][loss].get<double>(), g = y[l][loss].get<double>();
        EXPECT_LE(std::abs(g - r), rel_tol * std::abs(r)) << at << " " << loss << ": " << g << " vs " << r;
      }
    }
  }
}

}  // namespace ptest
