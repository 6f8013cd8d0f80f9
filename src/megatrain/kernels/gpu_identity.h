// Which physical GPU a CUDA device index is: its PCI bus id, the key that NVML (the driver's management library)
// and CUDA agree on whatever CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER renumber. Apart from ops.h so that adding
// it rebuilt no kernel.
#pragma once
#include <string>

namespace mt {

// "0000:3B:00.0" for CUDA device `device`; "" without CUDA or that device.
std::string cuda_pci_bus_id(int device);

}  // namespace mt
