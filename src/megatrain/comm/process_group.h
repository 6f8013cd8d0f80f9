// Process groups: collectives and point-to-point transfers among a set of ranks, asynchronous. Every op returns
// a Work to wait on, so compute continues while communication is in flight.
//  * Collectives of one group execute in the order they were issued, on the group's own thread (every rank must
//    issue a group's collectives in the same order, as with NCCL).
//  * send/recv are posted immediately and are not ordered behind collectives: a pipeline stage can post its
//    receives early and its sends whenever ready, in any interleaving, without deadlock (MegaScale §3.2).
// Tensors are contiguous host fp32 (I32 also for broadcast/send/recv/all_gather) on the Gloo backend; the NCCL
// backend (comm/cuda/nccl_group.h, the CUDA path) takes device tensors behind the same interface.
// A process using the Gloo backend should ignore SIGPIPE (`megatrain train` and `diagnose` do): a write to a peer
// that died then fails as ErrorKind::PeerLost; with the default disposition it kills the process (Gloo writes with
// writev, which has no MSG_NOSIGNAL).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "megatrain/core/tensor.h"
#include "megatrain/comm/store.h"

namespace mt {

class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the op completed; rethrows its error (mt::Error naming the op, group and peer).
  virtual void wait() = 0;
  virtual bool done() = 0;
  // Seconds the op spent executing (not queued), known after wait(); for timelines and overlap accounting.
  virtual double exec_seconds() const = 0;
};
using WorkPtr = std::shared_ptr<Work>;

// Communication time of one plane over a stretch of work (a step), in one shape for every user of groups
// (DataParallel, ProcessGroupTpComm, GptPipeline): busy = the ops' summed execution time; exposed = the time the
// caller was blocked waiting for them, i.e. the part not hidden behind compute.
struct CommTime {
  double busy_seconds = 0;
  double exposed_seconds = 0;
  CommTime& operator+=(const CommTime& o) {
    busy_seconds += o.busy_seconds;
    exposed_seconds += o.exposed_seconds;
    return *this;
  }
};

enum class ReduceOp { Sum, Max, Min };

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;  // rank within the group
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;  // e.g. "tp[0-1]" for messages
  virtual int global_rank(int group_rank) const = 0;

  virtual WorkPtr allreduce(Tensor t, ReduceOp op = ReduceOp::Sum) = 0;  // in place
  // in = size() equal chunks (in.numel() == size() * out.numel()); out = the reduction of chunk rank(). Out of place
  // (out outside in), `in` is only read: it is still the caller's own after the wait (train/sdc_rerun.h hashes it).
  virtual WorkPtr reduce_scatter(Tensor out, Tensor in, ReduceOp op = ReduceOp::Sum) = 0;
  // out = concatenation of every rank's in, in rank order (out.numel() == size() * in.numel()).
  virtual WorkPtr all_gather(Tensor out, Tensor in) = 0;
  virtual WorkPtr broadcast(Tensor t, int root) = 0;  // root: group rank
  // Personalised exchange of variable-size blocks (expert parallelism's token dispatch and combine). `in` is
  // size() consecutive blocks, block r (send_counts[r] elements) going to rank r; `out` receives size() consecutive
  // blocks, block r (recv_counts[r] elements) coming from rank r, my own block included (a copy). Every rank must
  // agree: recv_counts[r] on me == send_counts[me] on rank r. F32 or I32 (the same on both sides); out outside in.
  virtual WorkPtr all_to_all_v(Tensor out, Tensor in, const std::vector<int64_t>& recv_counts,
                               const std::vector<int64_t>& send_counts) = 0;
  // Point-to-point, matched by (peer, tag); peers are group ranks.
  virtual WorkPtr send(Tensor t, int dst, int tag) = 0;
  virtual WorkPtr recv(Tensor t, int src, int tag) = 0;
  virtual WorkPtr barrier() = 0;
};

struct GroupOptions {
  Millis timeout = Millis(60000);   // rendezvous and per-op timeout
  std::string iface = "127.0.0.1";  // address (host/IP) this process listens on
};

// Throws mt::Error naming what is wrong with a group's arguments (empty name or rank list, unsorted or negative
// ranks, my_global_rank not a member, a non-positive timeout); `maker` names the caller. Every backend checks these.
void check_group_args(const char* maker, const std::string& name, const std::vector<int>& ranks, int my_global_rank,
                      const GroupOptions& opt);

// Throws mt::Error naming the group when all_to_all_v's arguments disagree: a count vector not of the group's size,
// a negative count, counts not summing to the tensor's elements, or different dtypes.
void check_all_to_all_v(const ProcessGroup& g, const Tensor& out, const Tensor& in,
                        const std::vector<int64_t>& recv_counts, const std::vector<int64_t>& send_counts);

// Creates the group of `ranks` (global ranks, sorted, containing my_global_rank) over Gloo, rendezvousing through
// `store` under `name`. Only the members touch the store (no global barrier). A member that never arrives makes
// the others fail after opt.timeout with a message naming the missing global ranks.
std::unique_ptr<ProcessGroup> make_gloo_group(Store& store, const std::string& name, const std::vector<int>& ranks,
                                              int my_global_rank, const GroupOptions& opt = {});

}  // namespace mt
