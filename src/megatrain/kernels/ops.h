// The op interface: every numeric operation a layer or optimizer needs, over Tensor views.
// Two backends implement it: cpu/ (fp32, OpenMP + OpenBLAS; the reference and test oracle) and cuda/ (bf16 compute,
// fp32 accumulation). Layers call these and never branch on the device.
//
// Conventions (all row-major, llm.c style):
//   * activations are [N, C] with N = B*T rows (or [B, T, C], the same memory);
//   * a linear layer's weight is [OC, C] (PyTorch nn.Linear layout): out = inp @ w^T + bias;
//   * parameter gradients are ACCUMULATED (+=) so micro-batches can accumulate; callers zero them per step;
//   * "dinp" arguments say in their comment whether they are overwritten or accumulated;
//   * an optional tensor is passed as an undefined Tensor{} (ptr == nullptr).
//
// Dtypes (mixed precision). Let A = compute_dtype(): F32 on CPU, BF16 on CUDA. Activations (residual stream, norm
// outputs, qkv, attention output, MLP hidden, logits/dlogits and every activation gradient) and the weights as the
// forward/backward read them (the compute copy) are A. Always F32: parameter gradients (dw, dbias, dwte, ...: fp32
// accumulation across micro-batches), master weights and optimizer moments, norm statistics (mean, rstd), attention
// lse, losses and CE stats. Token ids and targets are I32 in device memory. The CPU backend takes only F32 (A = F32).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "megatrain/core/buffer.h"
#include "megatrain/core/tensor.h"
#include "megatrain/kernels/rope_freqs.h"

namespace mt {

// Shape of one attention call. qkv rows are packed [q heads | k heads | v heads], each head head_dim wide:
// row width = (n_head + 2*n_kv_head) * head_dim. Query head h reads kv head h / (n_head / n_kv_head) (GQA).
struct AttnShape {
  int B = 0, T = 0;
  int n_head = 0, n_kv_head = 0, head_dim = 0;
  int window = 0;  // 0 = full causal; W > 0: token t attends to s with t - W < s <= t (itself and W-1 before)
  int qkv_width() const { return (n_head + 2 * n_kv_head) * head_dim; }
};

// One op's time on the device, from events recorded around it without synchronising (see Ops::set_op_timing).
struct OpTiming {
  const char* name = "";  // a string literal: the op's name
  double start_ms = 0;    // since the first op recorded after set_op_timing(true)
  double ms = 0;
};

// One tensor of a multi-tensor optimizer call: elements [offset, offset + numel) of flat buffers, with its own
// weight decay (matrices decay, norms and biases do not).
struct AdamSegment {
  int64_t offset = 0, numel = 0;
  float weight_decay = 0;
};

// Elements [s.offset, s.offset + s.numel) of a flat tensor, as a 1-D view (checked against its size).
Tensor segment(const Tensor& flat, const AdamSegment& s);

// LAMB's trust ratio ||w|| / ||u|| from the squared norms, 1 where either is zero (You et al., 2020). In float, as
// the CUDA kernels compute it (sqrtf and / are correctly rounded there as here).
inline float lamb_trust(float w2, float u2) { return (w2 > 0 && u2 > 0) ? std::sqrt(w2 / u2) : 1.0f; }

struct AdamHParams {
  float lr = 0, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0;
  int step = 1;             // 1-based, for bias correction
  float grad_scale = 1.0f;  // grad is multiplied by this before use (clipping, loss-scale undo)
};

// The routing of a mixture-of-experts batch as the MoE ops read it (the terms are kernels/cpu/moe.h's). Routing
// itself, the top-k over the small [N, E] router logits, runs on the host (moe_route, into a MoeRouting); the index
// and gate arrays the kernels read are then put on device() once per batch (MoeRoutingBuffers::upload,
// kernels/moe_routing.h), while the expert offsets stay on the host: the grouped GEMMs size their launches from
// them. On the CPU backend the tensors are views of the host routing's own vectors.
struct MoeRouting;
struct MoeDeviceRouting {
  const MoeRouting* host = nullptr;  // N, E, k and offsets [E + 1]; the CPU backend reads everything from here
  Tensor row;                        // I32 [N, k]: assignment (t, j)'s row in the permuted order, -1 when dropped
  Tensor token;                      // I32 [A]: the token of each permuted row (A = offsets[E] = host->rows())
  Tensor gate;                       // F32 [N, k]: the combine weights
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual Device device() const = 0;
  // The device's product name (e.g. "NVIDIA H100 80GB HBM3"; "cpu" for the CPU backend): for messages, and for
  // looking up the datasheet peak that MFU is measured against (train/peak.h).
  virtual std::string device_name() const { return "cpu"; }

  // ---- memory ----------------------------------------------------------------------------------
  // The dtype of activations and of the weights' compute copy (see the top of this file).
  virtual DType compute_dtype() const = 0;
  // Zero-filled memory on device(), at least 256-byte aligned. Plan memory up front: never inside a step.
  virtual Buffer alloc(size_t bytes) = 0;
  // Copies between host memory and a tensor on device() (dst.nbytes() / src.nbytes() bytes). Ordered after the
  // ops issued before; to_host returns once the data is on the host.
  virtual void to_device(Tensor dst, const void* host) = 0;
  virtual void to_host(void* host, Tensor src) = 0;
  // dst = src converted to dst's dtype (F32 <-> BF16 rounding to nearest even, or a copy), same numel.
  virtual void convert(Tensor dst, Tensor src) = 0;
  // Blocks until every op issued so far has finished (a no-op on CPU).
  virtual void synchronize() = 0;
  // Bytes handed out by alloc() so far (memory is planned up front and never freed during training, so this is
  // the model's footprint on the device). 0 where the backend does not count.
  virtual size_t allocated_bytes() const { return 0; }

  // ---- memory / elementwise --------------------------------------------------------------------
  virtual void zero(Tensor t) = 0;
  virtual void copy(Tensor dst, Tensor src) = 0;               // same numel and dtype
  virtual void add(Tensor out, Tensor a, Tensor b) = 0;        // out = a + b (out may alias a or b)
  virtual void axpy(Tensor dst, Tensor src, float alpha) = 0;  // dst += alpha * src
  virtual void scale(Tensor t, float s) = 0;                   // t *= s
  virtual double sum_squares(Tensor t) = 0;                    // sum of t^2, accumulated in double
  // core/bits_hash.h's exact hash of an F32 or I32 tensor's bits, computed where the tensor lives (the CUDA backend
  // in one pass over device memory); the default copies it to the host first.
  virtual uint64_t bits_hash(Tensor t);

  // ---- timing ----------------------------------------------------------------------------------
  // When on, the backend records the device time of every op (CUDA: an event pair per op on the op stream, never
  // a sync; CPU: nothing, returns no timings). take_op_timings() returns and clears what finished so far.
  virtual void set_op_timing(bool on) {}
  virtual std::vector<OpTiming> take_op_timings() { return {}; }
  // The trace clock (obs/timeline.h, unix seconds) when this timing session's first op was enqueued, from which
  // start_ms counts (0 before any). With the device idle at that moment (synchronize() before set_op_timing(true))
  // that op starts within a launch latency of it, so base + start_ms / 1e3 puts ops on the host's timeline.
  virtual double op_timing_base() const { return 0; }

  // ---- linear ----------------------------------------------------------------------------------
  // out[N,OC] = inp[N,C] @ w[OC,C]^T (+ bias[OC])
  virtual void matmul_forward(Tensor out, Tensor inp, Tensor w, Tensor bias) = 0;
  // dinp[N,C] = dout @ w (overwritten, or accumulated when accumulate_dinp); dinp may be undefined (skip).
  // dw[OC,C] += dout^T @ inp (dw may be undefined: skip; inp may then be undefined too, dinp giving the rows);
  // dbias[OC] += column sums of dout (dbias may be undefined). With accumulate_dw false, dw and dbias are overwritten
  // instead (the first write of a step's gradients: ParamStore::begin_grads), bit for bit what zeroing them first
  // and accumulating gives.
  virtual void matmul_backward(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w,
                               bool accumulate_dinp, bool accumulate_dw = true) = 0;

  // Fused epilogues (cuBLASLt on CUDA); the defaults compose the plain ops, which the CPU backend keeps.
  // A linear joining the residual stream: out[N,OC] = residual + (inp @ w^T + bias) (overwritten; out may alias
  // residual). tmp: [N,OC] scratch distinct from out and residual, where a backend that does not fuse the add puts
  // the product (its contents are undefined afterwards).
  virtual void matmul_forward_add(Tensor out, Tensor inp, Tensor w, Tensor bias, Tensor residual, Tensor tmp) {
    matmul_forward(tmp, inp, w, bias);
    add(out, residual, tmp);
  }
  // MLP up-projection: pre = inp @ w^T + bias (kept for backward), out = gelu(pre).
  virtual void matmul_gelu_forward(Tensor out, Tensor pre, Tensor inp, Tensor w, Tensor bias) {
    matmul_forward(pre, inp, w, bias);
    gelu_forward(out, pre);
  }
  // MLP down-projection's backward fused with the GeLU before it: dpre = (dout @ w) * gelu'(pre) (overwritten);
  // dw += dout^T @ act, dbias += column sums of dout, where act = gelu(pre) was the projection's input
  // (overwritten instead with accumulate_dw false, as in matmul_backward).
  virtual void matmul_backward_gelu(Tensor dpre, Tensor dw, Tensor dbias, Tensor dout, Tensor act, Tensor w, Tensor pre,
                                    bool accumulate_dw = true) {
    matmul_backward(dpre, dw, dbias, dout, act, w, false, accumulate_dw);
    gelu_backward(dpre, pre, dpre);
  }

  // ---- embedding -------------------------------------------------------------------------------
  // out[B,T,C] = wte[tokens[b,t]] + wpe[t]   (wpe undefined: no positional table, e.g. with RoPE)
  // tokens are I32 [B,T] (T = last dim; [T] is one sequence); a token >= wte rows is an error. A token < 0 means
  // "no row" (a vocab-parallel rank not owning it): its output row is wpe[t] alone (or zero), its gradient skipped.
  virtual void embedding_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe) = 0;
  // dwte[tokens[b,t]] += dout[b,t]; dwpe[t] += sum_b dout[b,t]
  virtual void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens) = 0;

  // ---- normalisation (over the last dimension C) ------------------------------------------------
  // out = (inp - mean) * rstd * w + b; saves mean[N], rstd[N] for backward. b may be undefined; mean and rstd
  // may be undefined too (inference: nothing saved).
  virtual void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor w, Tensor b, float eps) = 0;
  // dinp += ...(accumulated: the residual stream's gradient is already there); dw += ; db += (db may be undefined);
  // dw and db overwritten instead with accumulate_dw false (as in matmul_backward; dinp still accumulates)
  virtual void layernorm_backward(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w, Tensor mean,
                                  Tensor rstd, bool accumulate_dw = true) = 0;
  // out = inp * rstd * w, rstd = 1/sqrt(mean(inp^2) + eps)   (rstd[N] saved; may be undefined for inference)
  virtual void rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor w, float eps) = 0;
  // dinp +=; dw += (overwritten with accumulate_dw false)
  virtual void rmsnorm_backward(Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, Tensor rstd,
                                bool accumulate_dw = true) = 0;

  // Residual add fused with the next norm: res = a + b (res may alias a), then out = LayerNorm(res) as above
  // (rms: RMSNorm instead, out = res * rstd * w, with mean and bias unused).
  virtual void add_layernorm_forward(Tensor res, Tensor out, Tensor mean, Tensor rstd, Tensor a, Tensor b, Tensor w,
                                     Tensor bias, float eps, bool rms) {
    add(res, a, b);
    if (rms) {
      rmsnorm_forward(out, rstd, res, w, eps);
    } else {
      layernorm_forward(out, mean, rstd, res, w, bias, eps);
    }
  }

  // ---- attention -------------------------------------------------------------------------------
  // out[B,T,n_head*head_dim] = softmax(q k^T / sqrt(hd) + causal/window mask) v, per head.
  // lse[B,n_head,T] keeps each row's log-sum-exp so backward recomputes probabilities (no T x T tensor kept).
  virtual void attention_forward(Tensor out, Tensor lse, Tensor qkv, const AttnShape& s) = 0;
  // dqkv[B,T,qkv_width] is overwritten (dq, dk, dv; GQA sums over the query heads sharing a kv head).
  // dqkv must not alias qkv.
  virtual void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, const AttnShape& s) = 0;
  // Rotary position embedding, in place on the q and k heads of qkv (v untouched), position = t.
  // Pairs are (i, i + head_dim/2) (GPT-NeoX / Llama "rotate_half" convention), freq_i = rope_inv_freq(f, i, head_dim)
  // (kernels/rope_freqs.h: theta^(-2i/head_dim), optionally Llama 3.1's long-context scaling).
  virtual void rope_forward(Tensor qkv, const AttnShape& s, const RopeFreqs& f) = 0;
  virtual void rope_backward(Tensor dqkv, const AttnShape& s,
                             const RopeFreqs& f) = 0;  // in place: the inverse rotation
  // Sizes any workspace attention needs for shapes up to s now, so that no step allocates (a no-op on CPU).
  virtual void reserve_attention(const AttnShape& s) {}

  // ---- activations -----------------------------------------------------------------------------
  // GeLU, tanh approximation (GPT-2).
  virtual void gelu_forward(Tensor out, Tensor inp) = 0;
  virtual void gelu_backward(Tensor dinp, Tensor inp, Tensor dout) = 0;  // dinp overwritten (may alias dout)
  // SwiGLU: inp[N, 2F] = [gate | up]; out[N, F] = silu(gate) * up.
  virtual void swiglu_forward(Tensor out, Tensor inp) = 0;
  virtual void swiglu_backward(Tensor dinp, Tensor inp, Tensor dout) = 0;  // dinp[N,2F] overwritten

  // ---- mixture of experts (kernels/cpu/moe.h: the terms, the routing, the reference functions) ---------------
  // The CPU backend runs the reference functions themselves. Tensors are activations (dtype A) unless stated; A rows
  // of a permuted tensor are expert-contiguous (rows [offsets[e], offsets[e+1]) are expert e's).
  // xp[A, C] (overwritten) = the token rows x[N, C] in the permuted order: xp[r] = x[token[r]].
  virtual void moe_permute(Tensor xp, Tensor x, const MoeDeviceRouting& r) = 0;
  // dx[N, C] += for each token, the sum over its kept slots j (in slot order) of dxp[row[t, j]] (accumulated).
  // Deterministic: every token row gathers its own at most k rows, no two writers share a row.
  virtual void moe_permute_backward(Tensor dx, Tensor dxp, const MoeDeviceRouting& r) = 0;
  // Grouped GEMM: for each expert e, out[rows of e] = in[rows of e] @ w[e]^T; in [A, I], w [E, O, I] (the weights'
  // compute copy), out [A, O] (overwritten), A = offsets[E]. offsets [E + 1] (host) start at 0 and never decrease;
  // experts without rows launch nothing.
  virtual void moe_grouped_matmul_forward(Tensor out, Tensor in, Tensor w, const std::vector<int64_t>& offsets) = 0;
  // Its backward per expert: din[rows of e] = dout[rows of e] @ w[e] (overwritten; din may be undefined: skipped);
  // dw[e] += dout[rows]^T @ in[rows], dw F32 [E, O, I] (overwritten instead with accumulate_dw false, an expert
  // without rows then getting zeros, as matmul_backward).
  virtual void moe_grouped_matmul_backward(Tensor din, Tensor dw, Tensor dout, Tensor in, Tensor w,
                                           const std::vector<int64_t>& offsets, bool accumulate_dw = true) = 0;
  // y[N, C] (overwritten) = for each token, the sum over its kept slots j in slot order of gate[t, j] *
  // yp[row[t, j]] (zero for a token whose assignments were all dropped).
  virtual void moe_combine(Tensor y, Tensor yp, const MoeDeviceRouting& r) = 0;
  // dyp[A, C] (overwritten): row row[t, j] = gate[t, j] * dy[t]; dgate F32 [N, k] (overwritten) = dot(dy[t],
  // yp[row[t, j]]), 0 for a dropped assignment. Deterministic (each dot a fixed-order reduction).
  virtual void moe_combine_backward(Tensor dyp, Tensor dgate, Tensor dy, Tensor yp, const MoeDeviceRouting& r) = 0;

  // ---- loss ------------------------------------------------------------------------------------
  // Fused softmax + cross-entropy over logits[N, Vp] (only the first V columns are real; padded columns
  // are ignored and get zero gradient). targets[N] are I32; a target < 0 is ignored (loss 0, no gradient).
  // losses[N] = -log softmax(logits)[target] (overwritten); a target >= V is an error. When write_grad, logits
  // is overwritten in place with dlogits = (softmax - onehot(target)) * dloss, so no probability tensor ever exists.
  virtual void cross_entropy(Tensor losses, Tensor logits, Tensor targets, int V, float dloss, bool write_grad) = 0;

  // Vocab-parallel cross-entropy (Megatron): each rank holds logits[N, Vl] for the vocabulary ids [v0, v0 + Vl),
  // of which the first n_real columns are real (the rest padding). stats is F32 [3, N]: row max, sum of exps,
  // target logit. The caller reduces between the three steps:
  //   1. vp_ce_max: stats[0] = max over my real columns (-inf if none);   then allreduce(stats[0], Max)
  //   2. vp_ce_sums: stats[1] = sum_j exp(l_j - stats[0]), stats[2] = logit of the target if it is mine, else 0;
  //      then allreduce(stats[1..2], Sum)
  //   3. vp_ce_finish: losses[N] = max + log(sum) - target_logit (0 where target < 0); when write_grad, logits
  //      become (softmax - onehot) * dloss in place (zero in padded columns and ignored rows).
  // targets are global I32 ids [N]; < 0 is ignored, >= V is an error (checked in step 2).
  virtual void vp_ce_max(Tensor stats, Tensor logits, int n_real) = 0;
  virtual void vp_ce_sums(Tensor stats, Tensor logits, Tensor targets, int64_t v0, int n_real, int V) = 0;
  virtual void vp_ce_finish(Tensor losses, Tensor logits, Tensor stats, Tensor targets, int64_t v0, int n_real,
                            float dloss, bool write_grad) = 0;

  // ---- optimizers (fp32 master weights and state) ----------------------------------------------
  // AdamW with decoupled weight decay: m,v updated from g = grad*grad_scale, then
  // param -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * param).
  virtual void adamw_update(Tensor param, Tensor grad, Tensor m, Tensor v, const AdamHParams& h) = 0;
  // AdamW over many tensors at once: each segment of the flat F32 buffers is updated as adamw_update with
  // h.weight_decay replaced by the segment's (CUDA: one launch for the whole model instead of one per tensor).
  // weight_out (optional; any dtype convert() writes, numel of param): each segment is overwritten with the updated
  // param converted to its dtype, the gaps left alone - the refresh of the bf16 compute copy fused into the update
  // (CUDA: the copy is written from registers, saving a pass that reads the fp32 weights again; 3.4 ms of a 1.3B
  // model's step on an H100).
  virtual void adamw_update_multi(Tensor param, Tensor grad, Tensor m, Tensor v, const std::vector<AdamSegment>& segs,
                                  const AdamHParams& h, Tensor weight_out = {}) {
    for (const AdamSegment& s : segs) {
      AdamHParams hs = h;
      hs.weight_decay = s.weight_decay;
      adamw_update(segment(param, s), segment(grad, s), segment(m, s), segment(v, s), hs);
      if (weight_out.defined()) convert(segment(weight_out, s), segment(param, s));
    }
  }
  // LAMB pass 1: update m, v from grad; return sum of squares of u = mhat/(sqrt(vhat)+eps) + wd*param.
  virtual double lamb_moments(Tensor param, Tensor grad, Tensor m, Tensor v, const AdamHParams& h) = 0;
  // LAMB pass 2: param -= lr * trust * u (u recomputed from m, v, param as in pass 1).
  virtual void lamb_apply(Tensor param, Tensor m, Tensor v, const AdamHParams& h, float trust) = 0;
  // LAMB over many tensors at once, with no host synchronisation (CUDA: the same few launches however many tensors,
  // the norms never leave the device). Segments and weight decay as in adamw_update_multi; `norms` is F32 [2 * segs.size()] on device().
  //   lamb_moments_multi: pass 1 on every segment s; norms[2s] = ||w_s||^2 (sum of squares of the param segment),
  //     norms[2s+1] = ||u_s||^2 (as lamb_moments returns), each rounded to float.
  //   lamb_apply_multi: pass 2 on every segment s with trust_s = lamb_trust(norms[2s], norms[2s+1]).
  // Between the two the caller may change norms (tensor parallelism: sum them over the processes).
  // The defaults are the per-tensor ops (sum_squares, lamb_moments, lamb_apply) segment by segment, norms moving
  // through to_device / to_host.
  virtual void lamb_moments_multi(Tensor param, Tensor grad, Tensor m, Tensor v, const std::vector<AdamSegment>& segs,
                                  const AdamHParams& h, Tensor norms);
  virtual void lamb_apply_multi(Tensor param, Tensor m, Tensor v, const std::vector<AdamSegment>& segs,
                                const AdamHParams& h, Tensor norms);
};

// The fp32 CPU backend (OpenMP + OpenBLAS).
std::unique_ptr<Ops> make_cpu_ops();
// The BLAS the CPU backend runs, for `megatrain --version`: OpenBLAS's own build line and the kernel it picked for
// this CPU (OPENBLAS_CORETYPE overrides it), e.g. "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Zen MAX_THREADS=64 (core Zen)".
std::string blas_version();
// Options of the CUDA backend.
struct CudaOptions {
  // The attention implementation: "flash" (our kernels, kernels/cuda/flash_attention.*), "cudnn" (cuDNN's fused
  // flash attention through its graph API, kernels/cuda/cudnn_attention.*; a shape cuDNN refuses is an error that
  // names it, never a silent fallback), or "auto": cuDNN where this build has it, else flash. cuDNN is the default
  // because it is the faster one: on an H100, 8.2x our kernels' forward+backward at B 4, T 2048, 16 heads of 128
  // (bench/results/bench_flash_attention-nvidia-h100-80gb-hbm3.json). Anything else is an error.
  std::string attention = "auto";
  // GEMM tuning (kernels/cuda/gemm.h, LtGemm::set_tuning): 0, the default, runs cuBLASLt's heuristic choice for
  // every GEMM; N in 2..64 times the heuristic's first N candidates on the first call of each distinct GEMM and
  // keeps the fastest. Tuned processes may choose different algorithms from one another (the choice follows
  // timings), and so round differently; hence off by default.
  int gemm_tuning = 0;
  // Deterministic mode (train.deterministic; Megatron's --deterministic-mode): every op repeats bit for bit from
  // run to run on one GPU model, at some cost in speed - the embedding and flash attention backward without float
  // atomics, cuDNN attention only through engines not marked nondeterministic (else our flash kernel for that
  // shape), the GEMMs as cuBLASLt's heuristic picks them (fixed per shape; gemm_tuning > 0 with it is an error).
  // See docs/cuda.md.
  bool deterministic = false;
};
// What CudaOptions::attention resolves to in this build: "cudnn" or "flash" ("auto" becomes "cudnn" when megatrain
// was built with cuDNN). Other values are returned unchanged (make_cuda_ops rejects them).
std::string resolve_cuda_attention(const std::string& attention);
// The CUDA backend (bf16 compute) on GPU `device` (made the process's current device), or on the current device
// when device < 0; throws naming the reason when this build has no CUDA (or no cuDNN, for attention = "cudnn"),
// the options are invalid, the machine has no GPU, or not that many.
std::unique_ptr<Ops> make_cuda_ops(int device = -1, const CudaOptions& opt = {});
// Whether make_cuda_ops() can succeed here: built with CUDA and at least one device visible.
bool cuda_available();
// The CUDA devices this process sees (CUDA_VISIBLE_DEVICES applied); 0 without CUDA or a device.
int cuda_device_count();
// The CUDA libraries this build runs on, for `megatrain --version`: "CUDA runtime 12.4 (driver 12.6), cuBLASLt
// 120403, cuDNN 9.1.0", or "not built with CUDA". Needs no GPU.
std::string cuda_versions();
// The host link of GPU `device` (`megatrain diagnose`): {host-to-device, device-to-host} GB/s, each the median of
// five timed copies of `bytes` between pinned host memory and the device. {0, 0} without CUDA or that device.
std::pair<double, double> cuda_host_link_gbps(int device, size_t bytes = size_t(256) << 20);

}  // namespace mt
