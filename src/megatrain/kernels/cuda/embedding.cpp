// Token (+ position) embedding ops (kernels in embedding_kernels.cu). A token >= the table's rows cannot be seen
// on the host without a sync: the kernels report it and the next synchronisation raises it.
#include "megatrain/kernels/cuda/cuda_args.h"
#include "megatrain/kernels/cuda/cuda_ops.h"
#include "megatrain/kernels/cuda/launch.h"

namespace mt {

using namespace cuda_args;

void CudaOps::embedding_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe) {
  const char* op = "embedding_forward";
  auto scope = timed(op);
  auto* o = bf16_arg(out, op, "out");
  const int32_t* tok = i32_arg(tokens, op, "tokens");
  const auto* te = bf16_arg(wte, op, "wte");
  const auto* pe = bf16_opt(wpe, op, "wpe");
  const auto [N, T, C, V] = embedding_dims(op, out, tokens, wte, wpe);
  if (N == 0) return;
  cuda::embedding_forward(stream_, o, tok, te, wte.size(0), pe, N, T, C, err_dev_);
}

void CudaOps::embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens) {
  const char* op = "embedding_backward";
  auto scope = timed(op);
  float* dte = f32_arg(dwte, op, "dwte");
  float* dpe = f32_opt(dwpe, op, "dwpe");
  const auto* dy = bf16_arg(dout, op, "dout");
  const int32_t* tok = i32_arg(tokens, op, "tokens");
  const auto [N, T, C, V] = embedding_backward_dims(op, dwte, dwpe, dout, tokens);
  if (N == 0) return;
  if (!deterministic_) {
    cuda::embedding_backward(stream_, dte, dwte.size(0), dpe, dy, tok, N, T, C, err_dev_);
    return;
  }
  // The sort's workspace is sized by the first call (the shape of every step of a run); a larger shape grows it
  // (a sync and a cudaMalloc, once).
  const size_t need = cuda::embedding_sorted_workspace_bytes(N, dwte.size(0));
  if (need > emb_ws_bytes_) {
    cuda::check(cudaStreamSynchronize(stream_), "embedding_backward: cudaStreamSynchronize");
    if (emb_ws_) cuda::check(cudaFree(emb_ws_), "embedding_backward: cudaFree");
    emb_ws_ = nullptr;
    emb_ws_bytes_ = 0;
    cuda::check(cudaMalloc(&emb_ws_, need), "embedding_backward: cudaMalloc(sort workspace)");
    emb_ws_bytes_ = need;
  }
  cuda::embedding_backward_sorted(stream_, dte, dwte.size(0), dpe, dy, tok, N, T, C, err_dev_, emb_ws_);
}

}  // namespace mt
