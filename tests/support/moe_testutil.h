// The MoE layer tests' parameter store: layer 0's MoE tensors under the names and shapes declare_gpt_params gives
// them (model/moe.h), the experts as ep rank `rank` of `ep` holds them (ep = 1: all, plain shapes).
#pragma once
#include <cstdint>

#include "megatrain/model/config.h"
#include "megatrain/model/params.h"
#include "megatrain/model/shard.h"

namespace mt::test {

// Declares (does not allocate) layer 0's router, its bias (sigmoid_bias), the routed experts and the shared ones.
inline void declare_moe_layer0(const ModelConfig& c, ParamStore& ps, int ep = 1, int rank = 0) {
  const int64_t C = c.d_model, E = c.moe_experts, F = c.moe_d_ff, SF = int64_t{c.moe_shared_experts} * F;
  ps.add("h.0.moe.router.weight", {E, C}, true);
  if (c.moe_router == MoeRouter::SigmoidBias) ps.add("h.0.moe.router.bias", {E}, false);
  if (ep == 1) {
    ps.add("h.0.moe.experts.c_fc.weight", {E, 2 * F, C}, true);
    ps.add("h.0.moe.experts.c_proj.weight", {E, C, F}, true);
  } else {
    ps.add("h.0.moe.experts.c_fc.weight", expert_spec({E, 2 * F, C}, ep, rank, "c_fc"), true);
    ps.add("h.0.moe.experts.c_proj.weight", expert_spec({E, C, F}, ep, rank, "c_proj"), true);
  }
  if (SF > 0) {
    ps.add("h.0.moe.shared.c_fc.weight", {2 * SF, C}, true);
    ps.add("h.0.moe.shared.c_proj.weight", {C, SF}, true);
  }
}

}  // namespace mt::test
