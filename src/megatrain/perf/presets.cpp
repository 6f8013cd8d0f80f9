#include "megatrain/perf/presets.h"

#include "megatrain/core/error.h"

namespace mt::perf {

namespace {

Layout paper_layout(int gpus, int batch) {
  Layout L;
  L.tp = 8;
  L.pp = 8;
  L.virtual_stages = 6;
  MT_CHECK(gpus % (L.tp * L.pp) == 0, "preset: {} GPUs is not a multiple of tp * pp = 64", gpus);
  L.dp = gpus / (L.tp * L.pp);
  L.micro_batch = 1;
  MT_CHECK(batch % L.dp == 0, "preset: batch {} does not divide over dp = {}", batch, L.dp);
  L.microbatches = batch / L.dp;
  L.seq = 2048;
  return L;
}

}  // namespace

Job system_job(const ModelConfig& base, const std::string& system, int gpus, int batch) {
  Job j;
  j.model = base;
  j.layout = paper_layout(gpus, batch);
  if (system == "megatron") {
    j.model.block = BlockKind::Sequential;
    j.model.window = 0;
  } else if (system == "megascale") {
    j.model.block = BlockKind::Parallel;
    j.model.window = kMegaScaleWindow;
    j.tech.tp_overlap = j.tech.pp_overlap = j.tech.dp_overlap = j.tech.fused_ops = j.tech.misc = true;
  } else {
    fail_as(ErrorKind::Config, "preset: system must be 'megatron' or 'megascale' (got '{}')", system);
  }
  return j;
}

std::vector<PresetRow> megascale_table2(const ModelConfig& base) {
  // (laid out by hand)
  // clang-format off
  struct R { int gpus, batch; double meg_s, meg_mfu, ms_s, ms_mfu; };
  const R rows[] = {
      {256, 768, 40.0, 53.0, 32.0, 65.3},       {512, 768, 21.2, 49.9, 16.5, 63.5},
      {768, 768, 15.2, 46.7, 11.5, 61.3},       {1024, 768, 11.9, 44.7, 8.9, 59.0},
      {3072, 6144, 29.02, 48.7, 23.66, 59.1},   {6144, 6144, 14.78, 47.8, 12.21, 57.3},
      {8192, 6144, 12.24, 43.3, 9.56, 54.9},    {12288, 6144, 8.57, 41.2, 6.34, 55.2},
  };
  // clang-format on
  std::vector<PresetRow> out;
  for (const char* system : {"megatron", "megascale"})
    for (const R& r : rows) {
      const bool meg = std::string(system) == "megatron";
      out.push_back({system, r.gpus, r.batch, meg ? r.meg_s : r.ms_s, (meg ? r.meg_mfu : r.ms_mfu) / 100,
                     system_job(base, system, r.gpus, r.batch)});
    }
  return out;
}

std::vector<PresetRow> megascale_table3(const ModelConfig& base) {
  const double paper[] = {47.7, 52.3, 53.3, 55.5, 58.0, 59.5, 61.2, 62.3, 65.3};
  const char* labels[] = {"baseline",
                          "+ PTB",
                          "+ SWA",
                          "+ TP overlap",
                          "+ PP overlap",
                          "+ DP overlap",
                          "+ efficient operators",
                          "+ misc",
                          "+ LAMB (batch 768)"};
  std::vector<PresetRow> out;
  Job j = system_job(base, "megatron", 256, 256);
  for (int step = 0; step < 9; ++step) {
    switch (step) {
      case 1: j.model.block = BlockKind::Parallel; break;
      case 2: j.model.window = kMegaScaleWindow; break;
      case 3: j.tech.tp_overlap = true; break;
      case 4: j.tech.pp_overlap = true; break;
      case 5: j.tech.dp_overlap = true; break;
      case 6: j.tech.fused_ops = true; break;
      case 7: j.tech.misc = true; break;
      case 8: j.layout = paper_layout(256, 768); break;
      default: break;
    }
    out.push_back({labels[step], 256, step == 8 ? 768 : 256, 0, paper[step] / 100, j});
  }
  return out;
}

std::vector<PresetRow> korthikanti_table5(const ModelConfig& base) {
  // (laid out by hand)
  // clang-format off
  struct R { const char* name; int layers, heads, hidden, pp, v, dp, micro_batch, batch; double full_s, selective_s; };
  const R runs[] = {
      {"22B",      48,  64,  6144,  1,  1, 1, 4, 4,    1.42,  1.10},
      {"175B",     96,  96,  12288, 8,  3, 1, 1, 64,   18.13, 13.75},
      {"530B",     105, 128, 20480, 35, 3, 1, 1, 280,  49.05, 37.83},
      {"1T",       128, 160, 25600, 64, 1, 1, 1, 512,  94.42, 71.49},
      {"530B-dp8", 105, 128, 20480, 35, 3, 8, 1, 2240, 0,     39.15},
  };
  // clang-format on
  std::vector<PresetRow> out;
  for (const R& r : runs)
    for (Recompute mode : {Recompute::Full, Recompute::Selective}) {
      const double published = mode == Recompute::Full ? r.full_s : r.selective_s;
      if (published <= 0) continue;
      Job j;
      j.model = base;
      j.model.n_layer = r.layers;
      j.model.n_head = r.heads;
      j.model.d_model = r.hidden;
      j.model.vocab_size = 51200;
      j.model.block = BlockKind::Sequential;
      j.model.window = 0;
      j.tech.recompute = mode;
      Layout& L = j.layout;
      L.tp = 8;
      L.pp = r.pp;
      L.virtual_stages = r.v;
      L.dp = r.dp;
      L.micro_batch = r.micro_batch;
      L.microbatches = r.batch / (r.dp * r.micro_batch);
      L.seq = 2048;
      out.push_back({fmt::format("{} {}", r.name, recompute_name(mode)), L.gpus(), r.batch, published, 0, j});
    }
  return out;
}

}  // namespace mt::perf
