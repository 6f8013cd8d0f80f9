// Without the CUDA backend in the build, asking for it fails with a message saying why.
#ifndef MT_HAVE_CUDA
#include "megatrain/kernels/gpu_identity.h"
#include "megatrain/kernels/ops.h"

namespace mt {

std::unique_ptr<Ops> make_cuda_ops(int, const CudaOptions&) {
  fail("this megatrain was built without CUDA (nvcc was not found at configure time); rebuild with "
       "/usr/local/cuda present or pick the CPU backend");
}

bool cuda_available() { return false; }

int cuda_device_count() { return 0; }

std::string cuda_versions() { return "not built with CUDA (nvcc was not found at configure time)"; }

std::pair<double, double> cuda_host_link_gbps(int, size_t) { return {0, 0}; }

std::string cuda_pci_bus_id(int) { return ""; }

std::string resolve_cuda_attention(const std::string& attention) { return attention == "auto" ? "flash" : attention; }

}  // namespace mt
#endif
