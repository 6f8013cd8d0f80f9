// The MoE layer's expert-parallel path (model/moe_ep.cpp) against the layer without it, in one process: the ep
// ranks are threads that exchange through shared memory (an EpComm written here: a barrier, then each rank copies
// its blocks out of the senders' buffers), each holding its shard of the experts (expert_spec). The oracle is the
// single-process MoeFfn with every expert, run on each rank's tokens separately: routing, capacity and the auxiliary
// losses are per rank's tokens under ep, so per rank the outputs, the input gradients and the router's and shared
// experts' gradients must be the oracle's, and each local expert's gradient the sum of the oracle's over the ranks.
#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "megatrain/core/error.h"
#include "megatrain/core/rng.h"
#include "megatrain/kernels/cpu/cpu_ops.h"
#include "megatrain/model/moe.h"
#include "megatrain/model/shard.h"

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

ModelConfig config(int E, int k, int shared, float cf) {
  ModelConfig c;
  c.d_model = 8, c.n_head = 2, c.n_layer = 1;
  c.moe_experts = E, c.moe_top_k = k, c.moe_d_ff = 6, c.moe_shared_experts = shared, c.moe_capacity_factor = cf;
  c.moe_aux_loss = 0.1f, c.moe_z_loss = 0.01f;
  return c;
}

// Layer 0's parameters, the experts as ep rank `rank` of `ep` holds them (ep = 1: all).
void declare(const ModelConfig& c, ParamStore& ps, int ep, int rank) {
  const int64_t C = c.d_model, E = c.moe_experts, F = c.moe_d_ff, SF = int64_t{c.moe_shared_experts} * F;
  ps.add("h.0.moe.router.weight", {E, C}, true);
  ps.add("h.0.moe.experts.c_fc.weight", expert_spec({E, 2 * F, C}, ep, rank, "c_fc"), true);
  ps.add("h.0.moe.experts.c_proj.weight", expert_spec({E, C, F}, ep, rank, "c_proj"), true);
  if (SF > 0) {
    ps.add("h.0.moe.shared.c_fc.weight", {2 * SF, C}, true);
    ps.add("h.0.moe.shared.c_proj.weight", {C, SF}, true);
  }
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

TEST(MoeExpertParallel, TwoRanksMatchTheLayerWithEveryExpert) {
  expect_ep_matches_one_process(config(4, 2, 0, 0), 2, 24);
}

TEST(MoeExpertParallel, FourRanksWithSharedExpertsMatch) { expect_ep_matches_one_process(config(8, 3, 1, 0), 4, 16); }

// Capacity drops are decided per rank's tokens, before the dispatch: the same drops as the layer on those tokens.
TEST(MoeExpertParallel, CapacityDropsMatchPerRank) { expect_ep_matches_one_process(config(4, 2, 1, 0.6f), 2, 24); }

}  // namespace
