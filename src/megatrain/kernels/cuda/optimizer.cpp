// AdamW and LAMB ops (kernels in optimizer_kernels.cu) over fp32 master weights, gradients and moments.
#include <algorithm>
#include <string>

#include "megatrain/kernels/cuda/cuda_args.h"
#include "megatrain/kernels/cuda/cuda_ops.h"
#include "megatrain/kernels/cuda/launch.h"

namespace mt {

using namespace cuda_args;

namespace {

// The CPU backend's constants (op_shapes.h's adam_consts), with the learning rate for the kernels.
cuda::AdamConsts kernel_consts(const char* op, const AdamHParams& h) {
  const AdamConsts k = adam_consts(op, h);
  return {k.b1, k.b2, k.one_minus_b1, k.one_minus_b2, k.inv_bc1, k.inv_bc2, k.eps, k.wd, k.gs, h.lr};
}

}  // namespace

void CudaOps::adamw_update(Tensor param, Tensor grad, Tensor m_t, Tensor v_t, const AdamHParams& h) {
  const char* op = "adamw_update";
  auto scope = timed(op);
  const auto [p, m, v, n] = opt_args(op, param, m_t, v_t, cuda_args::f32_arg);
  const float* g = f32_arg(grad, op, "grad");
  check_numel(grad, n, op, "grad");
  cuda::adamw_update(stream_, p, g, m, v, n, kernel_consts(op, h));
}

CudaOps::SegTable CudaOps::segment_table(const char* op, const std::vector<AdamSegment>& segs, int64_t n,
                                         size_t partials) {
  MT_CHECK(segs.size() <= 65535, "{}: {} segments exceed the 65535 one launch can address", op, segs.size());
  int64_t max_numel = 0;
  for (const AdamSegment& s : segs) {
    MT_CHECK(s.offset >= 0 && s.numel >= 0 && s.offset + s.numel <= n,
             "{}: segment [{}, {}) is outside the flat buffers of {} elements", op, s.offset, s.offset + s.numel, n);
    max_numel = std::max(max_numel, s.numel);
  }
  const size_t table_bytes = (segs.size() * sizeof(cuda::AdamSeg) + 255) / 256 * 256;
  const size_t bytes = table_bytes + partials * sizeof(double);
  auto same = [&](const SegEntry& e) {
    return e.segs.size() == segs.size() &&
           std::equal(segs.begin(), segs.end(), e.segs.begin(), [](const AdamSegment& a, const AdamSegment& b) {
             return a.offset == b.offset && a.numel == b.numel && a.weight_decay == b.weight_decay;
           });
  };
  auto it = std::find_if(seg_tables_.begin(), seg_tables_.end(), same);
  if (it == seg_tables_.end() || it->bytes < bytes) {
    // A new list, or more partials than its entry holds: a buffer of its own (an entry in use by queued kernels is
    // freed only after the stream drained). Runs meet a few lists, once each; a run that kept meeting new ones
    // would drain and start over past kMaxSegTables.
    constexpr size_t kMaxSegTables = 64;
    if (it != seg_tables_.end() || seg_tables_.size() >= kMaxSegTables) {
      cuda::check(cudaStreamSynchronize(stream_), (std::string(op) + ": cudaStreamSynchronize").c_str());
      if (it != seg_tables_.end()) {
        cudaFree(it->dev);
        seg_tables_.erase(it);
      } else {
        for (auto& e : seg_tables_) cudaFree(e.dev);
        seg_tables_.clear();
      }
    }
    SegEntry e;
    e.segs = segs;
    e.bytes = bytes;
    cuda::check(cudaMalloc(&e.dev, bytes), (std::string(op) + ": cudaMalloc(segment table)").c_str());
    std::vector<cuda::AdamSeg> table;
    for (const AdamSegment& s : segs) table.push_back({s.offset, s.numel, s.weight_decay});
    // On the compute stream: the kernels queued after it read the table only once it landed. From pageable memory
    // the call stages `table` before it returns, so the vector may go.
    cuda::check(cudaMemcpyAsync(e.dev, table.data(), table.size() * sizeof(cuda::AdamSeg), cudaMemcpyHostToDevice,
                                stream_),
                (std::string(op) + ": cudaMemcpyAsync(segment table)").c_str());
    seg_tables_.push_back(std::move(e));
    it = seg_tables_.end() - 1;
  }
  return {it->dev, reinterpret_cast<double*>(static_cast<char*>(it->dev) + table_bytes), max_numel};
}

void CudaOps::adamw_update_multi(Tensor param, Tensor grad, Tensor m_t, Tensor v_t,
                                 const std::vector<AdamSegment>& segs, const AdamHParams& h, Tensor weight_out) {
  const char* op = "adamw_update_multi";
  auto scope = timed(op);
  const auto [p, m, v, n] = opt_args(op, param, m_t, v_t, cuda_args::f32_arg);
  const float* g = f32_arg(grad, op, "grad");
  check_numel(grad, n, op, "grad");
  uint16_t* w16 = nullptr;
  if (weight_out.defined()) {
    if (weight_out.dtype != DType::BF16)  // an fp32 copy: the generic path (update, then convert per segment)
      return Ops::adamw_update_multi(param, grad, m_t, v_t, segs, h, weight_out);
    w16 = reinterpret_cast<uint16_t*>(bf16_arg(weight_out, op, "weight_out"));
    check_numel(weight_out, n, op, "weight_out");
  }
  if (segs.empty()) return;
  const SegTable t = segment_table(op, segs, n, 0);
  cuda::adamw_update_multi(stream_, p, g, m, v, static_cast<const cuda::AdamSeg*>(t.segs),
                           static_cast<int>(segs.size()), t.max_numel, kernel_consts(op, h), w16);
}

double CudaOps::lamb_moments(Tensor param, Tensor grad, Tensor m_t, Tensor v_t, const AdamHParams& h) {
  const char* op = "lamb_moments";
  int blocks = 0;
  {
    auto scope = timed(op);
    const auto [p, m, v, n] = opt_args(op, param, m_t, v_t, cuda_args::f32_arg);
    const float* g = f32_arg(grad, op, "grad");
    check_numel(grad, n, op, "grad");
    blocks = cuda::lamb_moments(stream_, p, g, m, v, n, kernel_consts(op, h), partials_dev_);
  }
  return sum_partials(blocks);
}

void CudaOps::lamb_apply(Tensor param, Tensor m_t, Tensor v_t, const AdamHParams& h, float trust) {
  const char* op = "lamb_apply";
  auto scope = timed(op);
  const auto [p, m, v, n] = opt_args(op, param, m_t, v_t, cuda_args::f32_arg);
  cuda::lamb_apply(stream_, p, m, v, n, kernel_consts(op, h), h.lr * trust);
}

void CudaOps::lamb_moments_multi(Tensor param, Tensor grad, Tensor m_t, Tensor v_t,
                                 const std::vector<AdamSegment>& segs, const AdamHParams& h, Tensor norms) {
  const char* op = "lamb_moments_multi";
  auto scope = timed(op);
  const auto [p, m, v, n] = opt_args(op, param, m_t, v_t, cuda_args::f32_arg);
  const float* g = f32_arg(grad, op, "grad");
  check_numel(grad, n, op, "grad");
  lamb_multi_check(op, norms, segs, n, Device::CUDA);
  if (segs.empty()) return;
  float* out = f32_arg(norms, op, "norms");
  int64_t max_numel = 0;
  for (const AdamSegment& s : segs) max_numel = std::max(max_numel, s.numel);
  const int n_segs = static_cast<int>(segs.size());
  const SegTable t = segment_table(op, segs, n, cuda::lamb_multi_partials(n_segs, max_numel));
  cuda::lamb_moments_multi(stream_, p, g, m, v, static_cast<const cuda::AdamSeg*>(t.segs), n_segs, t.max_numel,
                           kernel_consts(op, h), t.partials, out);
}

void CudaOps::lamb_apply_multi(Tensor param, Tensor m_t, Tensor v_t, const std::vector<AdamSegment>& segs,
                               const AdamHParams& h, Tensor norms) {
  const char* op = "lamb_apply_multi";
  auto scope = timed(op);
  const auto [p, m, v, n] = opt_args(op, param, m_t, v_t, cuda_args::f32_arg);
  lamb_multi_check(op, norms, segs, n, Device::CUDA);
  if (segs.empty()) return;
  const float* in = f32_arg(norms, op, "norms");
  // No partials: the table keeps whatever room lamb_moments_multi gave it.
  const SegTable t = segment_table(op, segs, n, 0);
  cuda::lamb_apply_multi(stream_, p, m, v, static_cast<const cuda::AdamSeg*>(t.segs), static_cast<int>(segs.size()),
                         t.max_numel, kernel_consts(op, h), in);
}

}  // namespace mt
