#include "megatrain/train/trainer.h"

#include <fmt/format.h>
#include <omp.h>

#include <cmath>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>

#include "megatrain/ckpt/checkpoint.h"
#include "megatrain/ckpt/config_json.h"
#include "megatrain/ckpt/model_weights.h"
#include "megatrain/core/clock.h"
#include "megatrain/core/fs.h"
#include "megatrain/core/resources.h"
#include "megatrain/data/loader.h"
#include "megatrain/dist/env.h"
#include "megatrain/dist/mesh.h"
#include "megatrain/parallel/data_parallel.h"
#include "megatrain/parallel/gpt_pipeline.h"
#include "megatrain/parallel/tensor_parallel.h"
#include "megatrain/data/tokenizer.h"
#include "megatrain/model/gpt.h"
#include "megatrain/model/layout.h"
#include "megatrain/optim/optimizer.h"
#include "megatrain/train/metrics.h"
#include "megatrain/train/peak.h"
#include "megatrain/train/sampler.h"

namespace mt {

namespace {

namespace fs = std::filesystem;

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

// Everything a checkpoint holds: parameters, optimizer moments, and the position of the run.
void save(const RunConfig& cfg, const std::vector<SavedTensor>& tensors, int step, const LoaderState& data,
          int micro, const std::string& why, TrainResult& res) {
  std::vector<TensorRef> model_t, optim_t;
  for (const SavedTensor& t : tensors) {
    model_t.push_back(tensor_ref(t.name, t.p));
    optim_t.push_back(tensor_ref("m." + t.name, t.m));
    optim_t.push_back(tensor_ref("v." + t.name, t.v));
  }
  nlohmann::json extra = {{"model", model_config_to_json(cfg.model)},
                          {"optim_name", cfg.optim.name},
                          {"step", step},
                          {"data", {{"epoch", data.epoch}, {"cursor", data.cursor}, {"dir", cfg.data.dir},
                                    {"batch_size", cfg.data.batch_size}, {"seq_len", cfg.data.seq_len},
                                    {"global_batch_size", cfg.data.batch_size * micro * cfg.parallel.dp},
                                    {"shuffle", cfg.data.shuffle}, {"seed", cfg.data.seed}}},
                          {"train", {{"steps", cfg.train.steps}, {"grad_accum", cfg.train.grad_accum}}},
                          {"parallel", {{"dp", cfg.parallel.dp}, {"pp", cfg.parallel.pp}, {"tp", cfg.parallel.tp},
                                        {"virtual_stages", cfg.parallel.virtual_stages}, {"microbatches", micro}}}};
  if (cfg.parallel.tp > 1) {
    // The tensors are saved full; the tp layout they were trained in is recorded for per-rank shard files later.
    ParamStore lay;
    declare_gpt_params(cfg.model, lay, cfg.parallel.tp, 0);
    nlohmann::json layout;
    for (const ParamInfo& p : lay.infos()) layout[p.name] = p.shard.describe();
    extra["tp_layout"] = layout;
  }
  if (cfg.parallel.pp > 1) {
    // Gathered full from the stages; which virtual stage(s) held each tensor (a tied wte: the first and last).
    nlohmann::json layout;
    const int pp = cfg.parallel.pp, v = cfg.parallel.virtual_stages;
    for (int r = 0; r < pp; ++r) {
      GptPart part = pipeline_part(cfg.model, pp, v, r);
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
  SaveOptions so;
  so.keep_last = cfg.ckpt.keep_last;
  double t0 = now_seconds();
  res.last_checkpoint = save_checkpoint(cfg.ckpt.dir, step,
                                        {{"model.safetensors", model_t}, {"optim.safetensors", optim_t}}, extra, so);
  fmt::print("checkpoint ({}) step {} -> {} in {:.2f} s\n", why, step, res.last_checkpoint, now_seconds() - t0);
}

// Restores model, optimizer and data position; returns the checkpoint's step.
int restore(const RunConfig& cfg, const std::string& path, GPT& model, const Moments& opt, LoaderState& data) {
  Checkpoint ck = Checkpoint::load(path);
  const nlohmann::json& x = ck.extra();
  MT_CHECK(x.contains("model") && x.contains("data") && x.contains("step"),
           "checkpoint {} lacks the training state (model/data/step); was it written by `megatrain convert`? Use "
           "model.init_from for weights only", ck.dir());
  ModelConfig saved = model_config_from_json(x["model"]);
  nlohmann::json want = model_config_to_json(cfg.model), have = model_config_to_json(saved);
  want.erase("recompute");
  have.erase("recompute");
  MT_CHECK(want == have, "checkpoint {} was trained with a different model config:\n  checkpoint: {}\n  this run:   {}",
           ck.dir(), have.dump(), want.dump());
  MT_CHECK(x.value("optim_name", "") == cfg.optim.name, "checkpoint {} used optimizer '{}' but this run uses '{}'",
           ck.dir(), x.value("optim_name", ""), cfg.optim.name);
  const auto& d = x["data"];
  const int micro = cfg.pipeline_microbatches();
  const int global_b = cfg.data.batch_size * micro * cfg.parallel.dp;
  MT_CHECK(d.value("global_batch_size", d.value("batch_size", 0)) == global_b && d.value("seq_len", 0) == cfg.data.seq_len,
           "checkpoint {} used a global batch of {} x {} tokens, this run {} x {}: the data position would not carry over",
           ck.dir(), d.value("global_batch_size", d.value("batch_size", 0)), d.value("seq_len", 0), global_b,
           cfg.data.seq_len);
  const ParamStore& ps = model.params();
  for (size_t i = 0; i < ps.size(); ++i) {
    const std::string& n = ps.info(static_cast<int>(i)).name;
    ck.copy_into(n, opt.p ? opt.p(static_cast<int>(i)) : ps.param(static_cast<int>(i)));
    ck.copy_into("m." + n, opt.m(static_cast<int>(i)));
    ck.copy_into("v." + n, opt.v(static_cast<int>(i)));
  }
  data.epoch = d["epoch"].get<uint64_t>();
  data.cursor = d["cursor"].get<uint64_t>();
  return x["step"].get<int>();
}

// Full (unsharded) copies of every parameter and moment of a tensor-parallel rank, for checkpoints.
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
  void scatter(const ParamStore& ps, const Moments& local) const {
    for (size_t k = 0; k < ps.size(); ++k) {
      const int i = static_cast<int>(k);
      shard_slice(specs[k], p[k].f32(), ps.param(i).f32());
      shard_slice(specs[k], m[k].f32(), local.m(i).f32());
      shard_slice(specs[k], v[k].f32(), local.v(i).f32());
    }
  }
};

double evaluate(GPT& model, const RunConfig& cfg) {
  // Every rank evaluates the same windows (the model is replicated across dp), so no reduction is needed.
  // A fresh, unshuffled loader each time: every evaluation sees the same validation windows.
  DataLoader val(cfg.data.dir, "val", cfg.data.batch_size, cfg.data.seq_len, false, 0, 0, 1, 0);
  int n = static_cast<int>(std::min<uint64_t>(cfg.train.eval_batches, val.batches_per_epoch()));
  double sum = 0;
  for (int i = 0; i < n; ++i) {
    Batch b = val.next();
    sum += model.forward(b.x.data(), b.y.data(), b.B, b.T, false);
  }
  return n > 0 ? sum / n : NAN;
}

}  // namespace

TrainResult run_training(const RunConfig& cfg) {
  TrainResult res;
  if (cfg.train.threads > 0) omp_set_num_threads(cfg.train.threads);

  // Where this process sits: a single process, or one rank of `megatrain launch` / torchrun / Slurm.
  const RankInfo ri = rank_info_from_env();
  const MeshShape shape{cfg.parallel.dp, cfg.parallel.pp, cfg.parallel.tp};
  check_mesh(shape, ri.world_size);
  const bool main_rank = ri.rank == 0;
  std::unique_ptr<Store> store;
  std::unique_ptr<DeviceMesh> mesh;
  if (ri.world_size > 1) {
    GroupOptions go;
    go.timeout = Millis(1000LL * cfg.parallel.timeout_s);
    store = open_store(ri.store_url, go.timeout);
    mesh = std::make_unique<DeviceMesh>(*store, shape, ri.rank, go);
    if (main_rank)
      fmt::print("mesh dp={} pp={} tp={} over {} ranks ready in {:.2f} s\n", shape.dp, shape.pp, shape.tp,
                 ri.world_size, mesh->init_seconds());
  }
  const int dp = shape.dp, dp_rank = mesh ? mesh->coord().dp : 0;
  const int tp = shape.tp, tp_rank = mesh ? mesh->coord().tp : 0;
  const int pp = shape.pp, pp_rank = mesh ? mesh->coord().pp : 0, vstages = cfg.parallel.virtual_stages;
  const int micro = cfg.pipeline_microbatches();  // pipeline micro-batches per step (1 without pp)
  auto say = [&](const std::string& line) {
    if (main_rank) fmt::print("{}\n", line);
  };

  if (main_rank) fs::create_directories(cfg.train.out_dir);
  auto ops = make_cpu_ops();

  // With pp a step's rows per dp rank are micro x data.batch_size: every pp rank reads them (the first stage uses
  // the tokens, the last the targets), in the order a single process with micro x dp times the batch reads them.
  DataLoader loader(cfg.data.dir, "train", cfg.data.batch_size * micro, cfg.data.seq_len, cfg.data.shuffle, cfg.data.seed,
                    dp_rank, dp, cfg.data.prefetch);
  MT_CHECK(loader.vocab_size() == 0 || loader.vocab_size() <= cfg.model.vocab_size,
           "the shards in {} use a vocabulary of {} tokens but model.vocab_size is {}", cfg.data.dir,
           loader.vocab_size(), cfg.model.vocab_size);

  // Tensor parallelism: the model holds this tp rank's shards and calls the tp group through TpComm.
  std::unique_ptr<ProcessGroupTpComm> tpc;
  NormReduce tp_norm_reduce;
  if (tp > 1) {
    TensorParallelOptions to;
    to.chunks = cfg.parallel.tp_chunks;
    to.overlap = cfg.parallel.overlap;
    tpc = std::make_unique<ProcessGroupTpComm>(mesh->tp(), to);
    tp_norm_reduce = [&mesh](float* d, size_t n) {
      mesh->tp().allreduce(f32_view(d, {static_cast<int64_t>(n)}))->wait();
    };
  }
  // Pipeline parallelism: this rank holds virtual stages c*pp + pp_rank (GptPart) and runs the schedule's actions.
  GPT model(cfg.model, *ops, dp_pad_multiple(dp), tpc.get(),
            pp > 1 ? pipeline_part(cfg.model, pp, vstages, pp_rank) : GptPart{});
  const std::vector<float> norm_weights = tp > 1 ? tp_norm_weights(model.params(), tp_rank) : std::vector<float>{};
  Schedule sched;
  std::unique_ptr<GptPipeline> pipe;
  // Tied embeddings with pp: the first and last stage each hold wte; their gradients are summed over the
  // "embedding group" before the optimizer, so both copies take identical steps (identical LAMB norms too).
  std::unique_ptr<ProcessGroup> emb_group;
  const int wte_copy = pp > 1 && cfg.model.tied_embeddings && pp_rank == pp - 1 ? model.params().index("wte.weight") : -1;
  std::vector<float> clip_weights;
  NormReduce clip_reduce;
  if (pp > 1) {
    sched = vstages > 1 ? make_interleaved_1f1b(pp, vstages, micro) : make_1f1b(pp, micro);
    pipe = std::make_unique<GptPipeline>(model, sched, pp_rank, cfg.data.batch_size, cfg.data.seq_len);
    if (cfg.model.tied_embeddings && (pp_rank == 0 || pp_rank == pp - 1)) {
      GroupOptions go;
      go.timeout = Millis(1000LL * cfg.parallel.timeout_s);
      const std::vector<int> ranks = {mesh_rank(shape, {dp_rank, 0, tp_rank}), mesh_rank(shape, {dp_rank, pp - 1, tp_rank})};
      emb_group = make_gloo_group(*store, fmt::format("emb[{},{}]", ranks[0], ranks[1]), ranks, ri.rank, go);
    }
    // The clipping norm sums over the stages (the wte copy counted once); LAMB's per-tensor norms stay local.
    clip_weights = tp > 1 ? norm_weights : std::vector<float>(model.params().size(), 1.0f);
    if (wte_copy >= 0) clip_weights[wte_copy] = 0;
    clip_reduce = [&mesh, tp](float* d, size_t n) {
      Tensor t = f32_view(d, {static_cast<int64_t>(n)});
      if (tp > 1) mesh->tp().allreduce(t)->wait();
      mesh->pp().allreduce(t)->wait();
    };
  }
  // One optimizer path per layout: the plain optimizer, or ZeRO-2 sharded across the dp group.
  std::unique_ptr<Optimizer> opt;
  std::unique_ptr<DataParallel> ddp;
  if (dp > 1) {
    DataParallelOptions o;
    o.bucket_floats = static_cast<size_t>(cfg.parallel.bucket_mb) << 18;
    o.overlap = cfg.parallel.overlap;
    o.norm_weights = norm_weights;
    o.norm_reduce = tp_norm_reduce;
    o.clip_norm_weights = clip_weights;
    o.clip_norm_reduce = clip_reduce;
    ddp = std::make_unique<DataParallel>(model, mesh->dp(), *ops, cfg.optim, o);
  } else {
    opt = std::make_unique<Optimizer>(cfg.optim, model.params(), *ops);
    if (tp > 1) opt->set_norm_reduce(norm_weights, tp_norm_reduce);
  }
  // Full moments for checkpoints: the optimizer's own, or a gathered copy of the shards.
  HostBuffer full_m, full_v;
  auto full_view = [&](HostBuffer& b, int i) {
    const ParamInfo& p = model.params().info(i);
    Tensor t = model.params().param(i);
    t.ptr = b.f32() + p.offset;
    return t;
  };
  Moments moments;
  if (opt) {
    moments.m = [&](int i) { return opt->m(i); };
    moments.v = [&](int i) { return opt->v(i); };
  } else {
    moments.m = [&](int i) { return full_view(full_m, i); };
    moments.v = [&](int i) { return full_view(full_v, i); };
  }
  // With tp the checkpoint holds full tensors: shards are gathered over tp on save and sliced on load, so a
  // run resumes under any tp. wte/lm_head are kept at the single-process padded_vocab() rows (the extra rows
  // that tp's coarser vocabulary padding adds are zero).
  TpFullState tp_full;
  Moments saved = moments;
  if (tp > 1) {
    tp_full.allocate(model.params(), cfg.model);
    saved.p = [&](int i) { return tp_full.view(tp_full.p, i); };
    saved.m = [&](int i) { return tp_full.view(tp_full.m, i); };
    saved.v = [&](int i) { return tp_full.view(tp_full.v, i); };
  }
  auto stage_tensors = [&] {  // this rank's tensors as saved (full), without the last stage's wte copy
    std::vector<SavedTensor> t;
    const ParamStore& ps = model.params();
    for (int i = 0; i < static_cast<int>(ps.size()); ++i)
      if (i != wte_copy) t.push_back({ps.info(i).name, saved.p ? saved.p(i) : ps.param(i), saved.m(i), saved.v(i)});
    return t;
  };
  // With pp the dp0/tp0 rank of every stage sends its (full) tensors to pp rank 0 over the pp group, which writes
  // one full checkpoint: any layout resumes from it.
  auto gather_stages = [&] {
    std::map<std::string, SavedTensor> all;
    for (SavedTensor& t : stage_tensors()) all[t.name] = t;
    std::deque<HostBuffer> bufs;
    for (int r = 1; r < pp; ++r) {
      ParamStore lay;
      declare_gpt_params(cfg.model, lay, 1, 0, pipeline_part(cfg.model, pp, vstages, r));
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
  };
  auto checkpoint = [&](int step, const char* why) {
    if (ddp) {
      ddp->sync_params();
      ddp->gather_moments(full_m, full_v);  // collective: every dp rank takes part
    }
    if (tp > 1) tp_full.gather(mesh->tp(), model.params(), moments);  // collective over tp
    const bool stage_writer = !mesh || (mesh->coord().dp == 0 && mesh->coord().tp == 0);
    if (pp > 1 && stage_writer && pp_rank > 0) {
      std::vector<WorkPtr> work;
      int tag = 0;
      for (const SavedTensor& t : stage_tensors())
        for (const Tensor& x : {t.p, t.m, t.v}) work.push_back(mesh->pp().send(x, 0, tag++));
      for (auto& w : work) w->wait();
    } else if (pp > 1 && main_rank) {
      auto gathered = gather_stages();
      save(cfg, gathered.first, step, loader.state(), micro, why, res);
    } else if (main_rank) {
      save(cfg, stage_tensors(), step, loader.state(), micro, why, res);
    }
    if (mesh) {  // nobody runs ahead of a checkpoint that is not committed yet
      mesh->dp().barrier()->wait();
      mesh->tp().barrier()->wait();
      mesh->pp().barrier()->wait();
    }
  };

  int step = 0;
  LoaderState pos;
  std::string resume_from;
  if (cfg.ckpt.resume == "auto") {
    if (auto latest = find_latest(cfg.ckpt.dir)) resume_from = *latest;
  } else if (cfg.ckpt.resume != "none") {
    resume_from = cfg.ckpt.resume;
  }
  if (!resume_from.empty()) {
    if (ddp) {
      full_m.resize(model.params().total_floats() * sizeof(float));
      full_v.resize(model.params().total_floats() * sizeof(float));
    }
    step = restore(cfg, resume_from, model, saved, pos);
    if (tp > 1) tp_full.scatter(model.params(), moments);
    if (ddp) ddp->scatter_moments(full_m.f32(), full_v.f32());
    loader.restore(pos);
    say(fmt::format("resumed from {} at step {}", resume_from, step));
  } else if (!cfg.init_from.empty()) {
    model.init_weights(cfg.train.seed);
    load_model_weights(cfg.init_from, cfg.model, model.params());
    say(fmt::format("initialised weights from {}", cfg.init_from));
  } else {
    model.init_weights(cfg.train.seed);  // same seed on every rank: replicas start identical
  }

  const int B = cfg.data.batch_size, T = cfg.data.seq_len, accum = cfg.train.grad_accum;
  const double tokens_per_step = static_cast<double>(B) * T * accum * dp * micro;
  const double flops_per_step = cfg.model.flops_per_token(T) * tokens_per_step;
  double peak = cfg.train.peak_tflops * 1e12;
  std::string peak_src = "configured";
  if (peak <= 0) {
    peak = measure_matmul_flops(*ops);
    peak_src = "measured matmul peak";
  }
  peak *= ri.world_size;  // every rank brings its own matmul peak (on one host they share the cores)
  say(fmt::format("model: {} layers, d_model {}, {} heads, block {}, window {}, {:.2f}M params | data: {} train tokens, "
                  "B={}x{} T={} accum={}{} | {} threads/rank | MFU vs {:.1f} GFLOP/s ({}, {} rank(s))",
                  cfg.model.n_layer, cfg.model.d_model, cfg.model.n_head, cfg.model.block, cfg.model.window,
                  cfg.model.num_params() / 1e6, loader.num_tokens(), dp, B, T, accum,
                  pp > 1 ? fmt::format(" | pipeline pp={} v={} microbatches={}", pp, vstages, micro) : "",
                  omp_get_max_threads(),
                  peak / 1e9, peak_src, ri.world_size));

  MetricsLog log;
  if (main_rank) {
    log.open(cfg.train.out_dir + "/metrics.jsonl", step > 0);
    log.write({{"kind", "run"}, {"config", cfg.source}, {"params", cfg.model.num_params()}, {"peak_flops", peak},
               {"peak_source", peak_src}, {"start_step", step}, {"threads", omp_get_max_threads()},
               {"world_size", ri.world_size}, {"dp", dp}});
  }

  res.first_step = step + 1;
  for (++step; step <= cfg.train.steps; ++step) {
    double t0 = now_seconds();
    model.params().zero_grads();
    float loss = 0;
    if (pipe) {
      // The dp reduce-scatters are not overlapped with the pipeline's backward: they start in finish_gradients.
      for (int round = 0; round < accum; ++round) {
        Batch b = loader.next();
        loss += pipe->run(mesh->pp(), b.x.data(), b.y.data(), 1.0f / static_cast<float>(accum * micro),
                          round == accum - 1);
      }
      loss /= static_cast<float>(accum * micro);
      if (emb_group) emb_group->allreduce(model.params().grad("wte.weight"))->wait();
      // Arming only now (no backward follows) resets the buckets so that finish_gradients reduces them all: armed
      // during the pipeline, a layer's bucket would be reduced after its first micro-batch's backward.
      if (ddp) ddp->begin_last_backward();
      mesh->pp().allreduce(f32_view(&loss, {1}))->wait();  // the loss exists on the last stage only
    } else {
      for (int mi = 0; mi < accum; ++mi) {
        Batch b = loader.next();
        if (ddp && mi == accum - 1) ddp->begin_last_backward();
        if (tp > 1) model.set_tp_grad_sync(mi == accum - 1);  // replicated grads: one tp sum per step
        loss += model.forward(b.x.data(), b.y.data(), B, T, true, 1.0f / accum);
        model.backward();
      }
      loss /= accum;
    }
    double norm;
    if (ddp) {
      norm = ddp->finish_gradients();
      mesh->dp().allreduce(f32_view(&loss, {1}))->wait();
      loss /= dp;
    } else {
      norm = pp > 1   ? global_grad_norm(*ops, model.params(), clip_weights, clip_reduce)
             : tp > 1 ? global_grad_norm(*ops, model.params(), norm_weights, tp_norm_reduce)
                      : global_grad_norm(*ops, model.params());
    }
    MT_CHECK(std::isfinite(loss) && std::isfinite(norm), "step {}: non-finite loss ({}) or gradient norm ({})", step,
             loss, norm);
    float scale = cfg.optim.grad_clip > 0 && norm > cfg.optim.grad_clip ? static_cast<float>(cfg.optim.grad_clip / norm)
                                                                        : 1.0f;
    float lr = lr_at(cfg.optim, step, cfg.train.steps);
    if (ddp)
      ddp->step(lr, scale, step);
    else
      opt->step(model.params(), lr, scale, step);
    double dt = now_seconds() - t0;

    StepStats s{step, cfg.train.steps, loss, lr, norm, dt, tokens_per_step / dt, flops_per_step / dt, 0};
    s.mfu = s.model_flops_per_second / peak;
    if (main_rank) log.write(MetricsLog::to_json(s));
    if (step == res.first_step) res.first_loss = loss;
    res.last_loss = loss;
    res.last_step = step;
    if (step % cfg.train.log_every == 0 || step == res.first_step || step == cfg.train.steps)
      say(MetricsLog::progress_line(s));
    const bool eval_now = cfg.train.eval_every > 0 && cfg.train.eval_batches > 0 &&
                          (step % cfg.train.eval_every == 0 || step == cfg.train.steps);
    if (eval_now && pp > 1) {
      if (step == cfg.train.eval_every || step == cfg.train.steps)
        say("(no validation: evaluation with parallel.pp > 1 is not supported yet; evaluate a checkpoint in one "
            "process)");
    } else if (eval_now) {
      res.last_val_loss = evaluate(model, cfg);
      say(fmt::format("step {:>6} | val loss {:.4f}", step, res.last_val_loss));
      if (main_rank) log.write({{"kind", "val"}, {"step", step}, {"val_loss", res.last_val_loss}});
    }
    if (cfg.ckpt.every > 0 && step % cfg.ckpt.every == 0 && step != cfg.train.steps) checkpoint(step, "periodic");
  }
  res.last_step = std::min(step - 1, cfg.train.steps);
  if (cfg.ckpt.save_final && res.last_step >= res.first_step) checkpoint(res.last_step, "final");
  if (ddp) ddp->sync_params();

  if (cfg.sample.tokens > 0 && main_rank && (tp > 1 || pp > 1)) {
    fmt::print("(no sample: sampling with parallel.tp > 1 or parallel.pp > 1 is not supported yet; sample from the "
               "checkpoint with `megatrain generate`)\n");
  } else if (cfg.sample.tokens > 0 && main_rank) {
    Tokenizer tok = Tokenizer::load_gpt2(default_gpt2_vocab_dir());
    if (tok.vocab_size() == cfg.model.vocab_size) {
      SampleOptions so{cfg.sample.tokens, cfg.sample.temperature, cfg.sample.top_k, cfg.sample.seed, tok.eot()};
      std::vector<int32_t> prompt = tok.encode(cfg.sample.prompt);
      if (prompt.empty()) prompt.push_back(tok.eot());
      std::vector<int32_t> out = sample_tokens(model, prompt, so);
      res.sample = cfg.sample.prompt + tok.decode(out);
      fmt::print("---- sample ----\n{}\n----------------\n", res.sample);
    } else {
      fmt::print("(no sample: model.vocab_size {} is not the GPT-2 vocabulary's {})\n", cfg.model.vocab_size,
                 tok.vocab_size());
    }
  }
  return res;
}

}  // namespace mt
