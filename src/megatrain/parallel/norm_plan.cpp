#include "megatrain/parallel/norm_plan.h"

#include "megatrain/parallel/tensor_parallel.h"

namespace mt {

double NormPlan::global_norm(Ops& ops, const ParamStore& params) const {
  if (clip_reduce) return global_grad_norm(ops, params, clip_weights, clip_reduce);
  if (tensor_reduce) return global_grad_norm(ops, params, tensor_weights, tensor_reduce);
  return global_grad_norm(ops, params);  // one reduction over the flat buffer: the single-rank fast path
}

NormPlan make_norm_plan(const ParamStore& params, ProcessGroup* tp_group, ProcessGroup* pp_group, int wte_copy) {
  NormPlan plan;
  const int tp = tp_group ? tp_group->size() : 1, pp = pp_group ? pp_group->size() : 1;
  if (tp > 1) {
    plan.tensor_weights = tp_norm_weights(params, tp_group->rank());
    plan.tensor_reduce = [tp_group](float* d, size_t n) {
      tp_group->allreduce(f32_view(d, {static_cast<int64_t>(n)}))->wait();
    };
  }
  if (pp > 1) {
    plan.clip_weights = tp > 1 ? plan.tensor_weights : std::vector<float>(params.size(), 1.0f);
    if (wte_copy >= 0) plan.clip_weights[wte_copy] = 0;
    plan.clip_reduce = [tp_group, pp_group, tp](float* d, size_t n) {
      Tensor t = f32_view(d, {static_cast<int64_t>(n)});
      if (tp > 1) tp_group->allreduce(t)->wait();
      pp_group->allreduce(t)->wait();
    };
  }
  return plan;
}

}  // namespace mt
