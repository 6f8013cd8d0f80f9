#include "megatrain/train/forward_backward.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <thread>

#include "megatrain/obs/timeline.h"
#include "megatrain/parallel/gpt_pipeline.h"
#include "megatrain/core/clock.h"
#include "megatrain/train/coded_forward_backward.h"
#include "megatrain/train/slow_rounds.h"

namespace mt {

namespace {

CommTime take(ProcessGroupTpComm* tpc) { return tpc ? tpc->take_comm_time() : CommTime{}; }

Batch next_batch(DataLoader& loader) {
  obs::ScopedSpan span("phase", "data");  // waiting for the loader (its prefetch thread reads ahead)
  return loader.next();
}

// The slowburst fault on an uncoded step (train/slow_rounds.h): in a slow round this replica's work takes F x its
// usual time (the median of its recent rounds), the extra slept right after the round, so an uncoded run pays for a
// slow replica as a synchronous step does (its peers wait in the gradient reduction) and can be set beside a coded
// run under the same fault. Without a slowburst item for this rank it only runs the round.
class UncodedSlowness {
 public:
  UncodedSlowness(const RunConfig& cfg, const Topology& topo)
      : slow_(topo.rank_info.rank, topo.coord.dp, topo.shape.dp, cfg.train.grad_accum, cfg.train.steps) {}
  void set_step(int step) { step_ = step; }
  template <class Work>
  void round(int r, Work&& work) {
    if (!slow_.any()) return work();
    const double t0 = now_seconds();
    work();
    const double took = now_seconds() - t0;
    const double f = slow_.factor(step_, r, !history_.empty());
    if (f > 1) {
      std::deque<double> v = history_;
      std::sort(v.begin(), v.end());
      std::this_thread::sleep_for(std::chrono::duration<double>((f - 1) * v[v.size() / 2]));
    }
    history_.push_back(took);
    if (history_.size() > 16) history_.pop_front();
  }

 private:
  SlowRounds slow_;
  std::deque<double> history_;  // recent rounds' own time (the sleep excluded)
  int step_ = 0;
};

class PlainForwardBackward final : public ForwardBackward {
 public:
  PlainForwardBackward(const RunConfig& cfg, Topology& topo, ModelStack& stack)
      : model_(*stack.model), tpc_(stack.tp_comm.get()), accum_(cfg.train.grad_accum), B_(cfg.data.batch_size),
        T_(cfg.data.seq_len), interleave_(cfg.parallel.ep_interleave), slow_(cfg, topo) {
    if (interleave_) model_.reserve_activation_slots(0, 2, B_, T_);  // both micro-batches of a pair
  }
  float run_rounds(const BatchSource& batch, Update& update) override {
    if (interleave_) return run_pairs(batch, update);
    float loss = 0;
    for (int mi = 0; mi < accum_; ++mi) {
      const Batch& b = batch(mi);
      const bool last = mi == accum_ - 1;
      if (last) update.begin_last_backward(-1);
      if (tpc_) model_.set_tp_grad_sync(last);  // replicated tensors' gradients: one tp sum per step
      slow_.round(mi, [&] {
        {
          obs::ScopedSpan span("compute", [mi] {
            return obs::SpanInfo{fmt::format("forward mb{}", mi), {{"mb", mi}}};
          });
          loss += model_.forward(b.x.data(), b.y.data(), B_, T_, true, 1.0f / accum_);
        }
        obs::ScopedSpan span("compute", [mi] { return obs::SpanInfo{fmt::format("backward mb{}", mi), {{"mb", mi}}}; });
        model_.backward();
      });
    }
    return loss / accum_;
  }
  // parallel.ep_interleave (model/gpt.h forward_pair): micro-batches 2p and 2p+1 forward together, then each one's
  // backward in order. The gradients accumulate in the same order as above (mb0's backward, mb1's, ...), and each
  // forward is the same arithmetic, so the step is the plain one's bit for bit.
  float run_pairs(const BatchSource& batch, Update& update) {
    float loss = 0;
    for (int mi = 0; mi < accum_; mi += 2) {
      const Batch &b0 = batch(mi), &b1 = batch(mi + 1);
      slow_.round(mi, [&] {
        float l[2];
        {
          obs::ScopedSpan span("compute", [mi] {
            return obs::SpanInfo{fmt::format("forward mb{}+mb{}", mi, mi + 1), {{"mb", mi}}};
          });
          model_.forward_pair({mi, mi + 1}, {b0.x.data(), b1.x.data()}, {b0.y.data(), b1.y.data()}, B_, T_,
                              1.0f / accum_, l);
        }
        loss += l[0];  // summed in the plain form's order
        loss += l[1];
        for (int k = 0; k < 2; ++k) {
          if (mi + k == accum_ - 1) update.begin_last_backward(-1);
          obs::ScopedSpan span("compute", [m = mi + k] {
            return obs::SpanInfo{fmt::format("backward mb{}", m), {{"mb", m}}};
          });
          model_.backward_chunk(0, mi + k, Tensor{});
        }
      });
    }
    return loss / accum_;
  }
  CommTime take_tp_time() override { return take(tpc_); }
  void set_step(int step) override { slow_.set_step(step); }

 private:
  GPT& model_;
  ProcessGroupTpComm* tpc_;
  int accum_, B_, T_;
  bool interleave_;
  UncodedSlowness slow_;
};

class PipelinedForwardBackward final : public ForwardBackward {
 public:
  PipelinedForwardBackward(const RunConfig& cfg, Topology& topo, ModelStack& stack)
      : stack_(stack), device_pp_(topo.device_mesh->pp()), host_pp_(topo.host_mesh->pp()), accum_(cfg.train.grad_accum),
        pipe_(*stack.model, stack.schedule, topo.coord.pp, cfg.data.batch_size, cfg.data.seq_len), slow_(cfg, topo) {}
  float run_rounds(const BatchSource& batch, Update& update) override {
    // A chunk's gradients are final in the backward of its last micro-batch: ZeRO's buckets start there.
    pipe_.set_before_last_backward([&update](int c) { update.begin_last_backward(c); });
    const int micro = stack_.microbatches;
    float loss = 0;
    for (int round = 0; round < accum_; ++round) {
      const Batch& b = batch(round);
      slow_.round(round, [&] {
        loss += pipe_.run(device_pp_, b.x.data(), b.y.data(), 1.0f / static_cast<float>(accum_ * micro),
                          round == accum_ - 1);
      });
    }
    loss /= static_cast<float>(accum_ * micro);
    // The two copies of a tied wte take the sum of both stages' gradients (ZeRO reduces the buckets holding wte
    // only in finish_gradients, after this sum).
    if (stack_.embedding_group) {
      obs::ScopedSpan span("wait", "tied-embedding sum");
      stack_.embedding_group->allreduce(stack_.model->params().grad("wte.weight"))->wait();
    }
    obs::ScopedSpan span("wait", "loss sum");
    host_pp_.allreduce(f32_view(&loss, {1}))->wait();  // the loss exists on the last stage only
    return loss;
  }
  CommTime take_tp_time() override { return take(stack_.tp_comm.get()); }
  CommTime take_pp_time() override { return pipe_.take_comm_time(); }
  void set_step(int step) override { slow_.set_step(step); }

 private:
  ModelStack& stack_;
  ProcessGroup &device_pp_, &host_pp_;
  int accum_;
  GptPipeline pipe_;
  UncodedSlowness slow_;
};

}  // namespace

float ForwardBackward::run(DataLoader& loader, Update& update) {
  kept_.clear();
  return run_rounds(
      [&](int) -> const Batch& {
        kept_.push_back(next_batch(loader));
        return kept_.back();
      },
      update);
}

float ForwardBackward::rerun(Update& update) {
  rerunning_ = true;
  struct Reset {
    bool& flag;
    ~Reset() { flag = false; }
  } reset{rerunning_};
  return run_rounds([&](int round) -> const Batch& { return kept_.at(static_cast<size_t>(round)); }, update);
}

std::unique_ptr<ForwardBackward> make_forward_backward(const RunConfig& cfg, Topology& topo, ModelStack& stack) {
  if (cfg.parallel.straggler_coding != StragglerScheme::None) return make_coded_forward_backward(cfg, topo, stack);
  if (topo.shape.pp > 1) return std::make_unique<PipelinedForwardBackward>(cfg, topo, stack);
  return std::make_unique<PlainForwardBackward>(cfg, topo, stack);
}

}  // namespace mt
