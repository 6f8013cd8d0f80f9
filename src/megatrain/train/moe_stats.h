// A MoE model's per-layer routing statistics of one step (GPT::take_moe_stats), made whole over the pipeline.
//
// Each pipeline stage counts the MoE layers it holds; the metrics (written by global rank 0, on stage 0) need all
// of them. With tensor parallelism every tp rank already holds its micro-batches' whole counts (model/moe.h shares
// them over tp), and with data parallelism each rank reports its own replica's (docs/moe.md), so only the stages
// are combined: one all-reduce over the pp group of a fixed-size record per layer (a layer lives on one stage,
// the others add zeros, so the sums are exact). Counts travel as two fp32 halves of 24 bits each (exact up to
// 2^48); the losses' sums as fp32 (metrics only).
#pragma once
#include <vector>

#include "megatrain/comm/process_group.h"
#include "megatrain/model/config.h"
#include "megatrain/model/moe.h"

namespace mt {

// Every MoE layer's stats, in layer order, on every rank of pp (collective over pp; pp nullptr or of size 1:
// `mine` itself). mine: this stage's, from GPT::take_moe_stats (empty when no training forward was counted).
std::vector<MoeLayerStats> gather_moe_stats(const ModelConfig& cfg, std::vector<MoeLayerStats> mine, ProcessGroup* pp);

}  // namespace mt
