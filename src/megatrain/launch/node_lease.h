// A node's lease on its place in a job the driver runs (several nodes, launch/driver.h).
//
// The driver declares a node lost when the node's liveness counter in the job store has stood still for
// --node-timeout seconds, and the job then goes on without it. A node cut off from the network cannot tell the
// driver anything, but its ranks live on, blocked in collectives with peers on the other side. If the network comes
// back after the job moved on, those ranks wake up: their collectives fail as a lost peer, and a rank that fails
// that way writes its in-memory snapshots into the job's checkpoint directory - where a newer attempt now runs
// (seen on two network namespaces: the evicted node's ranks wrote snapshots beside the running attempt's files).
//
// So the agent holds a lease: each acknowledged liveness bump renews it from the moment the bump was *sent*
// (the store applied it no earlier, and the driver saw it no earlier still, so the driver's clock for this node
// starts after ours). The lease lapses at 3/4 of --node-timeout, and a node whose lease lapses leaves the job at once,
// killing its ranks. Its ranks are therefore gone before the driver can declare it lost, and nothing of it acts after
// the job has moved on: the fencing a lease gives, without help from the file system.
//  - The lease starts with the first acknowledged bump: before it, the node is not in the job yet (its agent may
//    wait for node 0's store to come up), and there is nothing to fence.
//  - A lapsed lease is never renewed, even when the store answers again (a host that froze and thawed, a network
//    that came back): by then the driver may have declared the node lost.
#pragma once
#include <algorithm>
#include <atomic>

namespace mt::launch {

class NodeLease {
 public:
  explicit NodeLease(double node_timeout_s) : timeout_(node_timeout_s) {}

  // How often the agent bumps its liveness: at least three renewals per lease at every allowed timeout (>= 1 s),
  // so one slow round trip never lapses it by itself.
  double renew_interval() const { return std::min(1.0, timeout_ / 4); }
  // The lease's length: the driver waits the whole timeout, the node a quarter less (the margin covers killing
  // the ranks, and the driver's own delay never shortens its wait).
  double length() const { return 0.75 * timeout_; }
  // A bump sent at `sent_at` was acknowledged by the store: the first arms the lease; later ones renew it unless it
  // had lapsed by then. (One thread renews; others only read.)
  void renewed(double sent_at) {
    const double cur = sent_.load();
    if (cur < 0 || (sent_at > cur && sent_at - cur <= length())) sent_.store(sent_at);
  }
  bool armed() const { return sent_.load() >= 0; }
  double age(double now) const { return armed() ? now - sent_.load() : 0; }
  bool lapsed(double now) const { return armed() && age(now) > length(); }

 private:
  double timeout_;
  std::atomic<double> sent_{-1};  // when the newest acknowledged bump was sent; < 0: none yet
};

}  // namespace mt::launch
