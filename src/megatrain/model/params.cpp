#include "megatrain/model/params.h"

#include <algorithm>
#include <cstring>

#include "megatrain/core/error.h"

namespace mt {

static Tensor make_view(const Buffer& b, DType dt, const ParamInfo& p) {
  Tensor t;
  t.ptr = static_cast<char*>(b.data()) + p.offset * dtype_size(dt);
  t.dtype = dt;
  t.device = b.device();
  t.ndim = static_cast<int>(p.shape.size());
  for (int d = 0; d < t.ndim; ++d) t.dims[d] = p.shape[d];
  return t;
}

int ParamStore::add(const std::string& name, std::vector<int64_t> shape, bool decay) {
  return add(name, replicated_spec(std::move(shape)), decay);
}

int ParamStore::add(const std::string& name, const ShardSpec& spec, bool decay) {
  MT_CHECK(!allocated_, "ParamStore: cannot add '{}' after allocate()", name);
  MT_CHECK(!by_name_.count(name), "ParamStore: duplicate parameter '{}'", name);
  ParamInfo p;
  p.name = name;
  p.shape = spec.local_shape();
  p.shard = spec;
  p.numel = 1;
  for (auto d : p.shape) p.numel *= static_cast<size_t>(d);
  p.offset = total_;
  p.decay = decay;
  total_ += (p.numel + 15) / 16 * 16;
  by_name_[name] = static_cast<int>(infos_.size());
  infos_.push_back(std::move(p));
  return static_cast<int>(infos_.size()) - 1;
}

void ParamStore::allocate(size_t pad_multiple, Ops* ops) {
  MT_CHECK(!allocated_, "ParamStore: allocate() called twice");
  // Expert-parallel tensors are reduced over another group than their neighbours (the expert-dp group): every run
  // of them starts and ends on a pad_multiple boundary, so each group's buckets cut into equal, aligned slices.
  if (pad_multiple > 1) {
    size_t at = 0;
    for (size_t i = 0; i < infos_.size(); ++i) {
      if (i > 0 && infos_[i].shard.ep_sharded() != infos_[i - 1].shard.ep_sharded())
        at = (at + pad_multiple - 1) / pad_multiple * pad_multiple;
      infos_[i].offset = at;
      at += (infos_[i].numel + 15) / 16 * 16;
    }
    total_ = at;
  }
  if (pad_multiple > 1) total_ = (total_ + pad_multiple - 1) / pad_multiple * pad_multiple;
  const size_t bytes = std::max<size_t>(total_, 16) * sizeof(float);
  ops_ = ops;
  params_ = ops ? ops->alloc(bytes) : host_buffer(bytes);
  grads_ = ops ? ops->alloc(bytes) : host_buffer(bytes);
  compute_dtype_ = ops ? ops->compute_dtype() : DType::F32;
  if (compute_dtype_ != DType::F32) compute_ = ops->alloc(std::max<size_t>(total_, 16) * dtype_size(compute_dtype_));
  allocated_ = true;
}

void ParamStore::refresh_weights(Ops& ops) { refresh_weights(ops, 0, total_); }

void ParamStore::refresh_weights(Ops& ops, size_t begin, size_t end) {
  if (compute_.empty()) return;
  MT_CHECK(begin <= end && end <= total_, "refresh_weights: range [{}, {}) outside the {} floats", begin, end, total_);
  const auto n = static_cast<int64_t>(end - begin);
  Tensor master(params_data() + begin, {n}, DType::F32, params_.device());
  Tensor lowp(static_cast<char*>(compute_.data()) + begin * dtype_size(compute_dtype_), {n}, compute_dtype_,
              compute_.device());
  ops.convert(lowp, master);
}

Tensor ParamStore::compute_flat() const {
  if (compute_.empty()) return {};
  return Tensor(compute_.data(), {static_cast<int64_t>(total_)}, compute_dtype_, compute_.device());
}

int ParamStore::tensor_at_or_after(size_t off) const {
  for (size_t i = 0; i < infos_.size(); ++i)
    if (infos_[i].offset + infos_[i].numel > off) return static_cast<int>(i);
  return static_cast<int>(infos_.size());
}

int ParamStore::index(const std::string& name) const {
  auto it = by_name_.find(name);
  MT_CHECK(it != by_name_.end(), "unknown parameter '{}'", name);
  return it->second;
}

Tensor ParamStore::param(int i) const { return make_view(params_, DType::F32, infos_.at(i)); }
Tensor ParamStore::grad(int i) const { return make_view(grads_, DType::F32, infos_.at(i)); }
Tensor ParamStore::weight(int i) const {
  return compute_.empty() ? param(i) : make_view(compute_, compute_dtype_, infos_.at(i));
}

int64_t ParamStore::num_params() const {
  int64_t n = 0;
  for (auto& p : infos_) n += static_cast<int64_t>(p.numel);
  return n;
}

void ParamStore::zero_grads() {
  Tensor g(grads_.data(), {static_cast<int64_t>(total_)}, DType::F32, grads_.device());
  if (ops_)
    ops_->zero(g);
  else
    std::memset(grads_.data(), 0, total_ * sizeof(float));
  fresh_.assign(infos_.size(), 0);  // zero for real: nothing is pending
}

// The padding between and after tensors is never written by any op, so it stays as allocate() left it: zero.
void ParamStore::begin_grads() { fresh_.assign(infos_.size(), 1); }

bool ParamStore::take_fresh_grad(int i, int with) {
  MT_CHECK(i >= 0 && static_cast<size_t>(i) < infos_.size(), "take_fresh_grad: no parameter {}", i);
  const bool fresh = !fresh_.empty() && fresh_[i];
  if (fresh) fresh_[i] = 0;
  if (with >= 0)
    MT_CHECK(take_fresh_grad(with) == fresh,
             "the gradients of parameters {} and {} (written by one op) were not "
             "first written together",
             infos_[i].name, infos_.at(with).name);
  return fresh;
}

void ParamStore::settle_grads(int first, int end) {
  if (fresh_.empty()) return;
  MT_CHECK(0 <= first && first <= end && static_cast<size_t>(end) <= infos_.size(),
           "settle_grads: range [{}, {}) outside the {} parameters", first, end, infos_.size());
  for (int i = first; i < end; ++i) {
    if (!fresh_[i]) continue;
    fresh_[i] = 0;
    if (ops_)
      ops_->zero(grad(i));
    else
      std::memset(grad(i).ptr, 0, infos_[i].numel * sizeof(float));
  }
}

}  // namespace mt
