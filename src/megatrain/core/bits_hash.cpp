#include "megatrain/core/bits_hash.h"

#include <cstring>

namespace mt {

uint64_t bits_hash(const void* p, size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  uint64_t s = 0;
  const int64_t count = static_cast<int64_t>(n);
#pragma omp parallel for reduction(+ : s) schedule(static) if (count > (int64_t{1} << 20))
  for (int64_t i = 0; i < count; ++i) {
    uint32_t w;
    std::memcpy(&w, b + 4 * i, 4);
    s += bits_hash_term(w, static_cast<uint64_t>(i));
  }
  return bits_hash_finish(s, n);
}

}  // namespace mt
