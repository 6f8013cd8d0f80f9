#include "megatrain/core/resources.h"

#include <cstdlib>

#ifndef MT_PROJECT_ROOT
#define MT_PROJECT_ROOT "."
#endif

namespace mt {

std::string project_root() {
  const char* env = std::getenv("MEGATRAIN_HOME");
  if (env && *env) return env;
  return MT_PROJECT_ROOT;
}

std::string resource_path(const std::string& rel) { return project_root() + "/" + rel; }

}  // namespace mt
