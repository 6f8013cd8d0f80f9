// Data parallelism with ZeRO-2 style sharding over a ProcessGroup (the mesh's dp group).
//
// The model's flat gradient buffer is cut into buckets (flat ranges whose bounds are multiples of dp*16 floats).
// Backward finishes gradients from the last parameter to the first; as soon as every tensor touching a bucket is
// final, that bucket's reduce-scatter is launched, so communication overlaps the rest of backward. Rank r owns
// slice r of every bucket: it keeps the reduced gradients, the optimizer moments and the update for that slice
// only. After the update each bucket's parameters are all-gathered asynchronously in forward order; the next
// forward waits for a bucket only right before a layer reads it, so the first layers' all-gather is effectively
// prefetched and the rest overlaps compute.
//
// Gradient clipping uses the true global norm (sum of squares over the owned slices, all-reduced). LAMB's
// per-tensor norms are partial sums over slices, all-reduced before the trust ratios are formed.
//
// Expert parallelism runs two instances over one model: one over the dp group for the dense tensors, one over the
// expert-dp group for the expert tensors (DataParallelOptions::tensors selects them; ParamStore aligns every
// boundary between the two kinds to dp*16 floats, so each instance's buckets are runs of its own tensors). The expert
// instance divides its summed gradients by dp (mean_over), not by its group's size, since each expert's gradient
// already sums over its ep group's tokens, and sums its squared norms over the ep group too (norm_reduce). The owner
// of both installs the model's hooks and calls each instance's handlers (hooks()).
//
// Memory: the slices (gradients, moments, the all-gather staging) are allocated through the backend (Ops::alloc)
// and touched only by its ops and by the dp group, so on a GPU run they live in device memory and the group is
// NCCL. Host scalars (the squared norms) go over DataParallelOptions::host, a group of the host plane (Gloo),
// when one is given. The checkpoint accessors (gather/scatter_moments, moment_slices) work on host memory: on a
// GPU run through a host copy of the slices, refreshed when they are called (never inside a step).
#pragma once
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "megatrain/core/buffer.h"
#include "megatrain/comm/process_group.h"
#include "megatrain/kernels/ops.h"
#include "megatrain/model/gpt.h"
#include "megatrain/optim/optimizer.h"

namespace mt {

struct DataParallelOptions {
  size_t bucket_floats = 4 << 20;  // target bucket size (rounded to a multiple of dp*16)
  bool overlap = true;             // launch reduce-scatters during backward / wait all-gathers per layer
  // With tensor parallelism the model is split further over a tp group: the squared norms (global gradient
  // norm, LAMB's per-tensor norms) are weighted per tensor and then summed over tp by norm_reduce (see
  // global_grad_norm in optimizer.h). Empty / unset: the plain dp behaviour.
  std::vector<float> norm_weights;
  NormReduce norm_reduce;
  // Pipeline parallelism: the global gradient norm (for clipping) also sums over the other pipeline stages,
  // while LAMB's per-tensor norms stay within the stage. When set, these replace norm_weights / norm_reduce for
  // the global norm only (e.g. weight 0 for the last stage's copy of a tied embedding, counted once).
  std::vector<float> clip_norm_weights;
  NormReduce clip_norm_reduce;
  // The same dp ranks on the host plane, for the norms and the checkpoint accessors; nullptr: the dp group itself
  // (a CPU run, where one Gloo group serves both).
  ProcessGroup* host = nullptr;
  // Per parameter: 1 when this instance reduces and updates it; empty: every parameter. A run of selected tensors
  // must start and end on a dp*16 boundary of the flat buffers (ParamStore aligns expert-parallel runs).
  std::vector<char> tensors;
  // The summed gradients are divided by this many replicas (the mean over the global batch); 0: the group's size.
  int mean_over = 0;
  // false: the caller installs the model's hooks and forwards them to hooks() (two instances over one model).
  bool install_hooks = true;
};

// Every float of the flat buffer is padded so that it splits into dp equal, 16-aligned slices per bucket.
inline size_t dp_pad_multiple(int dp) { return static_cast<size_t>(dp) * 16; }

class DataParallel {
 public:
  // model must have been built with pad_multiple = dp_pad_multiple(group.size()).
  DataParallel(GPT& model, ProcessGroup& group, Ops& ops, const OptimConfig& ocfg, const DataParallelOptions& opt = {});
  ~DataParallel();

  // Call before the last micro-batch's backward of a step: its finished buckets are reduce-scattered on the fly.
  // (Earlier micro-batches only accumulate locally.)
  void begin_last_backward();
  // Pipeline parallelism: call right before the backward of the last micro-batch on model chunk c (in the last
  // pipeline run of a step). The gradients that backward produces (GPT::chunk_params(c)) are final as it finishes
  // them, and each bucket is reduce-scattered as soon as every tensor in it is final; chunks may finish in any
  // order (interleaving). A stage's tied-embedding copy is summed with the other stage's after the pipeline, so
  // its buckets wait for finish_gradients.
  void begin_last_backward(int chunk);
  // After the last backward: waits for the reduce-scatters, returns the global gradient norm (of the mean
  // gradient over the dp ranks' data).
  double finish_gradients();
  // Sharded optimizer update of the owned slices, then the asynchronous all-gather of the parameters.
  void step(float lr, float grad_scale, int step);
  // Waits for every outstanding all-gather (e.g. before a checkpoint).
  void sync_params();

  // Full optimizer moments assembled from every rank's slices, in host memory (collective over the host-plane dp group:
  // all dp ranks must call it).
  void gather_moments(HostBuffer& m, HostBuffer& v);
  // Loads this rank's slices from full moments laid out like the parameters.
  void scatter_moments(const float* m, const float* v);
  // This rank's slices of the moments as pieces of its parameter tensors: elements [begin, end) of tensor
  // `tensor` (flattened) are m[0, end-begin) and v[0, end-begin), in host memory (valid until the next step or
  // the next call). For per-rank (sharded) checkpoints.
  struct MomentSlice {
    int tensor = 0;
    size_t begin = 0, end = 0;
    float *m = nullptr, *v = nullptr;
  };
  std::vector<MomentSlice> moment_slices();
  // After writing into the memory moment_slices() handed out (a restore): makes it the moments the next step uses
  // (copies it to the device; a no-op on a CPU backend, where it is the moments themselves).
  void commit_moment_slices();

  // Called with a bucket's flat range [begin, end) of the local gradients, final, right before its reduce-scatter
  // is launched (during the backward with overlap, else in finish_gradients): fault injection's hook (sdcgrad,
  // train/faults.h). The reduce-scatter only reads the local gradients (into the separate shard buffer), so they
  // stay this rank's own after the reduction (the step's rerun compares them: train/sdc_rerun.h).
  void set_before_reduce(std::function<void(size_t begin, size_t end)> f) { before_reduce_ = std::move(f); }

  // This instance's model hooks (installed by the constructor unless DataParallelOptions::install_hooks is false).
  GptHooks hooks();

  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  // Buckets of the last finish_gradients() whose reduce-scatter was launched during backward (overlapped), not
  // by finish_gradients itself.
  int overlapped_buckets() const { return overlapped_last_; }
  // Communication time of the dp group since the last call (reduce-scatters, all-gathers, norm reductions).
  CommTime take_comm_time() { return std::exchange(comm_time_, CommTime{}); }

 private:
  struct Bucket {
    size_t begin = 0, end = 0;              // flat range
    int lowest_tensor = 0, end_tensor = 0;  // the tensors touching the range: ready when all their grads are final
    WorkPtr rs, ag;
    bool launched = false;
    size_t slice_begin() const;
  };
  void wait(WorkPtr& w);  // waits, accounting exec and exposed time
  // Waits for bucket b's parameter all-gather, then rewrites its range of the compute copy (bf16 on CUDA: what the
  // layers read) from the gathered fp32 weights. A no-op when nothing is in flight.
  void finish_all_gather(Bucket& b);
  Tensor span(float* p, size_t n) const;  // n floats of the backend's memory at p
  ProcessGroup& host() { return opt_.host ? *opt_.host : group_; }
  // My moment slices in host memory: the shard buffers themselves on a CPU backend; else a host copy, pulled
  // from the device when pull is set.
  std::pair<float*, float*> host_moments(bool pull);
  void on_grads_ready(int first_done);
  void arm(int first, int end);
  void on_params_used(int first, int end);
  void launch_reduce_scatter(size_t b);
  size_t slice_len(const Bucket& b) const { return (b.end - b.begin) / static_cast<size_t>(dp_); }
  size_t slice_start(const Bucket& b) const { return b.begin + rank_ * slice_len(b); }
  // Calls f(tensor index, flat begin, flat end, shard offset) for each tensor piece inside my slices.
  template <typename F>
  void for_each_owned_piece(F&& f) const;
  void plan_pieces();  // piece_segs_ / piece_tensor_ (and LAMB's norm buffers) from the buckets
  void plan_buckets(size_t unit, size_t bucket_floats);  // buckets_ / shard_offset_ over the selected tensors

  GPT& model_;
  ProcessGroup& group_;
  Ops& ops_;
  OptimConfig ocfg_;
  DataParallelOptions opt_;
  int dp_, rank_;
  std::vector<Bucket> buckets_;
  Buffer shard_grad_, shard_m_, shard_v_, shard_stage_;  // my slices, concatenated in bucket order (backend memory)
  size_t shard_floats_ = 0;
  HostBuffer host_m_, host_v_;        // host copies of shard_m_ / shard_v_ (only when the backend is not the CPU)
  std::vector<size_t> shard_offset_;  // per bucket: offset of its slice in the shard buffers
  // Per bucket: the tensor pieces in my slice as multi-tensor optimizer segments (offsets within the slice, weight
  // decay per tensor), and each piece's tensor. LAMB: [||w||^2, ||u||^2] per piece, on the device and on the host.
  std::vector<std::vector<AdamSegment>> piece_segs_;
  std::vector<std::vector<int>> piece_tensor_;
  Buffer piece_norms_;
  std::vector<float> piece_norms_host_;
  // Per tensor, in the current step: armed (its last backward has begun), final (that backward finished it);
  // deferred_: never armed (gradient still changes after backward).
  std::vector<char> armed_, final_, deferred_;
  int overlapped_ = 0, overlapped_last_ = 0;
  CommTime comm_time_;
  std::function<void(size_t, size_t)> before_reduce_;
};

}  // namespace mt
