#include "megatrain/data/node_ring.h"

#include "megatrain/core/error.h"

namespace mt {

namespace {

constexpr uint64_t kAlign = 64;
uint64_t round_up(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

uint64_t mix(uint64_t h, uint64_t v) {  // splitmix64 of the running hash and the next value
  uint64_t z = h ^ (v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

uint64_t node_ring_data_offset() { return round_up(sizeof(NodeRingHeader)); }

uint64_t node_ring_bytes(uint32_t slots, uint64_t slot_bytes) {
  return node_ring_data_offset() + static_cast<uint64_t>(slots) * round_up(slot_bytes);
}

void node_ring_init(NodeRingHeader& h, uint32_t slots, uint32_t consumers, uint64_t slot_bytes, int32_t reader_pid,
                    int32_t node) {
  MT_CHECK(slots >= 1 && slots <= kNodeRingMaxSlots, "node data loader: {} slots is not in [1, {}]", slots,
           kNodeRingMaxSlots);
  MT_CHECK(consumers <= kNodeRingMaxConsumers, "node data loader: {} local ranks take rows; at most {} can", consumers,
           kNodeRingMaxConsumers);
  h.magic.store(0, std::memory_order_relaxed);
  h.slots = slots;
  h.consumers = consumers;
  h.slot_bytes = round_up(slot_bytes);
  h.data_offset = node_ring_data_offset();
  h.reader_pid = reader_pid;
  h.node = node;
  h.heartbeat_ns.store(0, std::memory_order_relaxed);
  h.failed.store(0, std::memory_order_relaxed);
  h.attached.store(0, std::memory_order_relaxed);
  h.failed_kind = 0;
  h.error[0] = '\0';
  for (auto& t : h.taken) t.store(0, std::memory_order_relaxed);
  for (auto& s : h.slot) {
    s.seq.store(0, std::memory_order_relaxed);
    s.key.store(0, std::memory_order_relaxed);
  }
}

void node_ring_publish_header(NodeRingHeader& h) { h.magic.store(kNodeRingMagic, std::memory_order_release); }
bool node_ring_header_ready(const NodeRingHeader& h) {
  return h.magic.load(std::memory_order_acquire) == kNodeRingMagic;
}

uint64_t ring_position_key(uint64_t epoch, uint64_t cursor, const std::vector<uint64_t>& taken) {
  uint64_t k = mix(mix(0x6d74, epoch), cursor);
  for (uint64_t t : taken) k = mix(k, t);
  return k;
}

bool ring_writable(const NodeRingHeader& h, uint64_t s) {
  if (s < h.slots) return true;
  const uint64_t need = s + 1 - h.slots;  // batch s - slots copied out by every consumer
  for (uint32_t c = 0; c < h.consumers; ++c)
    if (h.taken[c].load(std::memory_order_acquire) < need) return false;
  return true;
}

uint32_t ring_slot(const NodeRingHeader& h, uint64_t s) { return static_cast<uint32_t>(s % h.slots); }

void ring_publish(NodeRingHeader& h, uint64_t s, uint64_t key) {
  NodeRingSlot& slot = h.slot[ring_slot(h, s)];
  slot.key.store(key, std::memory_order_relaxed);
  slot.seq.store(s + 1, std::memory_order_release);
}

bool ring_ready(const NodeRingHeader& h, uint64_t s) {
  return h.slot[ring_slot(h, s)].seq.load(std::memory_order_acquire) == s + 1;
}

uint64_t ring_key(const NodeRingHeader& h, uint64_t s) {
  return h.slot[ring_slot(h, s)].key.load(std::memory_order_relaxed);
}

void ring_release(NodeRingHeader& h, uint32_t c, uint64_t s) { h.taken[c].store(s + 1, std::memory_order_release); }

}  // namespace mt
