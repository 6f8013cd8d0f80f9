#include "megatrain/train/attempt_fence.h"

#include <fmt/format.h>

#include <cstdlib>
#include <sstream>

#include "megatrain/comm/store.h"

namespace mt {

std::string attempt_superseded() {
  const char* keys = std::getenv("MEGATRAIN_FENCE_KEYS");
  const char* url = std::getenv("MEGATRAIN_STORE");
  if (!keys || !*keys || !url || !*url) return "";
  try {
    // Unprefixed: the keys are the job driver's, outside the attempt's namespace (MEGATRAIN_STORE_PREFIX).
    std::unique_ptr<Store> store = open_store(url, Millis(5000));
    std::stringstream list(keys);
    for (std::string key; std::getline(list, key, ',');)
      if (!key.empty() && store->check(key))
        return fmt::format("the job went on without this rank's attempt (the store holds '{}')", key);
  } catch (const std::exception&) {
    // Nobody to ask: the job may be gone and a requeued one need the snapshots.
  }
  return "";
}

}  // namespace mt
