// The staged device plane (comm/staged_group.h) with the CPU standing in for the device: a "device" whose memory is
// its own (host vectors the group may only reach through the device's copies) and whose compute stream is a thread
// running queued work in order, slowly, so an op issued right after compute must wait for it. Each child process is a
// rank (tests/support/comm_fork_util.h); the oracle is a naive reduction of every rank's inputs, computed in the test.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "support/comm_fork_util.h"
#include "support/files.h"
#include "megatrain/comm/process_group.h"
#include "megatrain/comm/staged_group.h"
#include "megatrain/comm/store.h"
#include "megatrain/core/error.h"

using namespace mt;
using comm_test::run_procs;
using mt::test::ScratchDir;

namespace {

// A compute stream on the CPU: a thread that runs queued work in issue order. A mark is a promise the stream keeps
// when it reaches it; the copies check that no device tensor is touched while the stream is still ahead of a mark
// they were told to wait for (they cannot know: the group must have waited).
class CpuStream : public StagingDevice {
 public:
  CpuStream() : thread_([this] { loop(); }) {}
  ~CpuStream() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // Compute: runs on the stream after everything issued before.
  void issue(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(f));
    }
    cv_.notify_all();
  }
  Mark mark() override {
    auto reached = std::make_shared<bool>(false);
    issue([this, reached] {
      std::lock_guard<std::mutex> lock(mu_);
      *reached = true;
      cv_.notify_all();
    });
    return reached;
  }
  void wait(const Mark& m) override {
    auto reached = std::static_pointer_cast<bool>(m);
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return *reached; });
  }
  void to_host(void* host, const Tensor& src) override {
    MT_CHECK(src.device == Device::CUDA, "to_host of a tensor not on the device");
    std::memcpy(host, src.ptr, src.nbytes());
    ++copies_;
  }
  void to_device(const Tensor& dst, const void* host) override {
    MT_CHECK(dst.device == Device::CUDA, "to_device of a tensor not on the device");
    std::memcpy(dst.ptr, host, dst.nbytes());
    ++copies_;
  }
  int copies() const { return copies_; }

 private:
  void loop() {
    for (;;) {
      std::function<void()> f;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        f = std::move(queue_.front());
        queue_.pop_front();
      }
      f();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::atomic<int> copies_{0};
  std::thread thread_;
};

// A device tensor: F32 memory tagged as the device's, which the group must copy through the stand-in.
Tensor device_f32(std::vector<float>& v) {
  return Tensor(v.data(), {static_cast<int64_t>(v.size())}, DType::F32, Device::CUDA);
}

float val(int rank, size_t j, int salt) {  // halves: sums over a few ranks are exact in fp32 in any order
  return static_cast<float>(static_cast<int>((rank * 7919u + j * 104729u + salt * 31u) % 61u) - 30) * 0.5f;
}

struct Rank {
  std::unique_ptr<Store> store;
  std::shared_ptr<CpuStream> stream = std::make_shared<CpuStream>();
  std::unique_ptr<ProcessGroup> group;
  Rank(const std::string& dir, int n, int i) : store(make_file_store(dir)) {
    std::vector<int> ranks;
    for (int r = 0; r < n; ++r) ranks.push_back(r);
    group = make_staged_group(make_gloo_group(*store, "staged", ranks, i), stream);
  }
};

void expect_values(const std::vector<float>& got, const std::function<float(size_t)>& want, const std::string& what) {
  for (size_t j = 0; j < got.size(); ++j)
    MT_CHECK(got[j] == want(j), "{}: element {} is {}, expected {}", what, j, got[j], want(j));
}

// Compute that fills the inputs runs late on the stream (it sleeps first): an op that read the device tensor at
// issue, instead of after compute passed its mark, would send the zeros that were there.
TEST(StagedGroup, EachCollectiveSeesTheComputeIssuedBeforeItAndMatchesANaiveReduction) {
  ScratchDir dir;
  const std::string path = dir.path;
  const int n = 3;
  EXPECT_EQ(run_procs(n,
                      [&](int i) {
                        Rank r(path, n, i);
                        const size_t len = 1000;
                        std::vector<float> sum(len), gathered(n * len), mine(len), scattered(len), bcast(len),
                            in(n * len);
                        r.stream->issue([&] {
                          std::this_thread::sleep_for(std::chrono::milliseconds(200));
                          for (size_t j = 0; j < len; ++j)
                            sum[j] = val(i, j, 1), mine[j] = val(i, j, 2), bcast[j] = val(i, j, 3);
                          for (size_t j = 0; j < n * len; ++j) in[j] = val(i, j, 4);
                        });
                        auto a = r.group->allreduce(device_f32(sum));
                        auto g = r.group->all_gather(device_f32(gathered), device_f32(mine));
                        auto s = r.group->reduce_scatter(device_f32(scattered), device_f32(in));
                        auto b = r.group->broadcast(device_f32(bcast), 1);
                        b->wait();  // collectives finish in issue order: the earlier ones are done too
                        MT_CHECK(a->done() && g->done() && s->done(),
                                 "an earlier collective is not done after a later one");
                        for (auto& w : {a, g, s}) w->wait();
                        expect_values(
                            sum, [&](size_t j) { return val(0, j, 1) + val(1, j, 1) + val(2, j, 1); }, "allreduce");
                        expect_values(
                            gathered, [&](size_t j) { return val(int(j / len), j % len, 2); }, "all_gather");
                        expect_values(
                            scattered,
                            [&](size_t j) {
                              const size_t k = size_t(i) * len + j;
                              return val(0, k, 4) + val(1, k, 4) + val(2, k, 4);
                            },
                            "reduce_scatter");
                        expect_values(
                            bcast, [&](size_t j) { return val(1, j, 3); }, "broadcast");
                        MT_CHECK(r.stream->copies() > 0, "nothing went through the device's copies");
                      }),
            "");
}

// all_to_all_v through the stand-in device: rank s sends rank d (s + d + 1) elements 100 s + 10 d + j, filled by
// compute that runs late on the stream; every rank must receive each peer's block in rank order.
TEST(StagedGroup, AllToAllVDeliversEachBlockAfterTheComputeBeforeIt) {
  ScratchDir dir;
  const std::string path = dir.path;
  const int n = 3;
  EXPECT_EQ(run_procs(n,
                      [&](int i) {
                        Rank r(path, n, i);
                        std::vector<int64_t> send(n), recv(n);
                        for (int p = 0; p < n; ++p) send[p] = i + p + 1, recv[p] = p + i + 1;
                        std::vector<float> in(static_cast<size_t>(n * i + n * (n + 1) / 2)), out(in.size(), -1.0f),
                            want;
                        r.stream->issue([&] {
                          std::this_thread::sleep_for(std::chrono::milliseconds(100));
                          size_t at = 0;
                          for (int p = 0; p < n; ++p)
                            for (int64_t j = 0; j < send[p]; ++j) in[at++] = float(100 * i + 10 * p + j);
                        });
                        for (int p = 0; p < n; ++p)
                          for (int64_t j = 0; j < recv[p]; ++j) want.push_back(float(100 * p + 10 * i + j));
                        r.group->all_to_all_v(device_f32(out), device_f32(in), recv, send)->wait();
                        expect_values(
                            out, [&](size_t j) { return want[j]; }, "all_to_all_v");
                      }),
            "");
}

// A pipeline's pattern: every rank posts its receives first, then its sends; a receive posted early must not hold
// up a send, and neither waits behind a collective queued before it (here one that cannot finish before the sends
// did: rank 1 waits for its receive before it joins the allreduce).
TEST(StagedGroup, ReceivesPostedEarlyHoldUpNeitherSendsNorAreQueuedBehindCollectives) {
  ScratchDir dir;
  const std::string path = dir.path;
  const int n = 2;
  EXPECT_EQ(run_procs(n,
                      [&](int i) {
                        Rank r(path, n, i);
                        const int peer = 1 - i;
                        const size_t len = 5000;
                        std::vector<float> got(len, -1.0f), out(len), one(1, 1.0f);
                        for (size_t j = 0; j < len; ++j) out[j] = val(i, j, 7);
                        auto rv = r.group->recv(device_f32(got), peer, 0);
                        if (i == 1) rv->wait();
                        auto a = r.group->allreduce(device_f32(one));
                        auto sd = r.group->send(device_f32(out), peer, 0);
                        for (auto& w : {rv, sd, a}) w->wait();
                        expect_values(
                            got, [&](size_t j) { return val(peer, j, 7); }, "received");
                        MT_CHECK(one[0] == 2.0f, "allreduce gave {}", one[0]);
                      }),
            "");
}

// The sender sends at once; the receiver's compute issued before its receive still reads the buffer's old contents
// (late: it sleeps first). The data arrives long before that compute runs, and must land only after it.
TEST(StagedGroup, AReceiveLandsOnlyAfterTheComputeIssuedBeforeIt) {
  ScratchDir dir;
  const std::string path = dir.path;
  EXPECT_EQ(run_procs(2,
                      [&](int i) {
                        Rank r(path, 2, i);
                        const size_t len = 5000;
                        std::vector<float> buf(len, -1.0f), seen;
                        if (i == 1) {
                          for (size_t j = 0; j < len; ++j) buf[j] = val(1, j, 8);
                          r.group->send(device_f32(buf), 0, 0)->wait();
                          return;
                        }
                        r.stream->issue([&] {
                          std::this_thread::sleep_for(std::chrono::milliseconds(300));
                          seen = buf;
                        });
                        r.group->recv(device_f32(buf), 1, 0)->wait();
                        MT_CHECK(seen.size() == len && seen[0] == -1.0f && seen[len - 1] == -1.0f,
                                 "the receive landed before the compute issued before it ran");
                        expect_values(
                            buf, [&](size_t j) { return val(1, j, 8); }, "received");
                      }),
            "");
}

// A failure of the host group (here a peer that never comes) reaches wait() as the host group's error.
TEST(StagedGroup, AHostGroupsFailureIsWaitsError) {
  ScratchDir dir;
  const std::string path = dir.path;
  EXPECT_EQ(run_procs(2,
                      [&](int i) {
                        auto store = make_file_store(path);
                        GroupOptions o;
                        o.timeout = Millis(2000);
                        auto group = make_staged_group(make_gloo_group(*store, "staged", {0, 1}, i, o),
                                                       std::make_shared<CpuStream>());
                        // Both ends are connected before one leaves (a peer that left during the group's own
                        // set-up would fail its creation, outside what this test is about).
                        group->barrier()->wait();
                        if (i == 1) return;  // leaves: rank 0's receive cannot complete
                        std::vector<float> v(10);
                        auto w = group->recv(device_f32(v), 1, 3);
                        try {
                          w->wait();
                        } catch (const Error& e) {
                          MT_CHECK(std::string(e.what()).find("staged") != std::string::npos,
                                   "the error does not name the group: {}", e.what());
                          return;
                        }
                        throw std::runtime_error("a receive from a peer that left succeeded");
                      }),
            "");
}

}  // namespace
