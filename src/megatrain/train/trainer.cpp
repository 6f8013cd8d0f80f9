#include "megatrain/train/trainer.h"

#include <fmt/format.h>
#include <omp.h>

#include <cmath>
#include <filesystem>

#include "megatrain/ckpt/checkpoint.h"
#include "megatrain/ckpt/model_weights.h"
#include "megatrain/core/clock.h"
#include "megatrain/core/fs.h"
#include "megatrain/core/resources.h"
#include "megatrain/data/loader.h"
#include "megatrain/comm/env.h"
#include "megatrain/comm/mesh.h"
#include "megatrain/parallel/data_parallel.h"
#include "megatrain/parallel/gpt_pipeline.h"
#include "megatrain/parallel/pipeline_eval.h"
#include "megatrain/parallel/tensor_parallel.h"
#include "megatrain/data/tokenizer.h"
#include "megatrain/model/gpt.h"
#include "megatrain/model/layout.h"
#include "megatrain/optim/optimizer.h"
#include "megatrain/train/checkpointing.h"
#include "megatrain/train/finite.h"
#include "megatrain/train/gpu_groups.h"
#include "megatrain/train/host_mirror.h"
#include "megatrain/train/metrics.h"
#include "megatrain/train/peak.h"
#include "megatrain/train/sampler.h"

namespace mt {

namespace {

namespace fs = std::filesystem;

// Validation loss: the mean over the first train.eval_batches batches of the val split (unshuffled, so every
// evaluation sees the same windows) of each batch's mean loss. A batch is the step's global batch, dp x
// microbatches x data.batch_size rows, so any layout sees the windows one process with that batch size sees: each
// dp rank takes its rows (through the pipeline stages with pp; with tp the model's vocab-parallel loss is the same
// on every tp rank), and the per-position loss sums and target counts are summed over pp (only the last stage has
// them) and dp. The activations move over `data` (the NCCL groups of a GPU run), the sums over `mesh` (host memory).
double evaluate(GPT& model, const RunConfig& cfg, DeviceMesh* mesh, DeviceMesh* data, int micro) {
  const int dp = mesh ? mesh->shape().dp : 1, dp_rank = mesh ? mesh->coord().dp : 0;
  const bool pipelined = mesh && mesh->shape().pp > 1;
  const int B = cfg.data.batch_size, T = cfg.data.seq_len;
  DataLoader val(cfg.data.dir, "val", B * micro, T, false, 0, dp_rank, dp, 0);
  const int n = static_cast<int>(std::min<uint64_t>(cfg.train.eval_batches, val.batches_per_epoch()));
  if (n == 0) return NAN;
  std::vector<float> sums(2 * static_cast<size_t>(n), 0.0f);  // per batch: loss sum, valid targets
  for (int i = 0; i < n; ++i) {
    Batch b = val.next();
    int64_t valid = 0;
    for (int32_t y : b.y) valid += y >= 0;
    double loss_sum;
    if (pipelined) {
      loss_sum = pipeline_eval_loss(model, data->pp(), b.x.data(), b.y.data(), micro, B, T);
      if (mesh->coord().pp != mesh->shape().pp - 1) valid = 0;  // counted once, on the stage that has the loss
    } else {
      loss_sum = static_cast<double>(model.forward(b.x.data(), b.y.data(), b.B, b.T, false)) * static_cast<double>(valid);
    }
    sums[2 * i] = static_cast<float>(loss_sum);
    sums[2 * i + 1] = static_cast<float>(valid);
  }
  if (mesh) {
    Tensor t = f32_view(sums.data(), {static_cast<int64_t>(sums.size())});
    if (pipelined) mesh->pp().allreduce(t)->wait();
    if (dp > 1) mesh->dp().allreduce(t)->wait();
  }
  double mean = 0;
  for (int i = 0; i < n; ++i) mean += static_cast<double>(sums[2 * i]) / sums[2 * i + 1];
  return mean / n;
}

}  // namespace

TrainResult run_training(const RunConfig& cfg, const TrainSeams& seams) {
  TrainResult res;
  if (cfg.train.threads > 0) omp_set_num_threads(cfg.train.threads);

  // Where this process sits: a single process, or one rank of `megatrain launch` / torchrun / Slurm.
  const RankInfo ri = rank_info_from_env();
  const MeshShape shape{cfg.parallel.dp, cfg.parallel.pp, cfg.parallel.tp};
  check_mesh(shape, ri.world_size);
  const bool main_rank = ri.rank == 0;
  // The backend: fp32 on the CPU, or bf16 on a GPU (train.device): with several ranks, one GPU per local rank.
  const bool gpu = cfg.train.device == "cuda";
  auto ops = seams.make_ops ? seams.make_ops()
             : gpu        ? make_cuda_ops(ri.world_size > 1 ? ri.local_rank : -1, CudaOptions{cfg.train.attention})
                          : make_cpu_ops();
  // Two planes of groups. `mesh`: Gloo groups over host memory, for what the host computes or stores (norms,
  // losses, sampled ids, checkpoints). `data`: the groups the model's tensors move over (gradient buckets,
  // activations, parameters): the same Gloo groups on the CPU, NCCL groups on the compute stream on a GPU.
  std::unique_ptr<Store> store;
  std::unique_ptr<DeviceMesh> mesh, data_mesh;
  GroupOptions go;
  go.timeout = Millis(1000LL * cfg.parallel.timeout_s);
  GroupFactory data_groups;  // empty: the data plane is the host plane's Gloo groups (a CPU run)
  if (ri.world_size > 1) {
    store = open_store(ri.store_url, go.timeout);
    mesh = std::make_unique<DeviceMesh>(*store, shape, ri.rank, go, seams.host_groups);
    data_groups = seams.data_groups ? seams.data_groups : gpu ? gpu_mesh_groups(*ops) : GroupFactory{};
    if (data_groups) data_mesh = std::make_unique<DeviceMesh>(*store, shape, ri.rank, go, data_groups, "data/");
    if (main_rank)
      fmt::print("mesh dp={} pp={} tp={} over {} ranks ready in {:.2f} s{}\n", shape.dp, shape.pp, shape.tp,
                 ri.world_size, mesh->init_seconds(),
                 data_mesh ? fmt::format(" (host groups), {:.2f} s (data groups)", data_mesh->init_seconds()) : "");
  }
  DeviceMesh* data = data_mesh ? data_mesh.get() : mesh.get();
  const int dp = shape.dp, dp_rank = mesh ? mesh->coord().dp : 0;
  const int tp = shape.tp, tp_rank = mesh ? mesh->coord().tp : 0;
  const int pp = shape.pp, pp_rank = mesh ? mesh->coord().pp : 0, vstages = cfg.parallel.virtual_stages;
  const int micro = cfg.pipeline_microbatches();  // pipeline micro-batches per step (1 without pp)
  auto say = [&](const std::string& line) {
    if (main_rank) fmt::print("{}\n", line);
  };

  if (main_rank) fs::create_directories(cfg.train.out_dir);

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
    tpc = std::make_unique<ProcessGroupTpComm>(data->tp(), *ops, to);
    // Planned up front: a micro-batch's B*T rows of d_model, the most any of the model's tp collectives moves.
    tpc->reserve(static_cast<int64_t>(cfg.data.batch_size) * cfg.data.seq_len, cfg.model.d_model, ops->compute_dtype());
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
      const std::vector<int> ranks = {mesh_rank(shape, {dp_rank, 0, tp_rank}), mesh_rank(shape, {dp_rank, pp - 1, tp_rank})};
      const std::string name = fmt::format("emb[{},{}]", ranks[0], ranks[1]);
      // The wte gradients it sums are the model's tensors: a data-plane group.
      emb_group = data_groups ? data_groups(*store, "emb", "data/" + name, ranks, ri.rank, go)
                              : make_gloo_group(*store, name, ranks, ri.rank, go);
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
    o.control = data_mesh ? &mesh->dp() : nullptr;
    ddp = std::make_unique<DataParallel>(model, data->dp(), *ops, cfg.optim, o);
    // Under pp a chunk's gradients are final in the backward of its last micro-batch: its buckets start there.
    if (pipe) pipe->set_before_last_backward([&ddp](int c) { ddp->begin_last_backward(c); });
  } else {
    opt = std::make_unique<Optimizer>(cfg.optim, model.params(), *ops);
    if (tp > 1) opt->set_norm_reduce(norm_weights, tp_norm_reduce);
  }
  // A model in device memory is checkpointed (and imported) through a host copy, refreshed around each save.
  std::unique_ptr<HostMirror> mirror;
  if (ops->device() != Device::CPU)
    mirror = std::make_unique<HostMirror>(model, opt.get(), cfg.optim, dp_pad_multiple(dp));
  // Checkpoints hold full tensors whatever the layout; the checkpointer gathers and scatters this rank's part
  // (host memory: over the Gloo groups).
  TrainCheckpointer ckpt(cfg, mirror ? mirror->model() : model, mirror ? mirror->optimizer() : opt.get(), ddp.get(),
                         mesh.get(), wte_copy);
  auto checkpoint = [&](int step, const char* why) {
    if (mirror) mirror->pull();
    const std::string dir = ckpt.save(step, loader.state(), why);  // collective
    if (main_rank) res.last_checkpoint = dir;
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
    step = ckpt.restore(resume_from, pos);
    if (mirror) mirror->push();
    loader.restore(pos);
    say(fmt::format("resumed from {} at step {}", resume_from, step));
  } else if (!cfg.init_from.empty()) {
    GPT& target = mirror ? mirror->model() : model;
    target.init_weights(cfg.train.seed);
    load_model_weights(cfg.init_from, cfg.model, target.params());
    if (mirror) mirror->push();
    say(fmt::format("initialised weights from {}", cfg.init_from));
  } else {
    model.init_weights(cfg.train.seed);  // same seed on every rank: replicas start identical
  }

  const int B = cfg.data.batch_size, T = cfg.data.seq_len, accum = cfg.train.grad_accum;
  const double tokens_per_step = static_cast<double>(B) * T * accum * dp * micro;
  const double flops_per_step = cfg.model.flops_per_token(T) * tokens_per_step;
  double peak = cfg.train.peak_tflops * 1e12;
  std::string peak_src = "configured";
  if (peak <= 0 && ops->device() != Device::CPU) {
    peak = 989e12;  // H100 SXM dense bf16 (also used for H200); set train.peak_tflops for other GPUs
    peak_src = "H100 dense bf16";
  } else if (peak <= 0) {
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
      for (int round = 0; round < accum; ++round) {
        Batch b = loader.next();
        loss += pipe->run(data->pp(), b.x.data(), b.y.data(), 1.0f / static_cast<float>(accum * micro),
                          round == accum - 1);
      }
      loss /= static_cast<float>(accum * micro);
      // DataParallel reduces the buckets holding wte only in finish_gradients, after this sum.
      if (emb_group) emb_group->allreduce(model.params().grad("wte.weight"))->wait();
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
    if (eval_now) {
      res.last_val_loss = evaluate(model, cfg, mesh.get(), data, micro);
      say(fmt::format("step {:>6} | val loss {:.4f}", step, res.last_val_loss));
      if (main_rank) log.write({{"kind", "val"}, {"step", step}, {"val_loss", res.last_val_loss}});
      check_val_loss(step, res.last_val_loss);  // a diverged run stops here, before it checkpoints
    }
    if (cfg.ckpt.every > 0 && step % cfg.ckpt.every == 0 && step != cfg.train.steps) checkpoint(step, "periodic");
  }
  res.last_step = std::min(step - 1, cfg.train.steps);
  if (cfg.ckpt.save_final && res.last_step >= res.first_step) checkpoint(res.last_step, "final");
  if (ddp) ddp->sync_params();

  // Every rank of the first dp replica takes part in sampling (its tp and pp groups run the model); rank 0 prints.
  if (cfg.sample.tokens > 0 && dp_rank == 0) {
    Tokenizer tok = Tokenizer::load_gpt2(default_gpt2_vocab_dir());
    if (tok.vocab_size() == cfg.model.vocab_size) {
      SampleOptions so{cfg.sample.tokens, cfg.sample.temperature, cfg.sample.top_k, cfg.sample.seed, tok.eot()};
      std::vector<int32_t> prompt = tok.encode(cfg.sample.prompt);
      if (prompt.empty()) prompt.push_back(tok.eot());
      std::vector<int32_t> out = sample_tokens(model, tp > 1 ? &mesh->tp() : nullptr, pp > 1 ? &mesh->pp() : nullptr,
                                               prompt, so, pp > 1 ? &data->pp() : nullptr);
      res.sample = cfg.sample.prompt + tok.decode(out);
      if (main_rank) {
        fmt::print("---- sample ----\n{}\n----------------\n", res.sample);
        // A sample may end inside a multi-byte character: the log's copy has invalid UTF-8 replaced (U+FFFD).
        const auto text = nlohmann::json::parse(
            nlohmann::json(res.sample).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
        log.write({{"kind", "sample"}, {"step", res.last_step}, {"text", text}, {"tokens", out}});
      }
    } else if (main_rank) {
      fmt::print("(no sample: model.vocab_size {} is not the GPT-2 vocabulary's {})\n", cfg.model.vocab_size,
                 tok.vocab_size());
    }
  }
  return res;
}

}  // namespace mt
