// Attention ops: tensor checks here, the work in flash_attention.{h,cpp,cu} (the flash attention kernels), which
// check the shape itself (head_dim 64 or 128, 16-byte aligned pointers), or, after use_cudnn_attention(), in
// cudnn_attention.{h,cpp} (cuDNN's fused attention; a shape it refuses throws naming the shape, no fallback - except
// in deterministic mode, where a shape cuDNN has only nondeterministic engines for runs our flash kernel).
#include <fmt/format.h>

#include "megatrain/kernels/cuda/cuda_args.h"
#include "megatrain/kernels/cuda/cuda_ops.h"
#include "megatrain/kernels/cuda/flash_attention.h"
#include "megatrain/kernels/cuda/launch.h"

namespace mt {

using namespace cuda_args;
using cuda::bf16;

void CudaOps::set_deterministic(bool on) {
  deterministic_ = on;
  if (cudnn_attn_) cudnn_attn_->set_deterministic(on);
}

bool CudaOps::attention_on_cudnn(const AttnShape& s, bool backward) {
  if (!cudnn_attn_) return false;
  if (!deterministic_ || cudnn_attn_->has_deterministic(s, backward)) return true;
  if (!said_cudnn_fallback_) {
    fmt::print(stderr,
               "note: train.deterministic: cuDNN proposes only nondeterministic engines for the attention {} of "
               "B={} T={} n_head={} n_kv_head={} head_dim={} window={}; running our flash kernel's deterministic "
               "path for it instead (said once)\n",
               backward ? "backward" : "forward", s.B, s.T, s.n_head, s.n_kv_head, s.head_dim, s.window);
    said_cudnn_fallback_ = true;
  }
  return false;
}

void CudaOps::reserve(const AttnShape& s) {
  check_attn_shape("reserve", s);
  if (cudnn_attn_) {
    cudnn_attn_->reserve(s);
    if (attention_on_cudnn(s, false) && attention_on_cudnn(s, true)) return;
  }
  reserve_flash(s);
}

void CudaOps::reserve_flash(const AttnShape& s) {
  const size_t need = flash_attention_workspace_bytes(s);
  if (need <= attn_ws_bytes_) return;
  // Growing frees the old workspace: wait for the ops that may still use it.
  cuda::check(cudaStreamSynchronize(stream_), "reserve: cudaStreamSynchronize");
  if (attn_ws_) cuda::check(cudaFree(attn_ws_), "reserve: cudaFree");
  attn_ws_ = nullptr;
  attn_ws_bytes_ = 0;
  cuda::check(cudaMalloc(&attn_ws_, need), "reserve: cudaMalloc(attention workspace)");
  attn_ws_bytes_ = need;
}

void CudaOps::attention_forward(Tensor out, Tensor lse, Tensor qkv, const AttnShape& s) {
  const char* op = "attention_forward";
  auto scope = timed(op);
  check_attn_shape(op, s);
  auto* o = bf16_arg(out, op, "out");
  float* L = f32_arg(lse, op, "lse");
  const auto* x = bf16_arg(qkv, op, "qkv");
  check_attention_forward(op, out, lse, qkv, s);
  if (attention_on_cudnn(s, false))
    cudnn_attn_->forward(s, x, o, L);
  else
    flash_attention_forward(stream_, s, x, o, L);
}

void CudaOps::attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, const AttnShape& s) {
  const char* op = "attention_backward";
  auto scope = timed(op);
  check_attn_shape(op, s);
  auto* dx = bf16_arg(dqkv, op, "dqkv");
  const auto* dy = bf16_arg(dout, op, "dout");
  const auto* x = bf16_arg(qkv, op, "qkv");
  const auto* o = bf16_arg(out, op, "out");
  const float* L = f32_arg(lse, op, "lse");
  const int64_t rows = int64_t{s.B} * s.T;
  check_numel(qkv, rows * s.qkv_width(), op, "qkv");
  check_numel(dqkv, rows * s.qkv_width(), op, "dqkv");
  check_numel(out, rows * s.n_head * s.head_dim, op, "out");
  check_numel(dout, rows * s.n_head * s.head_dim, op, "dout");
  check_numel(lse, int64_t{s.B} * s.n_head * s.T, op, "lse");
  MT_CHECK(dqkv.ptr != qkv.ptr, "{}: dqkv must not alias qkv", op);
  if (attention_on_cudnn(s, true)) {
    cudnn_attn_->backward(s, x, o, dy, L, dx);
    return;
  }
  // The workspace is normally sized up front by reserve(); the first call of a larger shape grows it (a sync and
  // a cudaMalloc, once).
  reserve_flash(s);
  flash_attention_backward(stream_, s, x, o, dy, L, dx, static_cast<float*>(attn_ws_), deterministic_);
}

}  // namespace mt
