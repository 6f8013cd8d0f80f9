#pragma once
#include <chrono>

namespace mt {

// Seconds on a monotonic clock.
inline double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// Seconds since the Unix epoch: timestamps compared across hosts with synced clocks (heartbeats, events), and dates
// (a certificate's expiry).
inline double unix_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

}  // namespace mt
