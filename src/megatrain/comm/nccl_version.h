// The NCCL this build links, for `megatrain --version`: "NCCL 2.21.5", or why there is none. Needs no GPU.
#pragma once
#include <string>

namespace mt {

std::string nccl_version();

}  // namespace mt
