#include "megatrain/comm/staged_group.h"

#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"

namespace mt {

std::shared_ptr<void> StagingDevice::host_buffer(size_t bytes) {
  void* p = std::malloc(bytes > 0 ? bytes : 1);
  MT_CHECK(p, "cannot allocate {} bytes of host memory for a staged transfer", bytes);
  return std::shared_ptr<void>(p, std::free);
}

namespace {

// An op's completion, set by the thread that runs it.
class StagedWork : public Work {
 public:
  void wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }
  bool done() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_ && error_) std::rethrow_exception(error_);
    return done_;
  }
  bool done_quietly() const {  // done, without rethrowing its error
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  double exec_seconds() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return seconds_;
  }
  void finish(double seconds, std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      seconds_ = seconds;
      error_ = std::move(error);
      done_ = true;
    }
    cv_.notify_all();
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  double seconds_ = 0;
  std::exception_ptr error_;
};

// A device tensor's host copy: a buffer from the device and a host tensor over it (F32, or I32 for I32).
struct HostCopy {
  std::shared_ptr<void> buf;
  Tensor t;
};

class StagedGroup : public ProcessGroup {
 public:
  StagedGroup(std::unique_ptr<ProcessGroup> host, std::shared_ptr<StagingDevice> device)
      : host_(std::move(host)), dev_(std::move(device)) {
    MT_CHECK(host_ && dev_, "make_staged_group: a host group and a device are needed");
    worker_ = std::thread([this] { run_collectives(); });
  }
  ~StagedGroup() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();
    std::vector<P2p> p2p;
    {
      std::lock_guard<std::mutex> lock(mu_);
      p2p.swap(p2p_);
    }
    for (auto& p : p2p) p.thread.join();
  }

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const std::string& name() const override { return host_->name(); }
  int global_rank(int group_rank) const override { return host_->global_rank(group_rank); }

  WorkPtr allreduce(Tensor t, ReduceOp op) override {
    return collective([this, t, op] {
      HostCopy h = copy_in(t);
      host_->allreduce(h.t, op)->wait();
      dev_->to_device(t, h.buf.get());
    });
  }
  WorkPtr reduce_scatter(Tensor out, Tensor in, ReduceOp op) override {
    return collective([this, out, in, op] {
      HostCopy i = copy_in(in), o = host_copy(out);
      host_->reduce_scatter(o.t, i.t, op)->wait();
      dev_->to_device(out, o.buf.get());
    });
  }
  WorkPtr all_gather(Tensor out, Tensor in) override {
    return collective([this, out, in] {
      HostCopy i = copy_in(in), o = host_copy(out);
      host_->all_gather(o.t, i.t)->wait();
      dev_->to_device(out, o.buf.get());
    });
  }
  WorkPtr broadcast(Tensor t, int root) override {
    return collective([this, t, root] {
      HostCopy h = rank() == root ? copy_in(t) : host_copy(t);  // only the root's contents travel
      host_->broadcast(h.t, root)->wait();
      if (rank() != root) dev_->to_device(t, h.buf.get());
    });
  }
  WorkPtr all_to_all_v(Tensor out, Tensor in, const std::vector<int64_t>& recv_counts,
                       const std::vector<int64_t>& send_counts) override {
    check_all_to_all_v(*this, out, in, recv_counts, send_counts);
    return collective([this, out, in, recv_counts, send_counts] {
      HostCopy i = copy_in(in), o = host_copy(out);
      host_->all_to_all_v(o.t, i.t, recv_counts, send_counts)->wait();
      dev_->to_device(out, o.buf.get());
    });
  }
  WorkPtr barrier() override {
    return collective([this] { host_->barrier()->wait(); });  // (after the mark: compute before it is done)
  }
  WorkPtr send(Tensor t, int dst, int tag) override {
    return point_to_point([this, t, dst, tag](const StagingDevice::Mark& m) {
      dev_->wait(m);
      HostCopy h = copy_in(t);
      host_->send(h.t, dst, tag)->wait();
    });
  }
  WorkPtr recv(Tensor t, int src, int tag) override {
    return point_to_point([this, t, src, tag](const StagingDevice::Mark& m) {
      HostCopy h = host_copy(t);
      host_->recv(h.t, src, tag)->wait();
      dev_->wait(m);  // compute issued before the receive may still read the tensor's old contents
      dev_->to_device(t, h.buf.get());
    });
  }

 private:
  using Job = std::function<void()>;

  HostCopy host_copy(const Tensor& d) const {
    MT_CHECK(d.dtype == DType::F32 || d.dtype == DType::BF16 || d.dtype == DType::I32,
             "group {}: the staged group moves F32, BF16 and I32 tensors, not {}", name(), dtype_name(d.dtype));
    HostCopy h;
    h.buf = dev_->host_buffer(size_t(d.numel()) * 4);
    h.t = Tensor(h.buf.get(), {d.numel()}, d.dtype == DType::I32 ? DType::I32 : DType::F32, Device::CPU);
    return h;
  }
  HostCopy copy_in(const Tensor& d) const {
    HostCopy h = host_copy(d);
    dev_->to_host(h.buf.get(), d);
    return h;
  }

  // Queues `job` behind the group's earlier collectives, to run once compute passed the mark made now.
  WorkPtr collective(Job job) {
    auto work = std::make_shared<StagedWork>();
    StagingDevice::Mark m = dev_->mark();
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back([this, job = std::move(job), work, m] { run(work, [&] { dev_->wait(m), job(); }); });
    }
    cv_.notify_all();
    return work;
  }

  // Runs `job` on a thread of its own, with the mark made now.
  WorkPtr point_to_point(std::function<void(const StagingDevice::Mark&)> job) {
    auto work = std::make_shared<StagedWork>();
    StagingDevice::Mark m = dev_->mark();
    std::lock_guard<std::mutex> lock(mu_);
    // The threads of finished ops are joined here (finishing is the last thing they do), so a long run keeps only
    // the threads of the transfers in flight.
    for (auto it = p2p_.begin(); it != p2p_.end();)
      if (it->work->done_quietly()) {
        it->thread.join();
        it = p2p_.erase(it);
      } else {
        ++it;
      }
    P2p p;
    p.work = work;
    p.thread = std::thread([this, job = std::move(job), work, m] { run(work, [&] { job(m); }); });
    p2p_.push_back(std::move(p));
    return work;
  }

  static void run(const std::shared_ptr<StagedWork>& work, const std::function<void()>& job) {
    const double t0 = now_seconds();
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    work->finish(now_seconds() - t0, error);
  }

  void run_collectives() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and every queued op ran
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      job();
    }
  }

  std::unique_ptr<ProcessGroup> host_;
  std::shared_ptr<StagingDevice> dev_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool stopping_ = false;
  std::thread worker_;
  struct P2p {
    std::shared_ptr<StagedWork> work;
    std::thread thread;
  };
  std::vector<P2p> p2p_;  // the point-to-point ops' threads, joined once their op finished or when the group goes
};

}  // namespace

std::unique_ptr<ProcessGroup> make_staged_group(std::unique_ptr<ProcessGroup> host,
                                                std::shared_ptr<StagingDevice> device) {
  return std::make_unique<StagedGroup>(std::move(host), std::move(device));
}

}  // namespace mt
