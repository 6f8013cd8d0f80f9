#include "megatrain/kernels/cuda/cublaslt_api.h"

#include <dlfcn.h>
#include <fmt/ranges.h>

#include <type_traits>
#include <vector>

#include "megatrain/core/error.h"

// Set by CMake: <the folder of the library CUDAToolkit found>/<its soname>, and the soname alone.
#ifndef MT_CUBLASLT_PATH
#define MT_CUBLASLT_PATH ""
#endif
#ifndef MT_CUBLASLT_SONAME
#define MT_CUBLASLT_SONAME "libcublasLt.so"
#endif

namespace mt {

namespace {

LtApi load() {
  std::vector<std::string> tried;
  void* lib = nullptr;
  LtApi api{};
  for (const char* name : {MT_CUBLASLT_PATH, MT_CUBLASLT_SONAME}) {
    if (!*name) continue;
    // RTLD_LOCAL: nothing else resolves against it; the handle is kept for the life of the process.
    lib = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib) {
      api.path = name;
      break;
    }
    const char* why = ::dlerror();
    tried.push_back(fmt::format("{} ({})", name, why ? why : "unknown reason"));
  }
  if (!lib)
    fail_as(ErrorKind::Config,
            "cuBLASLt could not be loaded; tried: {}. Install the CUDA toolkit's cuBLAS, or put the folder holding "
            "{} on LD_LIBRARY_PATH",
            fmt::join(tried, "; "), MT_CUBLASLT_SONAME);
  auto sym = [&](auto& slot, const char* name) {
    ::dlerror();
    void* p = ::dlsym(lib, name);
    if (!p)
      fail_as(ErrorKind::Config, "cuBLASLt at {} has no {}: it is older than the toolkit megatrain was built with",
              api.path, name);
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(p);
  };
#define MT_CUBLASLT_LOAD(name) sym(api.name, "cublasLt" #name);
  MT_CUBLASLT_ENTRY_POINTS(MT_CUBLASLT_LOAD)
#undef MT_CUBLASLT_LOAD
  return api;
}

}  // namespace

const LtApi& lt() {
  static const LtApi api = load();  // a throw leaves it unset, so the next call tries again
  return api;
}

}  // namespace mt
