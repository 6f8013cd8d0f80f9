#include "megatrain/train/update.h"

#include <cmath>
#include <vector>

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

// ZeRO-2 over the dp group of the device mesh; its host scalars go over the host mesh's dp group. With expert
// parallelism a second instance takes the expert tensors over the expert-dp group (parallel/data_parallel.h): the
// gradient norm is then the square root of the two instances' squared norms, each counted once.
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
    if (topo.shape.ep == 1) {
      ddp_ = std::make_unique<DataParallel>(*stack.model, topo.device_mesh->dp(), *topo.ops, cfg.optim, o);
      return;
    }
    const ParamStore& ps = stack.model->params();
    std::vector<char> experts(ps.size());
    for (size_t i = 0; i < ps.size(); ++i) experts[i] = ps.info(static_cast<int>(i)).shard.ep_sharded();
    o.install_hooks = false;
    o.tensors.resize(ps.size());
    for (size_t i = 0; i < ps.size(); ++i) o.tensors[i] = !experts[i];
    ddp_ = std::make_unique<DataParallel>(*stack.model, topo.device_mesh->dp(), *topo.ops, cfg.optim, o);
    // The experts: reduced over their replicas (edp), their squared norms (global and LAMB's per tensor) summed over
    // the ep ranks, which hold different experts, and then as the dense ones' (the plan's tp and pp sums, with the
    // same per-tensor weights).
    DataParallelOptions e = o;
    e.tensors = experts;
    e.mean_over = topo.shape.dp;
    e.host = topo.own_device_mesh ? &topo.host_mesh->edp() : nullptr;
    ProcessGroup* host_ep = &topo.host_mesh->ep();
    auto over_ep_then = [host_ep](NormReduce then) -> NormReduce {
      return [host_ep, then](float* v, size_t n) {
        host_ep->allreduce(f32_view(v, {static_cast<int64_t>(n)}))->wait();
        if (then) then(v, n);
      };
    };
    e.norm_reduce = over_ep_then(o.norm_reduce);
    if (o.clip_norm_reduce) e.clip_norm_reduce = over_ep_then(o.clip_norm_reduce);
    expert_ddp_ = std::make_unique<DataParallel>(*stack.model, topo.device_mesh->edp(), *topo.ops, cfg.optim, e);
    GptHooks dense = ddp_->hooks(), expert = expert_ddp_->hooks();
    GptHooks both;
    both.grads_ready = [dense, expert](int first) { dense.grads_ready(first), expert.grads_ready(first); };
    both.before_params_used = [dense, expert](int first, int end) {
      dense.before_params_used(first, end), expert.before_params_used(first, end);
    };
    stack.model->set_hooks(both);
    model_ = stack.model.get();
  }
  ~ShardedUpdate() override {
    if (model_) model_->set_hooks({});
  }
  void begin_last_backward(int chunk) override {
    for (DataParallel* d : instances()) {
      if (chunk < 0)
        d->begin_last_backward();
      else
        d->begin_last_backward(chunk);
    }
  }
  double finish_gradients(float& loss) override {
    double ss = 0;
    for (DataParallel* d : instances()) {
      const double n = d->finish_gradients();
      ss += n * n;
    }
    host_dp_.allreduce(f32_view(&loss, {1}))->wait();
    loss /= static_cast<float>(host_dp_.size());
    return std::sqrt(ss);
  }
  void step(float lr, float grad_scale, int step) override {
    for (DataParallel* d : instances()) d->step(lr, grad_scale, step);
  }
  void sync_params() override {
    for (DataParallel* d : instances()) d->sync_params();
  }
  void set_before_reduce(std::function<void(size_t, size_t)> f) override {
    for (DataParallel* d : instances()) d->set_before_reduce(f);
  }
  CommTime take_comm_time() override {
    CommTime t;
    for (DataParallel* d : instances()) t += d->take_comm_time();
    return t;
  }
  DataParallel* data_parallel() override { return ddp_.get(); }
  DataParallel* expert_data_parallel() override { return expert_ddp_.get(); }

 private:
  std::vector<DataParallel*> instances() {
    if (expert_ddp_) return {ddp_.get(), expert_ddp_.get()};
    return {ddp_.get()};
  }

  ProcessGroup& host_dp_;
  std::unique_ptr<DataParallel> ddp_, expert_ddp_;
  GPT* model_ = nullptr;  // set when this update installed the model's hooks (expert parallelism)
};

}  // namespace

std::unique_ptr<Update> make_update(const RunConfig& cfg, Topology& topo, ModelStack& stack) {
  if (topo.shape.dp > 1) return std::make_unique<ShardedUpdate>(cfg, topo, stack);
  return std::make_unique<PlainUpdate>(cfg, *topo.ops, stack);
}

}  // namespace mt
