#include "megatrain/train/checkpoint/gathered_save.h"

#include <fmt/format.h>

#include <deque>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "megatrain/ckpt/checkpoint.h"
#include "megatrain/core/clock.h"
#include "megatrain/model/layout.h"
#include "megatrain/optim/optimizer.h"
#include "megatrain/parallel/data_parallel.h"
#include "megatrain/parallel/tensor_parallel.h"
#include "megatrain/train/checkpoint/finite_guard.h"
#include "megatrain/train/checkpoint/run_position.h"

namespace mt {

namespace {

// Optimizer moments as full tensors laid out like the parameters (from the optimizer, or gathered from the
// data-parallel shards).
struct Moments {
  std::function<Tensor(int)> m, v;
  std::function<Tensor(int)> p;  // the parameters as saved (unset: the model's own tensors)
};

// One full tensor of a checkpoint with its optimizer moments.
struct SavedTensor {
  std::string name;
  Tensor p, m, v;
};

// A full (gathered) checkpoint: parameters and optimizer moments, one file each. Returns its directory.
std::string write_checkpoint(const RunConfig& cfg, const std::vector<SavedTensor>& tensors, int step,
                             const LoaderState& data, const SaveFacts& facts, SaveWhy why) {
  std::vector<TensorRef> model_t, optim_t;
  for (const SavedTensor& t : tensors) {
    model_t.push_back(tensor_ref(t.name, t.p));
    optim_t.push_back(tensor_ref("m." + t.name, t.m));
    optim_t.push_back(tensor_ref("v." + t.name, t.v));
  }
  const nlohmann::json extra = checkpoint_extra(cfg, step, data, facts);
  SaveOptions so;
  so.keep_last = cfg.ckpt.keep_last;
  double t0 = now_seconds();
  std::string dir = save_checkpoint(cfg.ckpt.dir, step,
                                    {{"model.safetensors", model_t}, {"optim.safetensors", optim_t}}, extra, so);
  fmt::print("checkpoint ({}) step {} -> {} in {:.2f} s\n", kind_name(why), step, dir, now_seconds() - t0);
  return dir;
}

// Full (unsharded) copies of every parameter and moment of a tensor-parallel rank, for gathered checkpoints.
struct TpFullState {
  std::vector<HostBuffer> p, m, v;
  std::vector<ShardSpec> specs;
  std::vector<int64_t> saved_rows;  // dim 0 as saved (vocab tensors: the single-process padded_vocab())

  void allocate(const ParamStore& ps, const ModelConfig& mc) {
    for (const ParamInfo& info : ps.infos()) {
      specs.push_back(info.shard);
      const size_t bytes = static_cast<size_t>(info.shard.full_numel()) * sizeof(float);
      for (auto* b : {&p, &m, &v}) b->emplace_back(bytes);
      const bool vocab = info.name == "wte.weight" || info.name == "lm_head.weight";
      saved_rows.push_back(vocab ? mc.padded_vocab() : info.shard.full_shape[0]);
    }
  }
  Tensor view(std::vector<HostBuffer>& b, int i) const {
    Tensor t;
    t.ptr = b[i].data();
    t.ndim = static_cast<int>(specs[i].full_shape.size());
    for (int d = 0; d < t.ndim; ++d) t.dims[d] = specs[i].full_shape[d];
    t.dims[0] = saved_rows[i];
    return t;
  }
  void gather(ProcessGroup& g, const ParamStore& ps, const Moments& local) {
    for (size_t k = 0; k < ps.size(); ++k) {
      const int i = static_cast<int>(k);
      tp_gather_full(g, specs[k], ps.param(i).f32(), p[k].f32());
      tp_gather_full(g, specs[k], local.m(i).f32(), m[k].f32());
      tp_gather_full(g, specs[k], local.v(i).f32(), v[k].f32());
    }
  }
};

}  // namespace

struct GatheredSave::State {
  const RankHoldings h;
  // Full moments: the optimizer's own, or a gathered copy of the ZeRO shards.
  HostBuffer full_m, full_v;
  Moments moments;
  // With tp the shards are gathered over tp into full copies (allocated by the first save). wte/lm_head are saved at
  // the single-process padded_vocab() rows (the extra rows that tp's coarser vocabulary padding adds are zero).
  TpFullState tp_full;
  Moments saved;

  explicit State(const RankHoldings& holdings) : h(holdings) {
    if (h.opt) {
      moments.m = [this](int i) { return h.opt->m(i); };
      moments.v = [this](int i) { return h.opt->v(i); };
    } else {
      moments.m = [this](int i) { return full_view(full_m, i); };
      moments.v = [this](int i) { return full_view(full_v, i); };
    }
    saved = moments;
    if (h.cfg.parallel.tp > 1) {  // the full copies are allocated by the first save
      saved.p = [this](int i) { return tp_full.view(tp_full.p, i); };
      saved.m = [this](int i) { return tp_full.view(tp_full.m, i); };
      saved.v = [this](int i) { return tp_full.view(tp_full.v, i); };
    }
  }

  Tensor full_view(HostBuffer& b, int i) const {
    const ParamInfo& p = h.model.params().info(i);
    Tensor t = h.model.params().param(i);
    t.ptr = b.f32() + p.offset;
    return t;
  }

  // This rank's tensors as saved (full), without the last stage's wte copy.
  std::vector<SavedTensor> stage_tensors() const {
    std::vector<SavedTensor> t;
    const ParamStore& ps = h.model.params();
    for (int i = 0; i < static_cast<int>(ps.size()); ++i)
      if (i != h.wte_copy) t.push_back({ps.info(i).name, saved.p ? saved.p(i) : ps.param(i), saved.m(i), saved.v(i)});
    return t;
  }

  // With pp the dp0/tp0 rank of every stage sends its (full) tensors to pp rank 0 over the pp group, which writes
  // one full checkpoint: any layout resumes from it.
  std::pair<std::vector<SavedTensor>, std::deque<HostBuffer>> gather_stages() const {
    std::map<std::string, SavedTensor> all;
    for (SavedTensor& t : stage_tensors()) all[t.name] = t;
    std::deque<HostBuffer> bufs;
    const int pp = h.cfg.parallel.pp;
    for (int r = 1; r < pp; ++r) {
      ParamStore lay;
      declare_gpt_params(h.cfg.model, lay, 1, 0,
                         pipeline_part(h.cfg.model, pp, h.cfg.parallel.virtual_stages, r, h.cfg.parallel.stage_layers));
      std::vector<WorkPtr> work;
      int tag = 0;
      for (const ParamInfo& info : lay.infos()) {
        if (r == pp - 1 && h.cfg.model.tied_embeddings && info.name == "wte.weight") continue;
        SavedTensor st{info.name, {}, {}, {}};
        for (Tensor* x : {&st.p, &st.m, &st.v}) {
          bufs.emplace_back(info.numel * sizeof(float));
          x->ptr = bufs.back().data();
          x->dtype = DType::F32;
          x->ndim = static_cast<int>(info.shape.size());
          for (int d = 0; d < x->ndim; ++d) x->dims[d] = info.shape[d];
          work.push_back(h.mesh->pp().recv(*x, r, tag++));
        }
        all[info.name] = st;
      }
      for (auto& w : work) w->wait();
    }
    ParamStore full;
    declare_gpt_params(h.cfg.model, full);
    std::vector<SavedTensor> out;
    for (const ParamInfo& info : full.infos()) out.push_back(all.at(info.name));
    return std::make_pair(out, std::move(bufs));
  }
};

GatheredSave::GatheredSave(const RankHoldings& h) : s_(std::make_unique<State>(h)) {}

GatheredSave::~GatheredSave() = default;

std::string GatheredSave::save(int step, const LoaderState& data, const SaveFacts& facts, SaveWhy why,
                               Agreement& agreement) {
  State& s = *s_;
  const RankHoldings& h = s.h;
  const int pp = h.cfg.parallel.pp;
  const bool main_rank = h.main_rank();
  if (h.ddp) h.ddp->sync_params();
  refuse_non_finite(h, agreement, step);                 // collective: every rank refuses, or none
  if (h.ddp) h.ddp->gather_moments(s.full_m, s.full_v);  // collective: every dp rank takes part
  if (h.cfg.parallel.tp > 1) {
    if (s.tp_full.specs.empty()) s.tp_full.allocate(h.model.params(), h.cfg.model);
    s.tp_full.gather(h.mesh->tp(), h.model.params(), s.moments);  // collective over tp
  }
  std::string dir;
  if (pp > 1 && writes_gathered_stage(h) && h.coord().pp > 0) {
    std::vector<WorkPtr> work;
    int tag = 0;
    for (const SavedTensor& t : s.stage_tensors())
      for (const Tensor& x : {t.p, t.m, t.v}) work.push_back(h.mesh->pp().send(x, 0, tag++));
    for (auto& w : work) w->wait();
  } else if (pp > 1 && main_rank) {
    auto gathered = s.gather_stages();
    dir = write_checkpoint(h.cfg, gathered.first, step, data, facts, why);
  } else if (main_rank) {
    dir = write_checkpoint(h.cfg, s.stage_tensors(), step, data, facts, why);
  }
  agreement.barrier();  // nobody runs ahead of a checkpoint that is not committed yet
  return dir;
}

}  // namespace mt
