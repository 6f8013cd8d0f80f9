// Non-finite values (inf, NaN) in what a run would keep: a checkpoint must never hold one (every resume from it
// would fail, and `generate` would print garbage with exit 0). (A non-finite validation loss is refused by
// evaluate().)
#pragma once
#include <cstdint>

namespace mt {

// The index of the first inf or NaN among x[0, n), or -1 when every value is finite.
int64_t first_non_finite(const float* x, int64_t n);

}  // namespace mt
