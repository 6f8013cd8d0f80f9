#include "megatrain/train/host_mirror.h"

namespace mt {

HostMirror::HostMirror(GPT& device_model, Optimizer* device_opt, const OptimConfig& ocfg, size_t pad_multiple)
    : cpu_(make_cpu_ops()), dev_(device_model), dev_opt_(device_opt),
      // The tp comm gives the host model its shard layout only: the host model never runs forward or backward.
      host_(device_model.config(), *cpu_, pad_multiple, device_model.tp_comm(), device_model.part()) {
  if (dev_opt_) host_opt_ = std::make_unique<Optimizer>(ocfg, host_.params(), *cpu_);
  MT_CHECK(host_.params().size() == dev_.params().size() &&
               host_.params().total_floats() == dev_.params().total_floats(),
           "HostMirror: the host model has {} tensors in {} floats, the device {} in {}", host_.params().size(),
           host_.params().total_floats(), dev_.params().size(), dev_.params().total_floats());
}

void HostMirror::pull() {
  Ops& ops = dev_.ops();
  for (int i = 0; i < static_cast<int>(dev_.params().size()); ++i) {
    ops.to_host(host_.params().param(i).ptr, dev_.params().param(i));
    if (!dev_opt_) continue;
    ops.to_host(host_opt_->m(i).ptr, dev_opt_->m(i));
    ops.to_host(host_opt_->v(i).ptr, dev_opt_->v(i));
  }
}

void HostMirror::push() {
  Ops& ops = dev_.ops();
  for (int i = 0; i < static_cast<int>(dev_.params().size()); ++i) {
    ops.to_device(dev_.params().param(i), host_.params().param(i).ptr);
    if (!dev_opt_) continue;
    ops.to_device(dev_opt_->m(i), host_opt_->m(i).ptr);
    ops.to_device(dev_opt_->v(i), host_opt_->v(i).ptr);
  }
  dev_.params().refresh_weights(ops);
}

}  // namespace mt
