// Optimizers over a ParamStore: AdamW and LAMB with fp32 state (m, v) laid out like the parameters, global
// gradient-norm clipping, and the learning-rate schedule.
#pragma once
#include <array>
#include <functional>
#include <string>
#include <vector>

#include "megatrain/core/buffer.h"
#include "megatrain/core/kind.h"
#include "megatrain/kernels/ops.h"
#include "megatrain/model/params.h"

namespace mt {

// The optimizer and the learning-rate schedule after warm-up (spelt as in optim.name and optim.schedule).
enum class OptimizerKind { AdamW, Lamb };            // "adamw" | "lamb"
enum class LrSchedule { Cosine, Linear, Constant };  // "cosine" | "linear" | "constant"
inline constexpr std::array<const char*, 2> kOptimizerNames = {"adamw", "lamb"};
inline constexpr std::array<const char*, 3> kLrScheduleNames = {"cosine", "linear", "constant"};
inline const std::array<const char*, 2>& kind_names(OptimizerKind) { return kOptimizerNames; }
inline const std::array<const char*, 3>& kind_names(LrSchedule) { return kLrScheduleNames; }

struct OptimConfig {
  OptimizerKind name = OptimizerKind::AdamW;
  float lr = 6e-4f;                          // peak learning rate
  float min_lr = 0.0f;                       // floor of the decay
  LrSchedule schedule = LrSchedule::Cosine;  // after warmup
  int warmup_steps = 0;
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.1f;  // decoupled; applied only to tensors marked decay (matrices, embeddings)
  float grad_clip = 1.0f;     // max global L2 norm; 0 disables
  void validate() const;
};

// Learning rate at 1-based step `step` of `total_steps`: linear warmup from lr/warmup to lr, then decay to min_lr.
float lr_at(const OptimConfig& c, int step, int total_steps);

// The per-tensor hyperparameters of one AdamW/LAMB update (weight decay only where the tensor decays).
AdamHParams adam_hparams(const OptimConfig& c, bool decay, float lr, float grad_scale, int step);

// sqrt(sum over all gradients of g^2).
double global_grad_norm(Ops& ops, const ParamStore& params);

// Sums of squares spread over processes (tensor parallelism): weights[i] scales tensor i's squared norm before
// `reduce` (an in-place sum over the other processes holding parts of the model) is applied. A sharded tensor
// has weight 1 everywhere; a replicated one 1 on exactly one rank, 0 elsewhere.
using NormReduce = std::function<void(float* data, size_t n)>;
double global_grad_norm(Ops& ops, const ParamStore& params, const std::vector<float>& weights,
                        const NormReduce& reduce);

class Optimizer {
 public:
  Optimizer(const OptimConfig& cfg, const ParamStore& params, Ops& ops);

  // One update of every parameter from its gradient times grad_scale. `step` is 1-based (bias correction).
  void step(ParamStore& params, float lr, float grad_scale, int step);

  const OptimConfig& config() const { return cfg_; }
  // State tensors, same shapes as parameter i (for checkpoints).
  Tensor m(int i) const;
  Tensor v(int i) const;
  // Tensor parallelism: LAMB's per-tensor ||w||^2 and ||u||^2 are weighted and reduced as in global_grad_norm.
  void set_norm_reduce(std::vector<float> weights, NormReduce reduce);
  // Per-tensor LAMB trust ratios of the last step (empty for AdamW and before the first step), for diagnostics and
  // tests: recomputed from the last step's norms, which this copies to the host (a device synchronisation on a GPU).
  std::vector<float> last_trust() const;

 private:
  void lamb_step(ParamStore& params, float lr, float grad_scale, int step);
  Tensor norms() const;

  OptimConfig cfg_;
  const ParamStore& params_;
  Ops& ops_;
  Buffer m_, v_;                       // on the backend's device, laid out like the parameters
  std::vector<AdamSegment> segments_;  // every tensor's flat range and weight decay, one multi-tensor call per step
  // LAMB: norms_ holds [||w_i||^2, ||u_i||^2] per tensor (F32 [2 * tensors] on the device) from lamb_moments_multi to
  // lamb_apply_multi; norms_host_ is where the reduced path (set_norm_reduce) sums them over the processes.
  Buffer norms_;
  std::vector<float> norms_host_;
  bool lamb_stepped_ = false;  // norms_ holds a step's norms (for last_trust)
  std::vector<float> norm_weights_;
  NormReduce norm_reduce_;
};

}  // namespace mt
