/* Prints, for tests/CMakeLists.txt, the OpenBLAS core type this machine gets by default and the candidate core
 * types (OPENBLAS_CORETYPE values) whose kernels this CPU can execute, as "native;Haswell;Zen;...". */
#include <stdio.h>

char* openblas_get_corename(void);

int main(void) {
  printf("%s", openblas_get_corename());
#if defined(__x86_64__)
  __builtin_cpu_init();
  const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                     __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                     __builtin_cpu_supports("avx512cd");
  if (avx2) printf(";Haswell;Zen");
  if (avx2 && avx512) printf(";SkylakeX");
  if (__builtin_cpu_supports("avx")) printf(";Sandybridge");
#endif
  printf("\n");
  return 0;
}
