// The fp32 CPU backend: one class, its member functions spread over small files by op family
// (elementwise.cpp, matmul.cpp, embedding.cpp, norm.cpp, attention.cpp, rope.cpp, activation.cpp,
// cross_entropy.cpp, optimizer.cpp, moe_ops.cpp).
#pragma once
#include <atomic>

#include "megatrain/kernels/ops.h"

namespace mt {

class CpuOps : public Ops {
 public:
  Device device() const override { return Device::CPU; }

  DType compute_dtype() const override { return DType::F32; }
  Buffer alloc(size_t bytes) override;
  size_t allocated_bytes() const override { return allocated_.load(std::memory_order_relaxed); }
  void to_device(Tensor dst, const void* host) override;
  void to_host(void* host, Tensor src) override;
  void convert(Tensor dst, Tensor src) override;
  void synchronize() override {}

  void zero(Tensor t) override;
  void copy(Tensor dst, Tensor src) override;
  void add(Tensor out, Tensor a, Tensor b) override;
  void axpy(Tensor dst, Tensor src, float alpha) override;
  void scale(Tensor t, float s) override;
  double sum_squares(Tensor t) override;

  void matmul_forward(Tensor out, Tensor inp, Tensor w, Tensor bias) override;
  void matmul_backward(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w, bool accumulate_dinp,
                       bool accumulate_dw = true) override;

  void embedding_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe) override;
  void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens) override;

  void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor w, Tensor b, float eps) override;
  void layernorm_backward(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w, Tensor mean,
                          Tensor rstd, bool accumulate_dw = true) override;
  void rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor w, float eps) override;
  void rmsnorm_backward(Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, Tensor rstd,
                        bool accumulate_dw = true) override;

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

  void cross_entropy(Tensor losses, Tensor logits, Tensor targets, int V, float dloss, bool write_grad) override;
  void vp_ce_max(Tensor stats, Tensor logits, int n_real) override;
  void vp_ce_sums(Tensor stats, Tensor logits, Tensor targets, int64_t v0, int n_real, int V) override;
  void vp_ce_finish(Tensor losses, Tensor logits, Tensor stats, Tensor targets, int64_t v0, int n_real, float dloss,
                    bool write_grad) override;

  void adamw_update(Tensor param, Tensor grad, Tensor m, Tensor v, const AdamHParams& h) override;
  double lamb_moments(Tensor param, Tensor grad, Tensor m, Tensor v, const AdamHParams& h) override;
  void lamb_apply(Tensor param, Tensor m, Tensor v, const AdamHParams& h, float trust) override;

 private:
  std::atomic<size_t> allocated_{0};  // by alloc(), for the memory figure of a run (the model's host footprint)
};

}  // namespace mt
