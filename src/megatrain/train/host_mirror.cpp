#include "megatrain/train/host_mirror.h"

namespace mt {

HostMirror::HostMirror(GPT& device_model, Optimizer& device_opt, const OptimConfig& ocfg)
    : cpu_(make_cpu_ops()),
      dev_(device_model),
      dev_opt_(device_opt),
      host_(device_model.config(), *cpu_),
      host_opt_(ocfg, host_.params(), *cpu_) {
  MT_CHECK(device_model.part().whole() && device_model.tp_size() == 1,
           "HostMirror: the device model must be whole (no tensor or pipeline parallelism)");
  MT_CHECK(host_.params().size() == dev_.params().size(), "HostMirror: the host model has {} tensors, the device {}",
           host_.params().size(), dev_.params().size());
}

void HostMirror::pull() {
  Ops& ops = dev_.ops();
  for (int i = 0; i < static_cast<int>(dev_.params().size()); ++i) {
    ops.to_host(host_.params().param(i).ptr, dev_.params().param(i));
    ops.to_host(host_opt_.m(i).ptr, dev_opt_.m(i));
    ops.to_host(host_opt_.v(i).ptr, dev_opt_.v(i));
  }
}

void HostMirror::push() {
  Ops& ops = dev_.ops();
  for (int i = 0; i < static_cast<int>(dev_.params().size()); ++i) {
    ops.to_device(dev_.params().param(i), host_.params().param(i).ptr);
    ops.to_device(dev_opt_.m(i), host_opt_.m(i).ptr);
    ops.to_device(dev_opt_.v(i), host_opt_.v(i).ptr);
  }
  dev_.params().refresh_weights(ops);
}

}  // namespace mt
