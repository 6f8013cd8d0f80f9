// The pipeline executor against a single-process oracle: a chain of S = pp * v stages y = tanh(W_k x) with
// loss 0.5 * ||y_S||^2 per microbatch, run by pp processes (fork, Gloo over a file store) following 1F1B and
// interleaved 1F1B schedules. Every stage's accumulated weight gradient must equal the naive chain's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "support/comm_fork_util.h"
#include "support/files.h"
#include "megatrain/core/error.h"
#include "megatrain/core/rng.h"
#include "megatrain/comm/process_group.h"
#include "megatrain/parallel/pipeline.h"

using namespace mt;

namespace {

constexpr int D = 8, R = 4;  // width, rows per microbatch

std::vector<float> weights(int stage) {
  Rng r(mix_seed(17, stage));
  std::vector<float> w(D * D);
  for (auto& x : w) x = 0.4f * r.normal();
  return w;
}
std::vector<float> data(int mb) {
  Rng r(mix_seed(99, mb));
  std::vector<float> x(R * D);
  for (auto& v : x) v = r.normal();
  return x;
}

// y = tanh(x W^T) for rows of x.
void fwd(const std::vector<float>& w, const float* x, float* y) {
  for (int i = 0; i < R; ++i)
    for (int o = 0; o < D; ++o) {
      double s = 0;
      for (int k = 0; k < D; ++k) s += x[i * D + k] * w[o * D + k];
      y[i * D + o] = static_cast<float>(std::tanh(s));
    }
}
// Given y and dy: dW += dz^T x, dx = dz W with dz = dy * (1 - y^2).
void bwd(const std::vector<float>& w, const float* x, const float* y, const float* dy, std::vector<double>& dw,
         float* dx) {
  std::vector<double> dz(R * D);
  for (int i = 0; i < R * D; ++i) dz[i] = dy[i] * (1.0 - double(y[i]) * y[i]);
  for (int o = 0; o < D; ++o)
    for (int k = 0; k < D; ++k)
      for (int i = 0; i < R; ++i) dw[o * D + k] += dz[i * D + o] * x[i * D + k];
  if (dx)
    for (int i = 0; i < R; ++i)
      for (int k = 0; k < D; ++k) {
        double s = 0;
        for (int o = 0; o < D; ++o) s += dz[i * D + o] * w[o * D + k];
        dx[i * D + k] = static_cast<float>(s);
      }
}

// The oracle: the whole chain in one process.
std::vector<std::vector<double>> reference(int stages, int m) {
  std::vector<std::vector<double>> dw(stages, std::vector<double>(D * D, 0));
  for (int mb = 0; mb < m; ++mb) {
    std::vector<std::vector<float>> act(stages + 1, std::vector<float>(R * D));
    act[0] = data(mb);
    for (int k = 0; k < stages; ++k) fwd(weights(k), act[k].data(), act[k + 1].data());
    std::vector<float> g = act[stages], gx(R * D);
    for (int k = stages - 1; k >= 0; --k) {
      bwd(weights(k), act[k].data(), act[k + 1].data(), g.data(), dw[k], gx.data());
      g = gx;
    }
  }
  return dw;
}

class ChainChunk : public PipelineChunk {
 public:
  ChainChunk(int stage, int stages, int m)
      : stage_(stage), last_(stage == stages - 1), w_(weights(stage)), dw(D * D, 0.0), x_(m, std::vector<float>(R * D)),
        y_(m, std::vector<float>(R * D)), dy_(m, std::vector<float>(R * D)), dx_(m, std::vector<float>(R * D)) {}
  Tensor input(int mb) override { return f32_view(x_[mb].data(), {R, D}); }
  Tensor output(int mb) override { return f32_view(y_[mb].data(), {R, D}); }
  Tensor grad_output(int mb) override { return f32_view(dy_[mb].data(), {R, D}); }
  Tensor grad_input(int mb) override { return f32_view(dx_[mb].data(), {R, D}); }
  void forward(int mb) override {
    if (stage_ == 0) x_[mb] = data(mb);
    fwd(w_, x_[mb].data(), y_[mb].data());
    if (last_) dy_[mb] = y_[mb];  // d(0.5 ||y||^2)/dy
  }
  void backward(int mb) override {
    bwd(w_, x_[mb].data(), y_[mb].data(), dy_[mb].data(), dw, stage_ == 0 ? nullptr : dx_[mb].data());
  }
  int stage_;
  bool last_;
  std::vector<float> w_;
  std::vector<double> dw;
  std::vector<std::vector<float>> x_, y_, dy_, dx_;
};

void run_case(int pp, int v, int m) {
  mt::test::ScratchDir dir;
  Schedule s = make_interleaved_1f1b(pp, v, m);
  std::vector<int> ranks;
  for (int r = 0; r < pp; ++r) ranks.push_back(r);
  std::string err = comm_test::run_procs(ranks, [&](int rank) {
    auto store = make_file_store(dir.path);
    GroupOptions go;
    go.timeout = Millis(15000);
    auto group = make_gloo_group(*store, "pp", ranks, rank, go);
    std::vector<std::unique_ptr<ChainChunk>> owned;
    std::vector<PipelineChunk*> chunks;
    for (int c = 0; c < v; ++c) {
      owned.push_back(std::make_unique<ChainChunk>(s.stage_of(rank, c), s.stages(), m));
      chunks.push_back(owned.back().get());
    }
    run_pipeline(s, rank, chunks, *group);
    auto ref = reference(s.stages(), m);
    for (auto& c : owned)
      for (int i = 0; i < D * D; ++i)
        MT_CHECK(std::abs(c->dw[i] - ref[c->stage_][i]) <= 1e-5 * (1 + std::abs(ref[c->stage_][i])),
                 "stage {} dW[{}] = {} but the single-process chain gives {}", c->stage_, i, c->dw[i],
                 ref[c->stage_][i]);
  });
  EXPECT_EQ(err, "") << "pp=" << pp << " v=" << v << " m=" << m;
}

// How many micro-batches' activations each chunk keeps: a known answer for 1F1B (rank r of pp keeps
// min(pp - r, m)), and simulate()'s per-rank count, which for v == 1 is the one chunk's and with interleaving is
// bounded by the chunks' peaks (at most their sum, at least the largest).
TEST(Pipeline, PeakInFlightPerChunkMatchesTheSimulator) {
  EXPECT_EQ(peak_in_flight_per_chunk(make_1f1b(2, 4), 0), std::vector<int>{2});
  EXPECT_EQ(peak_in_flight_per_chunk(make_1f1b(2, 4), 1), std::vector<int>{1});
  EXPECT_EQ(peak_in_flight_per_chunk(make_1f1b(4, 2), 0), std::vector<int>{2});  // only 2 micro-batches exist
  for (auto [pp, v, m] : {std::tuple{2, 1, 4}, {3, 1, 5}, {4, 1, 8}, {2, 2, 4}, {3, 2, 6}, {2, 3, 8}}) {
    Schedule s = make_interleaved_1f1b(pp, v, m);
    SimResult sim = simulate(s, 1.0, 2.0, 0.1);
    for (int r = 0; r < pp; ++r) {
      std::vector<int> peak = peak_in_flight_per_chunk(s, r);
      ASSERT_EQ(static_cast<int>(peak.size()), v);
      int sum = 0, top = 0;
      for (int p : peak) sum += p, top = std::max(top, p);
      if (v == 1) {
        EXPECT_EQ(peak[0], std::min(pp - r, m)) << "pp " << pp << " rank " << r;
        EXPECT_EQ(peak[0], sim.peak_in_flight[r]);
      }
      EXPECT_GE(sum, sim.peak_in_flight[r]) << "pp " << pp << " v " << v << " m " << m << " rank " << r;
      EXPECT_LE(top, sim.peak_in_flight[r]) << "pp " << pp << " v " << v << " m " << m << " rank " << r;
    }
  }
  EXPECT_THROW(peak_in_flight_per_chunk(make_1f1b(2, 4), 2), Error);
}

// NCCL has no tags: on the GPU backend the sends from stage a to stage b and the receives b posts from a match in
// the order each side issues them (comm/cuda/nccl_group.h). So for every directed pair of neighbours, the tags of
// a's sends in issue order must equal the tags of b's receives in issue order, under every schedule and both p2p
// modes. Each rank's run_pipeline is driven alone over a group that records the point-to-point calls (every
// transfer completes at once; the chunks compute nothing), and the sequences of the ranks are compared.
class RecordingGroup final : public ProcessGroup {
 public:
  struct Done final : Work {
    void wait() override {}
    bool done() override { return true; }
    double exec_seconds() const override { return 0; }
  };
  RecordingGroup(int rank, int size) : rank_(rank), size_(size), name_("pp-recording") {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  int global_rank(int r) const override { return r; }
  WorkPtr send(Tensor, int dst, int tag) override {
    sends[dst].push_back(tag);
    return std::make_shared<Done>();
  }
  WorkPtr recv(Tensor, int src, int tag) override {
    recvs[src].push_back(tag);
    return std::make_shared<Done>();
  }
  WorkPtr allreduce(Tensor, ReduceOp) override { fail("the pipeline runs no collectives"); }
  WorkPtr reduce_scatter(Tensor, Tensor, ReduceOp) override { fail("the pipeline runs no collectives"); }
  WorkPtr all_gather(Tensor, Tensor) override { fail("the pipeline runs no collectives"); }
  WorkPtr broadcast(Tensor, int) override { fail("the pipeline runs no collectives"); }
  WorkPtr all_to_all_v(Tensor, Tensor, const std::vector<int64_t>&, const std::vector<int64_t>&) override {
    fail("the pipeline runs no collectives");
  }
  WorkPtr barrier() override { fail("the pipeline runs no collectives"); }
  std::map<int, std::vector<int>> sends, recvs;  // by peer: tags in issue order

 private:
  int rank_, size_;
  std::string name_;
};

class IdleChunk final : public PipelineChunk {
 public:
  Tensor input(int) override { return f32_view(buf_, {4}); }
  Tensor output(int) override { return f32_view(buf_, {4}); }
  Tensor grad_output(int) override { return f32_view(buf_, {4}); }
  Tensor grad_input(int) override { return f32_view(buf_, {4}); }
  void forward(int) override {}
  void backward(int) override {}

 private:
  float buf_[4] = {};
};

TEST(Pipeline, EachDirectedPairIssuesSendsAndReceivesInTheSameOrder) {
  for (auto [pp, v, m] :
       {std::tuple{2, 1, 4}, {3, 1, 5}, {4, 1, 8}, {4, 1, 2}, {2, 2, 4}, {3, 2, 6}, {2, 3, 8}, {4, 2, 8}, {4, 4, 16}}) {
    const Schedule s = make_interleaved_1f1b(pp, v, m);
    for (bool overlap : {true, false}) {
      std::vector<std::unique_ptr<RecordingGroup>> groups;
      for (int r = 0; r < pp; ++r) {
        groups.push_back(std::make_unique<RecordingGroup>(r, pp));
        std::vector<IdleChunk> chunks(v);
        std::vector<PipelineChunk*> cs;
        for (auto& c : chunks) cs.push_back(&c);
        run_pipeline(s, r, cs, *groups.back(), overlap);
      }
      int transfers = 0;
      for (int a = 0; a < pp; ++a)
        for (int b = 0; b < pp; ++b) {
          const std::vector<int>& sent = groups[a]->sends[b];
          const std::vector<int>& received = groups[b]->recvs[a];
          EXPECT_EQ(sent, received) << "pp " << pp << " v " << v << " m " << m << " overlap " << overlap << ": rank "
                                    << a << " -> rank " << b;
          if (!sent.empty()) {
            EXPECT_TRUE(b == (a + 1) % pp || a == (b + 1) % pp) << "not ring neighbours";
          }
          transfers += static_cast<int>(sent.size());
        }
      // Every boundary between consecutive virtual stages carries one activation and one gradient per micro-batch.
      EXPECT_EQ(transfers, 2 * (pp * v - 1) * m) << "pp " << pp << " v " << v << " m " << m;
    }
  }
}

TEST(Pipeline, OneFOneBMatchesSingleProcess) {
  run_case(2, 1, 4);
  run_case(3, 1, 5);
}

TEST(Pipeline, InterleavedMatchesSingleProcess) {
  run_case(2, 2, 4);
  run_case(3, 2, 6);
}

}  // namespace
