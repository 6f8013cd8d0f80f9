#include "megatrain/train/update.h"

namespace mt {

namespace {

// One replica per process: the optimizer over all of this rank's parameters; the norms follow the plan.
class PlainUpdate final : public Update {
 public:
  PlainUpdate(const RunConfig& cfg, Ops& ops, ModelStack& stack)
      : ops_(ops), params_(stack.model->params()), plan_(stack.norms), opt_(cfg.optim, stack.model->params(), ops) {
    if (plan_.tensor_reduce) opt_.set_norm_reduce(plan_.tensor_weights, plan_.tensor_reduce);
  }
  void begin_last_backward(int) override {}
  double finish_gradients(float&) override {
    if (before_reduce_) before_reduce_(0, params_.total_floats());
    return plan_.global_norm(ops_, params_);
  }
  void step(float lr, float grad_scale, int step) override { opt_.step(params_, lr, grad_scale, step); }
  void set_before_reduce(std::function<void(size_t, size_t)> f) override { before_reduce_ = std::move(f); }
  Optimizer* optimizer() override { return &opt_; }

 private:
  std::function<void(size_t, size_t)> before_reduce_;
  Ops& ops_;
  ParamStore& params_;
  const NormPlan& plan_;
  Optimizer opt_;
};

// ZeRO-2 over the dp group of the device mesh; its host scalars go over the host mesh's dp group.
class ShardedUpdate final : public Update {
 public:
  ShardedUpdate(const RunConfig& cfg, Topology& topo, ModelStack& stack) : host_dp_(topo.host_mesh->dp()) {
    DataParallelOptions o;
    o.bucket_floats = static_cast<size_t>(cfg.parallel.bucket_mb) << 18;
    o.overlap = cfg.parallel.overlap;
    o.norm_weights = stack.norms.tensor_weights;
    o.norm_reduce = stack.norms.tensor_reduce;
    o.clip_norm_weights = stack.norms.clip_weights;
    o.clip_norm_reduce = stack.norms.clip_reduce;
    o.host = topo.own_device_mesh ? &topo.host_mesh->dp() : nullptr;
    ddp_ = std::make_unique<DataParallel>(*stack.model, topo.device_mesh->dp(), *topo.ops, cfg.optim, o);
  }
  void begin_last_backward(int chunk) override {
    if (chunk < 0)
      ddp_->begin_last_backward();
    else
      ddp_->begin_last_backward(chunk);
  }
  double finish_gradients(float& loss) override {
    const double norm = ddp_->finish_gradients();
    host_dp_.allreduce(f32_view(&loss, {1}))->wait();
    loss /= static_cast<float>(host_dp_.size());
    return norm;
  }
  void step(float lr, float grad_scale, int step) override { ddp_->step(lr, grad_scale, step); }
  void sync_params() override { ddp_->sync_params(); }
  void set_before_reduce(std::function<void(size_t, size_t)> f) override { ddp_->set_before_reduce(std::move(f)); }
  CommTime take_comm_time() override { return ddp_->take_comm_time(); }
  DataParallel* data_parallel() override { return ddp_.get(); }

 private:
  ProcessGroup& host_dp_;
  std::unique_ptr<DataParallel> ddp_;
};

}  // namespace

std::unique_ptr<Update> make_update(const RunConfig& cfg, Topology& topo, ModelStack& stack) {
  if (topo.shape.dp > 1) return std::make_unique<ShardedUpdate>(cfg, topo, stack);
  return std::make_unique<PlainUpdate>(cfg, *topo.ops, stack);
}

}  // namespace mt
