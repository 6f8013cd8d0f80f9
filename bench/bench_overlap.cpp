// Overlap effectiveness of data and tensor parallelism: step time with communication overlapped vs serialised,
// and how much of the communication time the overlap hides. One process per rank, started by the launcher:
//   build/megatrain launch --nproc 2 --exec -- build/bench/bench_overlap --dp 2
//   build/megatrain launch --nproc 2 --exec -- build/bench/bench_overlap --tp 2
// Rank 0 prints one JSON object. Both modes run in the same process, alternating, and report medians.
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "megatrain/core/clock.h"
#include "megatrain/core/rng.h"
#include "megatrain/dist/env.h"
#include "megatrain/dist/mesh.h"
#include "megatrain/model/gpt.h"
#include "megatrain/optim/optimizer.h"
#include "megatrain/parallel/data_parallel.h"
#include "megatrain/parallel/tensor_parallel.h"

using namespace mt;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct ModeResult {
  std::vector<double> step, comm, exposed;
};

}  // namespace

int main(int argc, char** argv) {
  int dp = 1, tp = 1, steps = 6, layers = 4, width = 512, B = 4, T = 128;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    int v = std::atoi(argv[i + 1]);
    if (a == "--dp") dp = v;
    else if (a == "--tp") tp = v;
    else if (a == "--steps") steps = v;
    else if (a == "--layers") layers = v;
    else if (a == "--width") width = v;
    else if (a == "--batch") B = v;
    else if (a == "--seq") T = v;
    else {
      std::fprintf(stderr, "usage: bench_overlap [--dp N] [--tp N] [--steps N] [--layers L] [--width C] [--batch B] [--seq T]\n");
      return 2;
    }
  }
  try {
    RankInfo ri = rank_info_from_env();
    MeshShape shape{dp, 1, tp};
    check_mesh(shape, ri.world_size);
    MT_CHECK(ri.world_size > 1, "run under `megatrain launch --nproc N --exec -- bench_overlap ...`");
    auto store = open_store(ri.store_url);
    DeviceMesh mesh(*store, shape, ri.rank, {});
    ModelConfig cfg;
    cfg.n_layer = layers;
    cfg.d_model = width;
    cfg.n_head = width / 64;
    cfg.max_seq_len = T;
    auto ops = make_cpu_ops();
    OptimConfig oc;
    Rng rng(ri.rank / tp);  // the same data on the ranks of one tp group
    std::vector<int32_t> x(size_t(B) * T), y(size_t(B) * T);
    for (auto& v : x) v = static_cast<int32_t>(rng.below(cfg.vocab_size));
    for (auto& v : y) v = static_cast<int32_t>(rng.below(cfg.vocab_size));

    nlohmann::json out = {{"benchmark", "overlap"}, {"dp", dp}, {"tp", tp}, {"threads_per_rank", omp_get_max_threads()},
                          {"model", {{"n_layer", layers}, {"d_model", width}, {"B", B}, {"T", T}}}};
    std::map<bool, ModeResult> res;
    // Both configurations live side by side; steps alternate between them so machine drift hits both alike.
    struct Setup {
      std::unique_ptr<ProcessGroupTpComm> tpc;
      std::unique_ptr<GPT> model;
      std::unique_ptr<DataParallel> ddp;
      std::unique_ptr<Optimizer> opt;
    };
    std::map<bool, Setup> setups;
    for (bool overlap : {true, false}) {
      Setup& s = setups[overlap];
      if (tp > 1) s.tpc = std::make_unique<ProcessGroupTpComm>(mesh.tp(), TensorParallelOptions{4, overlap});
      s.model = std::make_unique<GPT>(cfg, *ops, dp_pad_multiple(dp), s.tpc.get());
      s.model->init_weights(1);
      if (dp > 1) {
        DataParallelOptions o;
        o.overlap = overlap;
        o.bucket_floats = size_t(4) << 20;
        if (tp > 1) {
          o.norm_weights = tp_norm_weights(s.model->params(), mesh.coord().tp);
          o.norm_reduce = [&mesh](float* d, size_t n) {
            mesh.tp().allreduce(f32_view(d, {static_cast<int64_t>(n)}))->wait();
          };
        }
        s.ddp = std::make_unique<DataParallel>(*s.model, mesh.dp(), *ops, oc, o);
      } else {
        s.opt = std::make_unique<Optimizer>(oc, s.model->params(), *ops);
      }
    }
    for (int it = 0; it < 2 * (steps + 1); ++it) {
      bool overlap = it % 2 == 0;
      Setup& s = setups[overlap];
      if (s.tpc) s.tpc->reset_comm_seconds();
      double t0 = now_seconds();
      s.model->params().zero_grads();
      if (s.ddp) s.ddp->begin_last_backward();
      s.model->forward(x.data(), y.data(), B, T, true);
      s.model->backward();
      double tp_comm = s.tpc ? s.tpc->comm_seconds() : 0;
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
        auto [c, e] = s.ddp->take_comm_stats();
        comm += c;
        exposed += e;
      }
      if (it >= 2) {  // the first step of each mode warms up
        res[overlap].step.push_back(dt);
        res[overlap].comm.push_back(comm);
        res[overlap].exposed.push_back(exposed);
      }
    }
    double on = median(res[true].step), off = median(res[false].step);
    double comm_off = median(res[false].comm);
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
    }
    if (ri.rank == 0) std::printf("%s\n", out.dump(2).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_overlap: %s\n", e.what());
    return 1;
  }
  return 0;
}
