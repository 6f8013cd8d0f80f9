#include <cblas.h>

#include <cstdlib>
#include <string>

#include "megatrain/kernels/cpu/blas_probe.h"
#include "megatrain/kernels/ops.h"

namespace mt {

std::string blas_version() {
  const char* config = openblas_get_config();
  const char* core = openblas_get_corename();
  return std::string(config ? config : "OpenBLAS (no config string)") + " (core " + (core ? core : "unknown") + ")";
}

std::string blas_core_name() {
  const char* core = openblas_get_corename();
  return core ? core : "unknown";
}

CpuFeatures cpu_features() {
  CpuFeatures c;
#if defined(__x86_64__)
  __builtin_cpu_init();
  c.amd = __builtin_cpu_is("amd");
  c.avx = __builtin_cpu_supports("avx");
  c.avx2 = __builtin_cpu_supports("avx2");
  c.fma = __builtin_cpu_supports("fma");
  c.avx512f = __builtin_cpu_supports("avx512f");
  c.avx512cd = __builtin_cpu_supports("avx512cd");
  c.avx512bw = __builtin_cpu_supports("avx512bw");
  c.avx512dq = __builtin_cpu_supports("avx512dq");
  c.avx512vl = __builtin_cpu_supports("avx512vl");
#endif
  return c;
}

std::string blas_core_summary() {
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  const std::string coretype = env ? env : "";
  const char* note = std::getenv(kBlasCoreNoteEnv);
  std::string why = note ? blas_core_note_reason(note, coretype) : "";
  if (why.empty()) why = coretype.empty() ? "OpenBLAS's choice" : "OPENBLAS_CORETYPE=" + coretype + " set by the user";
  return "BLAS core " + blas_core_name() + " (" + why + ")";
}

}  // namespace mt
