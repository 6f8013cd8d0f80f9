// The flight recorder: what every process group of this process is doing, kept so that a hang can be explained
// (after PyTorch c10d's). Each group records each op it is given:
//   posted  - issued by the caller (queued behind the group's earlier collectives);
//   started - entered: the group's thread is running it (waiting for the peers is part of running);
//   done / failed - completed.
// Collectives carry a per-group sequence number (0, 1, 2, ... in issue order): every member issues a group's
// collectives in the same order, so the same op has the same number on every member, and comparing the members'
// numbers names the one a hung collective waits for (it still shows seq k posted, or only k-1 done, while the
// others show k started). send/recv carry their own count per (direction, peer): the n-th send from a to b
// matches the n-th recv on b from a.
//
// Bounded: per group, the newest kDoneKept completed entries are kept, plus every entry not yet completed. Thread
// safe and cheap (a short critical section per state change; ops are milliseconds, this is nanoseconds).
//
// The enter hook runs on the thread that starts an op, just before it is marked started and handed to the
// backend; fault injection (train/faults.h) blocks there to model a rank stuck in a collective.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mt {

enum class OpState { Posted, Started, Done, Failed };
const char* op_state_name(OpState s);  // "posted", "started", "done", "failed"

struct FlightEntry {
  std::string op;   // allreduce, reduce_scatter, all_gather, broadcast, barrier, send, recv
  int64_t seq = 0;  // collectives: per group; send/recv: per (direction, peer)
  int peer = -1;    // send/recv: the peer's global rank; -1 for a collective
  OpState state = OpState::Posted;
  double t_posted = 0, t_started = 0, t_ended = 0;  // unix seconds; 0 = not (yet)
  std::string error;                                // failed: the backend's message
  bool p2p() const { return peer >= 0; }
  bool completed() const { return state == OpState::Done || state == OpState::Failed; }
};

// One group's state, as a hang report needs it.
struct GroupFlight {
  std::string group;                          // e.g. "dp[1,3]"
  int rank = 0;                               // this process's rank in the group
  std::vector<int> ranks;                     // the members' global ranks
  int64_t collectives = 0;                    // collectives posted so far (the next one gets this seq)
  std::optional<FlightEntry> last;            // the newest entry
  std::optional<FlightEntry> oldest_pending;  // the oldest entry not completed
};

nlohmann::json to_json(const FlightEntry& e);
nlohmann::json to_json(const GroupFlight& g);

// One group's record. The group's code calls post() when an op is issued and enter()/finish() as it runs.
class GroupRecord {
 public:
  static constexpr size_t kDoneKept = 64;
  GroupRecord(std::string name, std::vector<int> ranks, int rank);
  // Returns the entry's id (for enter/finish).
  uint64_t post_collective(const char* op);
  uint64_t post_p2p(const char* op, int peer_global_rank);  // op: "send" or "recv"
  void enter(uint64_t id);  // runs the process's enter hook (which may block), then marks it started
  void finish(uint64_t id, const std::string* error = nullptr);
  // A device op (NCCL): the host thread that issued it moves on at once, so its state is known only by asking the
  // device. probe() says Posted (queued on its stream), Started (running: waiting for peers is part of that),
  // Done or Failed, from CUDA events; it is asked whenever the record is read (flight(), entries()), under the
  // record's lock, so it must not block, until it says Done or Failed. No enter hook runs for such an op.
  void track(uint64_t id, std::function<OpState()> probe);
  const std::string& name() const { return name_; }
  GroupFlight flight() const;
  std::vector<FlightEntry> entries() const;  // oldest first

 private:
  uint64_t add(FlightEntry e);
  void trim() const;  // mu_ held
  // mu_ held: asks the tracked ops' probes, oldest first; all = false stops at the first op not completed (a new
  // op's post does that, so a record nobody reads stays bounded: one stream's ops complete in order).
  void poll(bool all) const;

  const std::string name_;
  const std::vector<int> ranks_;
  const int rank_;
  mutable std::mutex mu_;
  mutable std::map<uint64_t, FlightEntry> entries_;              // (poll() updates tracked ops from const readers)
  mutable std::map<uint64_t, std::function<OpState()>> probes_;  // tracked ops not yet completed
  uint64_t next_id_ = 0;
  int64_t next_seq_ = 0;
  std::map<std::pair<bool, int>, int64_t> p2p_seq_;  // (is send, peer) -> next seq
  mutable size_t done_count_ = 0;
};

class FlightRecorder {
 public:
  // What an enter hook is told: the group and the op about to start.
  using EnterHook = std::function<void(const std::string& group, const FlightEntry& e)>;

  // A group registers on creation and unregisters on destruction (a process may make groups of the same name
  // again, e.g. a test running two jobs in turn, or one per in-process rank).
  std::shared_ptr<GroupRecord> open(const std::string& name, const std::vector<int>& ranks, int rank);
  void close(const std::shared_ptr<GroupRecord>& g);

  // Per open group, in the order they were opened.
  std::vector<GroupFlight> snapshot() const;
  // {"groups": [{"group", "rank", "ranks", "collectives", "last", "oldest_pending"}, ...]}
  nlohmann::json json() const;
  // Every kept entry of the first open group named `group`, oldest first (empty when there is none).
  std::vector<FlightEntry> entries(const std::string& group) const;

  void set_enter_hook(EnterHook hook);  // an empty function removes it
  void run_enter_hook(const std::string& group, const FlightEntry& e) const;

 private:
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<GroupRecord>> groups_;
  std::shared_ptr<const EnterHook> hook_;
};

// The process's recorder.
FlightRecorder& flight_recorder();

}  // namespace mt
