// One transformer layer with explicit forward and backward.
//   sequential: h = x + Proj(Attn(LN1 x));  y = h + MLP(LN2 h)
//   parallel (MegaScale PTB): n = LN1 x;  y = x + Proj(Attn(n)) + MLP(n)
// Each dataflow is written once: its linears are column-parallel (c_attn, c_fc) or row-parallel (the two c_proj),
// plain GEMMs at tp = 1 and Megatron's gather/scatter around the same GEMMs at tp > 1.
// Attention may use RoPE, GQA and a sliding window; the MLP is GeLU or SwiGLU, or on a MoE layer
// (ModelConfig::moe_layer; sequential block) the mixture of experts of model/moe.h: y = h + MoE(LN2 h). The MoE is
// per token, so with tp it runs on this rank's rows of the sequence-parallel stream (no gather, no scatter), with
// its weights replicated and the micro-batch's routing statistics shared over tp (MoeFfn::set_token_group).
// The layer reads its weights and accumulates its gradients through ParamStore views; activations live in a
// BlockActs the caller plans.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "megatrain/core/buffer.h"
#include "megatrain/kernels/ops.h"
#include "megatrain/model/config.h"
#include "megatrain/model/moe.h"
#include "megatrain/model/params.h"
#include "megatrain/model/tp_comm.h"

namespace mt {

// The activations one layer keeps between forward and backward, for up to `rows` = B*T rows. With tensor
// parallelism (tp > 1) the head/MLP dimensions are this rank's 1/tp; ln1/ln2 hold the gathered [rows, C] norm
// outputs (the inputs of the column-parallel GEMMs) and the row-wise statistics cover this rank's rows only.
// Activations are in the backend's compute dtype (bf16 on CUDA); the statistics (mean, rstd, lse) are fp32.
// Without ops the memory is host fp32 (the CPU backend's).
struct BlockActs {
  Buffer ln1, ln1_mean, ln1_rstd, qkv, att, lse, h, ln2, ln2_mean, ln2_rstd, fc, act;
  // A MoE model's layers (model/moe.h): allocated on every layer of it, used on its MoE layers. loss_scale: the
  // step's (GPT::forward) for the auxiliary losses' gradients.
  MoeActs moe;
  float moe_loss_scale = 1.0f;
  DType dtype = DType::F32;
  void allocate(const ModelConfig& cfg, int64_t rows, int tp = 1, Ops* ops = nullptr);
};

// Scratch shared by all layers in backward (gradients of the intermediate activations) and forward temporaries.
struct BlockScratch {
  Buffer proj_out, d_ln, d_qkv, d_att, d_fc, d_act, d_h;
  Buffer ln;  // recompute_norm only: the norms' [rows, C] outputs (gathered with tp), rebuilt in backward
  DType dtype = DType::F32;
  void allocate(const ModelConfig& cfg, int64_t rows, int tp = 1, Ops* ops = nullptr);
};

// A [rows, cols] view of a buffer (the first rows*cols elements).
Tensor mat(const Buffer& b, int64_t rows, int64_t cols, DType dt = DType::F32);

class Block {
 public:
  // tp: tensor/sequence parallelism (nullptr or size 1: the single-process layer). With tp, x, y and dx are
  // this rank's row block [B*T/tp, C] of the residual stream and the weights are its shards (layout.h).
  // params: the layer reads its weights there and writes its gradients (the first write of a step overwrites:
  // ParamStore::begin_grads). ep: expert parallelism for a MoE layer (model/moe.h; nullptr or size 1: none).
  Block(const ModelConfig& cfg, ParamStore& params, int layer, TpComm* tp = nullptr, EpComm* ep = nullptr);

  // y[B*T, C] = layer(x). x must stay valid until backward (it is the saved layer input).
  void forward(Ops& ops, Tensor y, Tensor x, BlockActs& a, BlockScratch& s, int B, int T) const;
  // A MoE layer's forward in two halves, so that two micro-batches can interleave (GPT::forward_pair):
  // forward_attention keeps h = x + attn and the MoE's input LN2(h) in a (nothing of it in s once it returns), and
  // forward_moe then writes y = h + MoE(LN2 h), running while_dispatch while the experts' dispatch is in flight.
  // forward on a MoE layer is the two in a row.
  void forward_attention(Ops& ops, Tensor x, BlockActs& a, BlockScratch& s, int B, int T) const;
  void forward_moe(Ops& ops, Tensor y, BlockActs& a, BlockScratch& s, int B, int T,
                   const std::function<void()>& while_dispatch) const;
  // dx: on entry the gradient w.r.t. y; on exit the gradient w.r.t. x (in place, the residual stream).
  void backward(Ops& ops, Tensor dx, Tensor x, BlockActs& a, BlockScratch& s, int B, int T) const;
  // The MoE feed-forward replacing the MLP on a MoE layer (ModelConfig::moe_layer); nullptr on a dense layer.
  const MoeFfn* moe() const { return moe_ ? &*moe_ : nullptr; }

 private:
  struct Lin {
    int w = -1, b = -1;
  };
  struct Norm {
    int w = -1, b = -1;
  };
  Tensor P(int i) const { return i < 0 ? Tensor{} : params_.weight(i); }  // the compute copy
  Tensor G(int i) const { return i < 0 ? Tensor{} : params_.grad(i); }
  // A row-parallel linear's bias and its gradient: replicated over tp, so only tp rank 0's partial sum adds it
  // (exactly once in the reduce-scatter) and forms its gradient; undefined on the other ranks.
  Tensor row_bias(const Lin& l) const { return first_ ? P(l.b) : Tensor{}; }
  Tensor row_bias_grad(const Lin& l) const { return first_ ? G(l.b) : Tensor{}; }
  // Whether the op about to write the gradient of weight w (and of bias b, written by the same op; -1: none)
  // accumulates: false for the step's first write of it (ParamStore::begin_grads), which overwrites.
  bool accumulates(int w, int b) const { return !params_.take_fresh_grad(w, b); }
  bool accumulates(const Lin& l) const { return accumulates(l.w, l.b); }
  bool accumulates_row(const Lin& l) const { return accumulates(l.w, first_ ? l.b : -1); }  // row_bias_grad's bias
  void norm_forward(Ops& ops, const Norm& n, Tensor out, Tensor mean, Tensor rstd, Tensor in) const;
  void norm_backward(Ops& ops, const Norm& n, Tensor din, Tensor dout, Tensor in, Tensor mean, Tensor rstd) const;
  void rebuild_norm(Ops& ops, const Norm& n, Tensor full, Tensor out, Tensor in) const;
  void add_norm_forward(Ops& ops, const Norm& n, Tensor res, Tensor out, Tensor mean, Tensor rstd, Tensor a,
                        Tensor b) const;
  void mlp_up_forward(Ops& ops, Tensor fc, Tensor act, Tensor in) const;
  void mlp_down_backward(Ops& ops, Tensor d_fc, Tensor d_act, Tensor dout, Tensor act, Tensor fc, Tensor dbias) const;
  AttnShape attn_shape(int B, int T) const;
  // Views of one layer's activations and scratch for a batch [B, T]: [N, width] activations (N = B*T rows; the
  // norms' inputs/outputs and their statistics have this rank's N/tp rows where sequence parallelism splits them).
  struct Views {
    int64_t N = 0, Ns = 0;  // all rows, this rank's rows
    AttnShape as;
    Tensor ln1, mean1, rstd1, qkv, att, lse, fc, act, h, ln2, mean2, rstd2;  // h/ln2/..2: sequential block only
    Tensor proj, d_ln, d_qkv, d_att, d_fc, d_act, d_h;
    // Where a norm writes its output: the gathered ln1/ln2 itself at tp = 1, this rank's [Ns, C] rows (in the
    // proj scratch) at tp > 1, which the column-parallel GEMMs then gather.
    Tensor ln1_out, ln2_out;
    // Forward: a row-parallel GEMM's [N, C] output before it joins the residual stream (the d_ln scratch, which
    // backward alone uses otherwise).
    Tensor part;
  };
  Views views(BlockActs& a, BlockScratch& s, int B, int T) const;
  // A MoE layer's input LN2(h): this rank's [Ns, C] rows, kept in the first rows of ln2 (its gathered [N, C]
  // buffer on an MLP layer) until backward.
  static Tensor moe_input(const Views& v) { return v.ln2.slice0(0, v.Ns); }
  // The attention up to its output v.att (in the parallel block also the MLP's up-projection).
  void attention_forward(Ops& ops, Tensor x, const Views& v) const;
  // Backward from the attention's output gradient v.d_att to dx (accumulated into it), through LN1.
  void attention_backward(Ops& ops, Tensor dx, Tensor x, const Views& v) const;

  // ---- column- and row-parallel linears (Megatron's ColumnParallelLinear / RowParallelLinear, with sequence
  // parallelism). At tp = 1 each is its plain GEMM(s) on all N rows, once; at tp > 1 the all-gather or
  // reduce-scatter (TpComm) wraps the GEMMs, which run chunk by chunk so they overlap the communication.
  // A GEMM on the rows [r0, r0 + n) of a column-parallel linear's (gathered) input.
  using RowsGemm = std::function<void(int64_t r0, int64_t n)>;
  // A row-parallel GEMM writing the rows [r0, r0 + n) of its [N, C] output (a partial sum at tp > 1) into out.
  using PartGemm = std::function<void(Tensor out, int64_t r0, int64_t n)>;
  // A row-parallel linear's backward on the rows [r0, r0 + n) of its output gradient dy (those rows of it).
  using GradGemm = std::function<void(Tensor dy, int64_t r0, int64_t n)>;
  // One column-parallel linear's backward: its output gradient and its forward input, both [N, width].
  struct ColumnGrad {
    Lin lin;
    Tensor dout, in;
  };
  // full[N, C]: the input of column-parallel GEMMs; norm_out: where the norm wrote it (view Views::ln1_out).
  void column_forward(Tensor full, Tensor norm_out, const RowsGemm& gemms) const;
  // out[Ns, C] = the row-parallel product (summed over tp ranks, scattered to this rank's rows).
  void row_forward(Tensor out, int64_t N, const PartGemm& gemm) const;
  // A row-parallel linear and its [N, width] input (this rank's columns of it at tp > 1).
  struct RowLinear {
    Lin lin;
    Tensor in;
  };
  // y[Ns, C] = residual + the sum of the row-parallel products (tmp: [N, C] scratch).
  void row_forward_add(Ops& ops, Tensor y, Tensor residual, Tensor tmp, int64_t N,
                       const std::vector<RowLinear>& lins) const;
  // Runs grads on the output gradient dy[Ns, C], gathered through gathered[N, C] at tp > 1.
  void row_backward(Tensor dy, Tensor gathered, const GradGemm& grads) const;
  // din[Ns, C] = the sum of the linears' input gradients (reduce-scattered at tp > 1); accumulates their dW, db.
  void column_backward(Ops& ops, Tensor din, int64_t N, const std::vector<ColumnGrad>& lins) const;

  const ModelConfig& cfg_;
  ParamStore& params_;
  TpComm* tp_ = nullptr;  // set only when tp > 1
  int tp_size_ = 1;
  bool first_ = true;            // tp rank 0 (or no tp)
  bool recompute_act_ = false;   // ModelConfig::recompute_act with a GeLU MLP
  bool recompute_norm_ = false;  // ModelConfig::recompute_norm
  Norm ln1_, ln2_;
  Lin c_attn_, attn_proj_, c_fc_, mlp_proj_;
  std::optional<MoeFfn> moe_;
};

}  // namespace mt
