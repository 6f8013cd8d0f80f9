// Equivalence up to a measured noise floor: what every test that compares two computations of the same numbers in
// different orders (a parallel layout against one process, a resumed run against an uninterrupted one) uses to
// decide what is rounding and what is a bug.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "metrics.h"

namespace ptest {

// A parallel layout computes the same sums as one process in another order, so the two runs agree only up to
// rounding, and how much rounding shows differs per observable: a loss is a well-conditioned mean, Adam turns the
// rounding noise of a ~0 gradient element (the key bias's gradient is exactly 0 in exact arithmetic) into a
// full-size update, and the second moment of such an element is noise squared. Which noise a machine makes depends
// on its BLAS kernel (OPENBLAS_CORETYPE), so no fixed tolerance holds on every machine. Each test therefore
// measures its own noise floor: `alt` is the reference run again with every step's rows summed in another order
// (half the rows per micro-batch, twice the accumulation rounds: the same gradient in exact arithmetic). For each
// observable q (per-step loss and gradient norm; every tensor of the final parameters and both moments), with
// differences relative to the reference (norms of the difference for tensors),
//     floor(q) = |q_alt - q_ref|,      allowed(q) = kNoiseFactor * max(floor(q), median floor of q's class, kMinRel).
// The class median keeps an observable whose two sums happened to agree to the last bit from getting a zero
// tolerance; kMinRel (4 units of fp32 roundoff) is the floor of floors. The layout's run must sit within allowed(q)
// of the reference for every q.
//
// Why kNoiseFactor = 20: the twin reorders the batch sums only, while tensor parallelism also splits the K-sums of
// the forward GEMMs, so a layout's noise runs a few times the twin's. Over every case of the dp, tp and pp tests
// under the Zen and SkylakeX kernels (on a Zen 5 machine whose own kernel, Haswell's, passed too) the worst ratio
// got / max(floor, median, kMinRel) seen was 5.6 (each test prints its worst ratio per class); the expert-parallel
// tests' worst since is 10.8 (ep2 x dp2 x tp2, its twin split in four, under OpenBLAS's own choice on an EPYC,
// Cooperlake). Bugs of the kind these tests exist to catch score far higher on the same
// scale (planted and measured): a ZeRO bucket reduced twice, gradient norm 3e6; a replicated norm weight whose
// gradient is not summed over tp, gradient norm 550 and its moments 5e5; a pipeline micro-batch paired with another
// micro-batch's targets, 1e6 in every class. 20 sits 3.6x above the noise and 27x below the weakest of those.
inline constexpr double kNoiseFactor = 20;
inline constexpr double kMinRel = 4 * 0x1p-24;

// The flags that turn a run into its reordered twin: half of `batch` rows per micro-batch, twice the accumulation
// rounds, and twice the evaluation batches (a val batch is data.batch_size rows, taken in order from the val split,
// so 2n half batches are the n batches' windows and the same mean). `flags` are the run's own (the last
// --train.grad_accum / --train.eval_batches in them count; accumulation defaults to 1). Appended last, they
// override the run's own. `parts` > 2 splits finer (batch / parts rows, parts x the rounds and the eval batches):
// for a layout whose ranks hold one row each, whose gradient is then a sum of one-row gradients, the twin should
// sum the same way (halving leaves two-row GEMM sums, and measured a floor up to 26x below such a layout's rounding
// under OpenBLAS's Cooperlake kernels, a dp4 x tp2 MoE run without expert parallelism included).
inline std::string reordered(int batch, const std::string& flags, int parts = 2) {
  auto last_int = [&](const std::string& key, int dflt) {
    const auto p = flags.rfind(key);
    return p == std::string::npos ? dflt : std::stoi(flags.substr(p + key.size()));
  };
  EXPECT_EQ(batch % parts, 0) << "the reordered twin splits the batch into " << parts;
  std::string twin = " --data.batch_size=" + std::to_string(batch / parts) +
                     " --train.grad_accum=" + std::to_string(parts * last_int("--train.grad_accum=", 1));
  const int eval_batches = last_int("--train.eval_batches=", -1);
  if (eval_batches >= 0)
    twin += " --train.eval_batches=" + std::to_string(parts * eval_batches);
  else
    EXPECT_NE(flags.find("--train.eval_every=0"), std::string::npos)
        << "a run that evaluates must set --train.eval_batches, so its twin can evaluate the same windows";
  return twin;
}

// One observable's relative deviations from the reference: of the reordered run (the floor) and of the run under test.
struct Deviation {
  std::string cls, name;
  double floor, got;
};

inline double rel(double x, double ref) { return std::abs(x - ref) / std::max(std::abs(ref), 1e-300); }

// The per-step values of `field` ("loss", "grad_norm", "val_loss") in a run's metrics.jsonl, from lines of `kind`.
inline std::vector<double> series(const std::string& out, const std::string& field, const std::string& kind = "train") {
  return mt::test::metric_series(out + "/metrics.jsonl", field, kind);
}

// The per-step training losses of a run.
inline std::vector<double> losses(const std::string& out) { return series(out, "loss"); }

// Checks every deviation against its allowance (see above) and prints the worst ratio got / allowed-base per class,
// so a test's margin is visible in its log.
inline void expect_within_floor(const std::vector<Deviation>& devs, const std::string& what) {
  std::map<std::string, std::vector<double>> floors;
  for (const Deviation& d : devs) floors[d.cls].push_back(d.floor);
  std::map<std::string, double> median;
  for (auto& [cls, f] : floors) {
    std::sort(f.begin(), f.end());
    median[cls] = f[f.size() / 2];
  }
  std::map<std::string, std::pair<double, std::string>> worst;
  for (const Deviation& d : devs) {
    const double base = std::max({d.floor, median[d.cls], kMinRel});
    const double ratio = d.got / base;
    auto& w = worst[d.cls];
    if (ratio >= w.first) w = {ratio, d.name};
    EXPECT_LE(d.got, kNoiseFactor * base)
        << what << ": " << d.cls << " " << d.name << " deviates by " << d.got << " (relative) from the single process; "
        << "the reordered single run deviates by " << d.floor << ", the median of its class by " << median[d.cls]
        << ", so at most " << kNoiseFactor << " x " << base << " is rounding";
  }
  for (const auto& [cls, w] : worst)
    std::printf("noise-floor %s | %-9s worst ratio %7.3f (%s), class median floor %.2e\n", what.c_str(), cls.c_str(),
                w.first, w.second.c_str(), median[cls]);
}

// Per-step deviations of `field` of run `got` from the reference, floors from `alt`; `got` may have logged only
// the steps from `first_step` on (a resumed run). The floors of the steps before it still count in the median.
inline void add_series(std::vector<Deviation>& devs, const std::string& cls, const std::vector<double>& ref,
                       const std::vector<double>& alt, const std::vector<double>& got, size_t first_step = 1) {
  ASSERT_EQ(alt.size(), ref.size()) << cls;
  ASSERT_EQ(got.size() + first_step - 1, ref.size()) << cls;
  for (size_t i = 0; i < ref.size(); ++i) {
    const bool has = i + 1 >= first_step;
    // A step the run under test did not log contributes its floor only (got = 0 passes trivially).
    devs.push_back({cls, "step " + std::to_string(i + 1), rel(alt[i], ref[i]),
                    has ? rel(got[i + 1 - first_step], ref[i]) : 0.0});
  }
}

}  // namespace ptest
