#include "megatrain/cli/blas_reexec.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "megatrain/core/error.h"
#include "megatrain/launch/blas_core.h"

namespace mt::cli {

void apply_blas_core(int argc, char** argv) {
  if (launch::blas_core_decided()) return;  // a launcher, or this process before its re-exec, decided
  const BlasCoreDecision d = launch::choose_blas_core();
  for (const std::string& kv : launch::blas_core_env(d)) {
    const size_t eq = kv.find('=');
    ::setenv(kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str(), 1);
  }
  if (d.action != BlasCoreAction::Use) return;
  std::vector<char*> args = {const_cast<char*>("megatrain")};
  for (int i = 0; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  std::fflush(nullptr);
  ::execv("/proc/self/exe", args.data());
  fail("cannot re-execute megatrain with OPENBLAS_CORETYPE={}: {}", d.core, std::strerror(errno));
}

}  // namespace mt::cli
