// Peer links: the host-plane channel over which each rank copies its in-memory checkpoint snapshot to a buddy
// rank (train/checkpointing.h), Gemini-style: a rank that dies leaves its newest snapshot in a survivor's memory.
//
// The buddy of rank r is r + L (mod world), L = the launcher's ranks per node (LOCAL_WORLD_SIZE): the same local
// rank on the next node, so a lost node's snapshots live on another node. On one node (world == L) the buddy is
// r + 1: the copy survives a lost process, not a lost host.
//
// Two Gloo groups of two per rank, "snap[r>b]" (r sends to its buddy b) and "snap[p>r]" (its predecessor p sends
// to r), used only by the checkpointer's background thread: the training groups' collectives never wait behind a
// snapshot in flight. Groups are created in one global order (by sender, then receiver), so the ring of pairwise
// rendezvous cannot deadlock.
#pragma once
#include <memory>

#include "megatrain/ckpt/snapshot.h"
#include "megatrain/comm/process_group.h"
#include "megatrain/train/topology.h"

namespace mt {

struct PeerLinks {
  int rank = 0, buddy = 0, from = 0;  // global ranks: mine, whom I copy to, who copies to me
  std::unique_ptr<ProcessGroup> out, in;

  // Sends `mine` to the buddy and receives the predecessor's snapshot into `held` (collective between the three:
  // every rank calls it for the same snapshot). Throws the groups' errors (PeerLost, CommTimeout) unchanged.
  void exchange(ShardSnapshot& mine, ShardSnapshot& held);
};

// Global rank r's buddy in a world of `world` ranks with `local` ranks per node.
int snapshot_buddy(int r, int world, int local);

// The links of this rank, or nullptr when there are none to make (a single process, ckpt.snapshot_every = 0, or a
// gathered checkpoint layout: ckpt.sharded = false).
std::unique_ptr<PeerLinks> make_peer_links(const RunConfig& cfg, Topology& topo);

}  // namespace mt
