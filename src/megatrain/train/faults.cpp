#include "megatrain/train/faults.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "megatrain/comm/flight_recorder.h"
#include "megatrain/core/error.h"
#include "megatrain/model/gpt.h"
#include "megatrain/train/heartbeat.h"

namespace mt {

bool fault_badnode(int node) {
  const int attempt = attempt_from_env();
  for (const Fault& f : faults_from_env())
    if (f.kind == FaultKind::BadNode && f.node == node && f.fires_in(attempt)) return true;
  return false;
}

namespace {

// A block's first parameter: every pipeline stage holds a block, and each block parameter enters every row's
// forward (an embedding row would only matter where its token occurs).
int fault_victim_param(const ParamStore& p) {
  for (size_t i = 0; i < p.size(); ++i)
    if (p.info(static_cast<int>(i)).name.rfind("h.", 0) == 0) return static_cast<int>(i);
  return 0;
}

// sdcgrad's victim: fault_victim_param's choice among the tensors whose gradient no tp sum touches (under tp a
// replicated tensor's gradient is summed over tp in place during the backward, so a corruption there would be every
// tp peer's; the first sharded block parameter instead).
int grad_fault_victim_param(const GPT& model) {
  const ParamStore& p = model.params();
  for (size_t i = 0; i < p.size(); ++i) {
    const ParamInfo& info = p.info(static_cast<int>(i));
    if (info.name.rfind("h.", 0) == 0 && (model.tp_size() == 1 || info.shard.tp_sharded())) return static_cast<int>(i);
  }
  return fault_victim_param(p);
}

}  // namespace

struct FaultInjector::Shared {
  std::atomic<int> step{0};
  int hang_step = 0;  // 0: no hang for this rank in this attempt
  std::string hang_item;
  int rank = 0, attempt = 0;
  std::atomic<bool> hung{false};
};

FaultInjector::FaultInjector(const std::vector<Fault>& faults, int rank, int attempt)
    : all_(faults), rank_(rank), attempt_(attempt), shared_(std::make_shared<Shared>()) {
  shared_->rank = rank;
  shared_->attempt = attempt;
  for (const Fault& f : faults) {
    if (f.kind == FaultKind::BadNode || f.rank != rank || !f.fires_in(attempt)) continue;
    mine_.push_back(f);
    if (f.kind == FaultKind::Hang && (shared_->hang_step == 0 || f.step < shared_->hang_step)) {
      shared_->hang_step = f.step;
      shared_->hang_item = f.item;
    }
  }
  if (shared_->hang_step > 0) {
    std::shared_ptr<Shared> sh = shared_;
    flight_recorder().set_enter_hook([sh](const std::string& group, const FlightEntry& e) {
      const int step = sh->step.load();
      if (step < sh->hang_step) return;
      // The first op to enter announces it; it and every op of this process entering after it block for good
      // (a stuck device blocks them all).
      if (!sh->hung.exchange(true)) {
        heartbeat_event("fault_injected",
                        {{"fault", sh->hang_item},
                         {"kind", "hang"},
                         {"step", step},
                         {"attempt", sh->attempt},
                         {"group", group},
                         {"op", e.op},
                         {"seq", e.seq}},
                        true);
        std::fprintf(stderr, "fault injected: %s (rank %d, step %d, attempt %d): blocking in %s #%lld of group %s\n",
                     sh->hang_item.c_str(), sh->rank, step, sh->attempt, e.op.c_str(), static_cast<long long>(e.seq),
                     group.c_str());
        std::fflush(stderr);
      }
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    });
  }
}

FaultInjector::~FaultInjector() {
  if (shared_->hang_step > 0) flight_recorder().set_enter_hook(nullptr);
}

void FaultInjector::check_world(int world_size) const {
  // Only the faults of this attempt: a job that shrank after attempt 0 may no longer have the rank one named.
  for (const Fault& f : all_)
    if (f.kind != FaultKind::BadNode && f.fires_in(attempt_) && f.rank >= world_size)
      fail_as(ErrorKind::Config, "MEGATRAIN_FAULTS item '{}': rank {} is outside the world of {} ranks", f.item, f.rank,
              world_size);
}

void FaultInjector::fired(const Fault& f, int step) {
  heartbeat_event("fault_injected",
                  {{"fault", f.item}, {"kind", fault_kind_name(f.kind)}, {"step", step}, {"attempt", attempt_}}, true);
  std::fflush(stdout);
  std::fprintf(stderr, "fault injected: %s (rank %d, step %d, attempt %d)\n", f.item.c_str(), rank_, step, attempt_);
  std::fflush(stderr);
}

void FaultInjector::begin_step(int step, GPT& model) {
  shared_->step = step;
  slept_ = 0;
  for (const Fault& f : mine_) {
    switch (f.kind) {
      case FaultKind::Crash:
        if (step == f.step) {
          fired(f, step);
          ::raise(SIGKILL);
        }
        break;
      case FaultKind::Nan:
        if (step == f.step) {
          fired(f, step);
          ParamStore& p = model.params();
          const int victim = fault_victim_param(p);
          model.ops().scale(p.param(victim), NAN);
          p.refresh_weights(model.ops());
        }
        break;
      case FaultKind::Slow:
        if (step >= f.step) {
          if (!slow_announced_) {
            slow_announced_ = true;
            fired(f, step);
          }
          slept_ = (f.factor - 1) * base_compute_;
          if (slept_ > 0) std::this_thread::sleep_for(std::chrono::duration<double>(slept_));
        }
        break;
      case FaultKind::BitFlip:  // fires in after_update
      case FaultKind::SdcGrad:  // fires in before_reduce
      case FaultKind::Hang:     // fires in the enter hook
      case FaultKind::BadNode:
      case FaultKind::Stage2Delay:  // fire elsewhere (faults.h)
      case FaultKind::KillAfterSnapshot:
      case FaultKind::ClockSkew:
      case FaultKind::SlowBurst: break;  // fires in the coded forward/backward (train/coded_forward_backward.h)
    }
  }
}

void FaultInjector::after_update(int step, GPT& model, const std::function<void()>& settle) {
  for (const Fault& f : mine_) {
    if (f.kind != FaultKind::BitFlip || step != f.step) continue;
    settle();  // the update's parameter traffic lands first (ZeRO-2's all-gather would overwrite the flip)
    fired(f, step);
    // Bit 16 of element 0: a mantissa bit (a relative change of 2^-7), so the run goes on plausibly, as a real
    // corruption would, with nothing but the replicas' comparison to tell. Through the backend's memory, as the
    // optimizer writes it (a device model: copied out, flipped, copied back), then the compute copy re-derived.
    ParamStore& p = model.params();
    Tensor w = p.param(fault_victim_param(p));
    const Tensor first = w.view({w.numel()}).slice0(0, 1);
    float x;
    model.ops().to_host(&x, first);
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    bits ^= 1u << 16;
    std::memcpy(&x, &bits, sizeof bits);
    model.ops().to_device(first, &x);
    p.refresh_weights(model.ops());
  }
}

void FaultInjector::before_reduce(GPT& model, size_t begin, size_t end) {
  const int step = shared_->step.load();
  for (const Fault& f : mine_) {
    if (f.kind != FaultKind::SdcGrad || step != f.step || sdcgrad_fired_step_ == step) continue;
    ParamStore& p = model.params();
    const int victim = grad_fault_victim_param(model);
    const size_t at = p.info(victim).offset;
    if (at < begin || at >= end) continue;  // another bucket: its own reduction comes
    sdcgrad_fired_step_ = step;
    fired(f, step);
    // x 2^20: exact (a power of two), large enough that the global gradient norm jumps, and in the backend's memory
    // on its stream, so the reduction launched next reads it.
    Tensor g = p.grad(victim);
    model.ops().scale(g.view({g.numel()}).slice0(0, 1), 1048576.0f);
  }
}

void FaultInjector::step_compute(double seconds) { base_compute_ = std::max(0.0, seconds - slept_); }

}  // namespace mt
