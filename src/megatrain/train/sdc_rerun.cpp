#include "megatrain/train/sdc_rerun.h"

#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "megatrain/comm/agreement.h"
#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"
#include "megatrain/core/fault_spec.h"
#include "megatrain/model/gpt.h"
#include "megatrain/obs/timeline.h"
#include "megatrain/train/heartbeat.h"
#include "megatrain/train/sdc_verdict.h"

namespace mt {

namespace {

std::string rerun_hex(uint64_t h) { return fmt::format("{:016x}", h); }

}  // namespace

SdcRerun::SdcRerun(const RunConfig& cfg, Topology& topo, ModelStack& stack, ForwardBackward& fb, Update& update)
    : cfg_(cfg), topo_(topo), stack_(stack), fb_(fb), update_(update),
      on_(cfg.train.sdc_rerun_on_spike && (topo.ops->device() == Device::CPU || cfg.train.deterministic)),
      loss_spikes_(SpikeRule{cfg.train.spike_window, cfg.train.spike_sigmas, cfg.train.spike_factor}),
      norm_spikes_(SpikeRule{cfg.train.spike_window, cfg.train.spike_sigmas, cfg.train.spike_factor}) {
  if (cfg.train.sdc_rerun_on_spike && !on_ && topo.main_rank) {
    std::fflush(stdout);
    std::fprintf(stderr,
                 "note: train.sdc_rerun_on_spike is off in this run: a GPU run repeats its gradients bit for bit "
                 "only with train.deterministic = true, and the rerun's comparison needs that\n");
    std::fflush(stderr);
  }
  const GPT& model = *stack.model;
  const ParamStore& p = model.params();
  compared_.assign(p.size(), 1);
  for (size_t i = 0; i < p.size(); ++i) {
    const ParamInfo& info = p.info(static_cast<int>(i));
    const bool tp_summed = model.tp_size() > 1 && !info.shard.tp_sharded();
    const bool stages_summed = stack.embedding_group && info.name == "wte.weight";
    if (tp_summed || stages_summed) compared_[i] = 0;
  }
}

std::vector<uint64_t> SdcRerun::gradient_hashes() {
  GPT& model = *stack_.model;
  ParamStore& p = model.params();
  std::vector<uint64_t> h(p.size(), 0);
  for (size_t i = 0; i < p.size(); ++i) {
    if (!compared_[i]) continue;
    const ParamInfo& info = p.info(static_cast<int>(i));
    const float* data = p.grads_data() + info.offset;
    if (p.device() != Device::CPU) {
      host_.resize(info.numel);
      model.ops().to_host(host_.data(), p.grad(static_cast<int>(i)));
      data = host_.data();
    }
    h[i] = param_hash(data, info.numel);
  }
  return h;
}

void SdcRerun::after_gradients(int step, float loss, double norm) {
  if (!on_) return;
  // Both detectors see every step (neither short-circuits the other), so their windows stay the steps' values.
  const bool loss_spike = loss_spikes_.observe(loss).has_value();
  const bool norm_spike = norm_spikes_.observe(norm).has_value();
  if (!Agreement(topo_.host_mesh.get()).any_rank(loss_spike || norm_spike)) return;
  rerun(step, loss, norm, loss_spike ? "loss" : norm_spike ? "grad_norm" : "another rank's");
}

void SdcRerun::rerun(int step, float loss, double norm, const std::string& trigger) {
  obs::ScopedSpan phase("phase", "sdc rerun");
  const double t0 = now_seconds();
  ++reruns_;
  GPT& model = *stack_.model;
  const std::vector<uint64_t> first = gradient_hashes();
  model.params().begin_grads();
  float loss2 = fb_.rerun(update_);
  const double norm2 = update_.finish_gradients(loss2);
  const std::vector<uint64_t> again = gradient_hashes();
  const RerunVerdict v = judge_rerun(first, again);
  const std::vector<int> bad = Agreement(topo_.host_mesh.get()).which_ranks(!v.reproduced);
  seconds_ += now_seconds() - t0;
  if (!v.reproduced) {
    const std::string tensor = model.params().info(v.first_differing).name;
    heartbeat_event("sdc",
                    {{"step", step},
                     {"tensor", tensor},
                     {"transient", true},
                     {"node", node_from_env()},
                     {"trigger", trigger},
                     {"first", rerun_hex(first[v.first_differing])},
                     {"rerun", rerun_hex(again[v.first_differing])}},
                    /*sync=*/true);
    const std::string why = fmt::format(
        "rank {} (node {}) did not reproduce its own gradients when step {} ran again on the same data, first in {} "
        "(hash {} against {}): a transient fault",
        topo_.rank_info.rank, node_from_env(), step, tensor, rerun_hex(first[v.first_differing]),
        rerun_hex(again[v.first_differing]));
    std::fprintf(stderr, "silent data corruption detected by the rerun of step %d: %s\n", step, why.c_str());
    std::fflush(stderr);
    fail_as(ErrorKind::Sdc, "step {}: silent data corruption: {}", step, why);
  }
  if (!bad.empty())
    fail_as(ErrorKind::Sdc,
            "step {}: silent data corruption: rank(s) {} did not reproduce their gradients when the step ran again "
            "(their errors name the tensors): a transient fault",
            step, fmt::join(bad, ", "));
  // Bit for bit: the floats' bits, not their values (a NaN never equals itself; -0 equals 0).
  if (std::memcmp(&loss, &loss2, sizeof loss) != 0 || std::memcmp(&norm, &norm2, sizeof norm) != 0)
    fail_as(ErrorKind::Sdc,
            "step {}: silent data corruption: every rank reproduced its own gradients, but the rerun's loss {} and "
            "gradient norm {} differ from the first pass's {} and {} (a fault in a gradient summed in place, or in "
            "a reduction)",
            step, loss2, norm2, loss, norm);
  if (topo_.main_rank) {
    heartbeat_event("sdc_rerun",
                    {{"step", step}, {"trigger", trigger}, {"reproduced", true}, {"loss", loss}, {"grad_norm", norm}});
    std::fflush(stdout);
    std::fprintf(stderr,
                 "warning: %s spike at step %d (loss %.6g, gradient norm %.6g): its rerun reproduced every rank's "
                 "gradients bit for bit: not silent data corruption (train.sdc_rerun_on_spike)\n",
                 trigger.c_str(), step, loss, norm);
    std::fflush(stderr);
  }
}

}  // namespace mt
