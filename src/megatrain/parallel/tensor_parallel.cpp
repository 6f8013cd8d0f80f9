#include "megatrain/parallel/tensor_parallel.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"

namespace mt {

namespace {
Tensor span(float* p, int64_t n) { return f32_view(p, {n}); }

struct RowsShape {
  int64_t rows, cols;
};

RowsShape rows_of(const Tensor& t, const char* what) {
  MT_CHECK(t.defined() && (t.dtype == DType::F32 || t.dtype == DType::BF16) && t.ndim >= 1,
           "tensor parallel: {} must be a defined F32 or BF16 tensor (got {} {})", what, dtype_name(t.dtype),
           t.shape_str());
  const int64_t rows = t.size(0);
  return {rows, rows > 0 ? t.numel() / rows : 0};
}

// Elements [at, at + n) of the memory `base` points to, as a 1-D tensor of like's dtype and device.
Tensor elems(const Tensor& like, void* base, int64_t at, int64_t n) {
  return Tensor(static_cast<char*>(base) + static_cast<size_t>(at) * dtype_size(like.dtype), {n}, like.dtype,
                like.device);
}
}  // namespace

ProcessGroupTpComm::ProcessGroupTpComm(ProcessGroup& group, Ops& ops, const TensorParallelOptions& opt)
    : group_(group), ops_(ops), opt_(opt) {
  MT_CHECK(opt_.chunks >= 1, "parallel.tp_chunks must be >= 1 (got {})", opt_.chunks);
}

int ProcessGroupTpComm::num_chunks(int64_t rows_per_rank) const {
  if (!opt_.overlap) return 1;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(opt_.chunks, rows_per_rank)));
}

void ProcessGroupTpComm::reserve(int64_t rows, int64_t cols, DType dtype) {
  MT_CHECK(rows >= 0 && cols >= 0, "tensor parallel: cannot reserve {} x {} staging", rows, cols);
  stage(static_cast<size_t>(rows * cols) * dtype_size(dtype));
}

char* ProcessGroupTpComm::stage(size_t bytes) {
  if (stage_.size() < bytes) stage_ = ops_.alloc(bytes);
  return static_cast<char*>(stage_.data());
}

void ProcessGroupTpComm::wait(const WorkPtr& w) {
  const double t0 = now_seconds();
  w->wait();
  comm_time_.exposed_seconds += now_seconds() - t0;
  comm_time_.busy_seconds += w->exec_seconds();
}

void ProcessGroupTpComm::allreduce(Tensor t, TpReduce op) {
  wait(group_.allreduce(t, op == TpReduce::Max ? ReduceOp::Max : ReduceOp::Sum));
}

void ProcessGroupTpComm::all_gather_rows(Tensor full, Tensor shard, const Consume& consume) {
  const int tp = size();
  const auto [Ns, C] = rows_of(shard, "all_gather_rows shard");
  const int64_t N = Ns * tp;
  MT_CHECK(full.numel() == N * C, "all_gather_rows: full {} must hold {} ranks x {} rows x {} columns",
           full.shape_str(), tp, Ns, C);
  MT_CHECK(full.dtype == shard.dtype, "all_gather_rows: full is {}, shard {}", dtype_name(full.dtype),
           dtype_name(shard.dtype));
  const int K = num_chunks(Ns);
  if (K == 1) {  // rank-major concatenation is exactly the full layout
    wait(group_.all_gather(full.view({N * C}), shard.view({Ns * C})));
    if (consume) consume(0, N);
    return;
  }
  // Chunk k gathers rows [b_k, b_k+1) of every rank into a staging block [tp, len, C]; all chunks are issued
  // at once (the group runs them in order), so chunk k+1 is in flight while chunk k's rows are consumed. The
  // rows move from the staging block into place by the backend's copies (on the device on a GPU run).
  char* st = stage(static_cast<size_t>(N * C) * dtype_size(shard.dtype));
  auto bound = [&](int k) { return k * Ns / K; };
  std::vector<WorkPtr> works(K);
  for (int k = 0; k < K; ++k) {
    const int64_t b = bound(k), len = bound(k + 1) - b;
    works[k] = group_.all_gather(elems(shard, st, tp * b * C, tp * len * C), elems(shard, shard.ptr, b * C, len * C));
  }
  for (int k = 0; k < K; ++k) {
    wait(works[k]);
    const int64_t b = bound(k), len = bound(k + 1) - b;
    for (int r = 0; r < tp; ++r) {
      ops_.copy(elems(full, full.ptr, (r * Ns + b) * C, len * C), elems(shard, st, (tp * b + r * len) * C, len * C));
      if (consume) consume(r * Ns + b, len);
    }
  }
}

void ProcessGroupTpComm::reduce_scatter_rows(Tensor shard, int64_t N, const Produce& produce,
                                             const std::function<void()>& while_in_flight) {
  const int tp = size();
  const auto [Ns, C] = rows_of(shard, "reduce_scatter_rows shard");
  MT_CHECK(N == Ns * tp, "reduce_scatter_rows: {} rows do not split into {} ranks x {} rows", N, tp, Ns);
  const int K = num_chunks(Ns);
  char* st = stage(static_cast<size_t>(N * C) * dtype_size(shard.dtype));
  auto bound = [&](int k) { return k * Ns / K; };
  std::vector<WorkPtr> works(K);
  // Chunk k: every rank's partial rows [r*Ns + b_k, r*Ns + b_k+1) into a staging block [tp, len, C], then its
  // reduce-scatter is issued while the next chunk is computed.
  for (int k = 0; k < K; ++k) {
    const int64_t b = bound(k), len = bound(k + 1) - b;
    for (int r = 0; r < tp; ++r)
      produce(elems(shard, st, (tp * b + r * len) * C, len * C).view({len, C}), r * Ns + b, len);
    works[k] = group_.reduce_scatter(elems(shard, shard.ptr, b * C, len * C),
                                     elems(shard, st, tp * b * C, tp * len * C));
  }
  if (while_in_flight) while_in_flight();
  for (auto& w : works) wait(w);
}

std::vector<float> tp_norm_weights(const ParamStore& params, int tp_rank) {
  std::vector<float> w(params.size());
  for (size_t i = 0; i < params.size(); ++i)
    w[i] = params.info(static_cast<int>(i)).shard.tp_sharded() || tp_rank == 0 ? 1.0f : 0.0f;
  return w;
}

void tp_gather_full(ProcessGroup& group, const ShardSpec& spec, const float* local, float* full) {
  if (!spec.sharded()) {
    std::memcpy(full, local, static_cast<size_t>(spec.full_numel()) * sizeof(float));
    return;
  }
  MT_CHECK(group.size() == spec.tp_size, "tp_gather_full: the group has {} ranks but the tensor is split {} ways",
           group.size(), spec.tp_size);
  const int64_t n = spec.local_numel();
  std::vector<float> all(static_cast<size_t>(n * spec.tp_size));
  group.all_gather(span(all.data(), static_cast<int64_t>(all.size())), span(const_cast<float*>(local), n))->wait();
  for (int r = 0; r < spec.tp_size; ++r) shard_place(spec, r, all.data() + r * n, full);
}

}  // namespace mt
