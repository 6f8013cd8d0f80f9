#include "megatrain/train/checkpointing.h"

#include <fmt/format.h>

#include <signal.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <system_error>

#include "megatrain/ckpt/checkpoint.h"
#include "megatrain/ckpt/config_json.h"
#include "megatrain/ckpt/hf_model.h"
#include "megatrain/ckpt/model_weights.h"
#include "megatrain/ckpt/reader.h"
#include "megatrain/ckpt/sharded.h"
#include "megatrain/core/clock.h"
#include "megatrain/core/fault_spec.h"
#include "megatrain/core/fs.h"
#include "megatrain/data/loader.h"
#include "megatrain/data/window_order.h"
#include "megatrain/comm/agreement.h"
#include "megatrain/comm/mesh.h"
#include "megatrain/model/gpt.h"
#include "megatrain/model/layout.h"
#include "megatrain/optim/optimizer.h"
#include "megatrain/parallel/data_parallel.h"
#include "megatrain/parallel/gpt_pipeline.h"
#include "megatrain/parallel/tensor_parallel.h"
#include "megatrain/train/attempt_fence.h"
#include "megatrain/train/ckpt_async.h"
#include "megatrain/train/ckpt_worker.h"
#include "megatrain/train/finite.h"

namespace mt {

namespace {

// Optimizer moments as full tensors laid out like the parameters (from the optimizer, or gathered from the
// data-parallel shards).
struct Moments {
  std::function<Tensor(int)> m, v;
  std::function<Tensor(int)> p;  // the parameters as saved (unset: the model's own tensors)
};

// One full tensor of a checkpoint with its optimizer moments.
struct SavedTensor {
  std::string name;
  Tensor p, m, v;
};

// What a checkpoint records besides the tensors: the model and optimizer, the position of the run, the layout.
nlohmann::json checkpoint_extra(const RunConfig& cfg, int step, const LoaderState& data, int micro, uint64_t windows) {
  nlohmann::json extra = {{"model", model_config_to_json(cfg.model)},
                          {"optim_name", cfg.optim.name},
                          {"step", step},
                          {"data", {{"epoch", data.epoch}, {"cursor", data.cursor}, {"dir", cfg.data.sources()[0].dir},
                                    {"batch_size", cfg.data.batch_size}, {"seq_len", cfg.data.seq_len},
                                    {"global_batch_size", cfg.data.batch_size * micro * cfg.parallel.dp},
                                    {"shuffle", cfg.data.shuffle}, {"seed", cfg.data.seed},
                                    {"order", cfg.data.shuffle ? WindowOrder::kName : "sequential"}}},
                          {"train", {{"steps", cfg.train.steps}, {"grad_accum", cfg.train.grad_accum}}},
                          {"parallel", {{"dp", cfg.parallel.dp}, {"pp", cfg.parallel.pp}, {"tp", cfg.parallel.tp},
                                        {"virtual_stages", cfg.parallel.virtual_stages}, {"microbatches", micro}}}};
  if (windows > 0) extra["data"]["windows"] = windows;  // what the order permutes: a grown dataset is another order
  if (!data.taken.empty()) {  // a blend: its sources, and the rows each has given (the position)
    nlohmann::json blend = nlohmann::json::array();
    for (const DataSource& src : cfg.data.sources()) blend.push_back({{"dir", src.dir}, {"weight", src.weight}});
    extra["data"]["blend"] = blend;
    extra["data"]["taken"] = data.taken;
    extra["data"]["since"] = data.since;
  }
  if (cfg.parallel.tp > 1) {
    // The tp layout the tensors were trained in (a sharded checkpoint's pieces follow it).
    ParamStore lay;
    declare_gpt_params(cfg.model, lay, cfg.parallel.tp, 0);
    nlohmann::json layout;
    for (const ParamInfo& p : lay.infos()) layout[p.name] = p.shard.describe();
    extra["tp_layout"] = layout;
  }
  if (cfg.parallel.pp > 1) {
    // Which virtual stage(s) held each tensor (a tied wte: the first and last).
    nlohmann::json layout;
    const int pp = cfg.parallel.pp, v = cfg.parallel.virtual_stages;
    for (int r = 0; r < pp; ++r) {
      GptPart part = pipeline_part(cfg.model, pp, v, r, cfg.parallel.stage_layers);
      ParamStore lay;
      declare_gpt_params(cfg.model, lay, 1, 0, part);
      for (const ParamInfo& p : lay.infos()) {
        int stage = r;  // embedding / head: the first / last virtual stage
        if (p.name.rfind("h.", 0) == 0) {
          const int l = std::stoi(p.name.substr(2));
          for (size_t c = 0; c < part.chunks.size(); ++c)
            if (l >= part.chunks[c].first && l < part.chunks[c].second) stage = static_cast<int>(c) * pp + r;
        } else if (part.head && !part.embedding) {
          stage = pp * v - 1;
        }
        layout[p.name].push_back(stage);
      }
    }
    extra["pp_layout"] = layout;
  }
  return extra;
}

// A full (gathered) checkpoint: parameters and optimizer moments, one file each. Returns its directory.
std::string write_checkpoint(const RunConfig& cfg, const std::vector<SavedTensor>& tensors, int step,
                             const LoaderState& data, int micro, uint64_t windows, SaveWhy why) {
  std::vector<TensorRef> model_t, optim_t;
  for (const SavedTensor& t : tensors) {
    model_t.push_back(tensor_ref(t.name, t.p));
    optim_t.push_back(tensor_ref("m." + t.name, t.m));
    optim_t.push_back(tensor_ref("v." + t.name, t.v));
  }
  const nlohmann::json extra = checkpoint_extra(cfg, step, data, micro, windows);
  SaveOptions so;
  so.keep_last = cfg.ckpt.keep_last;
  double t0 = now_seconds();
  std::string dir = save_checkpoint(cfg.ckpt.dir, step,
                                    {{"model.safetensors", model_t}, {"optim.safetensors", optim_t}}, extra, so);
  fmt::print("checkpoint ({}) step {} -> {} in {:.2f} s\n", kind_name(why), step, dir, now_seconds() - t0);
  return dir;
}

// The run's position a checkpoint records (extra.step, extra.data.epoch/cursor), each type-checked: a wrong type
// is an error naming the manifest and the key, never a bare json type_error.
struct SavedPosition {
  int step = 0;
  LoaderState data;
};

// extra[key] (or extra.data[key] when data) of checkpoint ck: present and satisfying ok, else an error naming it.
const nlohmann::json& extra_field(const CheckpointReader& ck, const char* key, bool data,
                                  bool (*ok)(const nlohmann::json&), const char* expected) {
  const nlohmann::json& obj = data ? ck.extra()["data"] : ck.extra();
  const std::string path = data ? fmt::format("extra.data.{}", key) : fmt::format("extra.{}", key);
  MT_CHECK(obj.is_object() && obj.contains(key), "checkpoint {}: manifest.json lacks {}", ck.dir(), path);
  const nlohmann::json& v = obj[key];
  MT_CHECK(ok(v), "checkpoint {}: manifest.json: {} is {}, not {}", ck.dir(), path, v.dump(), expected);
  return v;
}

bool is_count(const nlohmann::json& v) { return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0); }
bool is_step(const nlohmann::json& v) { return is_count(v) && v.get<uint64_t>() <= uint64_t{INT32_MAX}; }
bool is_string(const nlohmann::json& v) { return v.is_string(); }
bool is_object(const nlohmann::json& v) { return v.is_object(); }

SavedPosition saved_position(const CheckpointReader& ck) {
  SavedPosition p;
  p.step = extra_field(ck, "step", false, is_step, "a step number (0 .. 2^31-1)").get<int>();
  p.data.epoch = extra_field(ck, "epoch", true, is_count, "a non-negative integer").get<uint64_t>();
  p.data.cursor = extra_field(ck, "cursor", true, is_count, "a non-negative integer").get<uint64_t>();
  return p;
}

// The data position a checkpoint saved, carried over to this run's sources. A blend's position is the rows each source
// has given, matched by directory; a source new to the run starts at its beginning. When the sources or their weights
// changed, the shares count from here (`since` = `taken`): the new weights hold over the rows to come, rather than
// making up the past. A one-source run resumed as a blend (or the reverse) carries its one source's position over
// through its window count. Every change is said on the main rank.
LoaderState position_for_this_run(const RunConfig& cfg, const CheckpointReader& ck, const LoaderState& saved,
                                  uint64_t windows, bool say) {
  const nlohmann::json& d = ck.extra()["data"];
  const std::vector<DataSource> now = cfg.data.sources();
  // The saved sources and the rows each gave: a blend's lists, or one source's (dir, epoch x windows + cursor).
  std::vector<DataSource> was;
  std::vector<uint64_t> taken, since;
  const bool saved_blend = d.contains("blend");
  if (saved_blend) {
    const nlohmann::json &b = d["blend"], &t = d.contains("taken") ? d["taken"] : nlohmann::json(),
                         &sn = d.contains("since") ? d["since"] : nlohmann::json();
    MT_CHECK(b.is_array() && t.is_array() && sn.is_array() && t.size() == b.size() && sn.size() == b.size(),
             "checkpoint {}: manifest.json: extra.data.blend, .taken and .since must be lists of one length", ck.dir());
    for (size_t k = 0; k < b.size(); ++k) {
      MT_CHECK(b[k].is_object() && b[k].contains("dir") && b[k]["dir"].is_string() && b[k].contains("weight") &&
                   b[k]["weight"].is_number() && is_count(t[k]) && is_count(sn[k]) && sn[k] <= t[k],
               "checkpoint {}: manifest.json: extra.data.blend entry {} is not a {{dir, weight}} with counts taken >= "
               "since", ck.dir(), k);
      was.push_back({b[k]["dir"].get<std::string>(), b[k]["weight"].get<double>()});
      taken.push_back(t[k].get<uint64_t>());
      since.push_back(sn[k].get<uint64_t>());
    }
  } else {
    const std::string dir = d.contains("dir") && d["dir"].is_string() ? d["dir"].get<std::string>() : "";
    const uint64_t w = d.contains("windows") && is_count(d["windows"]) ? d["windows"].get<uint64_t>() : 0;
    if (now.size() == 1) return saved;  // one source then and now: the position as saved (the order check follows)
    was.push_back({dir, 1.0});
    taken.push_back(saved.epoch * w + saved.cursor);
    since.push_back(taken.back());
    if (say && w == 0 && saved.epoch > 0)
      fmt::print(stderr, "warning: checkpoint {} records no window count for {}: its position in it is taken as "
                 "cursor {} of its first epoch\n", ck.dir(), dir, saved.cursor);
  }
  auto find = [&](const std::string& dir) -> int {
    for (size_t k = 0; k < was.size(); ++k)
      if (was[k].dir == dir) return static_cast<int>(k);
    return -1;
  };
  if (now.size() == 1) {  // a blend resumed as one source: that source's rows, as (epoch, cursor)
    const int k = find(now[0].dir);
    const uint64_t t = k >= 0 ? taken[k] : 0;
    if (say)
      fmt::print("data: checkpoint {} was a blend; this run reads {} alone, {}\n", ck.dir(), now[0].dir,
                 k >= 0 ? fmt::format("from its row {} on", t) : std::string("from its start (the blend did not hold it)"));
    return windows > 0 ? LoaderState(t / windows, t % windows) : LoaderState();
  }
  LoaderState out;
  double sum_was = 0, sum_now = 0;
  for (const DataSource& w : was) sum_was += w.weight;
  for (const DataSource& n : now) sum_now += n.weight;
  bool same = saved_blend && was.size() == now.size();
  for (const DataSource& n : now) {
    const int k = find(n.dir);
    out.taken.push_back(k >= 0 ? taken[k] : 0);
    out.since.push_back(k >= 0 ? since[k] : 0);
    same = same && k >= 0 && std::abs(was[k].weight / sum_was - n.weight / sum_now) <= 1e-12;
  }
  if (!same) {
    out.since = out.taken;
    if (say) {
      std::vector<std::string> a, b;
      for (const DataSource& w : was) a.push_back(fmt::format("{} {:.4g}", w.dir, w.weight / sum_was));
      for (const DataSource& n : now) b.push_back(fmt::format("{} {:.4g}", n.dir, n.weight / sum_now));
      fmt::print("data: the blend changed since checkpoint {} (was {}; now {}): each source continues where it was, "
                 "and the new shares hold from here\n", ck.dir(), fmt::join(a, ", "), fmt::join(b, ", "));
    }
  }
  // Each source's position is a count into its epochs' window orders: under another seed or shuffle setting, the
  // rest of each source's current epoch repeats some windows and skips others (as warn_if_order_changed says of one
  // source).
  const bool saved_shuffle = !d.contains("shuffle") || !d["shuffle"].is_boolean() || d["shuffle"].get<bool>();
  const std::string saved_seed = d.contains("seed") ? d["seed"].dump() : "?";
  if (say && saved_blend && (saved_shuffle != cfg.data.shuffle ||
                             (cfg.data.shuffle && saved_seed != std::to_string(cfg.data.seed))))
    fmt::print(stderr, "warning: checkpoint {} saved its blend's position in another window order ({}) than this "
               "run's ({}): the rest of each source's current epoch may repeat some windows and skip others\n",
               ck.dir(), saved_shuffle ? "shuffled, seed " + saved_seed : "sequential",
               cfg.data.shuffle ? "shuffled, seed " + std::to_string(cfg.data.seed) : "sequential");
  return out;
}

// The order an epoch visits the windows in, as a run configured with cfg over `windows` windows uses it and as
// checkpoint ck recorded it (checkpoints without "order" predate WindowOrder: they shuffled by Fisher-Yates). The
// window count is part of a shuffled order (a dataset that grew is permuted anew); it is compared when both sides
// know it.
std::string window_order_of(bool shuffle, const std::string& seed, const std::string& order, uint64_t windows) {
  if (!shuffle) return "sequential";
  return fmt::format("shuffled, seed {}, {}{}", seed, order, windows ? fmt::format(", {} windows", windows) : "");
}

// A data position is a cursor into one window order: resumed under another (a changed seed, a dataset that grew or
// shrank, another megatrain's shuffle), the rest of the saved epoch reads some windows twice and skips others.
// That is allowed (the next epoch is a whole epoch again) but never silent: the main rank says so.
void warn_if_order_changed(const RunConfig& cfg, uint64_t windows, const CheckpointReader& ck,
                           const LoaderState& data) {
  // Only the description depends on these keys, so a value of the wrong type is shown as it is, never thrown.
  const nlohmann::json& d = ck.extra()["data"];
  auto key = [&](const char* k) { return d.contains(k) ? d[k] : nlohmann::json(); };
  const nlohmann::json shuffle = key("shuffle"), order = key("order"), w = key("windows");
  const uint64_t saved_windows = w.is_number_unsigned() ? w.get<uint64_t>() : 0;
  const uint64_t both = saved_windows > 0 && windows > 0 ? 1 : 0;
  const std::string saved =
      window_order_of(!shuffle.is_boolean() || shuffle.get<bool>(), key("seed").dump(),
                      order.is_null() ? "fisher-yates" : order.is_string() ? order.get<std::string>() : order.dump(),
                      both * saved_windows);
  const std::string now = window_order_of(cfg.data.shuffle, std::to_string(cfg.data.seed), WindowOrder::kName,
                                          both * windows);
  if (saved == now || data.cursor == 0) return;
  fmt::print(stderr, "warning: checkpoint {} saved its data position (epoch {}, cursor {}) in another window order "
             "({}) than this run's ({}): the rest of epoch {} may repeat some windows and skip others; the epochs from {} "
             "on are whole\n", ck.dir(), data.epoch, data.cursor, saved, now, data.epoch, data.epoch + 1);
}

// Throws unless the checkpoint continues this run: same model, optimizer and global batch.
void check_fits(const RunConfig& cfg, const CheckpointReader& ck) {
  const nlohmann::json& x = ck.extra();
  MT_CHECK(x.is_object() && x.contains("model") && x.contains("data") && x.contains("step"),
           "checkpoint {} lacks the training state (model/data/step); was it written by `megatrain convert`? Use "
           "model.init_from for weights only", ck.dir());
  extra_field(ck, "data", false, is_object, "an object");
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
  const std::string optim = extra_field(ck, "optim_name", false, is_string, "a string").get<std::string>();
  MT_CHECK(optim == cfg.optim.name, "checkpoint {} used optimizer '{}' but this run uses '{}'", ck.dir(), optim,
           cfg.optim.name);
  const auto& d = x["data"];
  const int64_t saved_b = d.contains("global_batch_size")
                              ? extra_field(ck, "global_batch_size", true, is_count, "a non-negative integer").get<int64_t>()
                              : extra_field(ck, "batch_size", true, is_count, "a non-negative integer").get<int64_t>();
  const int64_t saved_t = extra_field(ck, "seq_len", true, is_count, "a non-negative integer").get<int64_t>();
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

// Full (unsharded) copies of every parameter and moment of a tensor-parallel rank, for gathered checkpoints.
struct TpFullState {
  std::vector<HostBuffer> p, m, v;
  std::vector<ShardSpec> specs;
  std::vector<int64_t> saved_rows;  // dim 0 as saved (vocab tensors: the single-process padded_vocab())

  void allocate(const ParamStore& ps, const ModelConfig& mc) {
    for (const ParamInfo& info : ps.infos()) {
      specs.push_back(info.shard);
      const size_t bytes = static_cast<size_t>(info.shard.full_numel()) * sizeof(float);
      for (auto* b : {&p, &m, &v}) b->emplace_back(bytes);
      const bool vocab = info.name == "wte.weight" || info.name == "lm_head.weight";
      saved_rows.push_back(vocab ? mc.padded_vocab() : info.shard.full_shape[0]);
    }
  }
  Tensor view(std::vector<HostBuffer>& b, int i) const {
    Tensor t;
    t.ptr = b[i].data();
    t.ndim = static_cast<int>(specs[i].full_shape.size());
    for (int d = 0; d < t.ndim; ++d) t.dims[d] = specs[i].full_shape[d];
    t.dims[0] = saved_rows[i];
    return t;
  }
  void gather(ProcessGroup& g, const ParamStore& ps, const Moments& local) {
    for (size_t k = 0; k < ps.size(); ++k) {
      const int i = static_cast<int>(k);
      tp_gather_full(g, specs[k], ps.param(i).f32(), p[k].f32());
      tp_gather_full(g, specs[k], local.m(i).f32(), m[k].f32());
      tp_gather_full(g, specs[k], local.v(i).f32(), v[k].f32());
    }
  }
};

}  // namespace

struct TrainCheckpointer::Impl {
  const RunConfig& cfg;
  GPT& model;
  Optimizer* opt;
  DataParallel* ddp;
  DeviceMesh* mesh;
  Agreement agreement;  // over the host mesh (trivial in a single process)
  const int wte_copy;
  const int tp, pp, vstages, pp_rank, micro;
  const bool main_rank;
  const bool sharded;  // each rank writes its own pieces (sharded.h); else rank 0 writes gathered full tensors
  uint64_t data_windows = 0;  // windows in an epoch of the training data (set_data_windows; 0 = not told)
  // Full moments for gathered checkpoints: the optimizer's own, or a gathered copy of the ZeRO shards.
  HostBuffer full_m, full_v;
  Moments moments;
  // A gathered save with tp gathers the shards over tp into full copies (allocated by the first such save).
  // wte/lm_head are saved at the single-process padded_vocab() rows (the extra rows that tp's coarser
  // vocabulary padding adds are zero), sharded or gathered.
  TpFullState tp_full;
  Moments saved;
  // Two-stage saves (every layout but a gathered parallel one): the state the background thread shares, the thread.
  const bool staged;
  std::shared_ptr<CkptAsyncState> as;
  std::unique_ptr<CkptWorker> worker;
  std::deque<HostBuffer> piece_staging;  // pieces not contiguous in memory, copied out before stage 1 copies them
  int snapshots = 0;
  bool failing = false;  // the run is failing: do not wait for a background copy to a dead peer at destruction
  std::vector<Fault> kill_faults;  // kill_after_snapshot faults for this rank (tests)
  int attempt = 0;                 // MEGATRAIN_ATTEMPT, for their message

  Impl(const RunConfig& c, GPT& m, Optimizer* o, DataParallel* d, DeviceMesh* me, int wc)
      : cfg(c), model(m), opt(o), ddp(d), mesh(me), agreement(me), wte_copy(wc), tp(c.parallel.tp), pp(c.parallel.pp),
        vstages(c.parallel.virtual_stages), pp_rank(me ? me->coord().pp : 0), micro(c.pipeline_microbatches()),
        main_rank(!me || me->rank() == 0), sharded(me && c.ckpt.sharded), staged(!me || c.ckpt.sharded),
        as(std::make_shared<CkptAsyncState>()), worker(std::make_unique<CkptWorker>()) {
    as->root = c.ckpt.dir;
    as->main_rank = main_rank;
    as->single = !me;
    as->world = c.parallel.dp * c.parallel.pp * c.parallel.tp;
    for (int p = 0; p < c.parallel.pp; ++p)
      for (int t = 0; t < c.parallel.tp; ++t)
        for (int d = 0; d < c.parallel.dp; ++d) as->files.push_back(shard_file_name(p, t, d));
    as->keep_last = c.ckpt.keep_last;
    // Rank 0 waits this long for the other ranks' shards: generous, a slow disk is not a dead rank.
    as->commit_timeout_s = std::max(600.0, 5.0 * c.parallel.timeout_s);
    // Test faults (core/fault_spec.h): a delay before every stage 2, a kill right after a stage 1.
    const int rank = me ? me->rank() : 0;
    for (const Fault& f : faults_for(FaultKind::Stage2Delay, rank)) as->stage2_delay_s = f.seconds;
    kill_faults = faults_for(FaultKind::KillAfterSnapshot, rank);
    if (!kill_faults.empty()) attempt = attempt_from_env();
    // The snapshot memory is allocated and faulted in by the background thread now, so the first save's stall is
    // a copy, not 12 bytes per parameter of fresh pages (seconds at 124M). Only runs that save periodically.
    if (staged && c.ckpt.every > 0) {
      std::vector<ShardPiece> layout = my_pieces(piece_staging);
      worker->post([st = as, layout] { st->own[0].reserve(layout); });
    }
    if (opt) {
      moments.m = [this](int i) { return opt->m(i); };
      moments.v = [this](int i) { return opt->v(i); };
    } else {
      moments.m = [this](int i) { return full_view(full_m, i); };
      moments.v = [this](int i) { return full_view(full_v, i); };
    }
    saved = moments;
    if (tp > 1) {  // the full copies are allocated by the first gathered save
      saved.p = [this](int i) { return tp_full.view(tp_full.p, i); };
      saved.m = [this](int i) { return tp_full.view(tp_full.m, i); };
      saved.v = [this](int i) { return tp_full.view(tp_full.v, i); };
    }
  }

  ~Impl() {
    // A task blocked on a dead peer would block the join until its group's timeout: on the failure path the
    // worker is left running (its tasks own the shared state) and the process exits under it.
    if (failing && !worker->idle()) (void)worker.release();
  }

  Tensor full_view(HostBuffer& b, int i) const {
    const ParamInfo& p = model.params().info(i);
    Tensor t = model.params().param(i);
    t.ptr = b.f32() + p.offset;
    return t;
  }

  // This rank's tensors as saved (full), without the last stage's wte copy.
  std::vector<SavedTensor> stage_tensors() const {
    std::vector<SavedTensor> t;
    const ParamStore& ps = model.params();
    for (int i = 0; i < static_cast<int>(ps.size()); ++i)
      if (i != wte_copy) t.push_back({ps.info(i).name, saved.p ? saved.p(i) : ps.param(i), saved.m(i), saved.v(i)});
    return t;
  }

  // With pp the dp0/tp0 rank of every stage sends its (full) tensors to pp rank 0 over the pp group, which writes
  // one full checkpoint: any layout resumes from it.
  std::pair<std::vector<SavedTensor>, std::deque<HostBuffer>> gather_stages() const {
    std::map<std::string, SavedTensor> all;
    for (SavedTensor& t : stage_tensors()) all[t.name] = t;
    std::deque<HostBuffer> bufs;
    for (int r = 1; r < pp; ++r) {
      ParamStore lay;
      declare_gpt_params(cfg.model, lay, 1, 0,
                         pipeline_part(cfg.model, pp, vstages, r, cfg.parallel.stage_layers));
      std::vector<WorkPtr> work;
      int tag = 0;
      for (const ParamInfo& info : lay.infos()) {
        if (r == pp - 1 && cfg.model.tied_embeddings && info.name == "wte.weight") continue;
        SavedTensor st{info.name, {}, {}, {}};
        for (Tensor* x : {&st.p, &st.m, &st.v}) {
          bufs.emplace_back(info.numel * sizeof(float));
          x->ptr = bufs.back().data();
          x->dtype = DType::F32;
          x->ndim = static_cast<int>(info.shape.size());
          for (int d = 0; d < x->ndim; ++d) x->dims[d] = info.shape[d];
          work.push_back(mesh->pp().recv(*x, r, tag++));
        }
        all[info.name] = st;
      }
      for (auto& w : work) w->wait();
    }
    ParamStore full;
    declare_gpt_params(cfg.model, full);
    std::vector<SavedTensor> out;
    for (const ParamInfo& info : full.infos()) out.push_back(all.at(info.name));
    return std::make_pair(out, std::move(bufs));
  }

  // ---- no checkpoint with a non-finite value

  // The first inf/NaN in what this rank holds (parameters, optimizer moments or its ZeRO slices of them),
  // described for the error; "" when every value is finite. Everything a checkpoint can take from this rank is
  // here: the gathered and the sharded save both write from these tensors.
  std::string non_finite_value() {
    const ParamStore& ps = model.params();
    auto scan = [](const char* what, const std::string& name, const float* x, int64_t n, int64_t base = 0) {
      const int64_t i = first_non_finite(x, n);
      return i < 0 ? std::string() : fmt::format("{} '{}' (element {}: {})", what, name, base + i, x[i]);
    };
    for (int i = 0; i < static_cast<int>(ps.size()); ++i) {
      const std::string& name = ps.info(i).name;
      const int64_t n = static_cast<int64_t>(ps.info(i).numel);
      std::string bad = scan("parameter", name, ps.param(i).f32(), n);
      if (bad.empty() && opt) bad = scan("optimizer moment m of", name, opt->m(i).f32(), n);
      if (bad.empty() && opt) bad = scan("optimizer moment v of", name, opt->v(i).f32(), n);
      if (!bad.empty()) return bad;
    }
    if (ddp) {
      for (const DataParallel::MomentSlice& ms : ddp->moment_slices()) {
        const std::string& name = ps.info(ms.tensor).name;
        const int64_t n = static_cast<int64_t>(ms.end - ms.begin), base = static_cast<int64_t>(ms.begin);
        std::string bad = scan("optimizer moment m of", name, ms.m, n, base);
        if (bad.empty()) bad = scan("optimizer moment v of", name, ms.v, n, base);
        if (!bad.empty()) return bad;
      }
    }
    return "";
  }

  // Throws on every rank when any rank holds a non-finite value, before any file of checkpoint `step` is written
  // (root/latest keeps naming the last good checkpoint). All ranks learn the verdict from one sum of per-rank
  // flags over the mesh, so they refuse together: no rank waits at a barrier for one that gave up (a hang until
  // the timeout), and no manifest is committed over a shard another rank refused to write.
  // staged_finite: stage 1 already found every value it copied finite, and what it copied is everything this rank
  // holds (no replica left unread): the scan is skipped. Otherwise (or to name the value) it scans.
  void check_finite(int step, bool staged_finite = false) {
    const std::string bad = staged_finite ? std::string() : non_finite_value();
    const char* keep = "the checkpoint is not written (the latest checkpoint is still the last good one)";
    if (!mesh) {
      if (!bad.empty())
        fail_as(ErrorKind::NonFinite, "step {}: {} holds a non-finite value: the weights diverged; {}", step, bad, keep);
      return;
    }
    const std::vector<int> ranks = agreement.which_ranks(!bad.empty());  // every rank's flag, everywhere
    if (!bad.empty())
      fail_as(ErrorKind::NonFinite, "step {}: rank {}: {} holds a non-finite value: the weights diverged; {}", step,
              mesh->rank(), bad, keep);
    if (!ranks.empty())
      fail_as(ErrorKind::NonFinite, "step {}: rank(s) {} hold non-finite values (their errors name the tensors): the "
              "weights diverged; {}", step, fmt::join(ranks, ", "), keep);
  }

  // ---- sharded checkpoints: each rank's pieces, read back by any layout

  // A tensor's shape in checkpoints: the full shape, but wte/lm_head at the single-process padded_vocab() rows
  // (tp pads the vocabulary to a multiple of vocab_pad_to * tp; those extra rows are zero and not saved).
  std::vector<int64_t> saved_shape(int i) const {
    const ParamInfo& info = model.params().info(i);
    std::vector<int64_t> s = info.shard.full_shape;
    if (info.name == "wte.weight" || info.name == "lm_head.weight") s[0] = cfg.model.padded_vocab();
    return s;
  }

  // The pieces of `box` (in tensor i's shard; `data` holds the box's elements contiguously) under full tensor
  // `name`: one per contiguous run of tp's split dimension, clipped to the saved shape. A piece that is not
  // contiguous within the box is copied to `staging`.
  void add_pieces(std::vector<ShardPiece>& out, std::deque<HostBuffer>& staging, int i, const std::string& name,
                  const char* group, const Slice& box, const float* data) const {
    const std::vector<int64_t> gshape = saved_shape(i);
    const size_t n = gshape.size();
    for (const Placement& pl : shard_placements(model.params().info(i).shard, box)) {
      const std::optional<Slice> full = intersect(pl.full, whole_slice(gshape));
      if (!full) continue;
      std::vector<int64_t> at(n);  // where the piece starts within the box
      for (size_t d = 0; d < n; ++d) at[d] = pl.local.start[d] + (full->start[d] - pl.full.start[d]) - box.start[d];
      const float* p = nullptr;
      if (slice_contiguous(Slice{at, full->extent}, box.extent)) {
        p = data + flat_index(at, box.extent);
      } else {
        staging.emplace_back(static_cast<size_t>(full->numel()) * sizeof(float), false);
        copy_box(data, box.extent, at, staging.back().data(), full->extent, std::vector<int64_t>(n, 0), full->extent,
                 sizeof(float));
        p = staging.back().f32();
      }
      out.push_back(ShardPiece{name, group, gshape, *full, DType::F32, p});
    }
  }

  // What this rank uniquely holds: its TP shard of every parameter of its stage if it is the dp-rank-0 replica,
  // its ZeRO slices of the moments (all of them without ZeRO, on dp rank 0). Replicated tensors come from tp
  // rank 0 only; the last stage's copy of a tied wte not at all.
  std::vector<ShardPiece> my_pieces(std::deque<HostBuffer>& staging) {
    const ParamStore& ps = model.params();
    const MeshCoord c = mesh ? mesh->coord() : MeshCoord{};
    auto mine = [&](int i) { return i != wte_copy && (c.tp == 0 || ps.info(i).shard.sharded()); };
    std::vector<ShardPiece> out;
    for (int i = 0; i < static_cast<int>(ps.size()); ++i) {
      if (!mine(i) || c.dp != 0) continue;
      const Slice all = whole_slice(ps.info(i).shape);
      add_pieces(out, staging, i, ps.info(i).name, "model.safetensors", all, ps.param(i).f32());
      if (opt) {
        add_pieces(out, staging, i, "m." + ps.info(i).name, "optim.safetensors", all, opt->m(i).f32());
        add_pieces(out, staging, i, "v." + ps.info(i).name, "optim.safetensors", all, opt->v(i).f32());
      }
    }
    if (ddp) {
      for (const DataParallel::MomentSlice& ms : ddp->moment_slices()) {
        if (!mine(ms.tensor)) continue;
        const ParamInfo& info = ps.info(ms.tensor);
        for (const Slice& box : flat_range_slices(info.shape, static_cast<int64_t>(ms.begin), static_cast<int64_t>(ms.end))) {
          const int64_t off = flat_index(box.start, info.shape) - static_cast<int64_t>(ms.begin);
          add_pieces(out, staging, ms.tensor, "m." + info.name, "optim.safetensors", box, ms.m + off);
          add_pieces(out, staging, ms.tensor, "v." + info.name, "optim.safetensors", box, ms.v + off);
        }
      }
    }
    return out;
  }

  // Reads the slices of full tensor `name` that box `box` of tensor i's shard holds into `data` (the box's
  // elements, contiguous).
  // Reader: a CheckpointReader, or an HfSliceReader (model.init_from of an HF model).
  template <class Reader>
  static void read_box(Reader& ck, const ParamInfo& info, const std::string& name, const Slice& box, float* data) {
    for (const Placement& pl : shard_placements(info.shard, box)) {
      std::vector<int64_t> at(box.start.size());
      for (size_t d = 0; d < at.size(); ++d) at[d] = pl.local.start[d] - box.start[d];
      ck.read(name, pl.full, data, box.extent, at);
    }
  }

  // ---- two-stage saves

  // Stage 1 of checkpoint `step` on the training thread; stage 2 (and the peer copy) posted to the background.
  // Returns the committed directory on rank 0 when `wait`, else "".
  //
  // Slots: with peer copies, snapshot k goes to own[k % 2] (and the buddy's copy of it to its held[k % 2]). Before
  // anyone overwrites slot k % 2 (snapshot k-2), every rank has finished its copy of snapshot k-1 (the agreement
  // below). So whenever a rank dies, either every copy of k-1 completed (set k-1 survives: every rank's own k-1,
  // and the dead rank's k-1 at its buddy) or nobody has passed this point yet, and set k-2 is untouched.
  std::string snapshot(int step, const LoaderState& data, SaveWhy why, bool wait) {
    const double t0 = now_seconds();
    worker->wait_idle();  // the previous save, if still in flight: its memory is about to be reused
    if (as->peers) {
      std::string err;
      ErrorKind kind;
      {
        std::lock_guard<std::mutex> lk(as->mu);
        err = as->exchange_error;
        kind = as->exchange_kind;
      }
      const std::vector<int> bad = agreement.which_ranks(!err.empty());
      if (!err.empty())
        fail_as(kind, "step {}: copying this rank's snapshot to buddy rank {} failed: {}", step, as->peers->buddy, err);
      if (!bad.empty())
        fail_as(ErrorKind::PeerLost, "step {}: rank(s) {} could not copy their snapshot to their buddy (their errors "
                "say why)", step, fmt::join(bad, ", "));
    }
    const bool persist = why != SaveWhy::Snapshot;
    const int slot = as->peers ? snapshots % 2 : 0;
    as->own_ok[slot] = false;
    if (persist && mesh && main_rank) begin_sharded_checkpoint(cfg.ckpt.dir, step);
    if (ddp) ddp->sync_params();
    piece_staging.clear();
    const MeshCoord c = mesh ? mesh->coord() : MeshCoord{};
    const bool finite = as->own[slot].stage(step, shard_file_name(c.pp, c.tp, c.dp), my_pieces(piece_staging),
                                            checkpoint_extra(cfg, step, data, micro, data_windows));
    const bool covered = !mesh || (c.dp == 0 && c.tp == 0 && wte_copy < 0);
    check_finite(step, finite && covered);  // collective: also the barrier after begin_sharded_checkpoint
    as->own_ok[slot] = true;
    ++snapshots;
    as->event({step, CheckpointStage::Snapshot, why, "", "", now_seconds() - t0});
    if (as->peers) worker->post([st = as, slot] { exchange_snapshot(*st, slot); });
    if (persist) worker->post([st = as, slot, why, t0] { persist_snapshot(*st, slot, why, t0); });
    kill_after_snapshot(step);
    if (!wait) return "";

    // Waited for (a synchronous save, the final and the stop checkpoint): every rank leaves only once rank 0 has
    // committed, and every rank fails together when any part failed.
    worker->wait_idle();
    bool failed;
    std::string msg, dir;
    {
      std::lock_guard<std::mutex> lk(as->mu);
      failed = persist && as->persist_failed;
      msg = as->persist_message;
      dir = as->committed_dir;
    }
    const std::vector<int> bad = agreement.which_ranks(failed);
    if (failed) fail_as(ErrorKind::IO, "checkpoint ({}) step {} failed: {}", kind_name(why), step, msg);
    if (!bad.empty())
      fail_as(ErrorKind::IO, "checkpoint ({}) step {} was not committed: rank(s) {} failed to write (their errors say "
              "why)", kind_name(why), step, fmt::join(bad, ", "));
    return main_rank && persist ? dir : "";
  }

  // Tests only (the kill_after_snapshot fault, core/fault_spec.h): this rank dies by SIGKILL right after stage 1
  // of `step`, its background work just posted: a rank lost with its snapshot only in memory.
  void kill_after_snapshot(int step) {
    for (const Fault& f : kill_faults) {
      if (f.step != step) continue;
      const int me = mesh ? mesh->rank() : 0;
      fmt::print(stderr, "fault injected: {} (rank {}, step {}, attempt {}): killed after the snapshot of step {}\n",
                 f.item, me, step, attempt, step);
      std::fflush(stderr);
      ::raise(SIGKILL);
    }
  }

  // ---- restore: phase A (local reads, which may fail), B (agreement), C (broadcast; no file access)

  // With one reader per dp group, dp rank 0 reads the replicated state (parameters, and the moments without ZeRO)
  // and broadcasts it; the ZeRO moment slices differ per dp rank, so each reads its own (nothing read twice).
  bool one_reader() const { return mesh && cfg.ckpt.one_reader && cfg.parallel.dp > 1; }

  // Phase A: this rank's reads. Returns "" or what failed (the reader's message names the file).
  std::string read_mine(CheckpointReader& ck) {
    try {
      const ParamStore& ps = model.params();
      if (!one_reader() || mesh->coord().dp == 0) {
        for (int i = 0; i < static_cast<int>(ps.size()); ++i) {
          const ParamInfo& info = ps.info(i);
          const Slice all = whole_slice(info.shape);
          read_box(ck, info, info.name, all, ps.param(i).f32());
          if (opt) {
            read_box(ck, info, "m." + info.name, all, opt->m(i).f32());
            read_box(ck, info, "v." + info.name, all, opt->v(i).f32());
          }
        }
      }
      if (ddp) {
        for (const DataParallel::MomentSlice& ms : ddp->moment_slices()) {
          const ParamInfo& info = ps.info(ms.tensor);
          for (const Slice& box : flat_range_slices(info.shape, static_cast<int64_t>(ms.begin), static_cast<int64_t>(ms.end))) {
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
  void broadcast_replicas() {
    const ParamStore& ps = model.params();
    ProcessGroup& g = mesh->dp();
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
    if (opt)
      for (int i = 0; i < static_cast<int>(ps.size()); ++i)
        for (Tensor t : {opt->m(i), opt->v(i)}) bcast(t.f32(), static_cast<size_t>(t.numel()));
  }

  // Loads checkpoint ck (checked to fit this run: a misfit throws on every rank alike). A read that fails on any
  // rank makes every rank return -1 with `problem` set (the failing rank's message, or which ranks failed).
  int load(CheckpointReader& ck, LoaderState& data, std::string& problem) {
    check_fits(cfg, ck);
    const std::string err = read_mine(ck);
    const std::vector<int> bad = agreement.which_ranks(!err.empty());
    if (!bad.empty()) {
      problem = !err.empty() ? err
                             : fmt::format("rank(s) {} could not read checkpoint {} (their messages name the file)",
                                           fmt::join(bad, ", "), ck.dir());
      return -1;
    }
    if (one_reader()) broadcast_replicas();
    if (ddp) ddp->commit_moment_slices();
    agreement.barrier();  // restored everywhere: rank 0's clock then times the whole group's restore
    const SavedPosition pos = saved_position(ck);
    data = position_for_this_run(cfg, ck, pos.data, data_windows, main_rank);
    if (main_rank && data.taken.empty() && !ck.extra()["data"].contains("blend"))
      warn_if_order_changed(cfg, data_windows, ck, data);
    as->protect = ck.dir();
    return pos.step;
  }

  // Sharded checkpoints: every rank writes its own files into ckpt.dir and rank 0 commits them, so every rank must
  // see the directory rank 0 sees. Rank 0 writes a probe holding a fresh nonce (broadcast to every rank), every
  // other rank reads it back, and all agree on who could not.
  void check_shared_dir() {
    if (!mesh || !sharded) return;
    const std::string probe = cfg.ckpt.dir + "/.megatrain-shared-probe";
    std::string nonce, err;
    if (main_rank) {
      nonce = std::to_string((uint64_t{std::random_device{}()} << 32) ^ std::random_device{}() ^
                             static_cast<uint64_t>(now_seconds() * 1e6));
      try {
        write_file_atomic(probe, nonce);
      } catch (const std::exception& e) {
        err = e.what();
      }
    }
    nonce = agreement.broadcast(nonce, 0);  // rank 0's nonce, everywhere
    if (!main_rank) {
      std::ifstream f(probe);
      std::string seen;
      if (!(f >> seen) || seen != nonce)
        err = f ? "it holds another run's probe" : "it is not there";
    }
    const std::vector<int> bad = agreement.which_ranks(!err.empty());
    if (main_rank) {
      std::error_code ec;
      std::filesystem::remove(probe, ec);
    }
    if (bad.empty()) return;
    if (!err.empty()) fmt::print(stderr, "ckpt.dir {}: the probe file rank 0 wrote there: {}\n", cfg.ckpt.dir, err);
    fail_as(ErrorKind::Config, "ckpt.dir {} is not one directory for every rank: rank(s) {} do not see the file "
            "rank 0 wrote there. Sharded checkpoints need a file system every rank shares (or ckpt.sharded=false: "
            "rank 0 writes them alone)", cfg.ckpt.dir, fmt::join(bad, ", "));
  }

  void init_params(const std::string& path) {
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
      const ParamStore& ps = model.params();
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
      fail_as(ErrorKind::Checkpoint, "{}", !err.empty() ? err
                                          : fmt::format("rank(s) {} could not read {} (their messages name the file)",
                                                        fmt::join(bad, ", "), source));
    agreement.barrier();
  }

  int restore(const std::string& path, LoaderState& data) {
    CheckpointReader ck = CheckpointReader::open(path);
    std::string problem;
    const int step = load(ck, data, problem);
    MT_CHECK(step >= 0, "{}", problem);
    return step;
  }

  // resume = auto: the newest readable checkpoint. Survivors' peer snapshots newer than the latest checkpoint are
  // committed first (rank 0, then a barrier); a checkpoint that is corrupt or partial is skipped with a warning
  // naming it, and the one before it tried. Returns -1 when there is none at all.
  int restore_auto(LoaderState& data, std::string& from) {
    const std::string& root = cfg.ckpt.dir;
    if (main_rank && staged && mesh) {
      try {
        promote_peer_snapshots(root, cfg.ckpt.keep_last);
      } catch (const std::exception& e) {
        fmt::print(stderr, "warning: the peer snapshots under {}/snapshots could not be committed: {}; resuming from "
                   "disk\n", root, e.what());
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
      // another run) are not a corrupt file: load() lets them stop the run.
      std::optional<CheckpointReader> ck;
      try {
        ck.emplace(CheckpointReader::open(c));
      } catch (const Error& e) {
        problem = e.what();
      }
      if (ck) step = load(*ck, data, problem);
      if (step >= 0) {
        from = c;
        return step;
      }
      if (main_rank || !problem.starts_with("rank("))
        fmt::print(stderr, "warning: resume = auto: skipping checkpoint {}: it is corrupt or partial: {}; {}\n", c,
                   problem, i + 1 < candidates.size() ? "falling back to " + candidates[i + 1] : "no older checkpoint");
    }
    if (!candidates.empty())
      fail_as(ErrorKind::Checkpoint, "resume = auto: none of the {} checkpoint(s) under {} is readable (the warnings "
              "above say why); move them away (or set ckpt.resume = none) to start afresh", candidates.size(), root);
    return -1;
  }
};

TrainCheckpointer::TrainCheckpointer(const RunConfig& cfg, GPT& model, Optimizer* opt, DataParallel* ddp,
                                     DeviceMesh* mesh, int wte_copy)
    : impl_(std::make_unique<Impl>(cfg, model, opt, ddp, mesh, wte_copy)) {}

TrainCheckpointer::~TrainCheckpointer() = default;

std::string TrainCheckpointer::save(int step, const LoaderState& data, SaveWhy why) {
  Impl& s = *impl_;
  if (s.staged) return s.snapshot(step, data, why, /*wait=*/true);
  if (s.ddp) s.ddp->sync_params();
  s.check_finite(step);  // collective: every rank refuses, or none
  if (s.ddp) s.ddp->gather_moments(s.full_m, s.full_v);  // collective: every dp rank takes part
  if (s.tp > 1) {
    if (s.tp_full.specs.empty()) s.tp_full.allocate(s.model.params(), s.cfg.model);
    s.tp_full.gather(s.mesh->tp(), s.model.params(), s.moments);  // collective over tp
  }
  const bool stage_writer = !s.mesh || (s.mesh->coord().dp == 0 && s.mesh->coord().tp == 0);
  std::string dir;
  if (s.pp > 1 && stage_writer && s.pp_rank > 0) {
    std::vector<WorkPtr> work;
    int tag = 0;
    for (const SavedTensor& t : s.stage_tensors())
      for (const Tensor& x : {t.p, t.m, t.v}) work.push_back(s.mesh->pp().send(x, 0, tag++));
    for (auto& w : work) w->wait();
  } else if (s.pp > 1 && s.main_rank) {
    auto gathered = s.gather_stages();
    dir = write_checkpoint(s.cfg, gathered.first, step, data, s.micro, s.data_windows, why);
  } else if (s.main_rank) {
    dir = write_checkpoint(s.cfg, s.stage_tensors(), step, data, s.micro, s.data_windows, why);
  }
  s.agreement.barrier();  // nobody runs ahead of a checkpoint that is not committed yet
  return dir;
}

int TrainCheckpointer::restore(const std::string& path, LoaderState& data) { return impl_->restore(path, data); }

void TrainCheckpointer::init_params(const std::string& path) { impl_->init_params(path); }

void TrainCheckpointer::check_shared_dir() { impl_->check_shared_dir(); }

int TrainCheckpointer::restore_auto(LoaderState& data, std::string& from) { return impl_->restore_auto(data, from); }

void TrainCheckpointer::snapshot(int step, const LoaderState& data, SaveWhy why) {
  Impl& s = *impl_;
  const bool wait = why == SaveWhy::Final || why == SaveWhy::Stop || !s.cfg.ckpt.async;
  if (!s.staged) {  // a gathered parallel checkpoint: synchronous, as it always was
    if (why == SaveWhy::Snapshot) return;
    const double t0 = now_seconds();
    const std::string dir = save(step, data, why);
    if (s.main_rank) s.as->event({step, CheckpointStage::Committed, why, dir, "", now_seconds() - t0});
    return;
  }
  s.snapshot(step, data, why, wait);
}

bool TrainCheckpointer::snapshot_due(int step) const {
  return impl_->as->peers && impl_->cfg.ckpt.snapshot_every > 0 && step % impl_->cfg.ckpt.snapshot_every == 0;
}

std::vector<CheckpointEvent> TrainCheckpointer::take_events() {
  std::lock_guard<std::mutex> lk(impl_->as->mu);
  return std::exchange(impl_->as->events, {});
}

void TrainCheckpointer::wait() { impl_->worker->wait_idle(); }

void TrainCheckpointer::set_data_windows(uint64_t windows) { impl_->data_windows = windows; }

void TrainCheckpointer::set_peer_links(std::unique_ptr<PeerLinks> links) {
  Impl& s = *impl_;
  s.worker->wait_idle();  // the background thread reads `peers`
  s.as->peers = std::move(links);
  if (s.as->peers) {  // both own slots, faulted in off the training thread (see the constructor)
    std::vector<ShardPiece> layout = s.my_pieces(s.piece_staging);
    const bool first_reserved = s.cfg.ckpt.every > 0;
    s.worker->post([st = s.as, layout, first_reserved] {
      if (!first_reserved) st->own[0].reserve(layout);
      st->own[1].reserve(layout);
    });
  }
}

namespace {
constexpr double kFinishOnErrorSeconds = 30;
}  // namespace

TrainObserver* TrainCheckpointer::survivor() {
  // On a failing run: a lost peer or a timeout means ranks may be gone; the snapshots this rank holds are written
  // out for the restarted job (persist_survivor_snapshots). Any failure: do not wait for background copies.
  struct Survivor final : TrainObserver {
    Impl* impl;
    explicit Survivor(Impl* i) : impl(i) {}
    void on_error(int, ErrorKind kind, const std::string&) override {
      // Every rank is alive (a non-finite loss, a data or I/O error): a periodic save in stage 2 holds good state
      // from before the failing step, so it may finish (bounded: rank 0's commit waits for every rank's shard)
      // and the restarted job loses fewer steps.
      if (kind != ErrorKind::PeerLost && kind != ErrorKind::CommTimeout && kind != ErrorKind::Device)
        impl->worker->wait_idle_for(kFinishOnErrorSeconds);
      impl->failing = true;
      if (impl->as->peers && (kind == ErrorKind::PeerLost || kind == ErrorKind::CommTimeout)) {
        if (const std::string over = attempt_superseded(); !over.empty()) {
          fmt::print(stderr, "peer snapshot: none written: {}\n", over);
          std::fflush(stderr);
          return;
        }
        persist_survivor_snapshots(*impl->as);
      }
    }
  };
  if (!survivor_) survivor_ = std::make_unique<Survivor>(impl_.get());
  return survivor_.get();
}

}  // namespace mt
