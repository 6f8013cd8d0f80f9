// The MoE layer's expert-parallel path (model/moe_ep.cpp) against the layer without it, in one process: the ep
// ranks are threads that exchange through shared memory (an EpComm written here: a barrier, then each rank copies
// its blocks out of the senders' buffers), each holding its shard of the experts (expert_spec). The oracle is the
// single-process MoeFfn with every expert, run on each rank's tokens separately: routing, capacity and the auxiliary
// losses are per rank's tokens under ep, so per rank the outputs, the input gradients and the router's and shared
// experts' gradients must be the oracle's, and each local expert's gradient the sum of the oracle's over the ranks.
// With a token group as well (ep x tp: each ep rank's micro-batch split over tp ranks, MoeFfn::set_token_group), the
// oracle is the layer on each micro-batch whole: the routing counts and the auxiliary losses are the micro-batch's.
#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "megatrain/core/error.h"
#include "megatrain/core/rng.h"
#include "megatrain/kernels/cpu/cpu_ops.h"
#include "megatrain/model/moe.h"
#include "megatrain/model/shard.h"
#include "megatrain/model/tp_comm.h"
#include "support/moe_testutil.h"

using namespace mt;

namespace {

// n threads as ep ranks. Every exchange: publish my buffer, wait for all, (run the caller's work,) copy my blocks
// from every sender, wait for all again so that no sender reuses its buffer before every copy is done.
struct Exchange {
  explicit Exchange(int n) : n(n), sync(n), rows(n), send(n), counts(n) {}
  int n;
  std::barrier<> sync;
  std::vector<const float*> rows;
  std::vector<std::vector<int64_t>> send;
  std::vector<const int32_t*> counts;
};

class ThreadEpComm final : public EpComm {
 public:
  ThreadEpComm(Exchange& x, int rank) : x_(x), rank_(rank) {}
  int size() const override { return x_.n; }
  int rank() const override { return rank_; }
  void exchange_counts(std::vector<int32_t>& recv, const std::vector<int32_t>& send, int n) override {
    x_.counts[rank_] = send.data();
    x_.sync.arrive_and_wait();
    recv.resize(static_cast<size_t>(x_.n) * n);
    for (int s = 0; s < x_.n; ++s) std::memcpy(&recv[s * n], x_.counts[s] + rank_ * n, n * sizeof(int32_t));
    x_.sync.arrive_and_wait();
  }
  void exchange_rows(Tensor out, Tensor in, const std::vector<int64_t>& recv_rows,
                     const std::vector<int64_t>& send_rows, const std::function<void()>& while_in_flight) override {
    const int64_t C = in.size(1);
    x_.rows[rank_] = in.f32();
    x_.send[rank_] = send_rows;
    x_.sync.arrive_and_wait();
    if (while_in_flight) while_in_flight();
    float* o = out.f32();
    for (int s = 0; s < x_.n; ++s) {
      int64_t at = 0;
      for (int q = 0; q < rank_; ++q) at += x_.send[s][q];
      MT_CHECK(x_.send[s][rank_] == recv_rows[s], "rank {} expects {} rows from {}, which sends {}", rank_,
               recv_rows[s], s, x_.send[s][rank_]);
      std::memcpy(o, x_.rows[s] + at * C, static_cast<size_t>(recv_rows[s] * C) * sizeof(float));
      o += recv_rows[s] * C;
    }
    x_.sync.arrive_and_wait();
  }

 private:
  Exchange& x_;
  int rank_;
};

// n threads as a token group (tensor parallelism's ranks): only the all-reduce, which is all the MoE layer calls.
struct Reduction {
  explicit Reduction(int n) : n(n), sync(n), bufs(n) {}
  int n;
  std::barrier<> sync;
  std::vector<const float*> bufs;
};

class ThreadTpComm final : public TpComm {
 public:
  ThreadTpComm(Reduction& x, int rank) : x_(x), rank_(rank) {}
  int size() const override { return x_.n; }
  int rank() const override { return rank_; }
  void allreduce(Tensor t, TpReduce op) override {
    MT_CHECK(op == TpReduce::Sum, "ThreadTpComm: sums only");
    x_.bufs[rank_] = t.f32();
    x_.sync.arrive_and_wait();
    std::vector<float> sum(static_cast<size_t>(t.numel()), 0.0f);
    for (int s = 0; s < x_.n; ++s)
      for (size_t j = 0; j < sum.size(); ++j) sum[j] += x_.bufs[s][j];
    x_.sync.arrive_and_wait();  // every rank has read every buffer before any is overwritten
    std::memcpy(t.f32(), sum.data(), sum.size() * sizeof(float));
  }
  void all_gather_rows(Tensor, Tensor, const Consume&) override { MT_CHECK(false, "ThreadTpComm: not used"); }
  void reduce_scatter_rows(Tensor, int64_t, const Produce&, const std::function<void()>&) override {
    MT_CHECK(false, "ThreadTpComm: not used");
  }

 private:
  Reduction& x_;
  int rank_;
};

ModelConfig config(int E, int k, int shared, float cf) {
  ModelConfig c;
  c.d_model = 8, c.n_head = 2, c.n_layer = 1;
  c.moe_experts = E, c.moe_top_k = k, c.moe_d_ff = 6, c.moe_shared_experts = shared, c.moe_capacity_factor = cf;
  c.moe_aux_loss = 0.1f, c.moe_z_loss = 0.01f;
  return c;
}

// Layer 0's parameters, the experts as ep rank `rank` of `ep` holds them (ep = 1: all), allocated.
void declare(const ModelConfig& c, ParamStore& ps, int ep, int rank) {
  test::declare_moe_layer0(c, ps, ep, rank);
  ps.allocate();
}

// Frobenius-relative deviation of got from want.
double rel(const float* got, const float* want, int64_t n) {
  double d = 0, s = 0;
  for (int64_t i = 0; i < n; ++i) d += double(got[i] - want[i]) * (got[i] - want[i]), s += double(want[i]) * want[i];
  return std::sqrt(d / std::max(s, 1e-300));
}

// Every computed value is the same fp32 arithmetic on the same rows in both runs, except a local expert's weight
// gradient: one GEMM over all ranks' rows under ep against the sum of one GEMM per rank in the oracle, a
// reassociation of at most 2 * N * k fp32 terms (a few ulps of 2^-24 each, relative to the terms' magnitudes). 1e-5
// bounds both with a margin; a misrouted row or a wrong gradient is off by O(1).
constexpr double kTol = 1e-5;

void expect_ep_matches_one_process(const ModelConfig& c, int ep, int64_t N) {
  auto ops = make_cpu_ops();
  ParamStore full;
  declare(c, full, 1, 0);
  Rng rng(11);
  for (size_t i = 0; i < full.size(); ++i) {
    Tensor p = full.param(static_cast<int>(i));
    const double scale = full.info(static_cast<int>(i)).name == "h.0.moe.router.weight" ? 0.8 : 0.3;
    for (int64_t j = 0; j < p.numel(); ++j) p.f32()[j] = static_cast<float>(scale * rng.normal());
  }
  const int64_t C = c.d_model;
  std::vector<std::vector<float>> x(ep, std::vector<float>(N * C)), dy(ep, std::vector<float>(N * C));
  for (int r = 0; r < ep; ++r)
    for (int64_t j = 0; j < N * C; ++j) x[r][j] = rng.normal(), dy[r][j] = rng.normal();

  // The oracle: each rank's tokens through the whole layer, its gradients kept per rank.
  std::vector<std::vector<float>> y_ref(ep), dx_ref(ep);
  std::vector<std::vector<std::vector<float>>> g_ref(ep);
  for (int r = 0; r < ep; ++r) {
    MoeActs a;
    a.allocate(c, N);
    MoeFfn layer(c, full, 0);
    y_ref[r].resize(N * C), dx_ref[r].resize(N * C);
    layer.forward(*ops, Tensor(y_ref[r].data(), {N, C}), Tensor(x[r].data(), {N, C}), a);
    full.begin_grads();
    layer.backward(*ops, Tensor(dx_ref[r].data(), {N, C}), Tensor(dy[r].data(), {N, C}), Tensor(x[r].data(), {N, C}), a,
                   1.0f);
    full.settle_grads(0, static_cast<int>(full.size()));
    for (size_t i = 0; i < full.size(); ++i) {
      Tensor g = full.grad(static_cast<int>(i));
      g_ref[r].emplace_back(g.f32(), g.f32() + g.numel());
    }
  }

  // The ep run: one thread per rank, each with its expert shard.
  Exchange xch(ep);
  std::vector<ParamStore> stores(ep);
  std::vector<std::vector<float>> y(ep, std::vector<float>(N * C)), dx(ep, std::vector<float>(N * C));
  std::vector<std::string> errors(ep);
  std::vector<std::thread> threads;
  for (int r = 0; r < ep; ++r) {
    declare(c, stores[r], ep, r);
    for (size_t i = 0; i < full.size(); ++i) {
      const ShardSpec& spec = stores[r].info(static_cast<int>(i)).shard;
      shard_slice(spec, full.param(static_cast<int>(i)).f32(), stores[r].param(static_cast<int>(i)).f32());
    }
  }
  for (int r = 0; r < ep; ++r)
    threads.emplace_back([&, r] {
      try {
        ThreadEpComm comm(xch, r);
        MoeActs a;
        a.allocate(c, N);
        MoeFfn layer(c, stores[r], 0, &comm);
        layer.forward(*ops, Tensor(y[r].data(), {N, C}), Tensor(x[r].data(), {N, C}), a);
        stores[r].begin_grads();
        layer.backward(*ops, Tensor(dx[r].data(), {N, C}), Tensor(dy[r].data(), {N, C}), Tensor(x[r].data(), {N, C}), a,
                       1.0f);
        stores[r].settle_grads(0, static_cast<int>(stores[r].size()));
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();

  for (int r = 0; r < ep; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    EXPECT_LE(rel(y[r].data(), y_ref[r].data(), N * C), kTol) << "output of rank " << r;
    EXPECT_LE(rel(dx[r].data(), dx_ref[r].data(), N * C), kTol) << "input gradient of rank " << r;
    for (size_t i = 0; i < full.size(); ++i) {
      const ParamInfo& info = stores[r].info(static_cast<int>(i));
      std::vector<float> want(info.numel);
      if (info.shard.ep_sharded()) {  // my experts' slice of the gradient summed over every rank's tokens
        std::vector<float> sum(g_ref[0][i].size(), 0.0f);
        for (int q = 0; q < ep; ++q)
          for (size_t j = 0; j < sum.size(); ++j) sum[j] += g_ref[q][i][j];
        shard_slice(info.shard, sum.data(), want.data());
      } else {  // replicated: this rank's tokens only
        want = g_ref[r][i];
      }
      EXPECT_LE(rel(stores[r].grad(static_cast<int>(i)).f32(), want.data(), static_cast<int64_t>(info.numel)), kTol)
          << info.name << " gradient on rank " << r;
    }
  }
}

// ---- ep x tp ----------------------------------------------------------------------------------------------

// Random parameters for a full layer, and the ep shards of them.
void fill_random(ParamStore& full, Rng& rng) {
  for (size_t i = 0; i < full.size(); ++i) {
    Tensor p = full.param(static_cast<int>(i));
    const double scale = full.info(static_cast<int>(i)).name == "h.0.moe.router.weight" ? 0.8 : 0.3;
    for (int64_t j = 0; j < p.numel(); ++j) p.f32()[j] = static_cast<float>(scale * rng.normal());
  }
}

// One rank's view of a layer run: output, input gradient, parameter gradients, the micro-batch's statistics.
struct RankRun {
  std::vector<float> y, dx;
  std::vector<std::vector<float>> grads;
  double aux = 0, z = 0;
  std::vector<int64_t> batch_routed;
  std::string error;
};

// Forward and backward of `layer` on [N, C] rows x with output gradient dy, into run.
void run_layer(Ops& ops, const ModelConfig& c, const MoeFfn& layer, ParamStore& ps, const float* x, const float* dy,
               int64_t N, RankRun& run) {
  const int64_t C = c.d_model;
  MoeActs a;
  a.allocate(c, N);
  run.y.resize(N * C), run.dx.resize(N * C);
  layer.forward(ops, Tensor(run.y.data(), {N, C}), Tensor(const_cast<float*>(x), {N, C}), a);
  ps.begin_grads();
  layer.backward(ops, Tensor(run.dx.data(), {N, C}), Tensor(const_cast<float*>(dy), {N, C}),
                 Tensor(const_cast<float*>(x), {N, C}), a, 1.0f);
  ps.settle_grads(0, static_cast<int>(ps.size()));
  for (size_t i = 0; i < ps.size(); ++i) {
    Tensor g = ps.grad(static_cast<int>(i));
    run.grads.emplace_back(g.f32(), g.f32() + g.numel());
  }
  run.aux = a.aux, run.z = a.z, run.batch_routed = a.routing.batch_routed;
}

void expect_ep_tp_runs_match(const ModelConfig& c, const ParamStore& full, const std::vector<RankRun>& ref,
                             const std::vector<RankRun>& got, int ep, int tp, int64_t N) {
  const int64_t C = c.d_model;
  for (int e = 0; e < ep; ++e)
    for (int t = 0; t < tp; ++t) {
      const RankRun& r = got[e * tp + t];
      const std::string at = "ep rank " + std::to_string(e) + ", tp rank " + std::to_string(t);
      ASSERT_EQ(r.error, "") << at;
      EXPECT_LE(rel(r.y.data(), ref[e].y.data() + t * N * C, N * C), kTol) << "output of " << at;
      EXPECT_LE(rel(r.dx.data(), ref[e].dx.data() + t * N * C, N * C), kTol) << "input gradient of " << at;
      EXPECT_NEAR(r.aux, ref[e].aux, kTol * ref[e].aux) << "aux loss of " << at;
      EXPECT_NEAR(r.z, ref[e].z, kTol * ref[e].z) << "z-loss of " << at;
      EXPECT_EQ(r.batch_routed, ref[e].batch_routed) << "routing counts of " << at;
    }
  for (size_t i = 0; i < full.size(); ++i) {
    for (int e = 0; e < ep; ++e) {
      std::vector<float> sum_tp(got[e * tp].grads[i].size(), 0.0f), want(sum_tp.size());
      for (int t = 0; t < tp; ++t)
        for (size_t j = 0; j < sum_tp.size(); ++j) sum_tp[j] += got[e * tp + t].grads[i][j];
      std::vector<float> full_want = ref[e].grads[i];
      const std::string name = full.info(static_cast<int>(i)).name;
      // An expert's gradient sums over the tokens of every ep rank (each tp rank's rows go to the experts of its
      // own tp coordinate); a replicated tensor's is the micro-batch's. Then e's shard (replicated: all of it).
      if (name.find("experts") != std::string::npos)
        for (int q = 0; q < ep; ++q)
          if (q != e)
            for (size_t j = 0; j < full_want.size(); ++j) full_want[j] += ref[q].grads[i][j];
      ParamStore shard;
      declare(c, shard, ep, e);
      shard_slice(shard.info(static_cast<int>(i)).shard, full_want.data(), want.data());
      EXPECT_LE(rel(sum_tp.data(), want.data(), static_cast<int64_t>(want.size())), kTol)
          << name << " gradient summed over tp on ep rank " << e;
    }
  }
}

// ep x tp threads: ep rank e's micro-batch of tp * N tokens, tp rank t holding rows [t N, (t+1) N) of it, against
// the layer with every expert on each micro-batch whole. Per thread: its rows of the output and the input gradient,
// the micro-batch's losses and counts; summed over tp, the replicated tensors' gradients are the micro-batch's and
// (summed over ep as well) the experts' are the sum over all micro-batches.
void expect_ep_tp_matches_one_process(const ModelConfig& c, int ep, int tp, int64_t N) {
  auto ops = make_cpu_ops();
  ParamStore full;
  declare(c, full, 1, 0);
  Rng rng(13);
  fill_random(full, rng);
  const int64_t C = c.d_model, M = tp * N;
  std::vector<std::vector<float>> x(ep, std::vector<float>(M * C)), dy(ep, std::vector<float>(M * C));
  for (int e = 0; e < ep; ++e)
    for (int64_t j = 0; j < M * C; ++j) x[e][j] = rng.normal(), dy[e][j] = rng.normal();
  std::vector<RankRun> ref(ep), got(ep * tp);
  for (int e = 0; e < ep; ++e) run_layer(*ops, c, MoeFfn(c, full, 0), full, x[e].data(), dy[e].data(), M, ref[e]);

  std::vector<std::unique_ptr<Exchange>> exchanges;  // one ep group per tp rank
  std::vector<std::unique_ptr<Reduction>> groups;    // one token group per ep rank
  for (int t = 0; t < tp; ++t) exchanges.push_back(std::make_unique<Exchange>(ep));
  for (int e = 0; e < ep; ++e) groups.push_back(std::make_unique<Reduction>(tp));
  std::vector<ParamStore> stores(ep * tp);
  for (int e = 0; e < ep; ++e)
    for (int t = 0; t < tp; ++t) {
      ParamStore& ps = stores[e * tp + t];
      declare(c, ps, ep, e);
      for (size_t i = 0; i < full.size(); ++i)
        shard_slice(ps.info(static_cast<int>(i)).shard, full.param(static_cast<int>(i)).f32(),
                    ps.param(static_cast<int>(i)).f32());
    }
  std::vector<std::thread> threads;
  for (int e = 0; e < ep; ++e)
    for (int t = 0; t < tp; ++t)
      threads.emplace_back([&, e, t] {
        RankRun& run = got[e * tp + t];
        try {
          ThreadEpComm comm(*exchanges[t], e);
          ThreadTpComm group(*groups[e], t);
          MoeFfn layer(c, stores[e * tp + t], 0, &comm);
          layer.set_token_group(&group);
          run_layer(*ops, c, layer, stores[e * tp + t], x[e].data() + t * N * C, dy[e].data() + t * N * C, N, run);
        } catch (const std::exception& ex) {
          run.error = ex.what();
        }
      });
  for (auto& th : threads) th.join();
  expect_ep_tp_runs_match(c, full, ref, got, ep, tp, N);
}

TEST(MoeExpertParallel, TwoRanksMatchTheLayerWithEveryExpert) {
  expect_ep_matches_one_process(config(4, 2, 0, 0), 2, 24);
}

TEST(MoeExpertParallel, FourRanksWithSharedExpertsMatch) { expect_ep_matches_one_process(config(8, 3, 1, 0), 4, 16); }

// Capacity drops are decided per rank's tokens, before the dispatch: the same drops as the layer on those tokens.
TEST(MoeExpertParallel, CapacityDropsMatchPerRank) { expect_ep_matches_one_process(config(4, 2, 1, 0.6f), 2, 24); }

// With a token group (ep x tp): the micro-batch's statistics, not the rank's rows' (the z-loss's and the aux loss's
// gradients reach the input gradient; the counts are what the metrics and the sigmoid_bias loads read).
TEST(MoeExpertParallel, WithATokenGroupTheStatisticsAreTheMicroBatchs) {
  expect_ep_tp_matches_one_process(config(4, 2, 1, 0), 2, 2, 12);
}

}  // namespace
