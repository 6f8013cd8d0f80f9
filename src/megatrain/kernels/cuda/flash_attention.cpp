// Flash attention's host side: checks the arguments, lays out the workspace, launches the kernels
// (flash_attention.cu) and turns a failed CUDA call into an mt::Error naming it.
#include "megatrain/kernels/cuda/flash_attention.h"

#include <cstdint>

#include "megatrain/core/error.h"
#include "megatrain/kernels/cuda/flash_attention_kernels.h"

namespace mt {

namespace {

void check_args(const char* op, const AttnShape& s) {
  MT_CHECK(s.B > 0 && s.T > 0, "{}: B ({}) and T ({}) must be positive", op, s.B, s.T);
  MT_CHECK(s.n_head > 0 && s.n_kv_head > 0 && s.n_head % s.n_kv_head == 0,
           "{}: n_head ({}) must be a positive multiple of n_kv_head ({})", op, s.n_head, s.n_kv_head);
  MT_CHECK(s.head_dim == 64 || s.head_dim == 128,
           "{}: head_dim {} is not supported by the CUDA flash attention kernels (only 64 and 128)", op, s.head_dim);
  MT_CHECK(s.window >= 0, "{}: window must be >= 0 (got {})", op, s.window);
  // The kernels index rows and (b, h, t) with 32-bit ints; element offsets are 64-bit.
  MT_CHECK(int64_t{s.B} * s.T * s.n_head < (int64_t{1} << 31), "{}: B*T*n_head ({}) is too large", op,
           int64_t{s.B} * s.T * s.n_head);
}

// Tiles are copied 16 bytes at a time.
void check_ptr(const char* op, const char* name, const void* p) {
  MT_CHECK(p != nullptr, "{}: {} is null", op, name);
  MT_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0, "{}: {} must be 16-byte aligned", op, name);
}

void raise_if_failed(const char* op, const flash::Status& st) {
  MT_CHECK(st.err == cudaSuccess, "{}: {} failed: {}", op, st.what, cudaGetErrorString(st.err));
}

flash::Problem problem(const AttnShape& s) {
  flash::Problem p;
  p.B = s.B;
  p.T = s.T;
  p.H = s.n_head;
  p.Hkv = s.n_kv_head;
  p.hd = s.head_dim;
  p.window = s.window;
  return p;
}

// The dq accumulator's bytes, rounded up so D after it stays 256-byte aligned.
size_t dq_bytes(const AttnShape& s) {
  const size_t n = static_cast<size_t>(s.B) * s.T * s.n_head * s.head_dim * sizeof(float);
  return (n + 255) / 256 * 256;
}

}  // namespace

size_t flash_attention_workspace_bytes(const AttnShape& s) {
  return dq_bytes(s) + static_cast<size_t>(s.B) * s.n_head * s.T * sizeof(float);
}

void flash_attention_forward(cudaStream_t stream, const AttnShape& s, const __nv_bfloat16* qkv, __nv_bfloat16* out,
                             float* lse) {
  const char* op = "flash_attention_forward";
  check_args(op, s);
  check_ptr(op, "qkv", qkv);
  check_ptr(op, "out", out);
  check_ptr(op, "lse", lse);
  raise_if_failed(op, flash::launch_forward(stream, problem(s), qkv, out, lse));
}

void flash_attention_backward(cudaStream_t stream, const AttnShape& s, const __nv_bfloat16* qkv,
                              const __nv_bfloat16* out, const __nv_bfloat16* dout, const float* lse,
                              __nv_bfloat16* dqkv, float* workspace, bool deterministic) {
  const char* op = "flash_attention_backward";
  check_args(op, s);
  check_ptr(op, "qkv", qkv);
  check_ptr(op, "out", out);
  check_ptr(op, "dout", dout);
  check_ptr(op, "lse", lse);
  check_ptr(op, "dqkv", dqkv);
  check_ptr(op, "workspace", workspace);
  MT_CHECK(static_cast<const void*>(dqkv) != static_cast<const void*>(qkv), "{}: dqkv must not alias qkv", op);
  float* dq_acc = workspace;
  float* Dvec = reinterpret_cast<float*>(reinterpret_cast<char*>(workspace) + dq_bytes(s));
  raise_if_failed(op,
                  flash::launch_backward(stream, problem(s), qkv, out, dout, lse, dqkv, dq_acc, Dvec, deterministic));
}

}  // namespace mt
