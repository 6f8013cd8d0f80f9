#include "megatrain/model/params.h"

#include <cstring>

#include "megatrain/core/error.h"

namespace mt {

static Tensor make_view(float* base, const ParamInfo& p) {
  Tensor t;
  t.ptr = base + p.offset;
  t.dtype = DType::F32;
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

void ParamStore::allocate(size_t pad_multiple) {
  MT_CHECK(!allocated_, "ParamStore: allocate() called twice");
  if (pad_multiple > 1) total_ = (total_ + pad_multiple - 1) / pad_multiple * pad_multiple;
  params_.resize(total_ * sizeof(float));
  grads_.resize(total_ * sizeof(float));
  allocated_ = true;
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

Tensor ParamStore::param(int i) const { return make_view(params_.f32(), infos_.at(i)); }
Tensor ParamStore::grad(int i) const { return make_view(grads_.f32(), infos_.at(i)); }

int64_t ParamStore::num_params() const {
  int64_t n = 0;
  for (auto& p : infos_) n += static_cast<int64_t>(p.numel);
  return n;
}

void ParamStore::zero_grads() { std::memset(grads_.data(), 0, total_ * sizeof(float)); }

}  // namespace mt
