// The ops' backend-independent argument checks: shapes, element counts, ranges, and the sizes each op derives from
// them (N, C, T, ...). Both backends (cpu/, cuda/) call these after their own dtype and device checks (f32_arg,
// bf16_arg, ...), so an op raises the same message on either backend. Every message names the op.
#pragma once
#include <cstdint>
#include <vector>

#include "megatrain/core/tensor.h"
#include "megatrain/kernels/ops.h"

namespace mt {

// t must have n elements.
void check_numel(const Tensor& t, int64_t n, const char* op, const char* name);

// ---- embedding -----------------------------------------------------------------------------------------------
// Tokens are [B, T] (or [T] for one sequence); the position of token i is i % T.
int64_t seq_len(const Tensor& tokens);

struct EmbeddingDims {
  int64_t N, T, C, V;  // N tokens, sequence length T, width C, V rows of the token table
};
// out [N, C], wte [V, C], wpe [max_T, C] with T <= max_T (wpe may be undefined). Token values are not checked.
EmbeddingDims embedding_dims(const char* op, const Tensor& out, const Tensor& tokens, const Tensor& wte,
                             const Tensor& wpe);
// The same for the gradients: dout [N, C], dwte [V, C], dwpe [max_T, C] (may be undefined).
EmbeddingDims embedding_backward_dims(const char* op, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                      const Tensor& tokens);

// ---- linear --------------------------------------------------------------------------------------------------
struct LinearDims {
  int64_t N, C, OC;
};
// w must be 2-D [OC, C]; returns {0, C, OC}.
LinearDims weight_dims(const char* op, const Tensor& w);
// The rows of inp, which must end in C (0 when C is 0); w only names the weight in the message.
int64_t linear_rows(const char* op, const Tensor& inp, const Tensor& w, int64_t C);

// ---- normalisation -------------------------------------------------------------------------------------------
struct NormDims {
  int64_t N, C;
};
// inp [N, C] with C > 0, w [C].
NormDims norm_dims(const char* op, const Tensor& inp, const Tensor& w);
// norm_dims, then out [N, C], and mean [N], rstd [N], b [C] where defined.
NormDims layernorm_dims(const char* op, const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                        const Tensor& w, const Tensor& b);
NormDims rmsnorm_dims(const char* op, const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& w);
// norm_dims, then dinp and dout [N, C], dw [C], db [C] where defined, mean and rstd [N].
NormDims layernorm_backward_dims(const char* op, const Tensor& dinp, const Tensor& dw, const Tensor& db,
                                 const Tensor& dout, const Tensor& inp, const Tensor& w, const Tensor& mean,
                                 const Tensor& rstd);
NormDims rmsnorm_backward_dims(const char* op, const Tensor& dinp, const Tensor& dw, const Tensor& dout,
                               const Tensor& inp, const Tensor& w, const Tensor& rstd);

// ---- attention -----------------------------------------------------------------------------------------------
// B, T, the head counts and head_dim positive, n_head a multiple of n_kv_head, window >= 0.
void check_attn_shape(const char* op, const AttnShape& s);
// qkv [B, T, qkv_width], out [B, T, n_head * head_dim], lse [B, n_head, T].
void check_attention_forward(const char* op, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                             const AttnShape& s);
// The shape RoPE needs (head_dim even), theta > 0, qkv [B, T, qkv_width].
void check_rope(const char* op, const Tensor& qkv, const AttnShape& s, const RopeFreqs& f);

// ---- activations ---------------------------------------------------------------------------------------------
// GeLU: out has inp's element count; returns it.
int64_t gelu_numel(const char* op, const Tensor& out, const Tensor& inp);
// GeLU backward: dinp and dout have inp's element count; returns it.
int64_t gelu_backward_numel(const char* op, const Tensor& dinp, const Tensor& inp, const Tensor& dout);

struct SwigluDims {
  int64_t N, F;
};
// inp [N, 2F] = [gate | up] with F > 0, out [N, F].
SwigluDims swiglu_dims(const char* op, const Tensor& out, const Tensor& inp);
// inp and dinp [N, 2F], dout [N, F].
SwigluDims swiglu_backward_dims(const char* op, const Tensor& dinp, const Tensor& inp, const Tensor& dout);

// ---- loss ----------------------------------------------------------------------------------------------------
struct CeDims {
  int64_t N, Vp;  // rows, padded vocabulary width
};
// logits [N, Vp] with 1 <= V <= Vp, targets [N], losses [N]. Target values are not checked.
CeDims cross_entropy_dims(const char* op, const Tensor& losses, const Tensor& logits, const Tensor& targets, int V);

struct VpDims {
  int64_t N, Vl;  // rows, local logits' width
};
// Vocab-parallel CE: logits [N, Vl] with 0 <= n_real <= Vl, stats [3, N].
VpDims vp_ce_dims(const char* op, const Tensor& stats, const Tensor& logits, int n_real);

// ---- mixture of experts ---------------------------------------------------------------------------------------
struct MoeDims {
  int64_t N, A, C;  // tokens, permuted rows, row width
  int k;
};
// r.host is set and r's tensors hold what it says (row and gate N*k elements, token A, each where defined: a
// backend checks that those it reads are); `tokens` is [N, C] (C its last dimension) and `permuted` has A*C elements
// (it may be undefined when A is 0). Names the tensors tokens_name and permuted_name.
MoeDims moe_dims(const char* op, const MoeDeviceRouting& r, const Tensor& tokens, const char* tokens_name,
                 const Tensor& permuted, const char* permuted_name);

struct GroupedDims {
  int64_t E, O, I, A;  // experts, output and input width, rows
};
// w [E, O, I]; offsets [E + 1] from 0, never decreasing, A = offsets[E]; in has A*I elements and out A*O (in and
// out may be undefined when A is 0 or the caller skips them).
GroupedDims grouped_dims(const char* op, const Tensor& out, const Tensor& in, const Tensor& w,
                         const std::vector<int64_t>& offsets);

// ---- optimizers ----------------------------------------------------------------------------------------------
// Per-call constants of an Adam-style moment update, bias corrections (computed in double) folded into reciprocals.
struct AdamConsts {
  float b1, b2, one_minus_b1, one_minus_b2, inv_bc1, inv_bc2, eps, wd, gs;
};
// Checks step >= 1 and beta1, beta2 in [0, 1).
AdamConsts adam_consts(const char* op, const AdamHParams& h);
// m and v have param's element count; returns it.
int64_t optimizer_numel(const char* op, const Tensor& param, const Tensor& m, const Tensor& v);

// The norms of lamb_moments_multi / lamb_apply_multi: F32 [2 * n_segs] on `device`; segments inside the flat
// buffers of n elements.
void lamb_multi_check(const char* op, const Tensor& norms, const std::vector<AdamSegment>& segs, int64_t n,
                      Device device);

// An optimizer's fp32 param, m and v, checked by the backend's f32_arg(t, op, name) (its dtype and device check),
// then optimizer_numel.
struct OptArgs {
  float *p, *m, *v;
  int64_t n;
};
template <class F32Arg>
OptArgs opt_args(const char* op, const Tensor& param, const Tensor& m, const Tensor& v, F32Arg f32_arg) {
  float* p = f32_arg(param, op, "param");
  float* mp = f32_arg(m, op, "m");
  float* vp = f32_arg(v, op, "v");
  return {p, mp, vp, optimizer_numel(op, param, m, v)};
}

}  // namespace mt
