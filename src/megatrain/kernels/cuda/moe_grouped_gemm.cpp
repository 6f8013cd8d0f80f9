// The grouped expert GEMMs: one cuBLASLt GEMM per expert with rows (the linear layer's calls, linear_calls.h, on the
// expert's row block and weight slice), spread over a few streams.
//
// Why not one grouped call: this toolkit's cuBLASLt has no grouped GEMM of different shapes per group (its batched
// modes, strided and pointer-array, take one m, n, k for the whole batch), and cuBLAS's cublasGemmGroupedBatchedEx
// would bring in libcublas beside the cuBLASLt this backend loads. Why several streams: an expert's block is
// N * k / E rows on average, so with many experts each GEMM is too small to fill the GPU, and on one stream they
// would run one after another. The experts with rows are dealt to the lanes in expert order (GemmLanes: the op
// stream and side streams forked from and joined back to it), so the group is one op in stream order; each expert's
// product is computed by the same algorithm whichever lane runs it, and no two experts write the same memory, so the
// result does not depend on the lanes or their timing. Experts without rows launch nothing (in the backward with
// accumulate_dw false their dw is zeroed, as matmul_backward does for an empty batch).
#include "megatrain/kernels/cuda/cuda_args.h"
#include "megatrain/kernels/cuda/cuda_ops.h"
#include "megatrain/kernels/cuda/launch.h"
#include "megatrain/kernels/cuda/linear_calls.h"
#include "megatrain/kernels/cuda/moe_grouped_calls.h"

namespace mt {

using namespace cuda_args;
using cuda::bf16;

namespace {

// A row-block tensor: required unless there are no rows.
bf16* rows_arg(const Tensor& t, int64_t rows, const char* op, const char* name) {
  return rows > 0 || t.defined() ? bf16_arg(t, op, name) : nullptr;
}

// The experts with at least one row, in expert order; checks that every GEMM fits cuBLASLt's 32-bit dimensions.
std::vector<int> experts_with_rows(const char* op, const GroupedDims& g, const std::vector<int64_t>& offsets) {
  constexpr int64_t kMax = (int64_t{1} << 31) - 1;
  MT_CHECK(g.I > 0, "{}: w [{}, {}, {}] has no input channels", op, g.E, g.O, g.I);
  MT_CHECK(g.O <= kMax && g.I <= kMax, "{}: dimensions too large for one GEMM", op);
  std::vector<int> experts;
  for (int e = 0; e < g.E; ++e) {
    const int64_t rows = offsets[e + 1] - offsets[e];
    MT_CHECK(rows <= kMax, "{}: expert {} has {} rows, too many for one GEMM", op, e, rows);
    if (rows > 0) experts.push_back(e);
  }
  return experts;
}

// Runs the GEMMs, those of the i-th expert in the list on lane i % lanes (all on the op stream without lanes or with
// fewer than two experts), the side streams forked from the op stream first and joined back to it last, also when a
// GEMM throws, so the op stream never runs ahead of work issued on a side stream.
void run_gemms(GemmLanes* lanes, cudaStream_t main, LtGemm& main_gemm, const std::vector<ExpertGemm>& gemms,
               const char* op) {
  auto run = [&](const ExpertGemm& g, int lane) {
    LtGemm& gemm = lanes ? lanes->gemm(lane, main_gemm) : main_gemm;
    if (!gemm.run(lanes ? lanes->stream(lane, main) : main, g.call, op))
      fail("{}: cuBLASLt found no algorithm for expert {}'s {} GEMM (m {}, n {}, k {})", op, g.expert, g.what, g.call.m,
           g.call.n, g.call.k);
  };
  const bool several = !gemms.empty() && gemms.front().expert != gemms.back().expert;
  if (!lanes || !several) {
    for (const ExpertGemm& g : gemms) run(g, 0);
    return;
  }
  lanes->fork(main);
  try {
    int slot = -1, last = -1;  // the expert's place among those with rows
    for (const ExpertGemm& g : gemms) {
      if (g.expert != last) ++slot, last = g.expert;
      run(g, slot % lanes->lanes());
    }
  } catch (...) {
    lanes->join(main);
    throw;
  }
  lanes->join(main);
}

}  // namespace

void CudaOps::set_expert_lanes(int n) {
  MT_CHECK(n >= 1 && n <= 16, "set_expert_lanes: {} lanes (1 to 16)", n);
  if (n != expert_lanes_) lanes_.reset();
  expert_lanes_ = n;
}

GemmLanes* CudaOps::gemm_lanes() {
  if (expert_lanes_ <= 1) return nullptr;
  if (!lanes_) lanes_ = std::make_unique<GemmLanes>(expert_lanes_, gemm_->tuning());
  return lanes_.get();
}

void CudaOps::moe_grouped_matmul_forward(Tensor out, Tensor in, Tensor w, const std::vector<int64_t>& offsets) {
  const char* op = "moe_grouped_matmul_forward";
  auto scope = timed(op);
  const bf16* wt = bf16_arg(w, op, "w");
  const GroupedDims g = grouped_dims(op, out, in, w, offsets);
  bf16* o = rows_arg(out, g.A, op, "out");
  const bf16* x = rows_arg(in, g.A, op, "in");
  const std::vector<int> experts = experts_with_rows(op, g, offsets);
  if (g.O == 0) return;
  run_gemms(experts.size() >= 2 ? gemm_lanes() : nullptr, stream_, *gemm_, grouped_forward_gemms(o, x, wt, g, offsets),
            op);
}

void CudaOps::moe_grouped_matmul_backward(Tensor din, Tensor dw, Tensor dout, Tensor in, Tensor w,
                                          const std::vector<int64_t>& offsets, bool accumulate_dw) {
  const char* op = "moe_grouped_matmul_backward";
  auto scope = timed(op);
  const bf16* wt = bf16_arg(w, op, "w");
  float* dwt = f32_arg(dw, op, "dw");
  const GroupedDims g = grouped_dims(op, dout, in, w, offsets);
  check_numel(dw, g.E * g.O * g.I, op, "dw");
  bf16* dx = din.defined() ? bf16_arg(din, op, "din") : nullptr;
  if (dx) check_numel(din, g.A * g.I, op, "din");
  const bf16* dy = rows_arg(dout, g.A, op, "dout");
  const bf16* x = rows_arg(in, g.A, op, "in");
  const std::vector<int> experts = experts_with_rows(op, g, offsets);
  const size_t expert_bytes = static_cast<size_t>(g.O * g.I) * sizeof(float);
  if (!accumulate_dw)  // the experts without rows get zeros (an empty sum), in stream order before the lanes fork
    for (int e = 0; e < g.E; ++e)
      if (offsets[e] == offsets[e + 1] && expert_bytes > 0)
        cuda::check(cudaMemsetAsync(dwt + e * g.O * g.I, 0, expert_bytes, stream_), "moe_grouped: memset dw");
  if (g.O == 0) {  // dout has no columns: din = 0, dw is empty
    if (dx && g.A > 0) cuda::check(cudaMemsetAsync(dx, 0, din.nbytes(), stream_), "moe_grouped: memset din");
    return;
  }
  run_gemms(experts.size() >= 2 ? gemm_lanes() : nullptr, stream_, *gemm_,
            grouped_backward_gemms(dx, dwt, dy, x, wt, g, offsets, accumulate_dw), op);
}

std::vector<ExpertGemm> grouped_forward_gemms(void* out, const void* in, const void* w, const GroupedDims& g,
                                              const std::vector<int64_t>& offsets) {
  auto* o = static_cast<bf16*>(out);
  const auto* x = static_cast<const bf16*>(in);
  const auto* wt = static_cast<const bf16*>(w);
  std::vector<ExpertGemm> gemms;
  for (int e = 0; e < g.E; ++e) {
    const int64_t a = offsets[e], rows = offsets[e + 1] - a;
    if (rows == 0) continue;
    const LinearDims d{rows, g.I, g.O};
    gemms.push_back({e, "forward", forward_call(o + a * g.O, x + a * g.I, wt + e * g.O * g.I, d)});
  }
  return gemms;
}

std::vector<ExpertGemm> grouped_backward_gemms(void* din, float* dw, const void* dout, const void* in, const void* w,
                                               const GroupedDims& g, const std::vector<int64_t>& offsets,
                                               bool accumulate_dw) {
  auto* dx = static_cast<bf16*>(din);
  const auto* dy = static_cast<const bf16*>(dout);
  const auto* x = static_cast<const bf16*>(in);
  const auto* wt = static_cast<const bf16*>(w);
  std::vector<ExpertGemm> gemms;
  for (int e = 0; e < g.E; ++e) {
    const int64_t a = offsets[e], rows = offsets[e + 1] - a;
    if (rows == 0) continue;
    const LinearDims d{rows, g.I, g.O};
    const bf16* we = wt + e * g.O * g.I;
    if (dx) gemms.push_back({e, "din", dinp_call(dx + a * g.I, dy + a * g.O, we, d, 0.0f)});
    gemms.push_back({e, "dw", dw_call(dw + e * g.O * g.I, dy + a * g.O, x + a * g.I, d, accumulate_dw ? 1.0f : 0.0f)});
  }
  return gemms;
}

}  // namespace mt
