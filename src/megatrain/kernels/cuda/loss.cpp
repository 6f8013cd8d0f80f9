// Softmax cross-entropy and its vocab-parallel steps (kernels in loss_kernels.cu): bf16 logits (overwritten with
// bf16 dlogits when write_grad), I32 targets, F32 losses and stats. Out-of-range targets are found on the device
// and raised at the next synchronisation (checking them here would cost a device-to-host copy and a sync per call).
#include "megatrain/kernels/cuda/cuda_args.h"
#include "megatrain/kernels/cuda/cuda_ops.h"
#include "megatrain/kernels/cuda/launch.h"

namespace mt {

using namespace cuda_args;

void CudaOps::cross_entropy(Tensor losses, Tensor logits, Tensor targets, int V, float dloss, bool write_grad) {
  const char* op = "cross_entropy";
  auto scope = timed(op);
  float* loss = f32_arg(losses, op, "losses");
  auto* z = bf16_arg(logits, op, "logits");
  const int32_t* tgt = i32_arg(targets, op, "targets");
  const auto [N, Vp] = cross_entropy_dims(op, losses, logits, targets, V);
  cuda::cross_entropy(stream_, loss, z, tgt, N, Vp, V, dloss, write_grad, err_dev_);
}

void CudaOps::vp_ce_max(Tensor stats, Tensor logits, int n_real) {
  const char* op = "vp_ce_max";
  auto scope = timed(op);
  float* st = f32_arg(stats, op, "stats");
  const auto* z = bf16_arg(logits, op, "logits");
  const auto [N, Vl] = vp_ce_dims(op, stats, logits, n_real);
  cuda::vp_ce_max(stream_, st, z, N, Vl, n_real);
}

void CudaOps::vp_ce_sums(Tensor stats, Tensor logits, Tensor targets, int64_t v0, int n_real, int V) {
  const char* op = "vp_ce_sums";
  auto scope = timed(op);
  float* st = f32_arg(stats, op, "stats");
  const auto* z = bf16_arg(logits, op, "logits");
  const int32_t* tgt = i32_arg(targets, op, "targets");
  const auto [N, Vl] = vp_ce_dims(op, stats, logits, n_real);
  check_numel(targets, N, op, "targets");
  cuda::vp_ce_sums(stream_, st, z, tgt, N, Vl, v0, n_real, V, err_dev_);
}

void CudaOps::vp_ce_finish(Tensor losses, Tensor logits, Tensor stats, Tensor targets, int64_t v0, int n_real,
                           float dloss, bool write_grad) {
  const char* op = "vp_ce_finish";
  auto scope = timed(op);
  float* loss = f32_arg(losses, op, "losses");
  auto* z = bf16_arg(logits, op, "logits");
  const float* st = f32_arg(stats, op, "stats");
  const int32_t* tgt = i32_arg(targets, op, "targets");
  const auto [N, Vl] = vp_ce_dims(op, stats, logits, n_real);
  check_numel(targets, N, op, "targets");
  check_numel(losses, N, op, "losses");
  cuda::vp_ce_finish(stream_, loss, z, st, tgt, N, Vl, v0, n_real, dloss, write_grad);
}

}  // namespace mt
