// The CUDA backend: bf16 activations and weights, fp32 accumulation, fp32 parameter gradients and optimizer state.
// One class, its member functions spread over small files by op family (memory.cpp, elementwise.cpp, matmul.cpp,
// norm.cpp, activation.cpp, embedding.cpp, rope.cpp, loss.cpp, optimizer.cpp, attention.cpp, moe.cpp,
// moe_grouped_gemm.cpp); the kernels live in the matching *_kernels.cu files behind launch.h.
//
// Every op is asynchronous on one non-blocking stream per CudaOps (stream()); only to_host, synchronize,
// sum_squares and lamb_moments wait for it. Everything an op needs beyond its arguments (the cuBLASLt handle and
// workspace, reduction scratch, the timing event pool) is allocated up front, so a training step never calls
// cudaMalloc; the exceptions are the attention backward workspace, sized by reserve() or, failing that, by the
// first (largest) shape seen, the deterministic embedding backward's sort workspace (sized by the first call), the
// multi-tensor optimizers' segment table (with LAMB's block partials), sized at the first step, and the grouped
// GEMMs' side streams and workspaces (made by the first grouped GEMM with two experts that have rows).
//
// Attention runs our flash kernels (flash_attention.h) unless use_cudnn_attention() switched it to cuDNN's fused
// attention (cudnn_attention.h; make_cuda_ops does this for CudaOptions::attention = "cudnn"), which then also owns
// the workspace (its plans and buffers are built per shape, by reserve() or the first call of a shape).
//
// Errors: argument errors throw mt::Error naming the op and argument before anything is launched; a failing CUDA,
// cuBLASLt call throws naming the call; data-dependent errors found on the device (a target >= V, a token outside
// the table) are raised at the next synchronisation (synchronize, to_host, sum_squares, lamb_moments).
#pragma once
#include <cuda_runtime.h>

#include <memory>

#include "megatrain/kernels/cuda/cudnn_attention.h"
#include "megatrain/kernels/cuda/gemm.h"
#include "megatrain/kernels/cuda/gemm_lanes.h"
#include "megatrain/kernels/cuda/op_timer.h"
#include "megatrain/kernels/ops.h"

namespace mt {

namespace cuda {
struct NormBackwardArgs;  // launch.h
}

class CudaOps final : public Ops {
 public:
  CudaOps();  // on the current CUDA device
  ~CudaOps() override;
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  cudaStream_t stream() const { return stream_; }
  int device_id() const { return device_; }
  // The bias gradients of matmul_backward from the weight-gradient GEMM's BGRADB epilogue (on, the default) or from
  // the column-sum kernels (off; bench_cuda_ops times both). fused_bias_grads() counts the calls that ran fused: a
  // shape cuBLASLt refuses the epilogue for takes the kernels whatever the switch says.
  void set_fuse_bias_grads(bool on) { fuse_bias_grads_ = on; }
  int64_t fused_bias_grads() const { return fused_bias_grads_; }
  // GEMM tuning (CudaOptions::gemm_tuning, LtGemm::set_tuning) and what it found per distinct GEMM so far.
  void set_gemm_tuning(int candidates) {
    gemm_->set_tuning(candidates);
    if (lanes_) lanes_->set_tuning(candidates);
  }
  std::vector<GemmTuned> gemm_tuning_report() const { return gemm_->tuned(); }
  // Deterministic mode (CudaOptions::deterministic): every op repeats bit for bit from run to run on one GPU model.
  // The embedding backward sorts instead of using atomics (embedding_kernels.cu), flash attention computes dq in a
  // pass of its own instead of atomics (flash_attention.cu), cuDNN attention takes only engines not marked
  // nondeterministic and, for a shape it has none for, runs our flash kernel instead (saying so once on stderr).
  // The GEMMs need nothing: cuBLASLt's heuristic choice for a shape is fixed (GEMM tuning must then be off).
  void set_deterministic(bool on);
  bool deterministic() const { return deterministic_; }
  // Sizes the attention backward workspace for shapes up to `s` now (allocating outside the training step).
  void reserve(const AttnShape& s);
  void reserve_attention(const AttnShape& s) override { reserve(s); }
  // Routes attention_forward/backward/reserve to cuDNN from now on (throws naming the reason when this build has no
  // cuDNN or cuDNN cannot start); call it before the first attention op.
  void use_cudnn_attention();
  bool uses_cudnn_attention() const { return cudnn_attn_ != nullptr; }
  // Whether the attention forward (backward) of s runs on cuDNN: it was switched there and, in deterministic mode,
  // cuDNN has an engine not marked nondeterministic for it (builds and caches the plan).
  bool attention_on_cudnn(const AttnShape& s, bool backward);

  Device device() const override { return Device::CUDA; }
  std::string device_name() const override;
  DType compute_dtype() const override { return DType::BF16; }
  Buffer alloc(size_t bytes) override;
  void adamw_update_multi(Tensor param, Tensor grad, Tensor m, Tensor v, const std::vector<AdamSegment>& segs,
                          const AdamHParams& h, Tensor weight_out = {}) override;
  size_t allocated_bytes() const override { return allocated_; }
  void to_device(Tensor dst, const void* host) override;
  void to_host(void* host, Tensor src) override;
  void convert(Tensor dst, Tensor src) override;
  void synchronize() override;

  void zero(Tensor t) override;
  void copy(Tensor dst, Tensor src) override;
  void add(Tensor out, Tensor a, Tensor b) override;
  void axpy(Tensor dst, Tensor src, float alpha) override;
  void scale(Tensor t, float s) override;
  double sum_squares(Tensor t) override;
  uint64_t bits_hash(Tensor t) override;

  void set_op_timing(bool on) override;
  std::vector<OpTiming> take_op_timings() override;
  double op_timing_base() const override { return timer_.base_host_seconds(); }

  void matmul_forward(Tensor out, Tensor inp, Tensor w, Tensor bias) override;
  void matmul_forward_add(Tensor out, Tensor inp, Tensor w, Tensor bias, Tensor residual, Tensor tmp) override;
  void matmul_backward(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w, bool accumulate_dinp,
                       bool accumulate_dw = true) override;
  void matmul_gelu_forward(Tensor out, Tensor pre, Tensor inp, Tensor w, Tensor bias) override;
  void matmul_backward_gelu(Tensor dpre, Tensor dw, Tensor dbias, Tensor dout, Tensor act, Tensor w, Tensor pre,
                            bool accumulate_dw = true) override;

  void embedding_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe) override;
  void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens) override;

  void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor w, Tensor b, float eps) override;
  void layernorm_backward(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w, Tensor mean,
                          Tensor rstd, bool accumulate_dw = true) override;
  void rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor w, float eps) override;
  void rmsnorm_backward(Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, Tensor rstd,
                        bool accumulate_dw = true) override;
  void add_layernorm_forward(Tensor res, Tensor out, Tensor mean, Tensor rstd, Tensor a, Tensor b, Tensor w,
                             Tensor bias, float eps, bool rms) override;

  void attention_forward(Tensor out, Tensor lse, Tensor qkv, const AttnShape& s) override;
  void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, const AttnShape& s) override;
  void rope_forward(Tensor qkv, const AttnShape& s, const RopeFreqs& f) override;
  void rope_backward(Tensor dqkv, const AttnShape& s, const RopeFreqs& f) override;

  void gelu_forward(Tensor out, Tensor inp) override;
  void gelu_backward(Tensor dinp, Tensor inp, Tensor dout) override;
  void swiglu_forward(Tensor out, Tensor inp) override;
  void swiglu_backward(Tensor dinp, Tensor inp, Tensor dout) override;

  void moe_permute(Tensor xp, Tensor x, const MoeDeviceRouting& r) override;
  void moe_permute_backward(Tensor dx, Tensor dxp, const MoeDeviceRouting& r) override;
  void moe_grouped_matmul_forward(Tensor out, Tensor in, Tensor w, const std::vector<int64_t>& offsets) override;
  void moe_grouped_matmul_backward(Tensor din, Tensor dw, Tensor dout, Tensor in, Tensor w,
                                   const std::vector<int64_t>& offsets, bool accumulate_dw = true) override;
  void moe_combine(Tensor y, Tensor yp, const MoeDeviceRouting& r) override;
  void moe_combine_backward(Tensor dyp, Tensor dgate, Tensor dy, Tensor yp, const MoeDeviceRouting& r) override;
  // The grouped GEMMs' lanes: 1 runs every expert on the op stream; n > 1 spreads the experts with rows over the op
  // stream and n - 1 side streams (GemmLanes), expert i of those with rows on lane i % n. Default kExpertLanes.
  // Changing it drops the side streams (made again, with their workspaces, by the next grouped GEMM).
  static constexpr int kExpertLanes = 4;
  void set_expert_lanes(int n);
  int expert_lanes() const { return expert_lanes_; }

  void cross_entropy(Tensor losses, Tensor logits, Tensor targets, int V, float dloss, bool write_grad) override;
  void vp_ce_max(Tensor stats, Tensor logits, int n_real) override;
  void vp_ce_sums(Tensor stats, Tensor logits, Tensor targets, int64_t v0, int n_real, int V) override;
  void vp_ce_finish(Tensor losses, Tensor logits, Tensor stats, Tensor targets, int64_t v0, int n_real, float dloss,
                    bool write_grad) override;

  void adamw_update(Tensor param, Tensor grad, Tensor m, Tensor v, const AdamHParams& h) override;
  double lamb_moments(Tensor param, Tensor grad, Tensor m, Tensor v, const AdamHParams& h) override;
  void lamb_apply(Tensor param, Tensor m, Tensor v, const AdamHParams& h, float trust) override;
  void lamb_moments_multi(Tensor param, Tensor grad, Tensor m, Tensor v, const std::vector<AdamSegment>& segs,
                          const AdamHParams& h, Tensor norms) override;
  void lamb_apply_multi(Tensor param, Tensor m, Tensor v, const std::vector<AdamSegment>& segs, const AdamHParams& h,
                        Tensor norms) override;

 private:
  // The segment tables of the multi-tensor optimizer ops on the device, each followed by room for
  // lamb_moments_multi's block partials: one per distinct segment list (a data-parallel step updates one list per
  // bucket, the same lists every step), uploaded once, in stream order. Why in stream order: the compute stream is
  // non-blocking, and a plain cudaMemcpy from pageable memory returns before its DMA lands, so a kernel queued right
  // after it could read a half-written table (seen on an H200 as an illegal address with two buckets, whose tables
  // were swapped every call).
  struct SegEntry {
    std::vector<AdamSegment> segs;
    void* dev = nullptr;
    size_t bytes = 0;
  };
  std::vector<SegEntry> seg_tables_;
  struct SegTable {
    const void* segs;   // cuda::AdamSeg[segs.size()]
    double* partials;   // room for the `partials` doubles asked for
    int64_t max_numel;  // the largest segment
  };
  // Checks segs against flat buffers of n elements (naming op) and returns the table on the device.
  SegTable segment_table(const char* op, const std::vector<AdamSegment>& segs, int64_t n, size_t partials);
  size_t allocated_ = 0;  // by alloc(), for the memory figure of benchmarks
  // Times one public op (see OpTimer): constructed first thing in every op.
  OpTimer::Scope timed(const char* name) { return OpTimer::Scope(timer_, name, stream_); }
  // Waits for the stream, then raises any error a kernel reported through err_dev_.
  void sync_and_check();
  // Copies `count` partial sums from partials_dev_ to the host after a sync and adds them in order.
  double sum_partials(int count);
  // matmul_forward_add through cuBLASLt with the residual as C; false when cuBLASLt has no algorithm for it (or OC
  // is 0), having launched nothing.
  bool fused_forward_add(const char* op, Tensor out, Tensor inp, Tensor w, Tensor bias, Tensor residual);
  // dw[OC,C] += dout^T @ inp and dbias += column sums of dout (the parts of matmul_backward that do not touch dinp);
  // both overwritten without accumulate.
  void weight_grads(const char* op, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, int64_t N, int64_t C, int64_t OC,
                    bool accumulate);
  // The weight-gradient GEMM `dw` with the BGRADB epilogue writing the column sums of dout into db (through the
  // scratch when accumulating); false, having launched nothing, when cuBLASLt has no algorithm for it.
  bool dw_with_bias_grads(const char* op, LtCall dw, float* db, int64_t OC, bool accumulate);
  // The norms' backward on filled-in args (dinp, dw, db, rows, C): an empty batch still overwrites dw/db.
  void run_norm_backward(cuda::NormBackwardArgs& a);

  // The grouped GEMMs' side streams, each with its cuBLASLt handle and a 32 MiB workspace: made by the first grouped
  // GEMM that has two experts with rows (an allocation outside planning, as the attention workspace's), kept after.
  std::unique_ptr<GemmLanes> lanes_;
  int expert_lanes_ = kExpertLanes;
  // The lanes for this call: null when one lane is asked for (everything on the op stream).
  GemmLanes* gemm_lanes();
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<LtGemm> gemm_;
  float* scratch_ = nullptr;  // reduction scratch (norm dw/db partials, column sums)
  size_t scratch_floats_ = 0;
  bool fuse_bias_grads_ = true;
  int64_t fused_bias_grads_ = 0;
  double* partials_dev_ = nullptr;   // [kMaxPartials] block sums of sum_squares / lamb_moments
  double* partials_host_ = nullptr;  // pinned copy
  int* err_dev_ = nullptr;           // device word: kernels OR DeviceError codes into it
  int* err_host_ = nullptr;          // pinned copy, read after each synchronisation
  void* attn_ws_ = nullptr;          // flash attention backward workspace
  size_t attn_ws_bytes_ = 0;
  bool deterministic_ = false;
  bool said_cudnn_fallback_ = false;  // the note that cuDNN has no deterministic engine for a shape, printed once
  void* emb_ws_ = nullptr;            // the deterministic embedding backward's sort workspace
  size_t emb_ws_bytes_ = 0;
  // The flash workspace for shapes up to s.
  void reserve_flash(const AttnShape& s);
  std::unique_ptr<CudnnAttention> cudnn_attn_;  // set: attention goes through cuDNN
  OpTimer timer_;
};

}  // namespace mt
