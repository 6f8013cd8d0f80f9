#include "megatrain/train/checkpoint/restore.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <optional>
#include <vector>

#include "megatrain/ckpt/checkpoint.h"
#include "megatrain/ckpt/config_json.h"
#include "megatrain/ckpt/hf_model.h"
#include "megatrain/ckpt/model_weights.h"
#include "megatrain/ckpt/reader.h"
#include "megatrain/core/error.h"
#include "megatrain/model/layout.h"
#include "megatrain/optim/optimizer.h"
#include "megatrain/parallel/data_parallel.h"
#include "megatrain/train/checkpoint/run_position.h"
#include "megatrain/train/ckpt_async.h"

namespace mt {

namespace {

// Phase A: this rank's reads. Returns "" or what failed (the reader's message names the file).
std::string read_my_boxes(const RankHoldings& h, CheckpointReader& ck) {
  try {
    const ParamStore& ps = h.model.params();
    if (reads_replicas(h)) {
      for (int i = 0; i < static_cast<int>(ps.size()); ++i) {
        const ParamInfo& info = ps.info(i);
        const Slice all = whole_slice(info.shape);
        read_box(ck, info, info.name, all, ps.param(i).f32());
        if (h.opt) {
          read_box(ck, info, "m." + info.name, all, h.opt->m(i).f32());
          read_box(ck, info, "v." + info.name, all, h.opt->v(i).f32());
        }
      }
    }
    for (DataParallel* zero : h.zero_instances()) {
      for (const DataParallel::MomentSlice& ms : zero->moment_slices()) {
        const ParamInfo& info = ps.info(ms.tensor);
        for (const Slice& box :
             flat_range_slices(info.shape, static_cast<int64_t>(ms.begin), static_cast<int64_t>(ms.end))) {
          const int64_t off = flat_index(box.start, info.shape) - static_cast<int64_t>(ms.begin);
          read_box(ck, info, "m." + info.name, box, ms.m + off);
          read_box(ck, info, "v." + info.name, box, ms.v + off);
        }
      }
    }
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

// Phase C: dp rank 0's replicated state to the rest of its dp group. The host plane never touches the backend's
// memory (a GPU run would hand Gloo a device pointer; see tests/train_planes_test.cpp), so the tensors go
// through a host buffer, 64 MiB at a time: two memcpys per chunk, small beside the transfer.
void broadcast_replicas(const RankHoldings& h) {
  const ParamStore& ps = h.model.params();
  ProcessGroup& g = h.mesh->dp();
  constexpr size_t kChunk = size_t{16} << 20;  // floats
  HostBuffer bounce(std::min(kChunk, std::max<size_t>(ps.total_floats(), 1)) * sizeof(float), false);
  const bool root = g.rank() == 0;
  auto bcast = [&](float* p, size_t n) {
    for (size_t off = 0; off < n; off += kChunk) {
      const size_t k = std::min(kChunk, n - off);
      if (root) std::memcpy(bounce.f32(), p + off, k * sizeof(float));
      g.broadcast(f32_view(bounce.f32(), {static_cast<int64_t>(k)}), 0)->wait();
      if (!root) std::memcpy(p + off, bounce.f32(), k * sizeof(float));
    }
  };
  bcast(ps.params_data(), ps.total_floats());
  if (h.opt)
    for (int i = 0; i < static_cast<int>(ps.size()); ++i)
      for (Tensor t : {h.opt->m(i), h.opt->v(i)}) bcast(t.f32(), static_cast<size_t>(t.numel()));
}

// Loads checkpoint ck (checked to fit this run: a misfit throws on every rank alike) and returns its step. A read
// that fails on any rank makes every rank return -1 with `problem` set (the failing rank's message, or which ranks
// failed).
int load_fitting(const RankHoldings& h, Agreement& agreement, uint64_t windows, CheckpointReader& ck, LoaderState& data,
                 std::string& problem) {
  const RunConfig& cfg = h.cfg;
  check_fits(cfg, ck);
  const std::string err = read_my_boxes(h, ck);
  const std::vector<int> bad = agreement.which_ranks(!err.empty());
  if (!bad.empty()) {
    problem = !err.empty() ? err
                           : fmt::format("rank(s) {} could not read checkpoint {} (their messages name the file)",
                                         fmt::join(bad, ", "), ck.dir());
    return -1;
  }
  if (one_reader(h)) broadcast_replicas(h);
  for (DataParallel* zero : h.zero_instances()) zero->commit_moment_slices();
  agreement.barrier();  // restored everywhere: rank 0's clock then times the whole group's restore
  const SavedPosition pos = saved_position(ck);
  data = position_for_this_run(cfg, ck, pos.data, windows, h.main_rank());
  if (h.main_rank() && data.taken.empty() && !ck.extra()["data"].contains("blend"))
    warn_if_order_changed(cfg, windows, ck, data);
  return pos.step;
}

}  // namespace

// Throws unless the checkpoint continues this run: same model, optimizer and global batch.
void check_fits(const RunConfig& cfg, const CheckpointReader& ck) {
  const nlohmann::json& x = ck.extra();
  MT_CHECK(x.is_object() && x.contains("model") && x.contains("data") && x.contains("step"),
           "checkpoint {} lacks the training state (model/data/step); was it written by `megatrain convert`? Use "
           "model.init_from for weights only",
           ck.dir());
  extra_field(ck, "data", false, is_json_object, "an object");
  const SavedPosition pos = saved_position(ck);  // checked before any tensor is read
  ModelConfig saved = model_config_from_manifest(x, ck.dir());
  nlohmann::json want = model_config_to_json(cfg.model), have = model_config_to_json(saved);
  // What backward rebuilds instead of keeping is a memory choice, not the model: a run may resume with another one.
  for (const char* k : {"recompute", "recompute_act", "recompute_norm"}) {
    want.erase(k);
    have.erase(k);
  }
  MT_CHECK(want == have, "checkpoint {} was trained with a different model config:\n  checkpoint: {}\n  this run:   {}",
           ck.dir(), have.dump(), want.dump());
  const std::string optim = extra_field(ck, "optim_name", false, is_json_string, "a string").get<std::string>();
  MT_CHECK(optim == kind_name(cfg.optim.name), "checkpoint {} used optimizer '{}' but this run uses '{}'", ck.dir(),
           optim, kind_name(cfg.optim.name));
  const auto& d = x["data"];
  const int64_t saved_b =
      d.contains("global_batch_size")
          ? extra_field(ck, "global_batch_size", true, is_json_count, "a non-negative integer").get<int64_t>()
          : extra_field(ck, "batch_size", true, is_json_count, "a non-negative integer").get<int64_t>();
  const int64_t saved_t = extra_field(ck, "seq_len", true, is_json_count, "a non-negative integer").get<int64_t>();
  const int micro = cfg.pipeline_microbatches();
  const int64_t global_b = int64_t{cfg.data.batch_size} * micro * cfg.parallel.dp;
  // The data position is a cursor into the epoch's window order, which any read size continues as long as a step
  // takes the same windows: the same rows per read, or (a job that shrank dp and accumulates more, launch/driver.h)
  // the same rows per optimizer step with the cursor on a read boundary. The one difference then: an epoch drops
  // its remainder of less than one read, which depends on the read size.
  const int64_t saved_accum = x.contains("train") && x["train"].is_object() && x["train"].contains("grad_accum") &&
                                      x["train"]["grad_accum"].is_number_integer()
                                  ? x["train"]["grad_accum"].get<int64_t>()
                                  : 0;
  const bool same_read = saved_b == global_b;
  const bool same_step = saved_accum > 0 && global_b > 0 && saved_b * saved_accum == global_b * cfg.train.grad_accum &&
                         pos.data.cursor % uint64_t(global_b) == 0;
  MT_CHECK((same_read || same_step) && saved_t == cfg.data.seq_len,
           "checkpoint {} used a global batch of {} x {} tokens (grad_accum {}), this run {} x {} (grad_accum {}): the "
           "data position would not carry over",
           ck.dir(), saved_b, saved_t, saved_accum, global_b, cfg.data.seq_len, cfg.train.grad_accum);
}

void init_params(const RankHoldings& h, Agreement& agreement, const std::string& path) {
  const RunConfig& cfg = h.cfg;
  // Both sources check, on every rank alike, that they hold this model and nothing else before a byte is read.
  std::optional<CheckpointReader> ck;
  std::optional<HfModelFiles> files;
  std::optional<HfSliceReader> hf;
  std::string source = "model.init_from = " + path;
  if (is_hf_model(path)) {
    files.emplace(HfModelFiles::open(path));
    hf.emplace(*files, cfg.model);
    source += " (an HF model)";
  } else {
    std::error_code ec;  // a checkpoint's model.safetensors stands for its directory, as in load_model_weights
    ck.emplace(CheckpointReader::open(std::filesystem::is_regular_file(path, ec)
                                          ? std::filesystem::path(path).parent_path().string()
                                          : path));
    source += " (checkpoint " + ck->dir() + ")";
    MT_CHECK(ck->extra().is_object() && ck->extra().contains(kModelConfigKey),
             "{} records no model config (extra.model)", source);
    check_same_architecture(model_config_from_manifest(ck->extra(), ck->dir()), cfg.model, source);
    ParamStore whole;  // the names of the whole model's parameters (declared, never allocated)
    declare_gpt_params(cfg.model, whole);
    for (const std::string& n : ck->tensor_names())
      MT_CHECK(n.starts_with("m.") || n.starts_with("v.") || whole.has(n),
               "{} holds tensor '{}', which this model does not have", source, n);
  }
  std::string err;
  try {
    const ParamStore& ps = h.model.params();
    for (int i = 0; i < static_cast<int>(ps.size()); ++i) {
      const ParamInfo& info = ps.info(i);
      const Slice all = whole_slice(info.shape);
      if (hf)
        read_box(*hf, info, info.name, all, ps.param(i).f32());
      else
        read_box(*ck, info, info.name, all, ps.param(i).f32());
    }
  } catch (const std::exception& e) {
    err = e.what();
  }
  const std::vector<int> bad = agreement.which_ranks(!err.empty());
  if (!bad.empty())
    fail_as(ErrorKind::Checkpoint, "{}",
            !err.empty() ? err
                         : fmt::format("rank(s) {} could not read {} (their messages name the file)",
                                       fmt::join(bad, ", "), source));
  agreement.barrier();
}

Restored restore_checkpoint(const RankHoldings& h, Agreement& agreement, uint64_t windows, const std::string& path,
                            LoaderState& data) {
  CheckpointReader ck = CheckpointReader::open(path);
  std::string problem;
  const int step = load_fitting(h, agreement, windows, ck, data, problem);
  MT_CHECK(step >= 0, "{}", problem);
  return {step, path, ck.dir()};
}

Restored restore_newest(const RankHoldings& h, Agreement& agreement, uint64_t windows, bool peer_snapshots,
                        LoaderState& data) {
  const std::string& root = h.cfg.ckpt.dir;
  const bool main_rank = h.main_rank();
  if (main_rank && peer_snapshots && h.mesh) {
    try {
      promote_peer_snapshots(root, h.cfg.ckpt.keep_last);
    } catch (const std::exception& e) {
      fmt::print(stderr,
                 "warning: the peer snapshots under {}/snapshots could not be committed: {}; resuming from "
                 "disk\n",
                 root, e.what());
    }
  }
  agreement.barrier();
  std::vector<std::string> candidates;
  if (auto latest = find_latest(root)) candidates.push_back(*latest);
  const std::vector<CheckpointEntry> all = list_checkpoints(root);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    std::error_code ec;
    if (candidates.empty() || !std::filesystem::equivalent(it->dir, candidates.front(), ec))
      candidates.push_back(it->dir);
  }
  for (size_t i = 0; i < candidates.size(); ++i) {
    const std::string& c = candidates[i];
    std::string problem;
    int step = -1;
    // open() reads the same manifest on every rank: they all fail it alike. check_fits' errors (a checkpoint of
    // another run) are not a corrupt file: load_fitting() lets them stop the run.
    std::optional<CheckpointReader> ck;
    try {
      ck.emplace(CheckpointReader::open(c));
    } catch (const Error& e) {
      problem = e.what();
    }
    if (ck) step = load_fitting(h, agreement, windows, *ck, data, problem);
    if (step >= 0) return {step, c, ck->dir()};
    if (main_rank || !problem.starts_with("rank("))
      fmt::print(stderr, "warning: resume = auto: skipping checkpoint {}: it is corrupt or partial: {}; {}\n", c,
                 problem, i + 1 < candidates.size() ? "falling back to " + candidates[i + 1] : "no older checkpoint");
  }
  if (!candidates.empty())
    fail_as(ErrorKind::Checkpoint,
            "resume = auto: none of the {} checkpoint(s) under {} is readable (the warnings "
            "above say why); move them away (or set ckpt.resume = none) to start afresh",
            candidates.size(), root);
  return {};
}

}  // namespace mt
