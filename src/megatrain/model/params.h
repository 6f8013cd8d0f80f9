// ParamStore: every parameter of a model in one flat fp32 buffer, its gradients in a second buffer of the same
// layout. Flat storage makes the optimizer one loop, checkpointing one write, and (later) ZeRO sharding a slice.
//
// Parameter names follow HF GPT-2 where the tensor exists there (without the "transformer." prefix):
//   wte.weight [Vp, C]              wpe.weight [max_seq_len, C]        (learned positions only)
//   h.{i}.ln_1.weight/.bias [C]     h.{i}.ln_2.weight/.bias [C]        (ln_2: sequential block only)
//   h.{i}.attn.c_attn.weight [(H+2*Hkv)*hd, C]  .bias [(H+2*Hkv)*hd]
//   h.{i}.attn.c_proj.weight [C, H*hd]          .bias [C]
//   h.{i}.mlp.c_fc.weight [F or 2F (swiglu: gate rows then up rows), C]  .bias
//   h.{i}.mlp.c_proj.weight [C, F]              .bias [C]
//   ln_f.weight/.bias [C]           lm_head.weight [Vp, C]             (untied only)
// Linear weights are [out, in] (nn.Linear); HF GPT-2 stores Conv1D [in, out], so conversion transposes.
// Biases exist only when ModelConfig::bias; RMSNorm has no bias.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "megatrain/core/buffer.h"
#include "megatrain/core/tensor.h"
#include "megatrain/kernels/ops.h"
#include "megatrain/model/shard.h"

namespace mt {

struct ParamInfo {
  std::string name;
  std::vector<int64_t> shape;
  size_t offset = 0;  // in floats, into the flat buffers
  size_t numel = 0;
  bool decay = true;  // weight decay applies (matrices yes; norms, biases no)
  ShardSpec shard;    // tensor-parallel split; shape == shard.local_shape()
};

class ParamStore {
 public:
  // Declares a parameter; returns its index. Call allocate() once all are declared.
  int add(const std::string& name, std::vector<int64_t> shape, bool decay);
  // Declares this rank's shard of a tensor-parallel parameter (shape = spec.local_shape()).
  int add(const std::string& name, const ShardSpec& spec, bool decay);
  // Zero-filled params and grads, 64-byte aligned, each tensor starting on a 16-float boundary. The flat buffers
  // are padded to a multiple of `pad_multiple` floats (data parallelism shards them into equal slices), and so is
  // every boundary between an expert-parallel tensor (ShardSpec::ep_sharded) and a tensor that is not.
  // Without ops: host fp32 memory (the CPU backend's). With ops: the backend's memory, plus the compute copy.
  void allocate(size_t pad_multiple = 16, Ops* ops = nullptr);

  size_t size() const { return infos_.size(); }
  const ParamInfo& info(int i) const { return infos_[i]; }
  const std::vector<ParamInfo>& infos() const { return infos_; }
  int index(const std::string& name) const;  // throws if unknown
  bool has(const std::string& name) const { return by_name_.count(name) > 0; }

  Tensor param(int i) const;   // fp32 master weights
  Tensor grad(int i) const;    // fp32 gradients
  Tensor weight(int i) const;  // the compute copy the layers read (== param(i) when the backend computes in fp32)
  // Re-derives the compute copy from the master weights (after an optimizer step or a load); no-op without one.
  void refresh_weights(Ops& ops);
  // The same for the flat range [begin, end) only (e.g. one data-parallel bucket once its all-gather is done).
  void refresh_weights(Ops& ops, size_t begin, size_t end);
  // The whole compute copy as one flat tensor [total_floats()] of compute_dtype() (what an optimizer step that
  // refreshes it in the same pass writes: Ops::adamw_update_multi's weight_out); undefined without a copy.
  Tensor compute_flat() const;
  Device device() const { return params_.device(); }
  DType compute_dtype() const { return compute_dtype_; }
  Tensor param(const std::string& name) const { return param(index(name)); }
  Tensor grad(const std::string& name) const { return grad(index(name)); }

  float* params_data() const { return static_cast<float*>(params_.data()); }
  float* grads_data() const { return static_cast<float*>(grads_.data()); }
  size_t total_floats() const { return total_; }  // including alignment padding between and after tensors
  // Index of the first tensor whose storage ends after flat offset `off` (the lowest tensor touching [off, ...)).
  int tensor_at_or_after(size_t off) const;
  int64_t num_params() const;  // sum of numel

  // Every gradient to zero now: one pass over the flat buffer.
  void zero_grads();
  // Every gradient to zero lazily (a training step's start): nothing is written now. The first op to write a tensor
  // overwrites it instead of accumulating (take_fresh_grad), and settle_grads zeroes the tensors of a range that
  // nothing wrote, before anything reads them. The model does both (GPT settles each layer as its backward ends), so
  // a step pays no separate pass over the gradients (1.65 ms of a 1.3B model's step on an H100).
  void begin_grads();
  // True, once, when tensor i's gradient is still logically zero: the caller then overwrites it. False afterwards:
  // accumulate. with (>= 0): a tensor the same op writes too (a linear's or a norm's bias), which must be in the same
  // state; a mismatch throws naming both.
  bool take_fresh_grad(int i, int with = -1);
  // Zeroes the gradients of tensors [first, end) that are still logically zero: after this they read as zeros.
  void settle_grads(int first, int end);

 private:
  std::vector<ParamInfo> infos_;
  std::unordered_map<std::string, int> by_name_;
  Buffer params_, grads_, compute_;  // compute_ is empty when the compute dtype is fp32
  std::vector<uint8_t> fresh_;       // per tensor: its gradient is logically zero (begin_grads), not yet written
  DType compute_dtype_ = DType::F32;
  Ops* ops_ = nullptr;  // the backend owning the memory (nullptr: host)
  size_t total_ = 0;
  bool allocated_ = false;
};

}  // namespace mt
