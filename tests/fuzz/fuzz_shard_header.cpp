// Fuzzes the token-shard format (data/shard.h): the input is a whole shard file, read by ShardReader and by the
// DataLoader that training uses. An accepted shard must hold exactly the tokens its header promises, each inside
// the recorded vocabulary, and the loader's batches must be windows of that stream (y is x shifted by one).
#include <fmt/format.h>

#include <cstdint>
#include <vector>

#include "fuzz_util.h"
#include "megatrain/core/error.h"
#include "megatrain/data/loader.h"
#include "megatrain/data/shard.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string dir = mt::fuzz::scratch_dir() + "/shards";
  const std::string path = mt::fuzz::write_scratch("shards/train_000000.bin", data, size);
  FUZZ_ACCEPT_MT_ERRORS({
    mt::ShardReader r(path);
    const mt::ShardHeader& h = r.header();
    FUZZ_CHECK(mt::kShardHeaderBytes + h.num_tokens * h.token_bytes() == size,
               fmt::format("{} tokens of {} bytes in a {}-byte file", h.num_tokens, h.token_bytes(), size));
    const std::vector<int32_t> all = r.read_all();
    for (size_t i = 0; i < all.size(); ++i) {
      FUZZ_CHECK(all[i] >= 0 && (h.vocab_size == 0 || all[i] < h.vocab_size),
                 fmt::format("token {} at {} outside vocabulary {}", all[i], i, h.vocab_size));
      FUZZ_CHECK(all[i] == r.token(i), "read_all disagrees with token()");
    }
    bool threw = false;
    try {
      int32_t one;
      r.read(h.num_tokens, 1, &one);  // one past the end must be refused
    } catch (const mt::Error&) {
      threw = true;
    }
    FUZZ_CHECK(threw, "reading past the last token succeeded");

    mt::DataLoader loader(dir, "train", /*B=*/1, /*T=*/3, /*shuffle=*/true, /*seed=*/1, 0, 1, /*prefetch=*/0);
    for (int i = 0; i < 3; ++i) {
      const mt::Batch b = loader.next();
      FUZZ_CHECK(b.x.size() == 3 && b.y.size() == 3, "batch of the wrong size");
      FUZZ_CHECK(b.x[1] == b.y[0] && b.x[2] == b.y[1], "y is not x shifted by one token");
      for (int32_t t : b.x) FUZZ_CHECK(t >= 0 && (h.vocab_size == 0 || t < h.vocab_size), "batch token out of range");
    }
  });
  return 0;
}
