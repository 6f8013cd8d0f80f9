// Where installed files live (configs, and the data files data/assets.h names): under $MEGATRAIN_HOME if set, else
// the source tree this binary was built from (scripts/setup installs npm data into <root>/.deps/npm).
#pragma once
#include <string>

namespace mt {

std::string project_root();                         // $MEGATRAIN_HOME or the build's source dir
std::string resource_path(const std::string& rel);  // project_root() + "/" + rel

}  // namespace mt
