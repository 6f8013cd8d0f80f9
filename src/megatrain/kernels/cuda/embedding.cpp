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
  cuda::embedding_backward(stream_, dte, dwte.size(0), dpe, dy, tok, N, T, C, err_dev_);
}

}  // namespace mt
