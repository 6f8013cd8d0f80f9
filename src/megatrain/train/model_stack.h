// The model stack builder: this rank's part of the model and what it needs to run in the layout: the tp and ep comms, the
// GPT (the whole model, or this pp rank's stages), the pipeline schedule, the tied-embedding group, and the plan
// by which gradient norms are summed over tp and pp.
#pragma once
#include <memory>

#include "megatrain/model/gpt.h"
#include "megatrain/parallel/expert_parallel.h"
#include "megatrain/parallel/norm_plan.h"
#include "megatrain/parallel/schedule.h"
#include "megatrain/parallel/tensor_parallel.h"
#include "megatrain/train/run_config.h"
#include "megatrain/train/topology.h"

namespace mt {

struct ModelStack {
  std::unique_ptr<ProcessGroupTpComm> tp_comm;  // tp > 1: the model calls its tp group through it
  std::unique_ptr<ProcessGroupEpComm> ep_comm;  // ep > 1: the MoE layers call their ep group through it
  std::unique_ptr<GPT> model;                   // with pp, the virtual stages c*pp + pp_rank (GptPart)
  Schedule schedule;                            // pp > 1: 1F1B or interleaved 1F1B
  int microbatches = 1;                         // pipeline micro-batches per step (1 without pp)
  // Tied embeddings with pp: the first and last stage each hold wte; their gradients are summed over this group
  // before the update, so both copies take identical steps. wte_copy: the last stage's copy's parameter index.
  std::unique_ptr<ProcessGroup> embedding_group;
  int wte_copy = -1;
  NormPlan norms;
};

ModelStack build_model_stack(const RunConfig& cfg, Topology& topo);

}  // namespace mt
