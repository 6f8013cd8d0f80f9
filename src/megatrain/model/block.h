// One transformer layer with explicit forward and backward.
//   sequential: h = x + Proj(Attn(LN1 x));  y = h + MLP(LN2 h)
//   parallel (MegaScale PTB): n = LN1 x;  y = x + Proj(Attn(n)) + MLP(n)
// Attention may use RoPE, GQA and a sliding window; the MLP is GeLU or SwiGLU. The layer reads its weights and
// accumulates its gradients through ParamStore views; activations live in a BlockActs the caller plans.
#pragma once
#include <string>

#include "megatrain/core/buffer.h"
#include "megatrain/kernels/ops.h"
#include "megatrain/model/config.h"
#include "megatrain/model/params.h"

namespace mt {

// The activations one layer keeps between forward and backward, for up to `rows` = B*T rows.
struct BlockActs {
  HostBuffer ln1, ln1_mean, ln1_rstd, qkv, att, lse, h, ln2, ln2_mean, ln2_rstd, fc, act;
  void allocate(const ModelConfig& cfg, int64_t rows);
};

// Scratch shared by all layers in backward (gradients of the intermediate activations) and forward temporaries.
struct BlockScratch {
  HostBuffer proj_out, d_ln, d_qkv, d_att, d_fc, d_act, d_h;
  void allocate(const ModelConfig& cfg, int64_t rows);
};

class Block {
 public:
  Block(const ModelConfig& cfg, const ParamStore& params, int layer);

  // y[B*T, C] = layer(x). x must stay valid until backward (it is the saved layer input).
  void forward(Ops& ops, Tensor y, Tensor x, BlockActs& a, BlockScratch& s, int B, int T) const;
  // dx: on entry the gradient w.r.t. y; on exit the gradient w.r.t. x (in place, the residual stream).
  void backward(Ops& ops, Tensor dx, Tensor x, BlockActs& a, BlockScratch& s, int B, int T) const;

 private:
  struct Lin {
    int w = -1, b = -1;
  };
  struct Norm {
    int w = -1, b = -1;
  };
  Tensor P(int i) const { return i < 0 ? Tensor{} : params_.param(i); }
  Tensor G(int i) const { return i < 0 ? Tensor{} : params_.grad(i); }
  void norm_forward(Ops& ops, const Norm& n, Tensor out, Tensor mean, Tensor rstd, Tensor in) const;
  void norm_backward(Ops& ops, const Norm& n, Tensor din, Tensor dout, Tensor in, Tensor mean, Tensor rstd) const;
  AttnShape attn_shape(int B, int T) const;

  const ModelConfig& cfg_;
  const ParamStore& params_;
  Norm ln1_, ln2_;
  Lin c_attn_, attn_proj_, c_fc_, mlp_proj_;
};

}  // namespace mt
