#include "megatrain/parallel/data_parallel.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>

#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"

namespace mt {

namespace {
Tensor host_span(float* p, size_t n) { return f32_view(p, {static_cast<int64_t>(n)}); }
float* f32(const Buffer& b) { return static_cast<float*>(b.data()); }
}  // namespace

Tensor DataParallel::span(float* p, size_t n) const {
  return Tensor(p, {static_cast<int64_t>(n)}, DType::F32, ops_.device());
}

DataParallel::DataParallel(GPT& model, ProcessGroup& group, Ops& ops, const OptimConfig& ocfg,
                           const DataParallelOptions& opt)
    : model_(model), group_(group), ops_(ops), ocfg_(ocfg), opt_(opt), dp_(group.size()), rank_(group.rank()) {
  ocfg_.validate();
  const ParamStore& ps = model_.params();
  const size_t unit = dp_pad_multiple(dp_), total = ps.total_floats();
  MT_CHECK(total % unit == 0,
           "DataParallel: the model's flat buffers ({} floats) are not padded to dp*16 = {}; build "
           "the GPT with pad_multiple = dp_pad_multiple(dp)",
           total, unit);
  plan_buckets(unit, std::max(unit, (opt_.bucket_floats + unit - 1) / unit * unit));
  MT_CHECK(opt_.host == nullptr || (opt_.host->size() == dp_ && opt_.host->rank() == rank_),
           "DataParallel: the host-plane dp group {} ({} ranks, rank {}) is not the dp group {} ({} ranks, rank {})",
           opt_.host ? opt_.host->name() : "", opt_.host ? opt_.host->size() : 0, opt_.host ? opt_.host->rank() : 0,
           group_.name(), dp_, rank_);
  const size_t shard = shard_floats_;
  for (Buffer* b : {&shard_grad_, &shard_m_, &shard_v_, &shard_stage_}) *b = ops_.alloc(shard * sizeof(float));
  plan_pieces();
  armed_.assign(ps.size(), 0);
  final_.assign(ps.size(), 0);
  deferred_.assign(ps.size(), 0);
  // Pipeline stages with tied embeddings: each holds a wte copy whose gradient the trainer sums with the other
  // stage's after the pipeline, so it is not final when backward finishes it.
  if (!model_.part().whole() && model_.config().tied_embeddings && ps.has("wte.weight"))
    deferred_[ps.index("wte.weight")] = 1;
  if (opt_.install_hooks) model_.set_hooks(hooks());
}

GptHooks DataParallel::hooks() {
  GptHooks h;
  h.grads_ready = [this](int first) { on_grads_ready(first); };
  h.before_params_used = [this](int first, int end) { on_params_used(first, end); };
  return h;
}

void DataParallel::plan_buckets(size_t unit, size_t bs) {
  const ParamStore& ps = model_.params();
  const size_t total = ps.total_floats();
  const int n = static_cast<int>(ps.size());
  MT_CHECK(opt_.tensors.empty() || opt_.tensors.size() == ps.size(),
           "DataParallel: a selection of {} tensors for a model of {}", opt_.tensors.size(), ps.size());
  auto selected = [&](int i) { return opt_.tensors.empty() || opt_.tensors[i]; };
  size_t shard = 0;
  for (int i = 0; i < n;) {
    if (!selected(i)) {
      ++i;
      continue;
    }
    // A run of selected tensors [i, j): from the first one's offset (0 for the first tensor) up to the next
    // tensor's (or the end of the buffers).
    int j = i;
    while (j < n && selected(j)) ++j;
    const size_t run_begin = i == 0 ? 0 : ps.info(i).offset, run_end = j == n ? total : ps.info(j).offset;
    MT_CHECK(run_begin % unit == 0 && run_end % unit == 0,
             "DataParallel: tensors {}..{} occupy [{}, {}) of the flat buffers, not on dp*16 = {} boundaries",
             ps.info(i).name, ps.info(j - 1).name, run_begin, run_end, unit);
    for (size_t b = run_begin; b < run_end; b += bs) {
      Bucket k;
      k.begin = b;
      k.end = std::min(run_end, b + bs);
      k.lowest_tensor = ps.tensor_at_or_after(k.begin);
      k.end_tensor = ps.tensor_at_or_after(k.end);  // the first tensor ending after the range: inside if it straddles
      if (k.end_tensor < n && ps.info(k.end_tensor).offset < k.end) ++k.end_tensor;
      buckets_.push_back(k);
      shard_offset_.push_back(shard);
      shard += (k.end - k.begin) / dp_;
    }
    i = j;
  }
  shard_floats_ = shard;
}

DataParallel::~DataParallel() {
  if (opt_.install_hooks) model_.set_hooks({});
  // Never leave communication in flight on buffers about to disappear.
  for (auto& b : buckets_) {
    try {
      if (b.rs) b.rs->wait();
      if (b.ag) b.ag->wait();
    } catch (...) {
    }
  }
}

template <typename F>
void DataParallel::for_each_owned_piece(F&& f) const {
  const ParamStore& ps = model_.params();
  for (size_t k = 0; k < buckets_.size(); ++k) {
    const Bucket& b = buckets_[k];
    const size_t s = slice_start(b), e = s + slice_len(b);
    for (int i = ps.tensor_at_or_after(s); i < static_cast<int>(ps.size()); ++i) {
      const ParamInfo& p = ps.info(i);
      if (p.offset >= e) break;
      size_t pb = std::max(s, p.offset), pe = std::min(e, p.offset + p.numel);
      if (pb < pe) f(i, pb, pe, shard_offset_[k] + (pb - s));
    }
  }
}

void DataParallel::wait(WorkPtr& w) {
  double t0 = now_seconds();
  w->wait();
  comm_time_.exposed_seconds += now_seconds() - t0;
  comm_time_.busy_seconds += w->exec_seconds();
  w.reset();
}

void DataParallel::finish_all_gather(Bucket& b) {
  if (!b.ag) return;
  wait(b.ag);
  // The update and the all-gather write the fp32 master weights only; on a backend that computes in another dtype
  // the layers read a separate copy, which would otherwise keep the weights of the step before (every step's).
  model_.params().refresh_weights(ops_, b.begin, b.end);
}

void DataParallel::begin_last_backward() { arm(0, static_cast<int>(model_.params().size())); }

void DataParallel::begin_last_backward(int chunk) {
  const auto [first, end] = model_.chunk_params(chunk);
  arm(first, end);
}

void DataParallel::arm(int first, int end) {
  if (!opt_.overlap) return;
  for (int i = first; i < end; ++i) armed_[i] = !deferred_[i];
}

void DataParallel::launch_reduce_scatter(size_t k) {
  Bucket& b = buckets_[k];
  b.launched = true;
  if (before_reduce_) before_reduce_(b.begin, b.end);
  float* g = model_.params().grads_data();
  b.rs = group_.reduce_scatter(span(f32(shard_grad_) + shard_offset_[k], slice_len(b)),
                               span(g + b.begin, b.end - b.begin));
}

void DataParallel::on_grads_ready(int first_done) {
  // The model has finished every gradient >= first_done of the backward in progress; the other armed tensors
  // belong to chunks whose last backward already ran. So every armed tensor >= first_done is final.
  bool any = false;
  for (size_t i = first_done; i < final_.size(); ++i)
    if (armed_[i] && !final_[i]) final_[i] = any = true;
  if (!any) return;
  // Highest addresses finish first; every rank sees the same sequence of calls, so the issue order matches.
  for (size_t k = buckets_.size(); k-- > 0;) {
    Bucket& b = buckets_[k];
    if (b.launched) continue;
    bool ready = true;
    for (int i = b.lowest_tensor; i < b.end_tensor && ready; ++i) ready = final_[i];
    if (ready) {
      launch_reduce_scatter(k);
      ++overlapped_;
    }
  }
}

void DataParallel::on_params_used(int first, int end) {
  if (first >= end) return;
  const ParamStore& ps = model_.params();
  const size_t lo = ps.info(first).offset, hi = ps.info(end - 1).offset + ps.info(end - 1).numel;
  for (auto& b : buckets_)
    if (b.ag && b.begin < hi && b.end > lo) finish_all_gather(b);
}

double DataParallel::finish_gradients() {
  for (size_t k = buckets_.size(); k-- > 0;)
    if (!buckets_[k].launched) launch_reduce_scatter(k);
  for (auto& b : buckets_) {
    wait(b.rs);
    b.launched = false;
  }
  std::fill(armed_.begin(), armed_.end(), 0);
  std::fill(final_.begin(), final_.end(), 0);
  overlapped_last_ = std::exchange(overlapped_, 0);
  Tensor g = span(f32(shard_grad_), shard_floats_);
  // sum over ranks -> mean over the global batch
  ops_.scale(g, 1.0f / static_cast<float>(opt_.mean_over > 0 ? opt_.mean_over : dp_));
  const bool clip_own = opt_.clip_norm_reduce != nullptr;
  const std::vector<float>& weights = clip_own ? opt_.clip_norm_weights : opt_.norm_weights;
  float ss = 0;
  if (weights.empty()) {
    ss = static_cast<float>(ops_.sum_squares(g));
  } else {  // tensor parallelism: weight each tensor (replicated ones count on one tp rank only)
    double acc = 0;
    for_each_owned_piece([&](int i, size_t b, size_t e, size_t so) {
      if (weights[i] != 0) acc += weights[i] * ops_.sum_squares(span(f32(shard_grad_) + so, e - b));
    });
    ss = static_cast<float>(acc);
  }
  float buf[1] = {ss};
  host().allreduce(host_span(buf, 1))->wait();
  const NormReduce& reduce = clip_own ? opt_.clip_norm_reduce : opt_.norm_reduce;
  if (reduce) reduce(buf, 1);
  return std::sqrt(static_cast<double>(buf[0]));
}

void DataParallel::plan_pieces() {
  const ParamStore& ps = model_.params();
  piece_segs_.assign(buckets_.size(), {});
  piece_tensor_.assign(buckets_.size(), {});
  size_t pieces = 0;
  for_each_owned_piece([&](int i, size_t b, size_t e, size_t so) {
    // The bucket whose slice holds the piece; the piece sits at the same offset in my slice of the parameters
    // (b - slice_start) as in my shard buffers (so - shard_offset_), so one segment serves all four views.
    const size_t k = static_cast<size_t>(std::upper_bound(shard_offset_.begin(), shard_offset_.end(), so) -
                                         shard_offset_.begin()) -
                     1;
    piece_segs_[k].push_back({static_cast<int64_t>(so - shard_offset_[k]), static_cast<int64_t>(e - b),
                              ps.info(i).decay ? ocfg_.weight_decay : 0.0f});
    piece_tensor_[k].push_back(i);
    ++pieces;
  });
  if (ocfg_.name == OptimizerKind::Lamb) {
    piece_norms_ = ops_.alloc(std::max<size_t>(1, 2 * pieces) * sizeof(float));
    piece_norms_host_.assign(2 * pieces, 0.0f);
  }
}

void DataParallel::step(float lr, float grad_scale, int step) {
  const ParamStore& ps = model_.params();
  float* p = ps.params_data();
  // Bucket k's views: my slice of the flat parameters and my shard of the gradients and moments; each tensor piece
  // inside is one segment of a multi-tensor call (weight decay per segment), so a step is a few launches per bucket.
  auto views = [&](size_t k) {
    const Bucket& b = buckets_[k];
    const size_t so = shard_offset_[k], n = slice_len(b);
    return std::array<Tensor, 4>{span(p + slice_start(b), n), span(f32(shard_grad_) + so, n),
                                 span(f32(shard_m_) + so, n), span(f32(shard_v_) + so, n)};
  };
  const AdamHParams h = adam_hparams(ocfg_, false, lr, grad_scale, step);  // weight decay: per segment
  if (ocfg_.name == OptimizerKind::AdamW) {
    for (size_t k = 0; k < buckets_.size(); ++k) {
      const auto [pv, gv, mv, vv] = views(k);
      ops_.adamw_update_multi(pv, gv, mv, vv, piece_segs_[k], h);
    }
  } else {
    // LAMB: every piece's ||w||^2 and ||u||^2 (pass 1, on the device), then one copy to the host: summed per tensor
    // (weighted under tp), over the dp ranks and tp; each piece takes its tensor's norms back for pass 2.
    auto piece_norms = [&](size_t at, size_t n) {
      return Tensor(static_cast<float*>(piece_norms_.data()) + at, {static_cast<int64_t>(n)}, DType::F32,
                    ops_.device());
    };
    size_t at = 0;
    for (size_t k = 0; k < buckets_.size(); ++k) {
      const auto [pv, gv, mv, vv] = views(k);
      ops_.lamb_moments_multi(pv, gv, mv, vv, piece_segs_[k], h, piece_norms(at, 2 * piece_segs_[k].size()));
      at += 2 * piece_segs_[k].size();
    }
    if (at > 0) ops_.to_host(piece_norms_host_.data(), piece_norms(0, at));
    std::vector<float> norms(2 * ps.size(), 0.0f);
    at = 0;
    for (size_t k = 0; k < buckets_.size(); ++k)
      for (int i : piece_tensor_[k]) {
        const float w = opt_.norm_weights.empty() ? 1.0f : opt_.norm_weights[i];
        norms[2 * i + 1] += w * piece_norms_host_[at + 1];
        norms[2 * i] += w * piece_norms_host_[at];
        at += 2;
      }
    host().allreduce(host_span(norms.data(), norms.size()))->wait();
    if (opt_.norm_reduce) opt_.norm_reduce(norms.data(), norms.size());
    at = 0;
    for (size_t k = 0; k < buckets_.size(); ++k)
      for (int i : piece_tensor_[k]) {
        piece_norms_host_[at] = norms[2 * i];
        piece_norms_host_[at + 1] = norms[2 * i + 1];
        at += 2;
      }
    if (at > 0) ops_.to_device(piece_norms(0, at), piece_norms_host_.data());
    at = 0;
    for (size_t k = 0; k < buckets_.size(); ++k) {
      const auto [pv, gv, mv, vv] = views(k);
      ops_.lamb_apply_multi(pv, mv, vv, piece_segs_[k], h, piece_norms(at, 2 * piece_segs_[k].size()));
      at += 2 * piece_segs_[k].size();
    }
  }
  // All-gather the updated parameters, in forward order: the first layers' buckets complete first.
  for (size_t k = 0; k < buckets_.size(); ++k) {
    Bucket& b = buckets_[k];
    // The group reads the staging copy (not the slice in place) since the all-gather writes the whole bucket.
    float* stage = f32(shard_stage_) + shard_offset_[k];
    ops_.copy(span(stage, slice_len(b)), span(p + slice_start(b), slice_len(b)));
    b.ag = group_.all_gather(span(p + b.begin, b.end - b.begin), span(stage, slice_len(b)));
  }
  if (!opt_.overlap) sync_params();
}

void DataParallel::sync_params() {
  for (auto& b : buckets_) finish_all_gather(b);
}

std::pair<float*, float*> DataParallel::host_moments(bool pull) {
  if (ops_.device() == Device::CPU) return {f32(shard_m_), f32(shard_v_)};
  if (host_m_.size() != shard_floats_ * sizeof(float)) {
    host_m_.resize(shard_floats_ * sizeof(float), false);
    host_v_.resize(shard_floats_ * sizeof(float), false);
  }
  if (pull) {
    ops_.to_host(host_m_.data(), span(f32(shard_m_), shard_floats_));
    ops_.to_host(host_v_.data(), span(f32(shard_v_), shard_floats_));
  }
  return {host_m_.f32(), host_v_.f32()};
}

void DataParallel::gather_moments(HostBuffer& m, HostBuffer& v) {
  const size_t total = model_.params().total_floats();
  m.resize(total * sizeof(float));
  v.resize(total * sizeof(float));
  const auto [hm, hv] = host_moments(true);
  for (size_t k = 0; k < buckets_.size(); ++k) {
    const Bucket& b = buckets_[k];
    host()
        .all_gather(host_span(m.f32() + b.begin, b.end - b.begin), host_span(hm + shard_offset_[k], slice_len(b)))
        ->wait();
    host()
        .all_gather(host_span(v.f32() + b.begin, b.end - b.begin), host_span(hv + shard_offset_[k], slice_len(b)))
        ->wait();
  }
}

void DataParallel::scatter_moments(const float* m, const float* v) {
  const auto [hm, hv] = host_moments(false);
  for (size_t k = 0; k < buckets_.size(); ++k) {
    const Bucket& b = buckets_[k];
    std::memcpy(hm + shard_offset_[k], m + slice_start(b), slice_len(b) * sizeof(float));
    std::memcpy(hv + shard_offset_[k], v + slice_start(b), slice_len(b) * sizeof(float));
  }
  commit_moment_slices();
}

void DataParallel::commit_moment_slices() {
  if (ops_.device() == Device::CPU) return;
  const auto [hm, hv] = host_moments(false);
  ops_.to_device(span(f32(shard_m_), shard_floats_), hm);
  ops_.to_device(span(f32(shard_v_), shard_floats_), hv);
}

std::vector<DataParallel::MomentSlice> DataParallel::moment_slices() {
  std::vector<MomentSlice> out;
  const ParamStore& ps = model_.params();
  const auto [hm, hv] = host_moments(true);
  for_each_owned_piece([&](int i, size_t pb, size_t pe, size_t at) {
    const size_t off = ps.info(i).offset;
    out.push_back({i, pb - off, pe - off, hm + at, hv + at});
  });
  return out;
}

}  // namespace mt
