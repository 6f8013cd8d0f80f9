// One data loader per node (MegaScale §3.4, redundant data loader elimination): a single reader reads each global
// batch's rows once for all the data-parallel replicas on its node, into a ring of batch slots in POSIX shared memory
// (shm_open + mmap; the protocol and its invariants: data/node_ring.h), and each local rank that needs tokens copies
// out its replica's rows. The ranks of a tensor-parallel group take the same rows from one slot; a pipeline stage
// that needs neither tokens nor targets (a middle stage) copies none. Per rank, the loader threads, the shard reads
// and the prefetched batches of per-rank loaders become one thread, one read and one copy in memory per node.
//
// The reader is a thread of local rank 0's process, not the launcher's agent: it is the same DataLoader as a rank's
// (same shards, blend, computed shuffle, id checks), it starts at the position the rank resumed from (the rank has just
// restored it from the checkpoint), and it lives and dies with a rank the supervisor already watches, so a node
// without an agent (torchrun, Slurm) has one too. Each rank still computes its batches' positions itself (state(),
// the checkpoint's cursor, the blend's epochs); the slot's key checks that reader and rank agree on every batch.
//
// Failure: a reader that throws (a corrupt shard, a token over the vocabulary) stores the error in the ring and
// every rank throws it, kind and text, with the reader named. A reader whose process is gone or has stopped (its
// heartbeat older than the collective timeout) makes a waiting rank fail with kind PeerLost (the supervisor restarts
// the job) naming the node, local rank 0 and the pid; no rank waits on an empty ring for longer than the timeout.
// The segment's name is removed once every local rank has mapped it, so a crash leaves no segment behind after
// start-up; a segment found with the same name is one a dead run left, and is replaced.
#pragma once
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "megatrain/data/loader.h"
#include "megatrain/data/node_ring.h"

namespace mt {

// What one rank knows of its node's loader (train/node_data.h makes it from the topology).
struct NodeLoaderPlan {
  std::string name;           // the shared memory segment, e.g. "/megatrain-data-<job hash>-node0"
  int node = 0;               // the node's index in the job (for messages)
  int local_rank = 0;         // this rank on the node; local rank 0 runs the reader
  std::vector<int> replicas;  // the dp ranks whose rows the node's slots hold, in slot order
  int consumers = 0;          // the local ranks that copy rows out
  int consumer = -1;          // this rank's index among them; -1: it needs no tokens
  int replica = -1;           // the index in replicas of this rank's dp rank; -1 when consumer is -1
  int slots = 3;              // batches in the ring (the reader runs up to slots ahead of the slowest rank)
  double timeout_s = 120;     // the collective timeout: a rank waits no longer for a reader that stopped
};

// A mapping of the segment: created by the reader (sized for its slots), or opened by a rank.
class NodeSegment {
 public:
  static std::unique_ptr<NodeSegment> create(const std::string& name, uint64_t bytes);
  // Waits (up to timeout_s) for the segment to exist with its header published by a live reader; throws kind PeerLost
  // naming the node's reader otherwise.
  static std::unique_ptr<NodeSegment> open(const NodeLoaderPlan& plan);
  ~NodeSegment();
  NodeSegment(const NodeSegment&) = delete;
  NodeSegment& operator=(const NodeSegment&) = delete;

  NodeRingHeader& header() { return *static_cast<NodeRingHeader*>(base_); }
  int32_t* slot_rows(uint64_t s);  // batch s's windows

 private:
  NodeSegment(void* base, uint64_t bytes) : base_(base), bytes_(bytes) {}
  void* base_;
  uint64_t bytes_;
};

// The reader: owns the segment and a thread that fills the ring from `loader` (one constructed with world = dp,
// prefetch 0). Started once, at the position the ranks begin at.
class NodeReader {
 public:
  NodeReader(const NodeLoaderPlan& plan, std::unique_ptr<DataLoader> loader);
  ~NodeReader();  // stops and joins the thread; removes the segment's name if no rank did
  NodeReader(const NodeReader&) = delete;
  NodeReader& operator=(const NodeReader&) = delete;
  void start(const LoaderState& from);

 private:
  void run(LoaderState pos);
  NodeLoaderPlan plan_;
  std::unique_ptr<DataLoader> loader_;
  std::unique_ptr<NodeSegment> seg_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// A rank's RowFeed: its replica's rows from the node's ring (none for a rank that needs no tokens). Local rank 0's
// feed owns the node's reader and starts it at the first batch.
class NodeFeed final : public RowFeed {
 public:
  NodeFeed(const NodeLoaderPlan& plan, std::unique_ptr<NodeReader> reader, int B, int T);
  void start(const LoaderState& from) override;
  void fill(Batch& b) override;
  double wait_seconds() const { return wait_s_; }  // time spent waiting for batches (for the benchmark)

 private:
  void wait_for(uint64_t s);
  [[noreturn]] void reader_failed();
  std::string reader_name() const;
  NodeLoaderPlan plan_;
  std::unique_ptr<NodeReader> reader_;  // local rank 0 only; declared before seg_ so it is destroyed after it
  std::unique_ptr<NodeSegment> seg_;    // null for a rank that copies nothing
  int B_, T_;
  uint64_t next_ = 0;  // the batch this rank takes next, counted from the start
  double wait_s_ = 0;
};

// Whether process pid is running (not gone, not a zombie). Exposed for tests.
bool process_alive(int pid);

}  // namespace mt
