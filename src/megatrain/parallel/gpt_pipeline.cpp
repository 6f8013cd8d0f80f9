#include "megatrain/parallel/gpt_pipeline.h"

#include <algorithm>

#include "megatrain/core/error.h"

namespace mt {

class GptPipeline::Chunk final : public PipelineChunk {
 public:
  Chunk(GptPipeline& p, int c, int B, int T) : p_(p), c_(c), B_(B), T_(T) {
    const GPT& m = p.model_;
    rows_ = static_cast<int64_t>(B) * T / m.tp_size();
    dtype_ = p.model_.ops().compute_dtype();
    const size_t bytes = static_cast<size_t>(rows_) * m.config().d_model * dtype_size(dtype_);
    for (auto* v : {&in_, &out_, &gout_, &gin_}) {
      v->resize(p.sched_.microbatches);
      for (auto& b : *v) b = p.model_.ops().alloc(bytes);
    }
  }
  void start(const int32_t* tokens, const int32_t* targets, float scale, bool last_run) {
    tokens_ = tokens;
    targets_ = targets;
    scale_ = scale;
    last_run_ = last_run;
    loss_ = 0;
    backwards_ = 0;
  }
  float loss() const { return loss_; }

  Tensor input(int mb) override { return view(in_, mb); }
  Tensor output(int mb) override { return view(out_, mb); }
  Tensor grad_output(int mb) override { return view(gout_, mb); }
  Tensor grad_input(int mb) override { return view(gin_, mb); }

  void forward(int mb) override {
    GPT& m = p_.model_;
    const size_t off = static_cast<size_t>(mb) * B_ * T_;
    float l = 0;
    Tensor y = m.forward_chunk(c_, mb, view(in_, mb), tokens_ ? tokens_ + off : nullptr,
                               targets_ ? targets_ + off : nullptr, B_, T_, scale_, &l);
    if (m.last_chunk(c_))
      loss_ += l;
    else
      m.ops().copy(view(out_, mb), y);
  }
  void backward(int mb) override {
    GPT& m = p_.model_;
    const bool last = last_run_ && ++backwards_ == p_.sched_.microbatches;
    m.set_tp_grad_sync(last);
    if (last && p_.before_last_backward_) p_.before_last_backward_(c_);
    Tensor gx = m.backward_chunk(c_, mb, view(gout_, mb));
    if (!m.first_chunk(c_)) m.ops().copy(view(gin_, mb), gx);
  }

 private:
  Tensor view(std::vector<Buffer>& v, int mb) {
    MT_CHECK(mb >= 0 && mb < static_cast<int>(v.size()), "pipeline micro-batch {} out of range [0, {})", mb, v.size());
    return v[mb].view({rows_, p_.model_.config().d_model}, dtype_);
  }

  GptPipeline& p_;
  int c_, B_, T_;
  int64_t rows_ = 0;
  DType dtype_ = DType::F32;                   // the backend's compute dtype (activations and their gradients)
  std::vector<Buffer> in_, out_, gout_, gin_;  // per micro-batch boundary buffers, in the backend's memory
  const int32_t *tokens_ = nullptr, *targets_ = nullptr;
  float scale_ = 1, loss_ = 0;
  bool last_run_ = true;
  int backwards_ = 0;
};

GptPipeline::GptPipeline(GPT& model, const Schedule& s, int pp_rank, int B, int T)
    : model_(model), sched_(s), rank_(pp_rank) {
  MT_CHECK(model.num_chunks() == s.virtual_stages,
           "pipeline: the model stage holds {} chunks but the schedule has {} "
           "virtual stages",
           model.num_chunks(), s.virtual_stages);
  const std::vector<int> peak = peak_in_flight_per_chunk(s, pp_rank);
  for (int c = 0; c < model.num_chunks(); ++c) {
    model.reserve_activation_slots(c, std::max(1, peak[c]), B, T);
    chunks_.push_back(std::make_unique<Chunk>(*this, c, B, T));
  }
}

GptPipeline::~GptPipeline() = default;

float GptPipeline::run(ProcessGroup& pp_group, const int32_t* tokens, const int32_t* targets, float loss_scale,
                       bool last_run) {
  std::vector<PipelineChunk*> cs;
  for (auto& c : chunks_) {
    c->start(tokens, targets, loss_scale, last_run);
    cs.push_back(c.get());
  }
  stats_ = run_pipeline(sched_, rank_, cs, pp_group, overlap_p2p_);
  comm_time_ += CommTime{stats_.comm_seconds, stats_.wait_seconds};
  model_.set_tp_grad_sync(true);
  float sum = 0;
  for (auto& c : chunks_) sum += c->loss();
  return sum;
}

}  // namespace mt
