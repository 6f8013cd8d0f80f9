// Token (+ position) embedding ops (kernels in embedding_kernels.cu). A token >= the table's rows cannot be seen
// on the host without a sync: the kernels report it and the next synchronisation raises it.
#include "megatrain/kernels/cuda/cuda_args.h"
#include "megatrain/kernels/cuda/cuda_ops.h"
#include "megatrain/kernels/cuda/launch.h"

namespace mt {

using namespace cuda_args;

namespace {

// Tokens are [B, T] (or [T] for one sequence); the position of token i is i % T.
int64_t seq_len(const Tensor& tokens) { return tokens.ndim >= 2 ? tokens.size(-1) : tokens.numel(); }

}  // namespace

void CudaOps::embedding_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe) {
  const char* op = "embedding_forward";
  auto scope = timed(op);
  auto* o = bf16_arg(out, op, "out");
  const int32_t* tok = i32_arg(tokens, op, "tokens");
  const auto* te = bf16_arg(wte, op, "wte");
  const auto* pe = bf16_opt(wpe, op, "wpe");
  MT_CHECK(wte.ndim == 2, "{}: wte must be 2-D [V, C] (got {})", op, wte.shape_str());
  const int64_t C = wte.size(1), N = tokens.numel(), T = seq_len(tokens);
  check_numel(out, N * C, op, "out");
  if (pe) {
    MT_CHECK(wpe.ndim == 2 && wpe.size(1) == C, "{}: wpe {} must be [max_T, {}]", op, wpe.shape_str(), C);
    MT_CHECK(T <= wpe.size(0), "{}: sequence length {} exceeds the {} positions of wpe", op, T, wpe.size(0));
  }
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
  MT_CHECK(dwte.ndim == 2, "{}: dwte must be 2-D [V, C] (got {})", op, dwte.shape_str());
  const int64_t C = dwte.size(1), N = tokens.numel(), T = seq_len(tokens);
  check_numel(dout, N * C, op, "dout");
  if (dpe) {
    MT_CHECK(dwpe.ndim == 2 && dwpe.size(1) == C, "{}: dwpe {} must be [max_T, {}]", op, dwpe.shape_str(), C);
    MT_CHECK(T <= dwpe.size(0), "{}: sequence length {} exceeds the {} positions of dwpe", op, T, dwpe.size(0));
  }
  if (N == 0) return;
  cuda::embedding_backward(stream_, dte, dwte.size(0), dpe, dy, tok, N, T, C, err_dev_);
}

}  // namespace mt
