#include "megatrain/optim/optimizer.h"

#include <cmath>

#include "megatrain/core/error.h"

namespace mt {

void OptimConfig::validate() const {
  // name and schedule are enums, checked where their spelling was parsed (parse_kind).
  // Every real-valued hyperparameter must be finite: an inf weight decay or learning rate turns the weights into
  // inf/NaN in the first step (and NaN fails every comparison below, so it is named explicitly).
  auto check = [](const char* key, float v, bool ok, const char* range) {
    MT_CHECK(std::isfinite(v) && ok, "optim.{} = {} is out of range: it must be {}", key, v, range);
  };
  check("lr", lr, lr > 0, "finite and > 0");
  check("min_lr", min_lr, min_lr >= 0 && min_lr <= lr, "finite and in [0, optim.lr]");
  MT_CHECK(warmup_steps >= 0, "optim.warmup_steps = {} is out of range: it must be >= 0", warmup_steps);
  check("beta1", beta1, beta1 >= 0 && beta1 < 1, "in [0, 1)");
  check("beta2", beta2, beta2 >= 0 && beta2 < 1, "in [0, 1)");
  check("eps", eps, eps > 0, "finite and > 0");
  check("weight_decay", weight_decay, weight_decay >= 0, "finite and >= 0");
  check("grad_clip", grad_clip, grad_clip >= 0, "finite and >= 0 (0 disables clipping)");
}

float lr_at(const OptimConfig& c, int step, int total_steps) {
  if (c.warmup_steps > 0 && step <= c.warmup_steps) return c.lr * static_cast<float>(step) / c.warmup_steps;
  if (c.schedule == LrSchedule::Constant || total_steps <= c.warmup_steps) return c.lr;
  double progress = static_cast<double>(step - c.warmup_steps) / static_cast<double>(total_steps - c.warmup_steps);
  progress = std::min(1.0, std::max(0.0, progress));
  double frac = c.schedule == LrSchedule::Cosine ? 0.5 * (1.0 + std::cos(M_PI * progress)) : 1.0 - progress;
  return static_cast<float>(c.min_lr + (c.lr - c.min_lr) * frac);
}

double global_grad_norm(Ops& ops, const ParamStore& params) {
  // One reduction over the flat gradient buffer (the padding between tensors is never written, so it stays zero):
  // a single launch and a single device-to-host read per step on a GPU instead of one per tensor.
  if (params.size() == 0) return 0;
  Tensor all(params.grads_data(), {static_cast<int64_t>(params.total_floats())}, DType::F32, params.device());
  return std::sqrt(ops.sum_squares(all));
}

double global_grad_norm(Ops& ops, const ParamStore& params, const std::vector<float>& weights,
                        const NormReduce& reduce) {
  MT_CHECK(weights.size() == params.size(), "global_grad_norm: {} weights for {} tensors", weights.size(),
           params.size());
  double ss = 0;
  for (size_t i = 0; i < params.size(); ++i)
    if (weights[i] != 0) ss += weights[i] * ops.sum_squares(params.grad(static_cast<int>(i)));
  float buf = static_cast<float>(ss);
  if (reduce) reduce(&buf, 1);
  return std::sqrt(static_cast<double>(buf));
}

void Optimizer::set_norm_reduce(std::vector<float> weights, NormReduce reduce) {
  MT_CHECK(weights.size() == params_.size(), "Optimizer::set_norm_reduce: {} weights for {} tensors", weights.size(),
           params_.size());
  norm_weights_ = std::move(weights);
  norm_reduce_ = std::move(reduce);
}

Optimizer::Optimizer(const OptimConfig& cfg, const ParamStore& params, Ops& ops)
    : cfg_(cfg), params_(params), ops_(ops) {
  cfg_.validate();
  // The moments live beside the master weights (device memory on CUDA), zero-initialised.
  m_ = ops.alloc(params.total_floats() * sizeof(float));
  v_ = ops.alloc(params.total_floats() * sizeof(float));
  for (const ParamInfo& p : params.infos())
    segments_.push_back({static_cast<int64_t>(p.offset), static_cast<int64_t>(p.numel),
                         p.decay ? cfg_.weight_decay : 0.0f});
  if (cfg_.name == OptimizerKind::Lamb) {
    norms_ = ops.alloc(2 * segments_.size() * sizeof(float));
    norms_host_.assign(2 * segments_.size(), 0.0f);
  }
}

AdamHParams adam_hparams(const OptimConfig& c, bool decay, float lr, float grad_scale, int step) {
  AdamHParams h;
  h.lr = lr;
  h.beta1 = c.beta1;
  h.beta2 = c.beta2;
  h.eps = c.eps;
  h.weight_decay = decay ? c.weight_decay : 0.0f;
  h.step = step;
  h.grad_scale = grad_scale;
  return h;
}

Tensor Optimizer::norms() const {
  return Tensor(norms_.data(), {static_cast<int64_t>(2 * segments_.size())}, DType::F32, norms_.device());
}

// LAMB over every tensor in two multi-tensor calls (no host synchronisation in between unless the norms must be
// reduced over processes): the moments and each tensor's ||w||^2 and ||u||^2 into norms_, then the updates scaled by
// the trust ratios ||w|| / ||u|| (1 where either norm is zero; You et al., 2020). Under tensor parallelism the
// tensors are split over processes: the weighted norms are summed over them between the two passes.
void Optimizer::lamb_step(ParamStore& params, float lr, float grad_scale, int step) {
  const int64_t n = static_cast<int64_t>(params.total_floats());
  auto flat = [&](void* p) { return Tensor(p, {n}, DType::F32, params.device()); };
  const AdamHParams h = adam_hparams(cfg_, false, lr, grad_scale, step);  // weight decay: per segment
  ops_.lamb_moments_multi(flat(params.params_data()), flat(params.grads_data()), flat(m_.data()), flat(v_.data()),
                          segments_, h, norms());
  if (norm_reduce_) {
    ops_.to_host(norms_host_.data(), norms());
    for (size_t k = 0; k < segments_.size(); ++k) {
      const double w = norm_weights_[k];
      norms_host_[2 * k] = static_cast<float>(w * norms_host_[2 * k]);
      norms_host_[2 * k + 1] = static_cast<float>(w * norms_host_[2 * k + 1]);
    }
    norm_reduce_(norms_host_.data(), norms_host_.size());
    ops_.to_device(norms(), norms_host_.data());
  }
  ops_.lamb_apply_multi(flat(params.params_data()), flat(m_.data()), flat(v_.data()), segments_, h, norms());
  lamb_stepped_ = true;
  params.refresh_weights(ops_);  // the compute copy (bf16 on CUDA) follows the updated master weights
}

std::vector<float> Optimizer::last_trust() const {
  if (!lamb_stepped_) return {};
  std::vector<float> host(2 * segments_.size()), trust(segments_.size());
  ops_.to_host(host.data(), norms());
  for (size_t k = 0; k < trust.size(); ++k) trust[k] = lamb_trust(host[2 * k], host[2 * k + 1]);
  return trust;
}

static Tensor state_view(const Buffer& b, const ParamInfo& p) {
  Tensor t;
  t.ptr = static_cast<float*>(b.data()) + p.offset;
  t.device = b.device();
  t.ndim = static_cast<int>(p.shape.size());
  for (int d = 0; d < t.ndim; ++d) t.dims[d] = p.shape[d];
  return t;
}

Tensor Optimizer::m(int i) const { return state_view(m_, params_.info(i)); }
Tensor Optimizer::v(int i) const { return state_view(v_, params_.info(i)); }

void Optimizer::step(ParamStore& params, float lr, float grad_scale, int step) {
  MT_CHECK(step >= 1, "optimizer step must be >= 1 (got {})", step);
  if (cfg_.name == OptimizerKind::Lamb) return lamb_step(params, lr, grad_scale, step);
  // AdamW: every tensor in one multi-tensor call over the flat buffers (each segment with its own weight decay),
  // which also rewrites the compute copy (bf16 on CUDA) from the updated weights: the segments are every tensor,
  // and the padding between them never changes, so the copy ends up as refresh_weights() would leave it.
  const int64_t n = static_cast<int64_t>(params.total_floats());
  auto flat = [&](void* p) { return Tensor(p, {n}, DType::F32, params.device()); };
  ops_.adamw_update_multi(flat(params.params_data()), flat(params.grads_data()), flat(m_.data()), flat(v_.data()),
                          segments_, adam_hparams(cfg_, false, lr, grad_scale, step), params.compute_flat());
}

}  // namespace mt
