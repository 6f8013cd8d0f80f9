#include <cblas.h>

#include <string>

#include "megatrain/kernels/ops.h"

namespace mt {

std::string blas_version() {
  const char* config = openblas_get_config();
  const char* core = openblas_get_corename();
  return std::string(config ? config : "OpenBLAS (no config string)") + " (core " + (core ? core : "unknown") + ")";
}

}  // namespace mt
