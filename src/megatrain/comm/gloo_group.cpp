// Process groups over Gloo's TCP transport.
//  * Collectives run one at a time, in issue order, on the group's worker thread: every rank issues a group's
//    collectives in the same order, so running them in that order on a single context cannot deadlock, and the
//    caller's thread is free to compute meanwhile.
//  * send/recv go straight to Gloo's unbound buffers from the caller's thread. Gloo's TCP transport moves the data
//    only once both sides have posted (a rendezvous), so posting early and waiting late is what lets pipeline
//    stages exchange activations in both directions at once. A small thread per transfer waits for completion so
//    that done() and exec_seconds() are meaningful without the caller having to wait.
//  * reduce_scatter is our own ring over unbound buffers: n-1 steps, each rank sends and receives one chunk per
//    step, so every rank moves (n-1)/n of the data, the bandwidth lower bound. (This Gloo has no ReduceScatter
//    with the options API; its halving-doubling class re-registers n^2 pair buffers per call and needs
//    per-rank count vectors, and allreduce + copy would move twice the data.)
//  * Gloo throws on its own network thread when peers disagree (a collective of another size on another rank):
//    nothing can catch that, and the process would abort. A terminate handler turns exactly those into an error line
//    naming the group and op in flight and exit code 1 (22, peer lost, when the connection was reset or closed: a
//    peer died under the network thread); see GlooFailureReport.
//  * The addresses Gloo publishes in the store are raw copies of a sockaddr_storage that Gloo never clears: past the
//    address they hold whatever the stack held (pointers). They are zeroed there before they leave the process.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/types.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstddef>
#include <cstring>
#include <exception>
#include <set>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <thread>

#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"
#include "megatrain/core/stop_request.h"
#include "megatrain/comm/flight_recorder.h"
#include "megatrain/comm/process_group.h"

namespace mt {
namespace {

// What a failed Gloo op means for whoever supervises the rank (core/error.h): Gloo's TCP pairs report a peer that
// went away as a closed or reset connection and a silent one as a timeout; anything else is left unclassified.
ErrorKind gloo_failure_kind(const std::exception& e) {
  const std::string w = e.what();
  for (const char* s : {"Timed out", "timed out", "Timeout", "timeout"})
    if (w.find(s) != std::string::npos) return ErrorKind::CommTimeout;
  for (const char* s : {"Connection closed", "closed by peer", "Connection reset", "Broken pipe", "Connection refused",
                        "ECONNRESET", "EPIPE"})
    if (w.find(s) != std::string::npos) return ErrorKind::PeerLost;
  return ErrorKind::Internal;
}

// Gloo slot prefixes 0x01..0x08 belong to its collectives; ours stay clear of them.
constexpr uint8_t kP2PSlotPrefix = 0x40;
constexpr uint8_t kReduceScatterSlotPrefix = 0x41;

double secs(Millis m) { return static_cast<double>(m.count()) / 1000.0; }

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

void reduce_into(ReduceOp op, float* out, const float* a, const float* b, size_t n) {
  switch (op) {
    case ReduceOp::Sum:
      for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
      break;
    case ReduceOp::Max:
      for (size_t i = 0; i < n; ++i) out[i] = std::max(a[i], b[i]);
      break;
    case ReduceOp::Min:
      for (size_t i = 0; i < n; ++i) out[i] = std::min(a[i], b[i]);
      break;
  }
}

// The ops the groups of this process are running, for the report of a failure on Gloo's network thread, which
// cannot say which group it belongs to.
class GlooFailureReport {
 public:
  static GlooFailureReport& get() {
    static GlooFailureReport* r = new GlooFailureReport;  // never destroyed: the handler may run during exit
    return *r;
  }
  void running(const void* group, const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    if (what.empty())
      ops_.erase(group);
    else
      ops_[group] = what;
  }
  // Installed once, when the first Gloo device opens. Exceptions that are not Gloo's go to the previous handler.
  void install() {
    std::lock_guard<std::mutex> lock(mu_);
    if (installed_) return;
    installed_ = true;
    previous_ = std::set_terminate(&on_terminate);
  }

 private:
  [[noreturn]] static void on_terminate() {
    GlooFailureReport& r = get();
    std::string what;
    ErrorKind kind = ErrorKind::Internal;
    if (std::exception_ptr e = std::current_exception()) {
      try {
        std::rethrow_exception(e);
      } catch (const gloo::Exception& x) {
        what = x.what();
        kind = gloo_failure_kind(x);
      } catch (const gloo::EnforceNotMet& x) {
        what = x.what();
        kind = gloo_failure_kind(x);
      } catch (...) {
      }
    }
    if (what.empty()) {
      if (r.previous_) r.previous_();
      std::abort();
    }
    std::string ops;
    if (r.mu_.try_lock()) {  // the failing thread is Gloo's, which never holds it; try_lock in case it ever does
      for (const auto& [g, op] : r.ops_) ops += (ops.empty() ? "" : "; ") + op;
      r.mu_.unlock();
    }
    std::fflush(stdout);
    // A peer that went away (its connection reset or closed under the network thread) is PeerLost, so a
    // supervisor restarts the job; anything else there is a disagreement between ranks, a bug: Internal.
    if (kind == ErrorKind::PeerLost)
      std::fprintf(stderr, "error: Gloo lost a peer on its network thread while running %s: %s\n",
                   ops.empty() ? "no collective of ours" : ops.c_str(), what.c_str());
    else
      std::fprintf(stderr,
                   "error: Gloo failed on its network thread while running %s: %s (do all ranks issue the same "
                   "collectives with the same sizes? their configs must agree)\n",
                   ops.empty() ? "no collective of ours" : ops.c_str(), what.c_str());
    std::fflush(stderr);
    std::_Exit(kind == ErrorKind::PeerLost ? exit_code(ErrorKind::PeerLost) : 1);
  }

  std::mutex mu_;
  std::map<const void*, std::string> ops_;
  bool installed_ = false;
  std::terminate_handler previous_ = nullptr;
};

// Gloo's TCP transport publishes, per peer, a copy of its address struct: a sockaddr_storage (128 bytes) and a
// sequence number (8 bytes). Only the sockaddr's own bytes (16 for IPv4, 28 for IPv6) mean anything; the rest of the
// storage is uninitialised memory of the publishing process. Zeroes that rest in place. A value of another layout
// (another Gloo) is left as it is; the comm_store test that reads these bytes would then fail and say so.
constexpr size_t kGlooAddressBytes = sizeof(sockaddr_storage) + sizeof(int64_t);
void zero_address_padding(std::vector<char>& data) {
  if (data.empty() || data.size() % kGlooAddressBytes != 0) return;
  for (size_t off = 0; off < data.size(); off += kGlooAddressBytes) {
    sockaddr_storage ss;
    std::memcpy(&ss, data.data() + off, sizeof ss);
    if (ss.ss_family != AF_INET && ss.ss_family != AF_INET6) return;
  }
  for (size_t off = 0; off < data.size(); off += kGlooAddressBytes) {
    sockaddr_storage ss;
    std::memcpy(&ss, data.data() + off, sizeof ss);
    size_t used = ss.ss_family == AF_INET ? offsetof(sockaddr_in, sin_zero) : sizeof(sockaddr_in6);
    std::memset(data.data() + off + used, 0, sizeof ss - used);
  }
}

// Gloo's rendezvous reads and writes addresses through this view of our store, under the group's prefix. Values are
// hex-encoded so any store works, also one whose protocol is not binary-safe.
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(mt::Store& store, std::string prefix, Millis timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& raw) override {
    static const char* hex = "0123456789abcdef";
    std::vector<char> data = raw;
    zero_address_padding(data);
    std::string s;
    s.reserve(data.size() * 2);
    for (char c : data) {
      auto u = static_cast<unsigned char>(c);
      s += hex[u >> 4];
      s += hex[u & 15];
    }
    store_.set(prefix_ + key, s);
  }

  std::vector<char> get(const std::string& key) override {
    auto it = fetched_.find(key);
    std::string s = it != fetched_.end() ? it->second : store_.get(prefix_ + key, timeout_);
    MT_CHECK(s.size() % 2 == 0, "store key '{}{}' holds malformed Gloo address data", prefix_, key);
    auto nib = [&](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      fail("store key '{}{}' holds malformed Gloo address data", prefix_, key);
    };
    std::vector<char> out(s.size() / 2);
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(nib(s[2 * i]) << 4 | nib(s[2 * i + 1]));
    return out;
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  // Gloo waits for a key and then gets it; fetching it here and keeping the value halves the store traffic.
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (const auto& k : keys) {
      auto left = std::chrono::ceil<Millis>(deadline - std::chrono::steady_clock::now());
      fetched_[k] = store_.get(prefix_ + k, std::max(left, Millis(0)));
    }
  }

 private:
  mt::Store& store_;
  std::string prefix_;
  Millis timeout_;
  std::map<std::string, std::string> fetched_;
};

// One TCP device (one event-loop thread) per process and address, shared by all groups. Keyed by pid too: a forked
// child must not reuse its parent's device, whose loop thread did not survive the fork.
std::shared_ptr<gloo::transport::Device> shared_device(const std::string& iface) {
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<gloo::transport::Device>> cache;
  static pid_t owner = 0;
  std::lock_guard<std::mutex> lock(mu);
  if (owner != ::getpid()) {
    cache.clear();
    owner = ::getpid();
  }
  if (auto dev = cache[iface].lock()) return dev;
  GlooFailureReport::get().install();
  gloo::transport::tcp::attr attr;
  attr.hostname = iface;
  std::shared_ptr<gloo::transport::Device> dev;
  try {
    dev = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    fail("cannot open a Gloo TCP device on '{}': {}", iface, e.what());
  }
  cache[iface] = dev;
  return dev;
}

// The Work every op returns: completed once, by whichever thread ran the op. `what` names the op in the error of an
// abandoned wait.
class OpWork : public Work {
 public:
  explicit OpWork(std::string what = "") : what_(std::move(what)) {}
  void finish(double exec, std::exception_ptr err) {
    std::lock_guard<std::mutex> lock(mu_);
    exec_ = exec;
    err_ = std::move(err);
    done_ = true;
    cv_.notify_all();
  }
  // Waits for the op; gives up with a lost-peer error once the supervisor abandons the attempt (stop_request.h).
  // The op itself stays blocked on the group's thread: the process is about to exit.
  void wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return done_; }))
      if (abandon_requested())
        throw Error(fmt::format("{}: abandoned while waiting for it: the supervisor ended the attempt (a peer is gone)",
                                what_.empty() ? std::string("a collective") : what_),
                    ErrorKind::PeerLost);
    if (err_) std::rethrow_exception(err_);
  }
  bool done() override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  double exec_seconds() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return exec_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string what_;
  bool done_ = false;
  double exec_ = 0;
  std::exception_ptr err_;
};

class GlooGroup : public ProcessGroup {
 public:
  GlooGroup(Store& store, const std::string& name, const std::vector<int>& ranks, int my_global_rank,
            const GroupOptions& opt)
      : name_(name), ranks_(ranks), timeout_(opt.timeout) {
    rank_ = static_cast<int>(std::find(ranks_.begin(), ranks_.end(), my_global_rank) - ranks_.begin());
    await_members(store, my_global_rank);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank_, size());
    ctx->setTimeout(timeout_);
    GlooStoreAdapter adapter(store, name_ + "/gloo/", timeout_);
    auto dev = shared_device(opt.iface);
    try {
      ctx->connectFullMesh(adapter, dev);
    } catch (const std::exception& e) {
      fail("group {}: connecting rank {} to its peers failed: {}", name_, my_global_rank, e.what());
    }
    ctx_ = std::move(ctx);
    record_ = flight_recorder().open(name_, ranks_, rank_);
    worker_ = std::thread([this] { run_worker(); });
  }

  ~GlooGroup() override {
    {
      std::lock_guard<std::mutex> lock(qmu_);
      stop_ = true;
    }
    qcv_.notify_all();
    worker_.join();
    std::lock_guard<std::mutex> lock(p2p_mu_);
    for (auto& op : p2p_) {
      if (!op->work->done()) {
        if (op->is_send)
          op->buf->abortWaitSend();
        else
          op->buf->abortWaitRecv();
      }
      op->waiter.join();
    }
    flight_recorder().close(record_);
  }

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(ranks_.size()); }
  const std::string& name() const override { return name_; }
  int global_rank(int r) const override {
    MT_CHECK(r >= 0 && r < size(), "group {}: rank {} out of range [0, {})", name_, r, size());
    return ranks_[r];
  }

  WorkPtr allreduce(Tensor t, ReduceOp op) override {
    check_tensor(t, "allreduce", false);
    auto* p = t.f32();
    size_t n = static_cast<size_t>(t.numel());
    return enqueue("allreduce", fmt::format("allreduce({}, {} floats)", op_name(op), n),
                   [this, p, n, op](uint32_t tag) {
                     if (n == 0 || size() == 1) return;
                     gloo::AllreduceOptions o(ctx_);
                     o.setOutput(p, n);
                     o.setReduceFunction([op](void* out, const void* a, const void* b, size_t k) {
                       reduce_into(op, static_cast<float*>(out), static_cast<const float*>(a),
                                   static_cast<const float*>(b), k);
                     });
                     o.setTag(tag);
                     o.setTimeout(timeout_);
                     gloo::allreduce(o);
                   });
  }

  WorkPtr reduce_scatter(Tensor out, Tensor in, ReduceOp op) override {
    check_tensor(out, "reduce_scatter output", false);
    check_tensor(in, "reduce_scatter input", false);
    MT_CHECK(in.numel() == size() * out.numel(),
             "group {}: reduce_scatter input has {} elements, expected size {} x output {} = {}", name_, in.numel(),
             size(), out.numel(), size() * out.numel());
    auto* po = out.f32();
    const float* pi = in.f32();
    size_t c = static_cast<size_t>(out.numel());
    return enqueue("reduce_scatter", fmt::format("reduce_scatter({}, {} floats per rank)", op_name(op), c),
                   [this, po, pi, c, op](uint32_t tag) { ring_reduce_scatter(po, pi, c, op, tag); });
  }

  WorkPtr all_gather(Tensor out, Tensor in) override {
    check_tensor(out, "all_gather output", true);
    check_tensor(in, "all_gather input", true);
    MT_CHECK(out.dtype == in.dtype, "group {}: all_gather of {} input into {} output", name_, dtype_name(in.dtype),
             dtype_name(out.dtype));
    MT_CHECK(out.numel() == size() * in.numel(),
             "group {}: all_gather output has {} elements, expected size {} x input {} = {}", name_, out.numel(),
             size(), in.numel(), size() * in.numel());
    char* po = static_cast<char*>(out.ptr);
    char* pi = static_cast<char*>(in.ptr);
    size_t bytes = in.nbytes();
    return enqueue("all_gather", fmt::format("all_gather({} bytes per rank)", bytes),
                   [this, po, pi, bytes](uint32_t tag) {
                     char* mine = po + static_cast<size_t>(rank_) * bytes;
                     if (bytes == 0) return;
                     if (size() == 1) {
                       if (mine != pi) std::memcpy(mine, pi, bytes);
                       return;
                     }
                     // Bytes, not typed elements: all_gather only moves data. An input that already is my chunk of the output
                     // (the in-place form) is not given to Gloo, which would memcpy it onto itself.
                     gloo::AllgatherOptions o(ctx_);
                     if (mine != pi) o.setInput(pi, bytes);
                     o.setOutput(po, bytes * static_cast<size_t>(size()));
                     o.setTag(tag);
                     o.setTimeout(timeout_);
                     gloo::allgather(o);
                   });
  }

  WorkPtr broadcast(Tensor t, int root) override {
    check_tensor(t, "broadcast", true);
    MT_CHECK(root >= 0 && root < size(), "group {}: broadcast root {} out of range [0, {})", name_, root, size());
    char* p = static_cast<char*>(t.ptr);
    size_t bytes = t.nbytes();
    return enqueue("broadcast", fmt::format("broadcast(root {}, {} bytes)", root, bytes),
                   [this, p, bytes, root](uint32_t tag) {
                     if (bytes == 0 || size() == 1) return;
                     gloo::BroadcastOptions o(ctx_);
                     o.setOutput(p, bytes);
                     o.setRoot(root);
                     o.setTag(tag);
                     o.setTimeout(timeout_);
                     gloo::broadcast(o);
                   });
  }

  WorkPtr all_to_all_v(Tensor out, Tensor in, const std::vector<int64_t>& recv_counts,
                       const std::vector<int64_t>& send_counts) override {
    check_tensor(out, "all_to_all_v output", true);
    check_tensor(in, "all_to_all_v input", true);
    check_all_to_all_v(*this, out, in, recv_counts, send_counts);
    // Counted in bytes: Gloo's alltoallv only moves data.
    const auto elem = static_cast<int64_t>(dtype_size(in.dtype));
    std::vector<int64_t> rb(recv_counts), sb(send_counts);
    for (int64_t& c : rb) c *= elem;
    for (int64_t& c : sb) c *= elem;
    char* po = static_cast<char*>(out.ptr);
    char* pi = static_cast<char*>(in.ptr);
    return enqueue("all_to_all_v", fmt::format("all_to_all_v({} bytes out, {} in)", in.nbytes(), out.nbytes()),
                   [this, po, pi, rb = std::move(rb), sb = std::move(sb)](uint32_t tag) {
                     if (size() == 1) {
                       if (sb[0] > 0) std::memcpy(po, pi, static_cast<size_t>(sb[0]));
                       return;
                     }
                     // Gloo registers a buffer even for an empty side: give it a valid address then.
                     static char empty[4];
                     gloo::AlltoallvOptions o(ctx_);
                     o.setInput<char>(pi ? pi : empty, sb);
                     o.setOutput<char>(po ? po : empty, rb);
                     o.setTag(tag);
                     o.setTimeout(timeout_);
                     gloo::alltoallv(o);
                   });
  }

  WorkPtr barrier() override {
    return enqueue("barrier", "barrier", [this](uint32_t tag) {
      if (size() == 1) return;
      gloo::BarrierOptions o(ctx_);
      o.setTag(tag);
      o.setTimeout(timeout_);
      gloo::barrier(o);
    });
  }

  WorkPtr send(Tensor t, int dst, int tag) override { return post_p2p(t, dst, tag, true); }
  WorkPtr recv(Tensor t, int src, int tag) override { return post_p2p(t, src, tag, false); }

 private:
  struct Task {
    std::string what;
    std::function<void(uint32_t)> body;
    uint32_t tag;
    std::shared_ptr<OpWork> work;
    uint64_t record_id;  // its flight-recorder entry
  };
  struct P2POp {
    bool is_send;
    std::unique_ptr<gloo::transport::UnboundBuffer> buf;
    std::shared_ptr<OpWork> work;
    std::thread waiter;
  };

  void await_members(Store& store, int me) {
    store.set(fmt::format("{}/arrived/{}", name_, me), "1");
    std::vector<std::string> keys;
    for (int r : ranks_)
      if (r != me) keys.push_back(fmt::format("{}/arrived/{}", name_, r));
    try {
      store.wait(keys, timeout_);
    } catch (const Error&) {
      auto miss = store.missing(keys);
      if (miss.empty()) throw;
      std::string list;
      for (const auto& k : miss) {
        if (!list.empty()) list += ", ";
        list += k.substr(k.rfind('/') + 1);
      }
      fail_as(ErrorKind::CommTimeout, "group {}: ranks {} never arrived within {:g} s", name_, list, secs(timeout_));
    }
  }

  void check_tensor(const Tensor& t, const char* what, bool int_ok) const {
    MT_CHECK(t.device == Device::CPU, "group {}: {} needs a host tensor (the Gloo backend)", name_, what);
    MT_CHECK(t.dtype == DType::F32 || (int_ok && t.dtype == DType::I32), "group {}: {} of {} tensors is not supported",
             name_, what, dtype_name(t.dtype));
    MT_CHECK(t.defined() || t.numel() == 0, "group {}: {} of an undefined tensor", name_, what);
  }

  // op: the collective's name in the flight recorder, whose sequence numbers equal the tags (both count this
  // group's collectives in issue order).
  WorkPtr enqueue(const char* op, std::string what, std::function<void(uint32_t)> body) {
    std::shared_ptr<OpWork> work;
    {
      std::lock_guard<std::mutex> lock(qmu_);
      MT_CHECK(!stop_, "group {}: {} issued while the group is being destroyed", name_, what);
      uint32_t tag = next_tag_++;
      work = std::make_shared<OpWork>(fmt::format("group {}: {} #{}", name_, what, tag));
      const uint64_t id = record_->post_collective(op);
      queue_.push_back(Task{fmt::format("{} #{}", what, tag), std::move(body), tag, work, id});
    }
    qcv_.notify_one();
    return work;
  }

  void run_worker() {
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(qmu_);
        qcv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
        if (stop_) {
          // Peers may be gone already; running it could only hang until the timeout.
          const std::string msg = fmt::format("group {}: {} never ran: the group was destroyed", name_, task.what);
          record_->finish(task.record_id, &msg);
          task.work->finish(0, std::make_exception_ptr(Error(msg)));
          continue;
        }
      }
      record_->enter(task.record_id);
      double t0 = now_seconds();
      std::exception_ptr err;
      std::string err_msg;
      GlooFailureReport::get().running(this, fmt::format("group {}: {}", name_, task.what));
      try {
        task.body(task.tag);
      } catch (const std::exception& e) {
        err_msg = fmt::format("group {}: {} failed: {}", name_, task.what, e.what());
        err = std::make_exception_ptr(Error(err_msg, gloo_failure_kind(e)));
      } catch (...) {
        err_msg = fmt::format("group {}: {} failed with an unknown exception", name_, task.what);
        err = std::make_exception_ptr(Error(err_msg));
      }
      GlooFailureReport::get().running(this, "");
      record_->finish(task.record_id, err ? &err_msg : nullptr);
      task.work->finish(now_seconds() - t0, err);
    }
  }

  // Ring reduce-scatter. At step s (0..n-2) rank r sends its running partial of chunk (r-1-s) mod n to r+1 and
  // receives the partial of chunk (r-2-s) mod n from r-1, adding its own contribution; after n-1 steps the chunk it
  // holds is (r-n) mod n = r, complete. Two scratch chunks alternate: one is sent while the other receives.
  void ring_reduce_scatter(float* out, const float* in, size_t c, ReduceOp op, uint32_t tag) {
    const int n = size(), r = rank_;
    if (c == 0) return;
    if (n == 1) {
      if (out != in) std::memmove(out, in, c * sizeof(float));
      return;
    }
    const size_t cb = c * sizeof(float);
    rs_scratch_.resize(2 * c);
    const uint64_t slot = gloo::Slot::build(kReduceScatterSlotPrefix, tag);
    const int right = (r + 1) % n, left = (r - 1 + n) % n;
    auto mod = [n](int x) { return ((x % n) + n) % n; };
    // Gloo only reads from a send buffer; the cast is for its untyped interface.
    auto in_buf = ctx_->createUnboundBuffer(const_cast<float*>(in), cb * static_cast<size_t>(n));
    std::unique_ptr<gloo::transport::UnboundBuffer> scratch[2] = {
        ctx_->createUnboundBuffer(rs_scratch_.data(), cb), ctx_->createUnboundBuffer(rs_scratch_.data() + c, cb)};
    for (int s = 0; s < n - 1; ++s) {
      auto& dst = scratch[s % 2];
      dst->recv(left, slot);
      gloo::transport::UnboundBuffer* src;
      if (s == 0) {
        src = in_buf.get();
        src->send(right, slot, static_cast<size_t>(mod(r - 1)) * cb, cb);
      } else {
        src = scratch[(s - 1) % 2].get();
        src->send(right, slot);
      }
      dst->waitRecv(timeout_);
      float* acc = static_cast<float*>(dst->ptr);
      const float* own = in + static_cast<size_t>(mod(r - 2 - s)) * c;
      // The last step writes the result; `out` is written only here, after every read of `in` by a send, so it
      // may be my own chunk of `in`.
      reduce_into(op, s == n - 2 ? out : acc, acc, own, c);
      src->waitSend(timeout_);
    }
  }

  WorkPtr post_p2p(Tensor t, int peer, int tag, bool is_send) {
    const char* what = is_send ? "send" : "recv";
    check_tensor(t, what, true);
    MT_CHECK(peer >= 0 && peer < size(), "group {}: {} peer {} out of range [0, {})", name_, what, peer, size());
    MT_CHECK(peer != rank_, "group {}: {} to/from itself (rank {}) is not supported", name_, what, rank_);
    MT_CHECK(tag >= 0, "group {}: {} tag {} must be >= 0", name_, what, tag);
    auto op = std::make_unique<P2POp>();
    op->is_send = is_send;
    const size_t bytes = t.nbytes();
    const std::string desc = fmt::format("group {}: {} of {} bytes {} rank {} (group rank {}), tag {}", name_, what,
                                         bytes, is_send ? "to" : "from", ranks_[peer], peer, tag);
    op->work = std::make_shared<OpWork>(desc);
    if (bytes == 0) {
      op->work->finish(0, nullptr);
      return op->work;
    }
    const uint64_t slot = gloo::Slot::build(kP2PSlotPrefix, static_cast<uint32_t>(tag));
    const uint64_t record_id = record_->post_p2p(what, ranks_[peer]);
    record_->enter(record_id);
    const double t0 = now_seconds();
    try {
      op->buf = ctx_->createUnboundBuffer(t.ptr, bytes);
      if (is_send)
        op->buf->send(peer, slot);
      else
        op->buf->recv(peer, slot);
    } catch (const std::exception& e) {
      const std::string msg = fmt::format("{} failed: {}", desc, e.what());
      record_->finish(record_id, &msg);
      fail("{}", msg);
    }
    P2POp* raw = op.get();
    WorkPtr work = op->work;
    std::lock_guard<std::mutex> lock(p2p_mu_);
    reap_p2p();
    op->waiter = std::thread([raw, desc, t0, timeout = timeout_, record = record_, record_id] {
      std::exception_ptr err;
      try {
        bool ok = raw->is_send ? raw->buf->waitSend(timeout) : raw->buf->waitRecv(timeout);
        if (!ok) err = std::make_exception_ptr(Error(desc + " aborted: the group was destroyed"));
      } catch (const std::exception& e) {
        err = std::make_exception_ptr(Error(fmt::format("{} failed: {}", desc, e.what()), gloo_failure_kind(e)));
      } catch (...) {  // an exception escaping a thread would terminate the process
        err = std::make_exception_ptr(Error(desc + " failed with an unknown exception"));
      }
      if (err) {
        std::string msg;
        try {
          std::rethrow_exception(err);
        } catch (const std::exception& e) {
          msg = e.what();
        }
        record->finish(record_id, &msg);
      } else {
        record->finish(record_id);
      }
      raw->work->finish(now_seconds() - t0, err);
    });
    p2p_.push_back(std::move(op));
    return work;
  }

  // Joins the waiters of completed transfers (called with p2p_mu_ held), so threads do not pile up.
  void reap_p2p() {
    for (auto it = p2p_.begin(); it != p2p_.end();) {
      if ((*it)->work->done()) {
        (*it)->waiter.join();
        it = p2p_.erase(it);
      } else {
        ++it;
      }
    }
  }

  std::string name_;
  std::vector<int> ranks_;
  int rank_ = 0;
  Millis timeout_;
  std::shared_ptr<gloo::Context> ctx_;   // declared before the threads: destroyed after they are joined
  std::shared_ptr<GroupRecord> record_;  // this group's flight-recorder record

  std::mutex qmu_;
  std::condition_variable qcv_;
  std::deque<Task> queue_;
  uint32_t next_tag_ = 0;
  bool stop_ = false;
  std::vector<float> rs_scratch_;  // worker thread only
  std::thread worker_;

  std::mutex p2p_mu_;
  std::list<std::unique_ptr<P2POp>> p2p_;
};

}  // namespace

std::unique_ptr<ProcessGroup> make_gloo_group(Store& store, const std::string& name, const std::vector<int>& ranks,
                                              int my_global_rank, const GroupOptions& opt) {
  check_group_args("make_gloo_group", name, ranks, my_global_rank, opt);
  return std::make_unique<GlooGroup>(store, name, ranks, my_global_rank, opt);
}

}  // namespace mt
