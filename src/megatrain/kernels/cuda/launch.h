// The boundary between the CUDA backend's host code (*.cpp: argument checks, cuBLASLt, timing) and its kernels
// (*_kernels.cu). Everything here is raw device pointers and sizes, already validated by the caller.
//
// Why the split: nvcc's C++20 front end rejects fmt's consteval format strings, and every mt header with an
// MT_CHECK pulls fmt in. So .cu files include only this header and CUDA's, and report failures through
// mt::cuda::check(), defined in a .cpp.
//
// Dtypes: bf16 = activations and the weights' compute copy; float = parameter gradients, statistics, optimizer
// state; int32 = token ids and targets. Every launcher is asynchronous on `s`.
#pragma once
#include "megatrain/kernels/rope_freqs.h"
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace mt::cuda {

using bf16 = __nv_bfloat16;

// Throws mt::Error "<what>: <CUDA error string>" when err != cudaSuccess.
void check(cudaError_t err, const char* what);
// After a kernel launch: reports a bad launch configuration (or an earlier asynchronous fault) naming the kernel.
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

// Errors found by kernels (data-dependent, so the host cannot see them without a sync): a kernel ORs its code into
// a word of device memory and the host reports it at the next synchronisation (CudaOps::sync_and_check).
enum DeviceError : int {
  kErrCeTarget = 1,  // cross_entropy: a target >= V
  kErrToken = 2,     // embedding: a token >= the table's rows
  kErrVpTarget = 4,  // vp_ce_sums: a target >= V
};

// Partial sums of the reductions that end on the host (sum_squares, lamb_moments): at most this many blocks, one
// double each, added on the host in block order (deterministic).
constexpr int kMaxPartials = 1024;

// ---- memory / elementwise (elementwise_kernels.cu) -------------------------------------------------------------
// F32 <-> BF16 with the host's rounding (core/bf16.h) bit for bit, NaN included.
void convert_f32_to_bf16(cudaStream_t s, bf16* dst, const float* src, int64_t n);
void convert_bf16_to_f32(cudaStream_t s, float* dst, const bf16* src, int64_t n);
// `is_bf16` picks the element type of every pointer (all F32 otherwise). Math in fp32, one rounding on store.
void add(cudaStream_t s, bool is_bf16, void* out, const void* a, const void* b, int64_t n);
void axpy(cudaStream_t s, bool is_bf16, void* dst, const void* src, float alpha, int64_t n);
void scale(cudaStream_t s, bool is_bf16, void* x, float alpha, int64_t n);
// partials[g] = sum of x^2 over block g's share (double); returns the number of blocks written (<= kMaxPartials).
int sum_squares_partials(cudaStream_t s, bool is_bf16, const void* x, int64_t n, double* partials);
// core/bits_hash.h's sum S over n 32-bit words, as per-block partial sums (modulo 2^64) in partials; the block count.
int bits_hash_partials(cudaStream_t s, const uint32_t* w, int64_t n, unsigned long long* partials);
// out[c] += sum over rows r of x[r, c] for x [N, C] (out = the sum without accumulate): per-block partial column
// sums in `scratch`, then add_partial_rows (deterministic, no atomics). scratch holds scratch_floats floats.
void column_sums_accumulate(cudaStream_t s, float* out, const bf16* x, int64_t N, int64_t C, float* scratch,
                            size_t scratch_floats, bool accumulate = true);
// The second pass of the column reductions (column sums, the norms' dw/db): for the partial rows [G, W] (row-major),
// column j's sum over the G rows is added to out0[j] for j < split and to out1[j - split] otherwise (out1 may be
// null: those columns are then dropped, e.g. the db half of a LayerNorm without bias). Accumulates (+=), or
// overwrites without accumulate (the bits of adding to zero); the order of the additions is fixed, so the result is
// the same bits on every run.
void add_partial_rows(cudaStream_t s, float* out0, float* out1, int64_t split, const float* partial, int64_t W,
                      int64_t G, bool accumulate = true);

// out[n, j] += bias[j] for out [N, OC]: a separate bias pass, used only as the unfused peer in bench_cuda_ops (the
// ops fuse the bias into the GEMM epilogue).
void add_bias_rows(cudaStream_t s, bf16* out, const bf16* bias, int64_t N, int64_t OC);

// ---- activations (activation_kernels.cu) -----------------------------------------------------------------------
void gelu_forward(cudaStream_t s, bf16* out, const bf16* inp, int64_t n);
void gelu_backward(cudaStream_t s, bf16* dinp, const bf16* inp, const bf16* dout, int64_t n);  // dinp may be dout
void swiglu_forward(cudaStream_t s, bf16* out, const bf16* inp, int64_t N, int64_t F);
void swiglu_backward(cudaStream_t s, bf16* dinp, const bf16* inp, const bf16* dout, int64_t N, int64_t F);

// ---- embedding (embedding_kernels.cu) --------------------------------------------------------------------------
// tokens [N] (N = B*T, position of token i is i % T); wpe may be null.
void embedding_forward(cudaStream_t s, bf16* out, const int32_t* tokens, const bf16* wte, int64_t rows, const bf16* wpe,
                       int64_t N, int64_t T, int64_t C, int* err);
// dwte += (atomics), dwpe += (deterministic: one thread per (t, c) sums the batch in order); dwpe may be null.
void embedding_backward(cudaStream_t s, float* dwte, int64_t rows, float* dwpe, const bf16* dout, const int32_t* tokens,
                        int64_t N, int64_t T, int64_t C, int* err);
// The same sums without atomics, bit for bit the same every run (train.deterministic): the (token, row) pairs are
// radix-sorted by token and each token's rows added in row order (embedding_kernels.cu says how). `workspace`:
// embedding_sorted_workspace_bytes(N, rows) bytes of device memory (contents on entry do not matter).
size_t embedding_sorted_workspace_bytes(int64_t N, int64_t rows);
void embedding_backward_sorted(cudaStream_t s, float* dwte, int64_t rows, float* dwpe, const bf16* dout,
                               const int32_t* tokens, int64_t N, int64_t T, int64_t C, int* err, void* workspace);

// ---- normalisation (norm_kernels.cu) ---------------------------------------------------------------------------
struct NormForwardArgs {
  bf16* out = nullptr;
  float* mean = nullptr;        // may be null (inference; always null for RMS)
  float* rstd = nullptr;        // may be null
  const bf16* inp = nullptr;    // the rows to normalise; with add_b, the residual's first operand
  const bf16* add_b = nullptr;  // optional fused residual add: res = inp + add_b (rounded to bf16), normalised
  bf16* res = nullptr;          // where res is written (may alias inp); required with add_b
  const bf16* w = nullptr;
  const bf16* b = nullptr;  // may be null (and is ignored for RMS)
  int64_t N = 0, C = 0;
  float eps = 0;
  bool rms = false;
};
void norm_forward(cudaStream_t s, const NormForwardArgs& a);

struct NormBackwardArgs {
  bf16* dinp = nullptr;  // accumulated (+=)
  float* dw = nullptr;   // accumulated (+=), or overwritten without accumulate_dw
  float* db = nullptr;   // as dw; may be null; unused for RMS
  bool accumulate_dw = true;
  const bf16* dout = nullptr;
  const bf16* inp = nullptr;
  const bf16* w = nullptr;
  const float* mean = nullptr;  // unused for RMS
  const float* rstd = nullptr;
  int64_t N = 0, C = 0;
  bool rms = false;
  float* scratch = nullptr;  // per-block partial dw/db rows
  size_t scratch_floats = 0;
};
void norm_backward(cudaStream_t s, const NormBackwardArgs& a);

// ---- rope (rope_kernels.cu) ------------------------------------------------------------------------------------
// In place on the q and k heads of qkv [B*T, (n_head + 2*n_kv_head) * hd]; sign +1 rotates, -1 un-rotates.
void rope(cudaStream_t s, bf16* qkv, int64_t B, int64_t T, int n_head, int n_kv_head, int head_dim, const RopeFreqs& f,
          float sign);

// ---- losses (loss_kernels.cu) ----------------------------------------------------------------------------------
void cross_entropy(cudaStream_t s, float* losses, bf16* logits, const int32_t* targets, int64_t N, int64_t Vp,
                   int64_t V, float dloss, bool write_grad, int* err);
void vp_ce_max(cudaStream_t s, float* stats, const bf16* logits, int64_t N, int64_t Vl, int64_t n_real);
void vp_ce_sums(cudaStream_t s, float* stats, const bf16* logits, const int32_t* targets, int64_t N, int64_t Vl,
                int64_t v0, int64_t n_real, int64_t V, int* err);
void vp_ce_finish(cudaStream_t s, float* losses, bf16* logits, const float* stats, const int32_t* targets, int64_t N,
                  int64_t Vl, int64_t v0, int64_t n_real, float dloss, bool write_grad);

// ---- mixture of experts (moe_permute_kernels.cu, moe_combine_kernels.cu) ---------------------------------------
// Rows of C bf16; row [N * k] and token [A] are the routing's (kernels/cpu/moe.h: row -1 = a dropped assignment),
// gate [N * k] its fp32 combine weights. Every sum is in fp32 in a fixed order (slot order across a token's rows),
// rounded once on store: the same bits on every run.
// xp[r, :] = x[token[r], :] for r < A.
void moe_permute(cudaStream_t s, bf16* xp, const bf16* x, const int32_t* token, int64_t A, int64_t C);
// dx[t, :] += the sum over t's kept slots j of dxp[row[t, j], :] (a gather per token: no atomics).
void moe_permute_backward(cudaStream_t s, bf16* dx, const bf16* dxp, const int32_t* row, int64_t N, int k, int64_t C);
// y[t, :] = the sum over t's kept slots j of gate[t, j] * yp[row[t, j], :] (zero when none is kept).
void moe_combine(cudaStream_t s, bf16* y, const bf16* yp, const int32_t* row, const float* gate, int64_t N, int k,
                 int64_t C);
// dyp[row[t, j], :] = gate[t, j] * dy[t, :]; dgate[t, j] = dot(dy[t, :], yp[row[t, j], :]) (0 when dropped), a
// block reduction of per-thread sums over fixed columns.
void moe_combine_backward(cudaStream_t s, bf16* dyp, float* dgate, const bf16* dy, const bf16* yp, const int32_t* row,
                          const float* gate, int64_t N, int k, int64_t C);

// ---- optimizers (optimizer_kernels.cu) -------------------------------------------------------------------------
// The per-call constants of an Adam-style update, computed on the host exactly as the CPU backend does.
struct AdamConsts {
  float b1, b2, one_minus_b1, one_minus_b2, inv_bc1, inv_bc2, eps, wd, gs, lr;
};
void adamw_update(cudaStream_t s, float* p, const float* g, float* m, float* v, int64_t n, const AdamConsts& k);
// One tensor of a multi-tensor update: elements [offset, offset + numel) of the flat buffers, its weight decay.
struct AdamSeg {
  int64_t offset, numel;
  float wd;
};
// AdamW over n_segs segments (a device array) of the flat buffers in one launch; k.wd is replaced per segment.
// max_numel: the largest segment (sizes the grid). w16 (may be null): the bf16 copy, each updated element written
// there too, rounded as convert_f32_to_bf16 rounds.
void adamw_update_multi(cudaStream_t s, float* p, const float* g, float* m, float* v, const AdamSeg* segs, int n_segs,
                        int64_t max_numel, const AdamConsts& k, uint16_t* w16 = nullptr);
// Updates m, v; partials[g] = sum of u^2 over block g (u as in lamb_apply); returns the number of blocks written.
int lamb_moments(cudaStream_t s, const float* p, const float* g, float* m, float* v, int64_t n, const AdamConsts& k,
                 double* partials);
void lamb_apply(cudaStream_t s, float* p, const float* m, const float* v, int64_t n, const AdamConsts& k, float step);
// Multi-tensor LAMB over n_segs segments (a device array; k.wd replaced per segment), never waiting for the host.
// Pass 1 updates m, v and sets norms[2j] = sum of p^2 and norms[2j+1] = sum of u^2 over segment j (each a double
// sum rounded to float): block sums into `partials` (lamb_multi_partials(n_segs, max_numel) doubles), then a second
// launch adds each segment's in a fixed order (deterministic, no atomics). max_numel: the largest segment.
size_t lamb_multi_partials(int n_segs, int64_t max_numel);
void lamb_moments_multi(cudaStream_t s, const float* p, const float* g, float* m, float* v, const AdamSeg* segs,
                        int n_segs, int64_t max_numel, const AdamConsts& k, double* partials, float* norms);
// Pass 2: p -= k.lr * trust_j * u on segment j, trust_j = sqrt(w2 / u2) from norms (1 where either is 0), as
// lamb_trust in ops.h.
void lamb_apply_multi(cudaStream_t s, float* p, const float* m, const float* v, const AdamSeg* segs, int n_segs,
                      int64_t max_numel, const AdamConsts& k, const float* norms);

}  // namespace mt::cuda
