// NodeRing: the protocol of a node's shared data loader (MegaScale §3.4, redundant data loader elimination), as plain
// functions on a header that lives in shared memory. One reader (a thread of local rank 0, data/node_loader.h) reads
// each global batch's rows once for every data-parallel replica on the node; the local ranks that need tokens (the
// consumers) copy out their replica's rows. Pure: the functions only load and store the header's fields, so the
// protocol is unit-tested in plain memory, without processes (tests/data_node_ring_test.cpp).
//
// The segment: a RingHeader, then `slots` slots of slot_bytes each (the batch's windows of T+1 tokens for every
// replica the node holds). Batch s (s = 0, 1, ... counted from where the reader started) goes to slot s % slots.
//   - slot[i].seq: s + 1 once batch s is complete in slot i (0: never written). Written by the reader only.
//   - slot[i].key: the batch's position (ring_position_key), so a consumer that expected another batch (a rank
//     resumed elsewhere than its node's reader) fails instead of training on the wrong rows.
//   - taken[c]: the batches consumer c has copied out (its next batch is taken[c]). Written by consumer c only.
// Invariants, and why they hold:
//   1. The reader writes batch s only when every consumer has taken[c] >= s + 1 - slots (ring_writable): batch
//      s - slots, the slot's previous batch, is copied out by all, so no consumer is reading the slot it overwrites.
//   2. The reader stores seq = s + 1 (release) after the batch's rows and key; a consumer loads seq (acquire) and
//      reads the rows only when it equals s + 1 (ring_ready): it never sees a half-written batch.
//   3. A consumer stores taken = s + 1 (release) only after its copy of batch s is done, and taken only grows: the
//      reader's acquire load in ring_writable orders its next write of the slot after that copy.
//   4. seq of a slot only grows, in steps of `slots`: a consumer that waits for s + 1 cannot mistake batch
//      s - slots (seq s + 1 - slots) or s + slots (never written before the consumer released s) for its own.
// Liveness: the reader stores its clock in `heartbeat` while it works or waits, and its pid and node in the header;
// a consumer waiting for a batch fails, naming them, when the reader's process is gone or its heartbeat stopped for
// longer than the collective timeout (node_loader.cpp). A reader that fails (a corrupt shard) stores its error in
// `error` and sets `failed`; every consumer then throws that error. The reader never waits on a consumer that
// stopped for good: the rank's collectives time out first, and the job restarts.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace mt {

constexpr uint64_t kNodeRingMagic = 0x6d742d6e6f646531ull;  // "mt-node1": stored last by the creator
constexpr int kNodeRingMaxSlots = 16;
constexpr int kNodeRingMaxConsumers = 64;

struct NodeRingSlot {
  std::atomic<uint64_t> seq{0};
  std::atomic<uint64_t> key{0};
};

struct NodeRingHeader {
  std::atomic<uint64_t> magic{0};
  uint32_t slots = 0;        // in the ring, <= kNodeRingMaxSlots
  uint32_t consumers = 0;    // local ranks that copy rows out, <= kNodeRingMaxConsumers
  uint64_t slot_bytes = 0;   // each slot's rows
  uint64_t data_offset = 0;  // where slot 0's rows start, from the header's address
  int32_t reader_pid = 0;    // the process the reader thread runs in (local rank 0)
  int32_t node = 0;          // the node's index in the job
  uint32_t replicas = 0;     // the dp ranks whose rows a slot holds, in order (a rank checks its own is where it looks)
  int32_t replica_dp[kNodeRingMaxConsumers] = {};
  std::atomic<uint64_t> heartbeat_ns{0};  // the reader's steady clock, stored while it works or waits
  std::atomic<uint32_t> failed{0};        // 1: the reader stopped with `error`
  std::atomic<uint32_t> attached{0};      // consumers that have mapped the segment
  int32_t failed_kind = 0;                // the error's ErrorKind, as an int
  char error[2048] = {};
  std::atomic<uint64_t> taken[kNodeRingMaxConsumers] = {};
  NodeRingSlot slot[kNodeRingMaxSlots];
};

// The segment's size: the header, then the slots (each rounded up to 64 bytes).
uint64_t node_ring_data_offset();
uint64_t node_ring_bytes(uint32_t slots, uint64_t slot_bytes);
// Sets a fresh header (every field but magic); the creator stores magic last (node_ring_publish_header).
void node_ring_init(NodeRingHeader& h, uint32_t slots, uint32_t consumers, uint64_t slot_bytes, int32_t reader_pid,
                    int32_t node);
void node_ring_publish_header(NodeRingHeader& h);
bool node_ring_header_ready(const NodeRingHeader& h);

// A batch's position as one number (non-blend: epoch and cursor; a blend: the rows each source had given).
uint64_t ring_position_key(uint64_t epoch, uint64_t cursor, const std::vector<uint64_t>& taken);

// Reader: whether batch s may be written now (invariant 1); the slot it goes to; its publication (invariant 2).
bool ring_writable(const NodeRingHeader& h, uint64_t s);
uint32_t ring_slot(const NodeRingHeader& h, uint64_t s);
void ring_publish(NodeRingHeader& h, uint64_t s, uint64_t key);

// Consumer c: whether batch s is in its slot (invariant 2), and the release after its copy (invariant 3).
bool ring_ready(const NodeRingHeader& h, uint64_t s);
uint64_t ring_key(const NodeRingHeader& h, uint64_t s);  // after ring_ready(h, s)
void ring_release(NodeRingHeader& h, uint32_t c, uint64_t s);

}  // namespace mt
