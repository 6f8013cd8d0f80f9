// Process groups over NCCL: the GPU backend of ProcessGroup. Tensors are contiguous device tensors (F32, BF16, I32;
// reductions on all three).
//
// Streams and ordering (the difference from the Gloo backend):
//  * The group owns non-blocking communication streams. Every op records an event on the caller's compute stream
//    and makes its communication stream wait on it, so the op sees all compute issued before it; then it enqueues
//    the NCCL call and records a done event. No op ever synchronises the device or the host.
//  * Work::wait() does NOT block the host: it makes the compute stream wait on the done event, so compute issued
//    after wait() sees the result. To read a result on the host, synchronise the compute stream (Ops::to_host does).
//    Errors NCCL has already detected are thrown from wait() / done(); a peer that never arrives leaves the GPU
//    waiting, not the host (the driver's hang detection sees the step stall).
//  * Work::done() = the done event completed (or the op failed); exec_seconds() = the time between a start event
//    (recorded after the comm stream's wait on compute) and the done event, so it counts waiting for peers but not
//    for our own compute; it is 0 until the op completed on the device (callers summing it right after wait()
//    get 0 on GPU; read it after the step's synchronize for real numbers).
//  * barrier() is a 1-element allreduce: it orders the streams of all members, it does not block any host.
//
// Collectives run on one communicator and stream, in issue order (every member issues them in the same order).
//
// Point-to-point: NCCL has no tags, and all operations of one communicator execute in issue order, whatever stream
// they are on. One shared communicator for sends and receives would let a receive posted early block a later send
// (pipeline stages post receives in both directions early), so each DIRECTED pair of neighbours gets its own
// 2-rank communicator and stream (a "channel"): sends from a to b and receives on b from a match in issue order,
// and nothing else queues behind them. Consequences:
//  * tags are not used for matching (only in messages): the sends from a to b and the receives on b from a must
//    be issued in the same order on both sides (the pipeline schedules do: per direction, in microbatch order);
//  * channels exist only to the ring neighbours (group ranks r-1 and r+1 mod size) and only when requested
//    (NcclOptions::p2p): enough for 1F1B and interleaved 1F1B (whose last stage sends to the first); each costs a
//    communicator's buffers, so tp/dp groups do without. They are connected while the group is created (a grouped
//    1-element exchange), so the first real send/recv never blocks the host on connection set-up;
//  * send/recv to oneself is not supported (as with Gloo).
//
// Bootstrap: every member announces itself in the store; group rank 0 creates the NCCL unique id and stores it
// under the group's name; the others read it (after opt.timeout: an error naming the missing global ranks, or
// rank 0's). Communicators are created in NCCL's non-blocking mode, so initialisation and the enqueue of every op
// are polled with opt.timeout instead of hanging the host forever. On any failure the destructor aborts the
// communicators (ncclCommAbort) instead of waiting for operations that cannot finish.
#pragma once
#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "megatrain/comm/mesh.h"
#include "megatrain/comm/process_group.h"
#include "megatrain/comm/store.h"

namespace mt {

struct NcclOptions {
  bool p2p = false;  // create send/recv channels to the ring neighbours (pipeline groups)
};

// Creates the NCCL group of `ranks` (global ranks, sorted, containing my_global_rank) on the current CUDA device.
// compute_stream: the stream the caller's compute runs on (ops order after it, Work::wait() orders it after them);
// it must outlive the group. A group of one rank is a real 1-rank communicator (collectives are copies).
std::unique_ptr<ProcessGroup> make_nccl_group(Store& store, const std::string& name, const std::vector<int>& ranks,
                                              int my_global_rank, cudaStream_t compute_stream,
                                              const GroupOptions& opt = {}, const NcclOptions& nccl = {});

// The DeviceMesh group factory for a GPU run: NCCL groups on compute_stream for every dimension (also those of
// size 1, whose copies must happen on the device), with p2p channels on the pipeline dimension only.
GroupFactory nccl_mesh_groups(cudaStream_t compute_stream);

}  // namespace mt
