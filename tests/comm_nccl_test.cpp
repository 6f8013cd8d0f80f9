// NCCL process groups on real GPUs (label `gpu`; skipped without a device). Every test body runs in forked
// children and the test process itself never touches CUDA: a process that initialised CUDA cannot hand it to a
// forked child, so even the device count is taken in a child.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "support/comm_fork_util.h"
#include "support/files.h"
#include "support/test_util.h"
#include "megatrain/core/bf16.h"
#include "megatrain/comm/cuda/nccl_group.h"
#include "megatrain/comm/store.h"

using namespace mt;
using comm_test::run_procs;
using mt::test::ScratchDir;

namespace {

int gpu_count() {
  static int n = -1;
  if (n >= 0) return n;
  pid_t pid = ::fork();
  if (pid == 0) {
    int c = 0;
    if (cudaGetDeviceCount(&c) != cudaSuccess) c = 0;
    ::_exit(std::min(c, 100));
  }
  int status = 0;
  n = pid > 0 && ::waitpid(pid, &status, 0) == pid && WIFEXITED(status) ? WEXITSTATUS(status) : 0;
  return n;
}

#define REQUIRE_GPUS(k)                                                          \
  do {                                                                           \
    if (gpu_count() < (k)) GTEST_SKIP() << "needs " << (k) << " CUDA device(s)"; \
  } while (0)

void cu(cudaError_t e, const char* what) { MT_CHECK(e == cudaSuccess, "{} failed: {}", what, cudaGetErrorString(e)); }

// Device memory plus the compute stream the test issues on; copies go through the stream, so a read-back after
// Work::wait() also checks that wait() ordered the stream after the op.
struct Dev {
  cudaStream_t stream = nullptr;
  std::vector<void*> bufs;
  explicit Dev(int device) {
    cu(cudaSetDevice(device), "cudaSetDevice");
    cu(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~Dev() {
    for (void* p : bufs) (void)cudaFree(p);
    (void)cudaStreamDestroy(stream);
  }
  template <typename T>
  Tensor upload(const std::vector<T>& host, DType dt) {
    void* p = nullptr;
    cu(cudaMalloc(&p, host.size() * sizeof(T) + 1), "cudaMalloc");
    bufs.push_back(p);
    cu(cudaMemcpyAsync(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream), "upload");
    return Tensor(p, {static_cast<int64_t>(host.size())}, dt, Device::CUDA);
  }
  template <typename T>
  std::vector<T> download(const Tensor& t) {
    std::vector<T> host(static_cast<size_t>(t.numel()));
    cu(cudaMemcpyAsync(host.data(), t.ptr, t.nbytes(), cudaMemcpyDeviceToHost, stream), "download");
    cu(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return host;
  }
};

// Small integers: sums over two ranks are exact in fp32 and bf16 whatever the order.
float val(int rank, size_t j) { return static_cast<float>(static_cast<int>((rank * 7 + j * 13) % 17) - 8); }

std::vector<float> input(int rank, size_t n) {
  std::vector<float> v(n);
  for (size_t j = 0; j < n; ++j) v[j] = val(rank, j);
  return v;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = float_to_bf16(v[i]);
  return out;
}

void expect_eq(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  MT_CHECK(got.size() == want.size(), "{}: size {} != {}", what, got.size(), want.size());
  for (size_t j = 0; j < got.size(); ++j)
    MT_CHECK(got[j] == want[j], "{}: element {} is {}, expected {}", what, j, got[j], want[j]);
}

GroupOptions quick(int ms = 30000) {
  GroupOptions o;
  o.timeout = Millis(ms);
  return o;
}

// ------------------------------------------------------------------------------------------------- one process

TEST(NcclGroup, SingleRankCollectivesOnDevice) {
  REQUIRE_GPUS(1);
  ScratchDir dir;
  std::string err = run_procs(
      {0},
      [&](int) {
        Dev dev(0);
        auto store = make_file_store(dir.path);
        auto g = make_nccl_group(*store, "one", {5}, 5, dev.stream, quick());
        MT_CHECK(g->rank() == 0 && g->size() == 1 && g->global_rank(0) == 5, "rank/size/global_rank wrong");
        // Large enough (64 MB) that a comm stream not waiting for the upload would read stale memory.
        const size_t n = size_t(1) << 24;
        auto x = input(1, n);
        Tensor t = dev.upload(x, DType::F32);
        g->allreduce(t, ReduceOp::Sum)->wait();
        expect_eq(dev.download<float>(t), x, "allreduce sum");
        g->allreduce(t, ReduceOp::Max)->wait();
        expect_eq(dev.download<float>(t), x, "allreduce max");

        Tensor out = dev.upload(std::vector<float>(n, 0.f), DType::F32);
        Tensor in = dev.upload(x, DType::F32);
        auto w = g->reduce_scatter(out, in, ReduceOp::Sum);
        w->wait();
        expect_eq(dev.download<float>(out), x, "reduce_scatter (out of place, one rank = copy)");
        MT_CHECK(w->done(), "reduce_scatter: done() false after wait() and a stream synchronize");
        MT_CHECK(w->exec_seconds() >= 0, "reduce_scatter: negative exec_seconds");

        Tensor gathered = dev.upload(std::vector<float>(n, 0.f), DType::F32);
        g->all_gather(gathered, in)->wait();
        expect_eq(dev.download<float>(gathered), x, "all_gather (one rank = copy)");

        auto xb = to_bf16(input(2, 1000));
        Tensor tb = dev.upload(xb, DType::BF16);
        g->allreduce(tb, ReduceOp::Sum)->wait();
        MT_CHECK(dev.download<uint16_t>(tb) == xb, "bf16 allreduce on one rank changed the data");

        std::vector<int32_t> ints = {1, -2, 3, 1 << 30};
        Tensor ti = dev.upload(ints, DType::I32);
        g->broadcast(ti, 0)->wait();
        MT_CHECK(dev.download<int32_t>(ti) == ints, "i32 broadcast on one rank changed the data");

        g->barrier()->wait();
        g->allreduce(Tensor(nullptr, {0}, DType::F32, Device::CUDA))->wait();  // empty: nothing to do
        cu(cudaStreamSynchronize(dev.stream), "cudaStreamSynchronize");
      },
      120);
  EXPECT_EQ(err, "");
}

TEST(NcclGroup, RejectsWhatItCannotDo) {
  REQUIRE_GPUS(1);
  ScratchDir dir;
  std::string err = run_procs(
      {0},
      [&](int) {
        Dev dev(0);
        auto store = make_file_store(dir.path);
        auto g = make_nccl_group(*store, "one", {0}, 0, dev.stream, quick());
        float host[4] = {};
        auto e = test::error_of([&] { g->allreduce(f32_view(host, {4})); });
        MT_CHECK(e.find("device tensor") != std::string::npos, "host tensor: unexpected message '{}'", e);
        Tensor t = dev.upload(std::vector<float>(4, 1.f), DType::F32);
        e = test::error_of([&] { g->send(t, 0, 0); });
        MT_CHECK(e.find("itself") != std::string::npos, "send to self: unexpected message '{}'", e);
        Tensor h(t.ptr, {8}, DType::F16, Device::CUDA);
        e = test::error_of([&] { g->allreduce(h); });
        MT_CHECK(e.find("F16") != std::string::npos, "F16: unexpected message '{}'", e);
        Tensor out = dev.upload(std::vector<float>(3, 0.f), DType::F32);
        e = test::error_of([&] { g->all_gather(out, t); });
        MT_CHECK(e.find("expected size 1") != std::string::npos, "all_gather size: unexpected message '{}'", e);
        // The group still works after rejected calls (they failed before reaching NCCL).
        g->allreduce(t)->wait();
        cu(cudaStreamSynchronize(dev.stream), "cudaStreamSynchronize");
      },
      120);
  EXPECT_EQ(err, "");
}

TEST(NcclGroup, MissingRanksAreNamedAfterTheTimeout) {
  REQUIRE_GPUS(1);
  ScratchDir dir;
  std::string err = run_procs(
      {0},
      [&](int) {
        Dev dev(0);
        auto store = make_file_store(dir.path);
        // Rank 3 waits for rank 1's id, which never comes.
        auto e = test::error_of([&] { make_nccl_group(*store, "a", {1, 3}, 3, dev.stream, quick(1500)); });
        MT_CHECK(e.find("rank 1 never published") != std::string::npos, "non-root: unexpected message '{}'", e);
        // Rank 1 (the root) publishes its id, then its initialisation never completes: rank 3 is named.
        e = test::error_of([&] { make_nccl_group(*store, "b", {1, 3}, 1, dev.stream, quick(3000)); });
        MT_CHECK(e.find("ranks 3 never arrived") != std::string::npos, "root: unexpected message '{}'", e);
      },
      120);
  EXPECT_EQ(err, "");
}

// ------------------------------------------------------------------------------------------------- two GPUs

// Group ranks 0, 1 are global ranks 1, 3 (a mix-up of group and global ranks shows); group rank i uses GPU i.
TEST(NcclGroup, TwoRanksCollectives) {
  REQUIRE_GPUS(2);
  ScratchDir dir;
  std::string err = run_procs(
      {0, 1},
      [&](int r) {
        Dev dev(r);
        auto store = make_file_store(dir.path);
        auto g = make_nccl_group(*store, "pair", {1, 3}, 2 * r + 1, dev.stream, quick());
        MT_CHECK(g->rank() == r && g->size() == 2, "rank {} / size {}", g->rank(), g->size());
        const size_t n = 3 * 1000 * 1000 + 7;
        std::vector<float> sum(n);
        for (size_t j = 0; j < n; ++j) sum[j] = val(0, j) + val(1, j);

        Tensor t = dev.upload(input(r, n), DType::F32);
        g->allreduce(t, ReduceOp::Sum)->wait();
        expect_eq(dev.download<float>(t), sum, "f32 allreduce sum");

        Tensor tb = dev.upload(to_bf16(input(r, n)), DType::BF16);
        g->allreduce(tb, ReduceOp::Sum)->wait();
        auto gb = dev.download<uint16_t>(tb);
        std::vector<float> gbf(n);
        for (size_t j = 0; j < n; ++j) gbf[j] = bf16_to_float(gb[j]);
        expect_eq(gbf, sum, "bf16 allreduce sum");

        const size_t c = 1000;  // per-rank chunk
        Tensor in = dev.upload(input(r, 2 * c), DType::F32);
        Tensor out = dev.upload(std::vector<float>(c, 0.f), DType::F32);
        g->reduce_scatter(out, in, ReduceOp::Sum)->wait();
        expect_eq(dev.download<float>(out), std::vector<float>(sum.begin() + r * c, sum.begin() + (r + 1) * c),
                  "reduce_scatter");

        Tensor mine = dev.upload(input(r, c), DType::F32);
        Tensor all = dev.upload(std::vector<float>(2 * c, 0.f), DType::F32);
        g->all_gather(all, mine)->wait();
        auto want = input(0, c);
        auto second = input(1, c);
        want.insert(want.end(), second.begin(), second.end());
        expect_eq(dev.download<float>(all), want, "all_gather");

        Tensor b = dev.upload(input(r, c), DType::F32);
        g->broadcast(b, 1)->wait();
        expect_eq(dev.download<float>(b), input(1, c), "broadcast from group rank 1");
        g->barrier()->wait();
        cu(cudaStreamSynchronize(dev.stream), "cudaStreamSynchronize");
      },
      180);
  EXPECT_EQ(err, "");
}

// all_to_all_v on the device against a known answer: rank s sends rank d (2 s + d + 1) * 1000 elements
// 100 s + 10 d + (j % 7) (my own block included, a device copy); each rank receives the blocks in rank order.
TEST(NcclGroup, TwoRanksAllToAllV) {
  REQUIRE_GPUS(2);
  ScratchDir dir;
  std::string err = run_procs(
      {0, 1},
      [&](int r) {
        Dev dev(r);
        auto store = make_file_store(dir.path);
        auto g = make_nccl_group(*store, "a2a", {0, 1}, r, dev.stream, quick());
        auto count = [](int s, int d) { return int64_t{2 * s + d + 1} * 1000; };
        std::vector<int64_t> send(2), recv(2);
        std::vector<float> in, want;
        for (int p = 0; p < 2; ++p) {
          send[p] = count(r, p), recv[p] = count(p, r);
          for (int64_t j = 0; j < send[p]; ++j) in.push_back(float(100 * r + 10 * p + j % 7));
          for (int64_t j = 0; j < recv[p]; ++j) want.push_back(float(100 * p + 10 * r + j % 7));
        }
        Tensor tin = dev.upload(in, DType::F32);
        Tensor tout = dev.upload(std::vector<float>(want.size(), -1.f), DType::F32);
        g->all_to_all_v(tout, tin, recv, send)->wait();
        expect_eq(dev.download<float>(tout), want, "all_to_all_v");
        cu(cudaStreamSynchronize(dev.stream), "cudaStreamSynchronize");
      },
      180);
  EXPECT_EQ(err, "");
}

// Both ranks post their receives before their sends, three messages each way: on one in-order communicator the
// early receives would block the sends for ever; the per-direction channels must not. Messages arrive in order.
TEST(NcclGroup, TwoRanksSendRecvBothWays) {
  REQUIRE_GPUS(2);
  ScratchDir dir;
  std::string err = run_procs(
      {0, 1},
      [&](int r) {
        Dev dev(r);
        auto store = make_file_store(dir.path);
        NcclOptions nopt;
        nopt.p2p = true;
        auto g = make_nccl_group(*store, "pp", {1, 3}, 2 * r + 1, dev.stream, quick(), nopt);
        const int peer = 1 - r;
        const size_t n = 1 << 20;
        std::vector<Tensor> rx, tx;
        std::vector<WorkPtr> works;
        for (int m = 0; m < 3; ++m) {
          rx.push_back(dev.upload(std::vector<float>(n, 0.f), DType::F32));
          works.push_back(g->recv(rx.back(), peer, m));
        }
        for (int m = 0; m < 3; ++m) {
          tx.push_back(dev.upload(input(10 * r + m, n), DType::F32));
          works.push_back(g->send(tx.back(), peer, m));
        }
        for (auto& w : works) w->wait();
        for (int m = 0; m < 3; ++m)
          expect_eq(dev.download<float>(rx[m]), input(10 * peer + m, n),
                    fmt::format("message {} from rank {}", m, peer));
        for (auto& w : works) MT_CHECK(w->done(), "a p2p op is not done after wait() and a stream synchronize");
      },
      180);
  EXPECT_EQ(err, "");
}

}  // namespace
