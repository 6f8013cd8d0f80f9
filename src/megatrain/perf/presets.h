// The paper's experiments as jobs: Table 2 (the 175B model, tp 8, pp 8, 6 virtual stages, strong scaling at batch
// 768 and 6,144, Megatron-LM against MegaScale) and Table 3 (the ablation at 256 GPUs, batch 256, one technique
// after another, then LAMB's batch 768). The model comes in from the caller (configs/megascale-175b.toml); the
// preset only sets the layout, the batch and the switches, with the paper's figure beside each job.
#pragma once
#include <string>
#include <vector>

#include "megatrain/perf/step_model.h"

namespace mt::perf {

// MegaScale's sliding window for the 175B model (not stated in the paper; see configs/megascale-175b.toml).
constexpr int kMegaScaleWindow = 1024;

struct PresetRow {
  std::string label;  // "megatron" / "megascale" (Table 2), or the ablation step (Table 3)
  int gpus = 0, batch = 0;
  double paper_seconds = 0;  // 0 where the paper gives none (Table 3)
  double paper_mfu = 0;      // fraction
  Job job;
};

// Sets the switches of one system on a copy of `base`: "megatron" (sequential block, full attention, nothing
// overlapped, Megatron's kernels) or "megascale" (all of §3 on). Throws on another name.
Job system_job(const ModelConfig& base, const std::string& system, int gpus, int batch);
std::vector<PresetRow> megascale_table2(const ModelConfig& base);
std::vector<PresetRow> megascale_table3(const ModelConfig& base);
// Korthikanti et al. 2022 (arXiv 2205.05198), Table 5: seconds per iteration of the 22B, 175B, 530B and 1T GPT
// models on Selene (DGX A100 80GB, 8 HDR NICs per node), tp 8 with sequence parallelism, under full and selective
// recomputation, and the 530B model with dp 8 on 2,240 GPUs (§6.3: 39.15 s). Shapes and layouts from the paper's
// Table 3, the interleaving as in calculon's validation configs of the same runs; vocabulary 51,200. Nine rows,
// labels "22B full", ..., "530B-dp8 selective", with paper_seconds (paper_mfu 0). The same runs as
// bench/perf_model_published.sh.
std::vector<PresetRow> korthikanti_table5(const ModelConfig& base);

}  // namespace mt::perf
