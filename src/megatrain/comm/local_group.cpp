// A group of one process (mesh dimensions of size 1): every collective is a copy or nothing, done at issue time.
#include <cstring>

#include "megatrain/comm/mesh.h"

namespace mt {
namespace {

class DoneWork : public Work {
 public:
  void wait() override {}
  bool done() override { return true; }
  double exec_seconds() const override { return 0; }
};

class LocalGroup : public ProcessGroup {
 public:
  LocalGroup(int global_rank, std::string name) : global_rank_(global_rank), name_(std::move(name)) {}

  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  int global_rank(int r) const override {
    MT_CHECK(r == 0, "group {}: rank {} out of range [0, 1)", name_, r);
    return global_rank_;
  }

  WorkPtr allreduce(Tensor t, ReduceOp) override {
    check(t, "allreduce", false);
    return done();
  }
  WorkPtr reduce_scatter(Tensor out, Tensor in, ReduceOp) override {
    check(out, "reduce_scatter output", false);
    check(in, "reduce_scatter input", false);
    MT_CHECK(in.numel() == out.numel(), "group {}: reduce_scatter input has {} elements, expected size 1 x output {}",
             name_, in.numel(), out.numel());
    copy(out, in);
    return done();
  }
  WorkPtr all_gather(Tensor out, Tensor in) override {
    check(out, "all_gather output", true);
    check(in, "all_gather input", true);
    MT_CHECK(out.dtype == in.dtype, "group {}: all_gather of {} input into {} output", name_, dtype_name(in.dtype),
             dtype_name(out.dtype));
    MT_CHECK(in.numel() == out.numel(), "group {}: all_gather output has {} elements, expected size 1 x input {}",
             name_, out.numel(), in.numel());
    copy(out, in);
    return done();
  }
  WorkPtr broadcast(Tensor t, int root) override {
    check(t, "broadcast", true);
    MT_CHECK(root == 0, "group {}: broadcast root {} out of range [0, 1)", name_, root);
    return done();
  }
  WorkPtr all_to_all_v(Tensor out, Tensor in, const std::vector<int64_t>& recv_counts,
                       const std::vector<int64_t>& send_counts) override {
    check(out, "all_to_all_v output", true);
    check(in, "all_to_all_v input", true);
    check_all_to_all_v(*this, out, in, recv_counts, send_counts);
    copy(out, in);
    return done();
  }
  WorkPtr send(Tensor, int dst, int) override {
    fail("group {}: send to rank {} in a group of one process (no peer to send to)", name_, dst);
  }
  WorkPtr recv(Tensor, int src, int) override {
    fail("group {}: recv from rank {} in a group of one process (no peer to receive from)", name_, src);
  }
  WorkPtr barrier() override { return done(); }

 private:
  static WorkPtr done() { return std::make_shared<DoneWork>(); }
  void check(const Tensor& t, const char* what, bool int_ok) const {
    MT_CHECK(t.device == Device::CPU, "group {}: {} needs a host tensor", name_, what);
    MT_CHECK(t.dtype == DType::F32 || (int_ok && t.dtype == DType::I32), "group {}: {} of {} tensors is not supported",
             name_, what, dtype_name(t.dtype));
    MT_CHECK(t.defined() || t.numel() == 0, "group {}: {} of an undefined tensor", name_, what);
  }
  static void copy(const Tensor& out, const Tensor& in) {
    if (out.ptr != in.ptr && in.nbytes() > 0) std::memmove(out.ptr, in.ptr, in.nbytes());
  }

  int global_rank_;
  std::string name_;
};

}  // namespace

std::unique_ptr<ProcessGroup> make_local_group(int global_rank, const std::string& name) {
  MT_CHECK(global_rank >= 0, "make_local_group: negative rank {}", global_rank);
  return std::make_unique<LocalGroup>(global_rank, name);
}

}  // namespace mt
