// NCCL process groups (see nccl_group.h for the semantics). Every CUDA and NCCL call is checked; a failure names
// the call, the op and the group, is remembered, and makes the destructor abort the communicators.
#include "megatrain/comm/cuda/nccl_group.h"

#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>

#include "megatrain/comm/flight_recorder.h"
#include "megatrain/comm/nccl_version.h"
#include "megatrain/core/error.h"

namespace mt {
namespace {

using SteadyClock = std::chrono::steady_clock;

double secs(Millis m) { return static_cast<double>(m.count()) / 1000.0; }

void cuda_check(cudaError_t e, const std::string& group, const char* call) {
  if (e != cudaSuccess) fail("group {}: {} failed: {} ({})", group, call, cudaGetErrorString(e), cudaGetErrorName(e));
}
// Names the failing call in the message: MT_CUDA(name_, cudaEventRecord(ev, s)).
#define MT_CUDA(group, call) cuda_check((call), (group), #call)

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  fail("unknown ReduceOp {}", static_cast<int>(op));
}

// The unique id travels through the store hex-encoded, so any store works, also one that is not binary-safe.
std::string to_hex(const ncclUniqueId& id) {
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (char c : id.internal) {
    auto u = static_cast<unsigned char>(c);
    s += hex[u >> 4];
    s += hex[u & 15];
  }
  return s;
}

ncclUniqueId from_hex(const std::string& s, const std::string& key) {
  ncclUniqueId id{};
  MT_CHECK(s.size() == 2 * sizeof id.internal, "store key '{}' holds {} characters, not a hex NCCL unique id ({})", key,
           s.size(), 2 * sizeof id.internal);
  auto nib = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    fail("store key '{}' holds a malformed NCCL unique id", key);
  };
  for (size_t i = 0; i < sizeof id.internal; ++i)
    id.internal[i] = static_cast<char>(nib(s[2 * i]) << 4 | nib(s[2 * i + 1]));
  return id;
}

// Makes `dev` current for the scope (events must be created on the device of the stream they are recorded on).
class DeviceGuard {
 public:
  DeviceGuard(int dev, const std::string& group) : dev_(dev) {
    MT_CUDA(group, cudaGetDevice(&prev_));
    if (prev_ != dev_) MT_CUDA(group, cudaSetDevice(dev_));
  }
  ~DeviceGuard() {
    if (prev_ != dev_) (void)cudaSetDevice(prev_);  // best effort: a destructor cannot throw
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int dev_, prev_ = 0;
};

// What a Work needs of its group, shared so that a Work that outlives the group stays safe: once `alive` is false
// the communicators are gone and only the Work's own events are consulted.
struct SharedState {
  std::mutex mu;
  bool alive = true;
  std::string failure;  // the first failure seen; the group aborts its communicators on destruction when set

  void set_failure(const std::string& msg) {
    std::lock_guard<std::mutex> lock(mu);
    if (failure.empty()) failure = msg;
  }
  std::string get_failure() {
    std::lock_guard<std::mutex> lock(mu);
    return failure;
  }
  // Throws (and remembers) an error NCCL reports asynchronously on comm (a peer gone, a network error).
  void check_async(ncclComm_t comm, const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    if (!failure.empty()) fail("{}: the group failed: {}", what, failure);
    if (!alive || comm == nullptr) return;
    ncclResult_t st = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm, &st);
    if (r != ncclSuccess) st = r;
    if (st == ncclSuccess || st == ncclInProgress) return;
    failure = fmt::format("{} failed: {} ({})", what, ncclGetErrorString(st), ncclGetLastError(comm));
    throw Error(failure);
  }
};

// A communicator with its own stream. The group's collectives use one; each directed p2p neighbour pair another.
struct Channel {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  std::string what;  // "collectives", "p2p 3->5" (global ranks): for messages
};

// An op's start and done events. Shared by its Work and its flight-recorder probe, which may outlive the Work.
struct OpEvents {
  cudaEvent_t start = nullptr, done = nullptr;
  OpEvents() = default;
  OpEvents(const OpEvents&) = delete;
  OpEvents& operator=(const OpEvents&) = delete;
  ~OpEvents() {
    // Destroying an event whose record is still pending is allowed: CUDA releases it once it completes.
    if (start) (void)cudaEventDestroy(start);
    if (done) (void)cudaEventDestroy(done);
  }
  // The op's state for the flight recorder (GroupRecord::track): cudaEventQuery never blocks, and works from any
  // thread (the heartbeat thread asks).
  OpState state() const {
    const cudaError_t d = cudaEventQuery(done);
    if (d == cudaSuccess) return OpState::Done;
    if (d != cudaErrorNotReady) return OpState::Failed;
    return cudaEventQuery(start) == cudaSuccess ? OpState::Started : OpState::Posted;
  }
};

class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<SharedState> state, ncclComm_t comm, cudaStream_t compute, std::string what)
      : state_(std::move(state)), comm_(comm), compute_(compute), what_(std::move(what)),
        events_(std::make_shared<OpEvents>()) {}
  NcclWork(const NcclWork&) = delete;
  NcclWork& operator=(const NcclWork&) = delete;

  // Called by the group while issuing, with the group's device current.
  void create_events(const std::string& group) {
    MT_CUDA(group, cudaEventCreate(&events_->start));
    MT_CUDA(group, cudaEventCreate(&events_->done));
    start_ = events_->start;
    done_ = events_->done;
  }
  cudaEvent_t start() const { return start_; }
  cudaEvent_t done_event() const { return done_; }
  const std::shared_ptr<OpEvents>& events() const { return events_; }

  // Orders the compute stream after the op; the host does not wait (see nccl_group.h).
  void wait() override {
    state_->check_async(comm_, what_);
    cudaError_t q = cudaEventQuery(done_);
    if (q == cudaErrorNotReady) {
      cuda_check(cudaStreamWaitEvent(compute_, done_, 0), what_, "cudaStreamWaitEvent(compute stream, done event)");
    } else if (q != cudaSuccess) {
      fail("{}: cudaEventQuery(done event) failed: {} ({})", what_, cudaGetErrorString(q), cudaGetErrorName(q));
    }
  }
  // True once the op completed on the device, or failed (then wait() throws).
  bool done() override {
    cudaError_t q = cudaEventQuery(done_);
    if (q != cudaErrorNotReady) return true;
    try {
      state_->check_async(comm_, what_);
    } catch (const Error&) {
      return true;
    }
    return false;
  }
  double exec_seconds() const override {
    if (cudaEventQuery(done_) != cudaSuccess) return 0;  // not finished (or failed): nothing to report yet
    float ms = 0;
    if (cudaEventElapsedTime(&ms, start_, done_) != cudaSuccess) return 0;
    return ms / 1000.0;
  }

 private:
  std::shared_ptr<SharedState> state_;
  ncclComm_t comm_;
  cudaStream_t compute_;
  std::string what_;
  std::shared_ptr<OpEvents> events_;
  cudaEvent_t start_ = nullptr, done_ = nullptr;  // events_'s, for short
};

// Zero-size ops move nothing and are skipped on every rank alike (sizes must match across ranks anyway).
class DoneWork : public Work {
 public:
  void wait() override {}
  bool done() override { return true; }
  double exec_seconds() const override { return 0; }
};

class NcclGroup : public ProcessGroup {
 public:
  NcclGroup(Store& store, const std::string& name, const std::vector<int>& ranks, int my_global_rank,
            cudaStream_t compute_stream, const GroupOptions& opt, const NcclOptions& nopt)
      : name_(name), ranks_(ranks), compute_(compute_stream), timeout_(opt.timeout),
        state_(std::make_shared<SharedState>()) {
    rank_ = static_cast<int>(std::find(ranks_.begin(), ranks_.end(), my_global_rank) - ranks_.begin());
    record_ = flight_recorder().open(name_, ranks_, rank_);
    try {
      init(store, nopt);
    } catch (const Error& e) {
      state_->set_failure(e.what());
      release();  // the destructor does not run for a constructor that throws
      throw;
    }
  }

  ~NcclGroup() override { release(); }

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(ranks_.size()); }
  const std::string& name() const override { return name_; }
  int global_rank(int r) const override {
    MT_CHECK(r >= 0 && r < size(), "group {}: rank {} out of range [0, {})", name_, r, size());
    return ranks_[r];
  }

  WorkPtr allreduce(Tensor t, ReduceOp op) override {
    ncclDataType_t dt = check_tensor(t, "allreduce");
    if (t.numel() == 0) return std::make_shared<DoneWork>();
    void* p = t.ptr;
    const size_t n = static_cast<size_t>(t.numel());
    Channel& ch = coll_;
    return launch(ch, "allreduce", -1, fmt::format("allreduce({}, {} x {})", op_name(op), n, dtype_name(t.dtype)),
                  "ncclAllReduce", [=, &ch] { return ncclAllReduce(p, p, n, dt, nccl_op(op), ch.comm, ch.stream); });
  }

  WorkPtr reduce_scatter(Tensor out, Tensor in, ReduceOp op) override {
    ncclDataType_t dt = check_tensor(out, "reduce_scatter output");
    check_tensor(in, "reduce_scatter input");
    MT_CHECK(out.dtype == in.dtype, "group {}: reduce_scatter of {} input into {} output", name_, dtype_name(in.dtype),
             dtype_name(out.dtype));
    MT_CHECK(in.numel() == size() * out.numel(),
             "group {}: reduce_scatter input has {} elements, expected size {} x output {} = {}", name_, in.numel(),
             size(), out.numel(), size() * out.numel());
    if (out.numel() == 0) return std::make_shared<DoneWork>();
    const void* pi = in.ptr;
    void* po = out.ptr;
    const size_t c = static_cast<size_t>(out.numel());
    Channel& ch = coll_;
    // NCCL's count is the per-rank (output) count; in place when out is my chunk of in.
    return launch(ch, "reduce_scatter", -1,
                  fmt::format("reduce_scatter({}, {} x {} per rank)", op_name(op), c, dtype_name(out.dtype)),
                  "ncclReduceScatter",
                  [=, &ch] { return ncclReduceScatter(pi, po, c, dt, nccl_op(op), ch.comm, ch.stream); });
  }

  WorkPtr all_gather(Tensor out, Tensor in) override {
    ncclDataType_t dt = check_tensor(out, "all_gather output");
    check_tensor(in, "all_gather input");
    MT_CHECK(out.dtype == in.dtype, "group {}: all_gather of {} input into {} output", name_, dtype_name(in.dtype),
             dtype_name(out.dtype));
    MT_CHECK(out.numel() == size() * in.numel(),
             "group {}: all_gather output has {} elements, expected size {} x input {} = {}", name_, out.numel(),
             size(), in.numel(), size() * in.numel());
    if (in.numel() == 0) return std::make_shared<DoneWork>();
    const void* pi = in.ptr;
    void* po = out.ptr;
    const size_t c = static_cast<size_t>(in.numel());
    Channel& ch = coll_;
    // NCCL's count is the per-rank (input) count; in place when in is my chunk of out.
    return launch(ch, "all_gather", -1, fmt::format("all_gather({} x {} per rank)", c, dtype_name(in.dtype)),
                  "ncclAllGather", [=, &ch] { return ncclAllGather(pi, po, c, dt, ch.comm, ch.stream); });
  }

  WorkPtr broadcast(Tensor t, int root) override {
    ncclDataType_t dt = check_tensor(t, "broadcast");
    MT_CHECK(root >= 0 && root < size(), "group {}: broadcast root {} out of range [0, {})", name_, root, size());
    if (t.numel() == 0) return std::make_shared<DoneWork>();
    void* p = t.ptr;
    const size_t n = static_cast<size_t>(t.numel());
    Channel& ch = coll_;
    return launch(ch, "broadcast", -1, fmt::format("broadcast(root {}, {} x {})", root, n, dtype_name(t.dtype)),
                  "ncclBroadcast", [=, &ch] { return ncclBroadcast(p, p, n, dt, root, ch.comm, ch.stream); });
  }

  // One ncclSend/ncclRecv per peer on the collective communicator (NCCL has no all-to-all-v of its own), inside
  // launch's ncclGroupStart/End: NCCL starts them together, so no order among the peers can deadlock. My own block
  // is a device copy on the same stream.
  WorkPtr all_to_all_v(Tensor out, Tensor in, const std::vector<int64_t>& recv_counts,
                       const std::vector<int64_t>& send_counts) override {
    ncclDataType_t dt = check_tensor(out, "all_to_all_v output");
    check_tensor(in, "all_to_all_v input");
    check_all_to_all_v(*this, out, in, recv_counts, send_counts);
    if (in.numel() == 0 && out.numel() == 0) return std::make_shared<DoneWork>();
    const char* pi = static_cast<const char*>(in.ptr);
    char* po = static_cast<char*>(out.ptr);
    const size_t elem = dtype_size(in.dtype);
    const int n = size(), me = rank_;
    Channel& ch = coll_;
    return launch(ch, "all_to_all_v", -1,
                  fmt::format("all_to_all_v({} x {} out, {} in)", in.numel(), dtype_name(in.dtype), out.numel()),
                  "ncclSend/ncclRecv", [=, &ch]() -> ncclResult_t {
                    size_t so = 0, ro = 0;
                    ncclResult_t r = ncclSuccess;
                    for (int p = 0; p < n && (r == ncclSuccess || r == ncclInProgress); ++p) {
                      const size_t sc = static_cast<size_t>(send_counts[p]), rc = static_cast<size_t>(recv_counts[p]);
                      if (p == me) {
                        if (sc > 0 && cudaMemcpyAsync(po + ro * elem, pi + so * elem, sc * elem,
                                                      cudaMemcpyDeviceToDevice, ch.stream) != cudaSuccess)
                          r = ncclUnhandledCudaError;
                      } else {
                        if (sc > 0) r = ncclSend(pi + so * elem, sc, dt, p, ch.comm, ch.stream);
                        if (rc > 0 && (r == ncclSuccess || r == ncclInProgress))
                          r = ncclRecv(po + ro * elem, rc, dt, p, ch.comm, ch.stream);
                      }
                      so += sc, ro += rc;
                    }
                    return r;
                  });
  }

  // A 1-element allreduce on a scratch float: orders every member's streams, never blocks a host.
  WorkPtr barrier() override {
    float* p = scratch_;
    Channel& ch = coll_;
    return launch(ch, "barrier", -1, "barrier", "ncclAllReduce",
                  [=, &ch] { return ncclAllReduce(p, p, 1, ncclFloat32, ncclSum, ch.comm, ch.stream); });
  }

  WorkPtr send(Tensor t, int dst, int tag) override {
    ncclDataType_t dt = check_tensor(t, "send");
    Channel& ch = p2p_channel(send_, dst, "send", tag);
    if (t.numel() == 0) return std::make_shared<DoneWork>();
    const void* p = t.ptr;
    const size_t n = static_cast<size_t>(t.numel());
    // In a channel's 2-rank communicator the sender is rank 0 and the receiver rank 1.
    return launch(ch, "send", ranks_[dst],
                  fmt::format("send of {} x {} to rank {} (group rank {}), tag {}", n, dtype_name(t.dtype), ranks_[dst],
                              dst, tag),
                  "ncclSend", [=, &ch] { return ncclSend(p, n, dt, 1, ch.comm, ch.stream); });
  }

  WorkPtr recv(Tensor t, int src, int tag) override {
    ncclDataType_t dt = check_tensor(t, "recv");
    Channel& ch = p2p_channel(recv_, src, "recv", tag);
    if (t.numel() == 0) return std::make_shared<DoneWork>();
    void* p = t.ptr;
    const size_t n = static_cast<size_t>(t.numel());
    return launch(ch, "recv", ranks_[src],
                  fmt::format("recv of {} x {} from rank {} (group rank {}), tag {}", n, dtype_name(t.dtype),
                              ranks_[src], src, tag),
                  "ncclRecv", [=, &ch] { return ncclRecv(p, n, dt, 0, ch.comm, ch.stream); });
  }

 private:
  // ------------------------------------------------------------------------------------------------ set-up
  void init(Store& store, const NcclOptions& nopt) {
    MT_CUDA(name_, cudaGetDevice(&device_));
    const std::string me = std::to_string(ranks_[rank_]);
    store.set(fmt::format("{}/nccl/arrived/{}", name_, me), "1");  // only read to name the missing on a timeout

    // The p2p channels: one per directed pair with each ring neighbour. The sender of a channel makes its id.
    std::vector<int> peers;
    if (nopt.p2p && size() > 1) {
      peers.push_back((rank_ + 1) % size());
      const int prev = (rank_ - 1 + size()) % size();
      if (prev != peers[0]) peers.push_back(prev);
    }
    std::map<int, ncclUniqueId> send_ids, recv_ids;
    for (int p : peers) {
      ncclUniqueId id;
      nccl_check(ncclGetUniqueId(&id), nullptr, "creating a p2p channel id", "ncclGetUniqueId");
      store.set(p2p_key(ranks_[rank_], ranks_[p]), to_hex(id));
      send_ids[p] = id;
    }
    ncclUniqueId coll_id;
    const std::string id_key = name_ + "/nccl/id";
    if (rank_ == 0) {
      nccl_check(ncclGetUniqueId(&coll_id), nullptr, "creating the group's id", "ncclGetUniqueId");
      store.set(id_key, to_hex(coll_id));
    } else {
      coll_id = from_hex(get_or_blame(store, id_key, ranks_[0], "the group's NCCL id"), id_key);
    }
    for (int p : peers) {
      const std::string key = p2p_key(ranks_[p], ranks_[rank_]);
      recv_ids[p] = from_hex(get_or_blame(store, key, ranks_[p], "its p2p channel id"), key);
    }

    // Streams first, so that every channel is complete before its communicator exists. High priority: NCCL kernels
    // need SMs while compute kernels hold them; the block scheduler then places communication blocks first, so
    // overlapped communication is not starved by long GEMMs.
    int least = 0, greatest = 0;
    MT_CUDA(name_, cudaDeviceGetStreamPriorityRange(&least, &greatest));
    auto new_stream = [&](Channel& ch) {
      MT_CUDA(name_, cudaStreamCreateWithPriority(&ch.stream, cudaStreamNonBlocking, greatest));
    };
    coll_.what = "collectives";
    new_stream(coll_);
    for (int p : peers) {
      Channel& s = send_[p];
      s.what = fmt::format("p2p {}->{}", ranks_[rank_], ranks_[p]);
      new_stream(s);
      Channel& r = recv_[p];
      r.what = fmt::format("p2p {}->{}", ranks_[p], ranks_[rank_]);
      new_stream(r);
    }
    MT_CUDA(name_, cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    MT_CUDA(name_, cudaMalloc(reinterpret_cast<void**>(&scratch_), kScratchFloats * sizeof(float)));
    MT_CUDA(name_, cudaMemset(scratch_, 0, kScratchFloats * sizeof(float)));
    // cudaMemset may return before it lands, and the group's streams are non-blocking (not ordered after it).
    MT_CUDA(name_, cudaDeviceSynchronize());

    // All communicators in one NCCL group: they are created together, so no order of creation among neighbours
    // can deadlock. Non-blocking mode: the calls return at once and we poll with the timeout (settle).
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    cfg.commName = name_.c_str();
    nccl_check(ncclGroupStart(), nullptr, "initialisation", "ncclGroupStart");
    ncclResult_t r = ncclCommInitRankConfig(&coll_.comm, size(), coll_id, rank_, &cfg);
    for (int p : peers) {
      if (r != ncclSuccess && r != ncclInProgress) break;
      r = ncclCommInitRankConfig(&send_[p].comm, 2, send_ids[p], 0, &cfg);
      if (r != ncclSuccess && r != ncclInProgress) break;
      r = ncclCommInitRankConfig(&recv_[p].comm, 2, recv_ids[p], 1, &cfg);
    }
    ncclResult_t r_end = ncclGroupEnd();  // ended even after a failed call: the group must not stay open
    nccl_check(r, nullptr, "initialisation", "ncclCommInitRankConfig");
    nccl_check(r_end, nullptr, "initialisation", "ncclGroupEnd");
    auto missing = [&] { return missing_members(store); };
    for (Channel* ch : channels()) settle(*ch, "initialisation", missing);

    // Connect the p2p channels now with a grouped 1-float exchange (every rank posts all of its channels at once,
    // so it cannot deadlock): NCCL connects peers lazily, and a first send that had to wait for its peer's first
    // receive would block this host inside the step.
    if (!peers.empty()) {
      nccl_check(ncclGroupStart(), nullptr, "connecting the p2p channels", "ncclGroupStart");
      int slot = 2;  // scratch_[0]: barrier; [1]: what we send; [2..]: what we receive
      r = ncclSuccess;
      for (int p : peers) {
        r = ncclSend(scratch_ + 1, 1, ncclFloat32, 1, send_[p].comm, send_[p].stream);
        if (r != ncclSuccess && r != ncclInProgress) break;
        r = ncclRecv(scratch_ + slot++, 1, ncclFloat32, 0, recv_[p].comm, recv_[p].stream);
        if (r != ncclSuccess && r != ncclInProgress) break;
      }
      r_end = ncclGroupEnd();
      nccl_check(r, nullptr, "connecting the p2p channels", "ncclSend/ncclRecv");
      nccl_check(r_end, nullptr, "connecting the p2p channels", "ncclGroupEnd");
      for (Channel* ch : channels()) settle(*ch, "connecting the p2p channels", missing);
      for (Channel* ch : channels()) drain(*ch, "connecting the p2p channels");
    }
  }

  static constexpr size_t kScratchFloats = 8;

  std::string p2p_key(int src_global, int dst_global) const {
    return fmt::format("{}/nccl/p2p/{}-{}", name_, src_global, dst_global);
  }

  std::string get_or_blame(Store& store, const std::string& key, int from_global, const char* what) {
    try {
      return store.get(key, timeout_);
    } catch (const Error&) {
      fail("group {}: rank {} never published {} (store key '{}') within {:g} s", name_, from_global, what, key,
           secs(timeout_));
    }
  }

  std::string missing_members(Store& store) {
    std::vector<std::string> keys;
    for (int r : ranks_) keys.push_back(fmt::format("{}/nccl/arrived/{}", name_, r));
    std::string list;
    try {
      for (const auto& k : store.missing(keys)) {
        if (!list.empty()) list += ", ";
        list += k.substr(k.rfind('/') + 1);
      }
    } catch (const std::exception& e) {
      return fmt::format("(the store could not say which ranks are missing: {})", e.what());
    }
    return list.empty() ? "(every rank arrived; one may have died during set-up)" : "ranks " + list + " never arrived";
  }

  std::vector<Channel*> channels() {
    std::vector<Channel*> out{&coll_};
    for (auto& [p, ch] : send_) out.push_back(&ch);
    for (auto& [p, ch] : recv_) out.push_back(&ch);
    return out;
  }

  // ------------------------------------------------------------------------------------------------ errors
  // A returned error (ncclInProgress is not one: non-blocking mode; settle() waits it out).
  void nccl_check(ncclResult_t r, const Channel* ch, const std::string& what, const char* call) {
    if (r == ncclSuccess || r == ncclInProgress) return;
    fail("group {}{}: {}: {} failed: {} ({})", name_, ch ? " (" + ch->what + ")" : "", what, call,
         ncclGetErrorString(r), ncclGetLastError(ch ? ch->comm : nullptr));
  }

  // Polls the communicator until the last call on it has been carried out (enqueued on the stream, or the
  // communicator initialised), for at most the timeout. In the common case the first query says success.
  void settle(const Channel& ch, const std::string& what, const std::function<std::string()>& hint = {}) {
    const auto deadline = SteadyClock::now() + timeout_;
    for (;;) {
      ncclResult_t st = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(ch.comm, &st);
      nccl_check(r, &ch, what, "ncclCommGetAsyncError");
      if (st == ncclSuccess) return;
      if (st != ncclInProgress)
        fail("group {} ({}): {} failed: {} ({})", name_, ch.what, what, ncclGetErrorString(st),
             ncclGetLastError(ch.comm));
      if (SteadyClock::now() > deadline)
        fail("group {} ({}): {} did not finish within {:g} s{}{}", name_, ch.what, what, secs(timeout_),
             hint ? ": " : "", hint ? hint() : "");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // Waits (bounded by the timeout) for everything issued on the channel's stream to finish.
  void drain(const Channel& ch, const std::string& what) {
    const auto deadline = SteadyClock::now() + timeout_;
    for (;;) {
      cudaError_t q = cudaStreamQuery(ch.stream);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) cuda_check(q, name_ + " (" + ch.what + ", " + what + ")", "cudaStreamQuery");
      ncclResult_t st = ncclSuccess;
      nccl_check(ncclCommGetAsyncError(ch.comm, &st), &ch, what, "ncclCommGetAsyncError");
      nccl_check(st, &ch, what, "(asynchronous error)");
      if (SteadyClock::now() > deadline)
        fail("group {} ({}): {}: the stream did not drain within {:g} s (a peer stopped?)", name_, ch.what, what,
             secs(timeout_));
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  // ------------------------------------------------------------------------------------------------ issue
  ncclDataType_t check_tensor(const Tensor& t, const char* what) const {
    MT_CHECK(t.device == Device::CUDA, "group {}: {} needs a device tensor (the NCCL backend)", name_, what);
    MT_CHECK(t.defined() || t.numel() == 0, "group {}: {} of an undefined tensor", name_, what);
    switch (t.dtype) {
      case DType::F32: return ncclFloat32;
      case DType::BF16: return ncclBfloat16;
      case DType::I32: return ncclInt32;
      default: fail("group {}: {} of {} tensors is not supported (F32, BF16, I32)", name_, what, dtype_name(t.dtype));
    }
  }

  Channel& p2p_channel(std::map<int, Channel>& chans, int peer, const char* what, int tag) {
    MT_CHECK(peer >= 0 && peer < size(), "group {}: {} peer {} out of range [0, {})", name_, what, peer, size());
    MT_CHECK(peer != rank_, "group {}: {} to/from itself (rank {}) is not supported", name_, what, rank_);
    MT_CHECK(tag >= 0, "group {}: {} tag {} must be >= 0", name_, what, tag);
    auto it = chans.find(peer);
    if (it == chans.end()) {
      if (chans.empty())
        fail("group {}: {} with group rank {}: the group has no p2p channels (create it with NcclOptions::p2p)", name_,
             what, peer);
      fail("group {}: {} with group rank {}: NCCL p2p reaches only the ring neighbours of rank {} (group ranks {} "
           "and {})",
           name_, what, peer, rank_, (rank_ - 1 + size()) % size(), (rank_ + 1) % size());
    }
    return it->second;
  }

  // Issues one op on ch: the comm stream waits for the compute issued so far, a start event, the NCCL call (in its
  // own NCCL group), a done event. Returns at once; a failure is remembered so the destructor aborts. op, peer: the
  // flight recorder's name for it and, for send/recv, the peer's global rank (-1 for a collective); the record
  // follows the op's events from then on (GroupRecord::track), so a hang report sees GPU collectives too.
  WorkPtr launch(Channel& ch, const char* op, int peer, const std::string& what, const char* call_name,
                 const std::function<ncclResult_t()>& call) {
    std::lock_guard<std::mutex> lock(issue_mu_);  // one communicator must not be used by two threads at once
    const std::string full = fmt::format("group {} ({}): {}", name_, ch.what, what);
    if (std::string f = state_->get_failure(); !f.empty()) fail("{} issued after an earlier failure: {}", full, f);
    const uint64_t id = peer >= 0 ? record_->post_p2p(op, peer) : record_->post_collective(op);
    try {
      DeviceGuard guard(device_, name_);
      auto work = std::make_shared<NcclWork>(state_, ch.comm, compute_, full);
      work->create_events(name_);
      MT_CUDA(name_, cudaEventRecord(ready_, compute_));
      MT_CUDA(name_, cudaStreamWaitEvent(ch.stream, ready_, 0));
      MT_CUDA(name_, cudaEventRecord(work->start(), ch.stream));
      nccl_check(ncclGroupStart(), &ch, what, "ncclGroupStart");
      ncclResult_t r = call();
      ncclResult_t r_end = ncclGroupEnd();
      nccl_check(r, &ch, what, call_name);
      nccl_check(r_end, &ch, what, "ncclGroupEnd");
      settle(ch, what);
      MT_CUDA(name_, cudaEventRecord(work->done_event(), ch.stream));
      record_->track(id, [ev = work->events()] { return ev->state(); });
      return work;
    } catch (const Error& e) {
      state_->set_failure(e.what());
      const std::string why = e.what();
      record_->finish(id, &why);
      throw;
    }
  }

  // ------------------------------------------------------------------------------------------------ teardown
  // Clean: drain the streams (bounded), finalize and destroy the communicators. After any failure, or when the
  // streams do not drain in time: abort them (NCCL stops its kernels) instead of waiting for what cannot finish.
  void release() noexcept {
    bool failed = !state_->get_failure().empty();
    int prev = -1;
    const bool dev_ok = cudaGetDevice(&prev) == cudaSuccess &&
                        (prev == device_ || cudaSetDevice(device_) == cudaSuccess);
    if (!failed) {
      try {
        for (Channel* ch : channels())
          if (ch->comm && ch->stream) drain(*ch, "destruction");
      } catch (const std::exception& e) {
        state_->set_failure(e.what());
        failed = true;
      }
    }
    {
      std::lock_guard<std::mutex> lock(state_->mu);  // Works stop querying the communicators
      state_->alive = false;
    }
    for (Channel* ch : channels()) {
      if (!ch->comm) continue;
      bool clean = false;
      if (!failed) {
        ncclResult_t r = ncclCommFinalize(ch->comm);  // non-blocking mode: usually ncclInProgress, settled below
        clean = r == ncclSuccess || r == ncclInProgress;
      }
      if (clean) {
        try {
          settle(*ch, "finalize");
        } catch (const std::exception&) {
          clean = false;
        }
      }
      if (clean)
        (void)ncclCommDestroy(ch->comm);
      else
        (void)ncclCommAbort(ch->comm);
      ch->comm = nullptr;
    }
    for (Channel* ch : channels()) {
      if (ch->stream) (void)cudaStreamDestroy(ch->stream);
      ch->stream = nullptr;
    }
    if (ready_) (void)cudaEventDestroy(ready_);
    ready_ = nullptr;
    if (scratch_) (void)cudaFree(scratch_);
    scratch_ = nullptr;
    if (dev_ok && prev != device_) (void)cudaSetDevice(prev);
    if (record_) flight_recorder().close(record_);
    record_.reset();
  }

  std::string name_;
  std::vector<int> ranks_;
  int rank_ = 0;
  int device_ = 0;
  cudaStream_t compute_;
  Millis timeout_;
  std::shared_ptr<SharedState> state_;

  std::mutex issue_mu_;
  Channel coll_;
  std::map<int, Channel> send_, recv_;   // by peer group rank
  cudaEvent_t ready_ = nullptr;          // recorded on the compute stream per op (reusable: waits capture it)
  float* scratch_ = nullptr;             // kScratchFloats device floats: barrier and p2p warm-up
  std::shared_ptr<GroupRecord> record_;  // this group's flight-recorder record (launch posts and tracks each op)
};

}  // namespace

std::unique_ptr<ProcessGroup> make_nccl_group(Store& store, const std::string& name, const std::vector<int>& ranks,
                                              int my_global_rank, cudaStream_t compute_stream, const GroupOptions& opt,
                                              const NcclOptions& nccl) {
  check_group_args("make_nccl_group", name, ranks, my_global_rank, opt);
  return std::make_unique<NcclGroup>(store, name, ranks, my_global_rank, compute_stream, opt, nccl);
}

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "NCCL (version unknown)";
  // NCCL_VERSION(X, Y, Z) = X * 10000 + Y * 100 + Z since 2.9 (X * 1000 + Y * 100 + Z before).
  return v >= 10000 ? fmt::format("NCCL {}.{}.{}", v / 10000, (v % 10000) / 100, v % 100)
                    : fmt::format("NCCL {}.{}.{}", v / 1000, (v % 1000) / 100, v % 100);
}

GroupFactory nccl_mesh_groups(cudaStream_t compute_stream) {
  return [compute_stream](Store& store, GroupRole role, const std::string& name, const std::vector<int>& ranks,
                          int my_global_rank, const GroupOptions& opt) {
    NcclOptions nopt;
    nopt.p2p = role == GroupRole::PP && ranks.size() > 1;
    return make_nccl_group(store, name, ranks, my_global_rank, compute_stream, opt, nopt);
  };
}

}  // namespace mt
