// Overlap effectiveness of data, tensor and pipeline parallelism: step time with communication overlapped vs
// serialised, and how much of the communication time the overlap hides. One process per rank, started by the
// launcher:
//   build/megatrain launch --nproc 2 --exec -- build/bench/bench_overlap --dp 2
//   build/megatrain launch --nproc 2 --exec -- build/bench/bench_overlap --tp 2
//   build/megatrain launch --nproc 2 --exec -- build/bench/bench_overlap --pp 2
//   build/megatrain launch --nproc 4 --exec -- build/bench/bench_overlap --dp 2 --pp 2
// Rank 0 prints one JSON object. Both modes run in the same process, alternating, and report medians.
//
// With pp the GPT is split in stages run by GptPipeline over a 1F1B schedule (--micro micro-batches of --batch
// rows, default 2*pp). Overlap on: receives posted early, sends asynchronous and, with dp, each chunk's
// reduce-scatters launched during its last backward. Off: run_pipeline's serialised mode and DataParallel's
// overlap=false. A p2p op's exec_seconds runs from its post to its completion, so it includes waiting for the peer
// to reach the matching post (for a receive posted early, the peer's whole compute): it is not the transfer time.
// The transfer time is measured separately on the idle pp link (one message of the activation size, one way) and
// multiplied by the messages pp rank 0 moves per step; that is the p2p communication the overlap can hide.
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "megatrain/core/clock.h"
#include "megatrain/core/rng.h"
#include "megatrain/comm/env.h"
#include "megatrain/comm/mesh.h"
#include "megatrain/model/gpt.h"
#include "megatrain/optim/optimizer.h"
#include "megatrain/model/layout.h"
#include "megatrain/parallel/data_parallel.h"
#include "megatrain/parallel/gpt_pipeline.h"
#include "megatrain/parallel/schedule.h"
#include "megatrain/parallel/tensor_parallel.h"

using namespace mt;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct ModeResult {
  std::vector<double> step, comm, exposed;
  std::vector<double> p2p_blocked, p2p_exec;  // pipeline: time waited on / summed exec time of the p2p transfers
};

// All ranks of the mesh at one point: a barrier over each dimension in turn (a rank leaves the last one only once
// every rank has entered the first). Keeps one mode's pipeline step from running into the other's.
void mesh_barrier(DeviceMesh& mesh) {
  mesh.dp().barrier()->wait();
  mesh.pp().barrier()->wait();
  mesh.tp().barrier()->wait();
}

// One-way time of one `floats`-float message from pp rank 0 to pp rank 1 over the otherwise idle link, the receive
// posted before the send starts (median of `reps`, valid on pp rank 0). Every pp rank takes part in the barriers.
double p2p_transfer_seconds(ProcessGroup& pp, size_t floats, int reps) {
  std::vector<float> buf(floats, 1.0f);
  Tensor t = f32_view(buf.data(), {static_cast<int64_t>(floats)});
  const int tag_base = 1 << 24;  // beyond the schedule's tags
  std::vector<double> dt;
  for (int i = 0; i < reps; ++i) {
    WorkPtr r;
    if (pp.rank() == 1) r = pp.recv(t, 0, tag_base + i);
    pp.barrier()->wait();
    if (pp.rank() == 0) {
      double t0 = now_seconds();
      pp.send(t, 1, tag_base + i)->wait();
      dt.push_back(now_seconds() - t0);
    }
    if (r) r->wait();
  }
  return dt.empty() ? 0.0 : median(dt);
}

}  // namespace

int main(int argc, char** argv) {
  int dp = 1, tp = 1, pp = 1, micro = 0, steps = 6, layers = 4, width = 512, B = 4, T = 128;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    int v = std::atoi(argv[i + 1]);
    if (a == "--dp")
      dp = v;
    else if (a == "--tp")
      tp = v;
    else if (a == "--pp")
      pp = v;
    else if (a == "--micro")
      micro = v;
    else if (a == "--steps")
      steps = v;
    else if (a == "--layers")
      layers = v;
    else if (a == "--width")
      width = v;
    else if (a == "--batch")
      B = v;
    else if (a == "--seq")
      T = v;
    else {
      std::fprintf(stderr, "usage: bench_overlap [--dp N] [--tp N] [--pp N] [--micro M] [--steps N] [--layers L] "
                           "[--width C] [--batch B] [--seq T]\n");
      return 2;
    }
  }
  try {
    if (micro <= 0) micro = pp > 1 ? 2 * pp : 1;  // 1F1B reaches its steady state from 2*pp micro-batches
    RankInfo ri = rank_info_from_env();
    MeshShape shape{dp, pp, tp};
    check_mesh(shape, ri.world_size);
    MT_CHECK(ri.world_size > 1, "run under `megatrain launch --nproc N --exec -- bench_overlap ...`");
    auto store = open_store(ri.store_url);
    DeviceMesh mesh(*store, shape, ri.rank, {});
    const MeshCoord me = mesh.coord();
    ModelConfig cfg;
    cfg.n_layer = layers;
    cfg.d_model = width;
    cfg.n_head = width / 64;
    cfg.max_seq_len = T;
    auto ops = make_cpu_ops();
    OptimConfig oc;
    Rng rng(me.dp);  // the same data on the tp and pp ranks of one replica
    const int rows = pp > 1 ? micro * B : B;
    std::vector<int32_t> x(size_t(rows) * T), y(size_t(rows) * T);
    for (auto& v : x) v = static_cast<int32_t>(rng.below(cfg.vocab_size));
    for (auto& v : y) v = static_cast<int32_t>(rng.below(cfg.vocab_size));

    nlohmann::json out = {{"benchmark", "overlap"},
                          {"dp", dp},
                          {"tp", tp},
                          {"pp", pp},
                          {"threads_per_rank", omp_get_max_threads()},
                          {"model", {{"n_layer", layers}, {"d_model", width}, {"B", B}, {"T", T}}}};
    // Pipeline pieces shared by both modes (they run one after the other): the schedule, and with tied embeddings
    // the group of the first and last stage whose wte copies sum their gradients after the pipeline (as the
    // trainer does; blocking in both modes).
    Schedule sched;
    std::unique_ptr<ProcessGroup> emb_group;
    if (pp > 1) {
      sched = make_1f1b(pp, micro);
      out["microbatches"] = micro;
      out["schedule"] = "1f1b";
      if (cfg.tied_embeddings && (me.pp == 0 || me.pp == pp - 1)) {
        const std::vector<int> ranks = {mesh_rank(shape, {me.dp, 0, me.tp}), mesh_rank(shape, {me.dp, pp - 1, me.tp})};
        emb_group = make_gloo_group(*store, fmt::format("emb[{},{}]", ranks[0], ranks[1]), ranks, ri.rank, {});
      }
    }
    std::map<bool, ModeResult> res;
    // Both configurations live side by side; steps alternate between them so machine drift hits both alike.
    struct Setup {
      std::unique_ptr<ProcessGroupTpComm> tpc;
      std::unique_ptr<GPT> model;
      std::unique_ptr<GptPipeline> pipe;
      std::unique_ptr<DataParallel> ddp;
      std::unique_ptr<Optimizer> opt;
      int wte_copy = -1;  // the last stage's copy of a tied wte
    };
    std::map<bool, Setup> setups;
    for (bool overlap : {true, false}) {
      Setup& s = setups[overlap];
      if (tp > 1) s.tpc = std::make_unique<ProcessGroupTpComm>(mesh.tp(), *ops, TensorParallelOptions{4, overlap});
      s.model = std::make_unique<GPT>(cfg, *ops, dp_pad_multiple(dp), s.tpc.get(),
                                      pp > 1 ? pipeline_part(cfg, pp, 1, me.pp) : GptPart{});
      s.model->init_weights(1);
      std::vector<float> clip_weights;
      NormReduce clip_reduce;
      if (pp > 1) {
        s.pipe = std::make_unique<GptPipeline>(*s.model, sched, me.pp, B, T);
        s.pipe->set_overlap_p2p(overlap);
        if (cfg.tied_embeddings && me.pp == pp - 1) s.wte_copy = s.model->params().index("wte.weight");
        // The clipping norm sums over the stages, the wte copy counted once (as in the trainer).
        clip_weights = tp > 1 ? tp_norm_weights(s.model->params(), me.tp)
                              : std::vector<float>(s.model->params().size(), 1.0f);
        if (s.wte_copy >= 0) clip_weights[s.wte_copy] = 0;
        clip_reduce = [&mesh, tp](float* d, size_t n) {
          Tensor t = f32_view(d, {static_cast<int64_t>(n)});
          if (tp > 1) mesh.tp().allreduce(t)->wait();
          mesh.pp().allreduce(t)->wait();
        };
      }
      if (dp > 1) {
        DataParallelOptions o;
        o.overlap = overlap;
        o.bucket_floats = size_t(4) << 20;
        if (tp > 1) {
          o.norm_weights = tp_norm_weights(s.model->params(), me.tp);
          o.norm_reduce = [&mesh](float* d, size_t n) {
            mesh.tp().allreduce(f32_view(d, {static_cast<int64_t>(n)}))->wait();
          };
        }
        o.clip_norm_weights = clip_weights;
        o.clip_norm_reduce = clip_reduce;
        s.ddp = std::make_unique<DataParallel>(*s.model, mesh.dp(), *ops, oc, o);
        // A chunk's gradients are final in the backward of its last micro-batch: its buckets start there (a no-op
        // with overlap off, where finish_gradients reduces every bucket).
        if (s.pipe) s.pipe->set_before_last_backward([d = s.ddp.get()](int c) { d->begin_last_backward(c); });
      } else {
        s.opt = std::make_unique<Optimizer>(oc, s.model->params(), *ops);
      }
    }
    double transfer = 0;  // pp: one activation message, one way, on the idle link
    int messages = 0;     // pp: messages pp rank 0 sends or receives per step
    if (pp > 1) {
      transfer = p2p_transfer_seconds(mesh.pp(), size_t(B) * T / tp * width, 5);
      for (const Action& a : sched.per_rank[me.pp])
        if (a.kind == ActionKind::PostSendForward || a.kind == ActionKind::PostSendBackward ||
            a.kind == ActionKind::PostRecvForward || a.kind == ActionKind::PostRecvBackward)
          ++messages;
    }
    for (int it = 0; it < 2 * (steps + 1); ++it) {
      bool overlap = it % 2 == 0;
      Setup& s = setups[overlap];
      if (s.pipe) mesh_barrier(mesh);  // the stages start a step together (untimed)
      if (s.tpc) s.tpc->take_comm_time();
      double t0 = now_seconds();
      s.model->params().zero_grads();
      double tp_comm = 0;
      if (s.pipe) {
        s.pipe->run(mesh.pp(), x.data(), y.data(), 1.0f / static_cast<float>(micro), true);
        tp_comm = s.tpc ? s.tpc->take_comm_time().busy_seconds : 0;
        if (emb_group) emb_group->allreduce(s.model->params().grad("wte.weight"))->wait();
      } else {
        if (s.ddp) s.ddp->begin_last_backward();
        s.model->forward(x.data(), y.data(), B, T, true);
        s.model->backward();
        tp_comm = s.tpc ? s.tpc->take_comm_time().busy_seconds : 0;
      }
      if (s.ddp) {
        s.ddp->finish_gradients();
        s.ddp->step(1e-4f, 1.0f, it / 2 + 1);
        s.ddp->sync_params();
      } else {
        s.opt->step(s.model->params(), 1e-4f, 1.0f, it / 2 + 1);
      }
      double dt = now_seconds() - t0;
      double comm = tp_comm, exposed = 0;
      if (s.ddp) {
        const CommTime t = s.ddp->take_comm_time();
        comm += t.busy_seconds;
        exposed += t.exposed_seconds;
      }
      if (it >= 2) {  // the first step of each mode warms up
        res[overlap].step.push_back(dt);
        res[overlap].comm.push_back(comm);
        res[overlap].exposed.push_back(exposed);
        if (s.pipe) {
          res[overlap].p2p_blocked.push_back(s.pipe->stats().wait_seconds);
          res[overlap].p2p_exec.push_back(s.pipe->stats().comm_seconds);
        }
      }
    }
    double on = median(res[true].step), off = median(res[false].step);
    // Serialised communication time per step: the dp / tp collectives as executed with overlap off, plus with pp
    // the transfer time of the p2p messages (their exec_seconds include waiting for the peer, see the top).
    const double p2p_transfer = transfer * messages;
    double comm_off = median(res[false].comm) + p2p_transfer;
    out["step_seconds_overlap_on"] = on;
    out["step_seconds_overlap_off"] = off;
    out["speedup"] = off / on;
    out["comm_seconds_per_step"] = comm_off;
    // Share of the serialised communication time that overlapping removed from the step.
    out["hidden_fraction_of_comm"] = comm_off > 0 ? (off - on) / comm_off : 0.0;
    if (dp > 1) {
      double c = median(res[true].comm), e = median(res[true].exposed);
      out["dp_comm_seconds"] = c;
      out["dp_comm_exposed_seconds"] = e;
      out["dp_hidden_fraction_from_waits"] = c > 0 ? 1.0 - e / c : 0.0;
      if (pp > 1) {
        out["dp_comm_seconds_overlap_off"] = median(res[false].comm);
        out["dp_comm_exposed_seconds_overlap_off"] = median(res[false].exposed);
      }
    }
    if (pp > 1) {
      // Of pp rank 0 (rank 0 prints). Blocked: time in the executor's waits, which also holds pipeline bubbles
      // (waiting for the peer's compute), so it is an upper bound of the exposed p2p communication.
      out["p2p"] = {{"of", "pp rank 0"},
                    {"messages_per_step", messages},
                    {"message_bytes", size_t(B) * T / tp * width * sizeof(float)},
                    {"transfer_seconds_per_message", transfer},
                    {"transfer_seconds_per_step", p2p_transfer},
                    {"blocked_seconds_overlap_on", median(res[true].p2p_blocked)},
                    {"blocked_seconds_overlap_off", median(res[false].p2p_blocked)},
                    {"exec_seconds_overlap_on", median(res[true].p2p_exec)},
                    {"exec_seconds_overlap_off", median(res[false].p2p_exec)}};
    }
    if (ri.rank == 0) std::printf("%s\n", out.dump(2).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_overlap: %s\n", e.what());
    return 1;
  }
  return 0;
}
