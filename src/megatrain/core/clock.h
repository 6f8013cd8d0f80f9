#pragma once
#include <chrono>

namespace mt {

// Seconds on a monotonic clock.
inline double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace mt
