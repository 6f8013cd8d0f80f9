// The node loader's ring protocol (data/node_ring.h) in plain memory, without processes: the reader may write a
// batch only when every consumer has copied out the slot's previous batch, a consumer sees a batch only once it is
// published, and a random interleaving of one reader and several consumers never overwrites a slot a consumer has
// yet to copy, and hands every consumer every batch in order. The oracle is a bookkeeping of what each side did.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <set>

#include "megatrain/core/error.h"
#include "megatrain/data/node_ring.h"

namespace mt {
namespace {

std::unique_ptr<NodeRingHeader> ring(uint32_t slots, uint32_t consumers) {
  auto h = std::make_unique<NodeRingHeader>();
  node_ring_init(*h, slots, consumers, 100, 1234, 0);
  node_ring_publish_header(*h);
  return h;
}

TEST(NodeRing, AFreshRingTakesOneBatchPerSlotAndNoMore) {
  auto h = ring(3, 2);
  for (uint64_t s = 0; s < 3; ++s) {
    EXPECT_TRUE(ring_writable(*h, s)) << s;
    ring_publish(*h, s, 100 + s);
  }
  EXPECT_FALSE(ring_writable(*h, 3));  // slot 0 still holds batch 0, which nobody copied
  ring_release(*h, 0, 0);
  EXPECT_FALSE(ring_writable(*h, 3));  // consumer 1 has not
  ring_release(*h, 1, 0);
  EXPECT_TRUE(ring_writable(*h, 3));
  EXPECT_FALSE(ring_writable(*h, 4));  // batch 1 is still in slot 1
}

TEST(NodeRing, ABatchIsReadyOnlyOncePublishedAndOnlyAsItself) {
  auto h = ring(2, 1);
  EXPECT_FALSE(ring_ready(*h, 0));
  ring_publish(*h, 0, 7);
  EXPECT_TRUE(ring_ready(*h, 0));
  EXPECT_EQ(ring_key(*h, 0), 7u);
  EXPECT_FALSE(ring_ready(*h, 2));  // same slot, a later batch: not the one in it (invariant 4)
  ring_release(*h, 0, 0);
  ring_publish(*h, 1, 8);
  ring_release(*h, 0, 1);
  ring_publish(*h, 2, 9);
  EXPECT_TRUE(ring_ready(*h, 2));
  EXPECT_FALSE(ring_ready(*h, 0));  // batch 0's slot now holds batch 2
  EXPECT_EQ(ring_slot(*h, 2), 0u);
  EXPECT_EQ(ring_slot(*h, 5), 1u);
}

TEST(NodeRing, NoConsumersNeverBlockTheReader) {
  auto h = ring(2, 0);
  for (uint64_t s = 0; s < 10; ++s) EXPECT_TRUE(ring_writable(*h, s));
}

TEST(NodeRing, PositionKeysTellBatchesApart) {
  std::set<uint64_t> keys;
  for (uint64_t e = 0; e < 4; ++e)
    for (uint64_t c = 0; c < 64; c += 4) keys.insert(ring_position_key(e, c, {}));
  for (uint64_t a = 0; a < 8; ++a)
    for (uint64_t b = 0; b < 8; ++b) keys.insert(ring_position_key(0, 0, {a, b}));
  EXPECT_EQ(keys.size(), 4u * 16 + 64);
  EXPECT_EQ(ring_position_key(1, 2, {3}), ring_position_key(1, 2, {3}));
}

TEST(NodeRing, TheLayoutRoundsSlotsAndRefusesOutOfRangeSizes) {
  EXPECT_EQ(node_ring_bytes(3, 100), node_ring_data_offset() + 3 * 128);
  EXPECT_EQ(node_ring_data_offset() % 64, 0u);
  EXPECT_GE(node_ring_data_offset(), sizeof(NodeRingHeader));
  NodeRingHeader h;
  EXPECT_FALSE(node_ring_header_ready(h));
  EXPECT_THROW(node_ring_init(h, 0, 1, 8, 1, 0), Error);
  EXPECT_THROW(node_ring_init(h, kNodeRingMaxSlots + 1, 1, 8, 1, 0), Error);
  EXPECT_THROW(node_ring_init(h, 2, kNodeRingMaxConsumers + 1, 8, 1, 0), Error);
  node_ring_init(h, 2, 1, 8, 1, 0);
  EXPECT_FALSE(node_ring_header_ready(h));  // magic comes last
  node_ring_publish_header(h);
  EXPECT_TRUE(node_ring_header_ready(h));
}

// A random interleaving of one reader and three consumers over a ring of `slots`: each step one of them acts if it
// can. The slots' "rows" are the batch number the reader wrote there; the oracle checks that a consumer copies the
// batch it expects, that the reader never writes over a batch some consumer has not copied, and that everyone
// progresses to the end.
TEST(NodeRing, RandomInterleavingsDeliverEveryBatchInOrderAndNeverOverwriteAnUncopiedOne) {
  for (uint32_t slots : {1u, 2u, 3u, 5u}) {
    for (int seed = 0; seed < 20; ++seed) {
      SCOPED_TRACE(::testing::Message() << "slots " << slots << " seed " << seed);
      constexpr uint32_t kConsumers = 3;
      constexpr uint64_t kBatches = 50;
      auto h = ring(slots, kConsumers);
      std::vector<int64_t> rows(slots, -1);                // the batch each slot's rows hold
      std::vector<uint64_t> next(kConsumers, 0);           // each consumer's next batch
      std::vector<std::set<uint64_t>> copied(kConsumers);  // what each consumer has copied
      uint64_t written = 0;
      std::mt19937 rng(static_cast<unsigned>(seed));
      for (int guard = 0;
           guard < 100000 && (written < kBatches || next[0] < kBatches || next[1] < kBatches || next[2] < kBatches);
           ++guard) {
        const int who = static_cast<int>(rng() % (kConsumers + 1));
        if (who == static_cast<int>(kConsumers)) {
          if (written < kBatches && ring_writable(*h, written)) {
            const int64_t old = rows[ring_slot(*h, written)];
            if (old >= 0) {
              for (uint32_t c = 0; c < kConsumers; ++c)
                ASSERT_TRUE(copied[c].count(static_cast<uint64_t>(old))) << "batch " << old << " overwritten";
            }
            rows[ring_slot(*h, written)] = static_cast<int64_t>(written);
            ring_publish(*h, written, ring_position_key(0, written, {}));
            ++written;
          }
        } else {
          const auto c = static_cast<uint32_t>(who);
          const uint64_t s = next[c];
          if (s < kBatches && ring_ready(*h, s)) {
            ASSERT_EQ(rows[ring_slot(*h, s)], static_cast<int64_t>(s));
            ASSERT_EQ(ring_key(*h, s), ring_position_key(0, s, {}));
            copied[c].insert(s);
            ring_release(*h, c, s);
            ++next[c];
          }
        }
      }
      EXPECT_EQ(written, kBatches);
      for (uint32_t c = 0; c < kConsumers; ++c) EXPECT_EQ(copied[c].size(), kBatches) << "consumer " << c;
    }
  }
}

}  // namespace
}  // namespace mt
