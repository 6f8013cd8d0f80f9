// The MoE router's kinds (model.moe_router), here below the model so that the kernels' routing (cpu/moe.h) and the
// model's config (model/config.h) share one enum; spellings and parsing as every kind (core/kind.h).
#pragma once
#include <array>

namespace mt {

// softmax: softmax over the experts, top-k, gates renormalised over the k (Mixtral, Qwen).
// sigmoid_bias: sigmoid scores, top-k of score + a balancing bias, gates the chosen scores normalised (DeepSeek-V3).
enum class MoeRouter { Softmax, SigmoidBias };  // "softmax" | "sigmoid_bias"
inline constexpr std::array<const char*, 2> kMoeRouterNames = {"softmax", "sigmoid_bias"};
inline const std::array<const char*, 2>& kind_names(MoeRouter) { return kMoeRouterNames; }

}  // namespace mt
