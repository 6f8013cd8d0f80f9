#include "megatrain/data/node_loader.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>

#include "megatrain/core/error.h"

namespace mt {

namespace {

uint64_t steady_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now()
                                                                                        .time_since_epoch())
                                   .count());
}

// Waiting: a few yields (a batch usually lands within microseconds of the previous copy), then sleeps growing to
// max_us, so a rank waiting out a slow read costs no core. A rank waits up to 500 us between looks; the reader,
// which waits on a full ring most of the time and is `slots` batches ahead, 2 ms.
class Backoff {
 public:
  explicit Backoff(int max_us = 500) : max_us_(max_us) {}
  void pause() {
    if (n_ < 64) {
      ++n_;
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(us_));
    us_ = std::min(us_ * 2, max_us_);
  }

 private:
  int max_us_, n_ = 0, us_ = 20;
};

uint64_t slot_stride(const NodeRingHeader& h) { return h.slot_bytes; }

}  // namespace

bool process_alive(int pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream f(fmt::format("/proc/{}/stat", pid));
  std::string stat;
  if (!std::getline(f, stat)) return ::kill(pid, 0) == 0 || errno != ESRCH;
  const size_t paren = stat.rfind(')');  // the state follows the command name, which may hold spaces
  if (paren == std::string::npos || paren + 2 >= stat.size()) return true;
  const char state = stat[paren + 2];
  return state != 'Z' && state != 'X';
}

// ---- NodeSegment ----

std::unique_ptr<NodeSegment> NodeSegment::create(const std::string& name, uint64_t bytes) {
  ::shm_unlink(name.c_str());  // a dead run's segment of the same name (NodeSegment::open skips it until then)
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0)
    fail_as(ErrorKind::IO, "node data loader: cannot create shared memory {}: {}", name, std::strerror(errno));
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int e = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    fail_as(ErrorKind::IO, "node data loader: cannot size shared memory {} to {} bytes: {} (is /dev/shm large enough?)",
            name, bytes, std::strerror(e));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int e = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    ::shm_unlink(name.c_str());
    fail_as(ErrorKind::IO, "node data loader: cannot map shared memory {}: {}", name, std::strerror(e));
  }
  new (p) NodeRingHeader();
  return std::unique_ptr<NodeSegment>(new NodeSegment(p, bytes));
}

std::unique_ptr<NodeSegment> NodeSegment::open(const NodeLoaderPlan& plan) {
  const uint64_t t0 = steady_ns();
  Backoff wait;
  std::string last = "it does not exist yet";
  while (static_cast<double>(steady_ns() - t0) * 1e-9 < plan.timeout_s) {
    const int fd = ::shm_open(plan.name.c_str(), O_RDWR, 0600);
    if (fd >= 0) {
      struct stat st {};
      void* p = MAP_FAILED;
      if (::fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_size) >= node_ring_data_offset())
        p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      ::close(fd);
      if (p != MAP_FAILED) {
        auto seg = std::unique_ptr<NodeSegment>(new NodeSegment(p, static_cast<uint64_t>(st.st_size)));
        NodeRingHeader& h = seg->header();
        if (node_ring_header_ready(h) && process_alive(h.reader_pid) &&
            node_ring_bytes(h.slots, h.slot_bytes) <= seg->bytes_)
          return seg;
        last = node_ring_header_ready(h) ? fmt::format("it was left by pid {}, which is gone", h.reader_pid)
                                         : "its reader has not finished setting it up";
      }
    }
    wait.pause();
  }
  fail_as(ErrorKind::PeerLost,
          "node data loader: the reader of node {} (local rank 0) never set up shared memory {} within {} s "
          "(parallel.timeout_s): {} (local rank 0 failed first, or this node's ranks are not numbered contiguously: "
          "data.node_loader = false gives every rank its own loader)",
          plan.node, plan.name, plan.timeout_s, last);
}

NodeSegment::~NodeSegment() { ::munmap(base_, bytes_); }

int32_t* NodeSegment::slot_rows(uint64_t s) {
  NodeRingHeader& h = header();
  return reinterpret_cast<int32_t*>(static_cast<char*>(base_) + h.data_offset + ring_slot(h, s) * slot_stride(h));
}

// ---- NodeReader ----

NodeReader::NodeReader(const NodeLoaderPlan& plan, std::unique_ptr<DataLoader> loader)
    : plan_(plan), loader_(std::move(loader)) {
  MT_CHECK(!plan.replicas.empty() && plan.replicas.size() <= kNodeRingMaxConsumers,
           "node data loader: {} replicas on a node; 1 to {} can be", plan.replicas.size(), kNodeRingMaxConsumers);
  const uint64_t slot_bytes = plan.replicas.size() * static_cast<uint64_t>(loader_->batch_rows()) *
                              (static_cast<uint64_t>(loader_->seq_len()) + 1) * sizeof(int32_t);
  const auto slots = static_cast<uint32_t>(plan.slots);
  seg_ = NodeSegment::create(plan.name, node_ring_bytes(slots, slot_bytes));
  NodeRingHeader& h = seg_->header();
  node_ring_init(h, slots, static_cast<uint32_t>(plan.consumers), slot_bytes, static_cast<int32_t>(::getpid()),
                 plan.node);
  h.replicas = static_cast<uint32_t>(plan.replicas.size());
  for (size_t j = 0; j < plan.replicas.size(); ++j) h.replica_dp[j] = plan.replicas[j];
  h.heartbeat_ns.store(steady_ns(), std::memory_order_relaxed);
  node_ring_publish_header(h);
}

NodeReader::~NodeReader() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  ::shm_unlink(plan_.name.c_str());  // ENOENT when the last rank to map it removed it already
}

void NodeReader::start(const LoaderState& from) {
  MT_CHECK(!thread_.joinable(), "node data loader: the reader of node {} was started twice", plan_.node);
  thread_ = std::thread([this, from] { run(from); });
}

void NodeReader::run(LoaderState pos) {
  NodeRingHeader& h = seg_->header();
  try {
    for (uint64_t s = 0; !stop_; ++s) {
      Backoff wait(2000);
      for (;;) {
        h.heartbeat_ns.store(steady_ns(), std::memory_order_relaxed);
        if (stop_) return;
        if (ring_writable(h, s)) break;
        wait.pause();
      }
      const LoaderState at = loader_->read_windows(pos, plan_.replicas, seg_->slot_rows(s));
      ring_publish(h, s, ring_position_key(at.epoch, at.cursor, at.taken));
    }
  } catch (const Error& e) {
    h.failed_kind = static_cast<int32_t>(e.kind);
    std::snprintf(h.error, sizeof(h.error), "%s", e.what());
    h.failed.store(1, std::memory_order_release);
  } catch (const std::exception& e) {
    h.failed_kind = static_cast<int32_t>(ErrorKind::Internal);
    std::snprintf(h.error, sizeof(h.error), "%s", e.what());
    h.failed.store(1, std::memory_order_release);
  }
}

// ---- NodeFeed ----

NodeFeed::NodeFeed(const NodeLoaderPlan& plan, std::unique_ptr<NodeReader> reader, int B, int T)
    : plan_(plan), reader_(std::move(reader)), B_(B), T_(T) {
  if (plan_.consumer < 0) return;
  seg_ = NodeSegment::open(plan_);
  NodeRingHeader& h = seg_->header();
  MT_CHECK(static_cast<uint32_t>(plan_.consumer) < h.consumers && static_cast<uint32_t>(plan_.replica) < h.replicas &&
               h.replica_dp[plan_.replica] == plan_.replicas[static_cast<size_t>(plan_.replica)],
           "node data loader: local rank {} (consumer {}, dp rank {}) does not fit the ring {} set up: {} consumers, "
           "{} replicas (are the ranks of a node numbered contiguously?)",
           plan_.local_rank, plan_.consumer, plan_.replicas[static_cast<size_t>(std::max(plan_.replica, 0))],
           reader_name(), h.consumers, h.replicas);
  // The last rank to map the segment removes its name: a crash from now on leaves nothing in /dev/shm.
  if (h.attached.fetch_add(1) + 1 == h.consumers) ::shm_unlink(plan_.name.c_str());
}

std::string NodeFeed::reader_name() const {
  const int pid = seg_ ? seg_->header().reader_pid : 0;
  return fmt::format("the data reader of node {} (local rank 0, pid {})", plan_.node, pid);
}

void NodeFeed::start(const LoaderState& from) {
  if (reader_) reader_->start(from);
}

void NodeFeed::reader_failed() {
  NodeRingHeader& h = seg_->header();
  fail_as(static_cast<ErrorKind>(h.failed_kind), "{} failed: {}", reader_name(), h.error);
}

void NodeFeed::wait_for(uint64_t s) {
  NodeRingHeader& h = seg_->header();
  if (ring_ready(h, s)) return;
  const uint64_t t0 = steady_ns();
  uint64_t checked = t0;
  Backoff wait;
  while (!ring_ready(h, s)) {
    if (h.failed.load(std::memory_order_acquire)) reader_failed();
    const uint64_t now = steady_ns();
    if (now - checked > 10'000'000) {  // every 10 ms: is the reader still there?
      checked = now;
      if (!process_alive(h.reader_pid))
        fail_as(ErrorKind::PeerLost, "{} is gone: local rank {} waited {:.1f} s for its batch {} in shared memory {}",
                reader_name(), plan_.local_rank, static_cast<double>(now - t0) * 1e-9, s, plan_.name);
      const uint64_t beat = h.heartbeat_ns.load(std::memory_order_relaxed);
      if (now > beat && static_cast<double>(now - beat) * 1e-9 > plan_.timeout_s)
        fail_as(ErrorKind::CommTimeout,
                "{} has not moved for {:.0f} s (parallel.timeout_s {}): local rank {} waited for its batch {}",
                reader_name(), static_cast<double>(now - beat) * 1e-9, plan_.timeout_s, plan_.local_rank, s);
    }
    wait.pause();
  }
  wait_s_ += static_cast<double>(steady_ns() - t0) * 1e-9;
}

void NodeFeed::fill(Batch& b) {
  if (!seg_) {  // a middle pipeline stage: neither tokens nor targets
    b.x.clear();
    b.y.clear();
    ++next_;
    return;
  }
  const uint64_t s = next_++;
  wait_for(s);
  NodeRingHeader& h = seg_->header();
  const uint64_t want = ring_position_key(b.epoch, b.cursor, b.taken);
  if (ring_key(h, s) != want)
    fail_as(ErrorKind::Internal,
            "node data loader: batch {} from {} is not the one local rank {} expects (epoch {}, cursor {}): the rank "
            "and its node's reader began at different positions",
            s, reader_name(), plan_.local_rank, b.epoch, b.cursor);
  const size_t row = static_cast<size_t>(T_) + 1;
  const int32_t* rows = seg_->slot_rows(s) + static_cast<size_t>(plan_.replica) * B_ * row;
  b.x.resize(static_cast<size_t>(B_) * T_);
  b.y.resize(static_cast<size_t>(B_) * T_);
  for (int r = 0; r < B_; ++r) {
    const int32_t* w = rows + static_cast<size_t>(r) * row;
    std::copy(w, w + T_, b.x.begin() + static_cast<size_t>(r) * T_);
    std::copy(w + 1, w + row, b.y.begin() + static_cast<size_t>(r) * T_);
  }
  ring_release(h, static_cast<uint32_t>(plan_.consumer), s);
}

}  // namespace mt
