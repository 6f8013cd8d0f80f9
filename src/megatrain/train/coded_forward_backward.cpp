#include "megatrain/train/coded_forward_backward.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <thread>

#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"
#include "megatrain/core/fault_spec.h"
#include "megatrain/obs/timeline.h"
#include "megatrain/parallel/gpt_pipeline.h"
#include "megatrain/parallel/straggler_code.h"
#include "megatrain/train/slow_rounds.h"

namespace mt {

namespace {

constexpr auto kStragglerPoll = std::chrono::milliseconds(2);  // between looks at the store
constexpr size_t kRoundHistory = 16;                           // recent per-micro-batch compute times kept
constexpr size_t kMinRoundHistory = 3;                         // below this: no deadline, the round waits for all

std::string bitmap_text(const std::vector<bool>& b) {
  std::string s;
  for (bool x : b) s += x ? '1' : '0';
  return s;
}

std::vector<bool> bitmap_from(const std::string& s, int n) {
  MT_CHECK(static_cast<int>(s.size()) == n, "straggler coding: a decision of {} replicas for {}", s.size(), n);
  std::vector<bool> b(static_cast<size_t>(n));
  for (int w = 0; w < n; ++w) b[static_cast<size_t>(w)] = s[static_cast<size_t>(w)] == '1';
  return b;
}

double median_of(std::deque<double> v) {
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

int task_microbatches(const std::vector<Piece>& pieces) {
  int k = 0;
  for (const Piece& p : pieces) k += static_cast<int>(p.microbatches.size());
  return k;
}

// A piece this rank computed: its gradient and its micro-batches' loss sum, kept until its job is decoded.
struct HeldPiece {
  int round = 0, index = 0, job = 0;
  std::vector<float> grad;
  double loss = 0;
};

// The store keys of one round of one run (a rerun replays and uses none).
struct RoundKeys {
  std::string base;
  std::string done(int w) const { return fmt::format("{}done/{}", base, w); }
  std::string late(int w) const { return fmt::format("{}late/{}", base, w); }
  std::string ndone() const { return base + "ndone"; }
  std::string decider() const { return base + "decider"; }
  std::string decision() const { return base + "decision"; }
};

// Thrown from the model's layer hooks when this rank abandons its round mid-piece; caught by the round.
struct RoundAbandoned {};

// What one round ended with, on this rank.
struct RoundEnd {
  std::vector<bool> bitmap;  // the agreed stragglers
  double finish_s = 0;       // this rank's finish (or, abandoned, its estimated finish) since its round start
};

class CodedForwardBackward final : public ForwardBackward {
 public:
  CodedForwardBackward(const RunConfig& cfg, Topology& topo, ModelStack& stack)
      : cfg_(cfg), topo_(topo), stack_(stack), model_(*stack.model), tpc_(stack.tp_comm.get()),
        host_tp_(topo.shape.tp > 1 ? &topo.host_mesh->tp() : nullptr),
        host_pp_(topo.shape.pp > 1 ? &topo.host_mesh->pp() : nullptr), lead_(topo.coord.tp == 0 && topo.coord.pp == 0),
        group_(host_tp_ || host_pp_), n_(topo.shape.dp), me_(topo.coord.dp), m_(cfg.train.grad_accum),
        micro_(stack.microbatches), B_(cfg.data.batch_size), T_(cfg.data.seq_len),
        timeout_(std::chrono::seconds(cfg.parallel.timeout_s)),
        slow_(topo.rank_info.rank, topo.coord.dp, topo.shape.dp,
              StragglerCode(cfg.parallel.straggler_code(), topo.shape.dp, cfg.train.grad_accum).rounds(),
              cfg.train.steps) {
    MT_CHECK(topo.store, "straggler coding needs the job's rendezvous store (a launched job of parallel.dp >= 2)");
    if (host_pp_) pipe_ = std::make_unique<GptPipeline>(*stack.model, stack.schedule, topo.coord.pp, B_, T_);
    // Between layers (forward: before a layer reads its parameters; backward: once a layer's gradients are done)
    // a straggler looks for the round's decision, and a slow replica pays its injected sleep.
    inner_hooks_ = model_.hooks();
    GptHooks h;
    h.before_params_used = [this](int first, int end) {
      if (inner_hooks_.before_params_used) inner_hooks_.before_params_used(first, end);
      between_layers();
    };
    h.grads_ready = [this](int first) {
      if (inner_hooks_.grads_ready) inner_hooks_.grads_ready(first);
      between_layers();
    };
    model_.set_hooks(h);
  }
  ~CodedForwardBackward() override { model_.set_hooks(inner_hooks_); }
  CodedForwardBackward(const CodedForwardBackward&) = delete;
  CodedForwardBackward& operator=(const CodedForwardBackward&) = delete;
  void set_step(int step) override { step_ = step; }
  CommTime take_tp_time() override { return tpc_ ? tpc_->take_comm_time() : CommTime{}; }
  CommTime take_pp_time() override { return pipe_ ? pipe_->take_comm_time() : CommTime{}; }
  CommTime take_dp_wait() override { return std::exchange(dp_wait_, CommTime{}); }
  std::optional<StragglerStepReport> take_straggler_report() override { return std::exchange(report_, std::nullopt); }

 protected:
  float run_rounds(const BatchSource& batch, Update& update) override;

 private:
  double compute_piece(int round, int index, const Piece& p, const std::vector<const Batch*>& batches);
  RoundEnd agreed_round(const StragglerCode& code, int round, const std::vector<const Batch*>& batches);
  std::vector<bool> await_decision(const RoundKeys& k, const StragglerCode& code, double t0, bool finished);
  void fold_due_jobs(const StragglerCode& code, int round);
  void drop_round(int round);
  void report(const StragglerCode& code, int seq);
  void note_waits(const StragglerCode& code, int round, const std::vector<bool>& bitmap, RoundOutcome o) const;
  bool abandons(const StragglerCode& code, const RoundKeys& k);
  bool replica_abandons(const StragglerCode& code, const RoundKeys& k);
  void between_layers();
  Store& store() { return *topo_.store; }

  const RunConfig& cfg_;
  Topology& topo_;
  ModelStack& stack_;
  GPT& model_;
  ProcessGroupTpComm* tpc_;  // tp > 1: the model's tp comm
  // The replica's other ranks on the host plane (tp > 1, pp > 1), over which they agree on abandoning together.
  ProcessGroup *host_tp_, *host_pp_;
  bool lead_;   // tp and pp rank 0: posts the replica's finish to the store
  bool group_;  // a replica is several ranks (tp or pp): they abandon together, between micro-batches
  int n_, me_, m_, micro_, B_, T_;     // micro_: pipeline micro-batches of B_ rows in one of the code's micro-batches
  std::unique_ptr<GptPipeline> pipe_;  // pp > 1
  Millis timeout_;
  SlowRounds slow_;
  int step_ = 0, seq_ = 0;
  std::deque<double> history_;                   // recent per-micro-batch compute seconds of this rank
  std::vector<HeldPiece> held_;                  // pieces whose jobs are not decoded yet
  std::vector<float> sum_;                       // the kept pieces' gradient sum
  double loss_sum_ = 0;                          // and their loss sum
  std::vector<std::vector<bool>> last_bitmaps_;  // the last run()'s agreed bitmaps, for rerun()
  std::optional<StragglerStepReport> report_;
  std::vector<bool> decided_;  // the current round's decision once seen
  bool have_decision_ = false;
  int abandon_verdict_ = -1;  // -1: not worked out yet for this round's decision
  GptHooks inner_hooks_;      // the Update's (ZeRO-2's), called first
  // While a round runs under the agreement: its code and keys (null otherwise: a replay never abandons), when the
  // store was last looked at, and the injected sleep the next layer boundary owes (and what was slept in all).
  const StragglerCode* live_code_ = nullptr;
  const RoundKeys* live_keys_ = nullptr;
  double last_look_ = 0, owed_sleep_ = 0, slept_ = 0;
  double slow_factor_ = 1;  // this round's slowburst factor
  // Store keys of the last run this rank removes when the next run starts (every rank is past the last run's
  // reads then: the step's reduction came between): a lead its replica's finish keys, the main rank the shared ones.
  std::vector<std::string> spent_keys_;
  CommTime dp_wait_;  // waits for the rounds' decisions and for stragglers outside the model
};

// At a layer boundary of a round under the agreement: pays the injected sleep owed (in slices, looking for the
// decision between them), and at most once a millisecond looks for a decision that lets this rank abandon.
void CodedForwardBackward::between_layers() {
  if (!live_code_) return;
  const double owed = std::exchange(owed_sleep_, 0.0);
  const double until = now_seconds() + owed;
  for (double t = now_seconds(); t < until; t = now_seconds()) {
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(until - t, 0.005)));
    slept_ += now_seconds() - t;
    if (!abandons(*live_code_, *live_keys_)) continue;
    if (group_) return;  // the replica's ranks abandon together, at the next micro-batch boundary
    throw RoundAbandoned{};
  }
  if (group_ || now_seconds() - last_look_ < 1e-3) return;
  last_look_ = now_seconds();
  if (abandons(*live_code_, *live_keys_)) throw RoundAbandoned{};
}

double CodedForwardBackward::compute_piece(int round, int index, const Piece& p,
                                           const std::vector<const Batch*>& batches) {
  obs::ScopedSpan span("compute", [&] {
    return obs::SpanInfo{fmt::format("piece r{} j{}", round, p.job), {{"round", round}, {"job", p.job}}};
  });
  const double t0 = now_seconds();
  ParamStore& params = model_.params();
  params.begin_grads();
  HeldPiece h{round, index, p.job, {}, 0};
  const size_t rows = static_cast<size_t>(B_) * static_cast<size_t>(micro_) * static_cast<size_t>(T_);
  for (int id : p.microbatches) {
    const Batch& b = *batches.at(static_cast<size_t>(id / n_));
    const size_t off = static_cast<size_t>(id % n_) * rows;
    // Several ranks to a replica (tp, pp): they agree between micro-batches whether to abandon (a collective each).
    if (live_code_ && group_ && id != p.microbatches.front() && replica_abandons(*live_code_, *live_keys_))
      throw RoundAbandoned{};
    // A slow replica's micro-batch takes F x its usual compute time (the history's median): the extra is slept at
    // the first layer boundary of its forward.
    if (live_code_ && slow_factor_ > 1 && !history_.empty() && abandon_verdict_ != 1)
      owed_sleep_ = (slow_factor_ - 1) * median_of(history_);
    // Replicated tensors' gradients are summed over tp in each piece's last backward, so every piece is whole.
    const bool last = id == p.microbatches.back();
    if (pipe_) {  // the loss exists on the last stage only (summed over the replica's stages at the step's end)
      h.loss += pipe_->run(topo_.device_mesh->pp(), b.x.data() + off, b.y.data() + off,
                           1.0f / static_cast<float>(m_ * micro_), last);
      continue;
    }
    if (tpc_) model_.set_tp_grad_sync(last);
    h.loss += model_.forward(b.x.data() + off, b.y.data() + off, B_, T_, true, 1.0f / static_cast<float>(m_));
    model_.backward();
  }
  params.settle_grads(0, static_cast<int>(params.size()));
  h.grad.assign(params.grads_data(), params.grads_data() + params.total_floats());
  held_.push_back(std::move(h));
  return now_seconds() - t0;
}

// Whether this rank may abandon the round (asked at piece, micro-batch and layer boundaries, and during its injected
// sleep): the decision is in, marks its replica, and the core accepts the round without it.
bool CodedForwardBackward::abandons(const StragglerCode& code, const RoundKeys& k) {
  if (!have_decision_ && store().check(k.decision())) {
    decided_ = bitmap_from(store().get(k.decision(), timeout_), n_);
    have_decision_ = true;
  }
  if (!have_decision_ || !decided_[static_cast<size_t>(me_)]) return false;
  if (abandon_verdict_ < 0) {
    StragglerCode probe = code;
    abandon_verdict_ = probe.record(decided_) == RoundOutcome::Accepted;
  }
  return abandon_verdict_ == 1;
}

// At a piece or (under tp, pp) micro-batch boundary: whether the replica abandons the round. Under tp and pp its
// ranks agree first (any of them that saw the decision), so they leave the round's collectives at the same point.
bool CodedForwardBackward::replica_abandons(const StragglerCode& code, const RoundKeys& k) {
  float flag = abandons(code, k) ? 1.0f : 0.0f;
  // The maximum over tp, then over pp: over every rank of the replica.
  if (host_tp_) host_tp_->allreduce(f32_view(&flag, {1}), ReduceOp::Max)->wait();
  if (host_pp_) host_pp_->allreduce(f32_view(&flag, {1}), ReduceOp::Max)->wait();
  return flag > 0;
}

// The decision of the round, made here when this rank (a replica's lead) is the first finished one to see every
// replica done or to pass its deadline.
std::vector<bool> CodedForwardBackward::await_decision(const RoundKeys& k, const StragglerCode& code, double t0,
                                                       bool finished) {
  double deadline = -1;
  if (history_.size() >= kMinRoundHistory) {
    int longest = 0;
    for (const std::vector<Piece>& t : code.tasks()) longest = std::max(longest, task_microbatches(t));
    deadline = cfg_.parallel.straggler_deadline * median_of(history_) * std::max(longest, 1);
  }
  while (!have_decision_) {
    if (store().check(k.decision())) {
      decided_ = bitmap_from(store().get(k.decision(), timeout_), n_);
      have_decision_ = true;
      break;
    }
    const bool all = store().add(k.ndone(), 0) >= n_;
    const bool late = deadline >= 0 && now_seconds() - t0 >= deadline;
    if (finished && lead_ && (all || late) && store().add(k.decider(), 1) == 1) {
      std::vector<bool> b(static_cast<size_t>(n_));
      for (int w = 0; w < n_; ++w) b[static_cast<size_t>(w)] = !store().check(k.done(w));
      store().set(k.decision(), bitmap_text(b));
      decided_ = b;
      have_decision_ = true;
      break;
    }
    std::this_thread::sleep_for(kStragglerPoll);
  }
  return decided_;
}

// One round under the store's agreement (the header's step 2); returns the agreed bitmap. Pieces this rank
// computed that the round ends without are dropped.
RoundEnd CodedForwardBackward::agreed_round(const StragglerCode& code, int round,
                                            const std::vector<const Batch*>& batches) {
  const RoundKeys k{fmt::format("straggler/{}/{}/{}/", step_, seq_, round)};
  const std::vector<Piece> mine = code.tasks()[static_cast<size_t>(me_)];
  have_decision_ = false;
  abandon_verdict_ = -1;
  const double t0 = now_seconds();
  slow_factor_ = slow_.factor(step_, round, !history_.empty());
  slept_ = 0, last_look_ = 0;
  double compute = 0;
  size_t done = 0;
  bool abandoned = false;
  {
    live_code_ = &code, live_keys_ = &k;
    struct Unlive {
      CodedForwardBackward& fb;
      ~Unlive() { fb.live_code_ = nullptr, fb.live_keys_ = nullptr, fb.owed_sleep_ = 0; }
    } unlive{*this};
    try {
      for (; done < mine.size() && !(abandoned = replica_abandons(code, k)); ++done)
        compute += compute_piece(round, static_cast<int>(done), mine[done], batches);
    } catch (const RoundAbandoned&) {
      abandoned = true;  // inside piece `done`, between two layers
    }
  }
  const int mbs = task_microbatches(mine);
  const double per_mb = history_.empty() ? 0 : median_of(history_);
  if (!abandoned && mbs > 0) {
    history_.push_back(std::max(compute - slept_, 0.0) / mbs);  // the injected sleep is not compute
    if (history_.size() > kRoundHistory) history_.pop_front();
  }
  RoundEnd end;
  if (abandoned) {  // estimated finish: what was left of the pieces, at this replica's pace this round
    int left = 0;
    for (size_t i = done; i < mine.size(); ++i) left += static_cast<int>(mine[i].microbatches.size());
    end.finish_s = now_seconds() - t0 + left * per_mb * slow_factor_;
    if (lead_) store().set(k.late(me_), fmt::format("{}", end.finish_s));
  } else {
    end.finish_s = now_seconds() - t0;
    if (lead_) {
      store().set(k.done(me_), fmt::format("{}", end.finish_s));
      store().add(k.ndone(), 1);
    }
  }
  if (lead_) spent_keys_.push_back(abandoned ? k.late(me_) : k.done(me_));
  if (topo_.main_rank) spent_keys_.insert(spent_keys_.end(), {k.ndone(), k.decider(), k.decision()});
  const double w0 = now_seconds();
  end.bitmap = await_decision(k, code, t0, !abandoned);
  StragglerCode probe = code;
  if (probe.record(end.bitmap) != RoundOutcome::Accepted) {  // the round waits for the stragglers
    std::vector<std::string> keys;
    for (int w = 0; w < n_; ++w)
      if (end.bitmap[static_cast<size_t>(w)]) keys.push_back(k.done(w));
    obs::ScopedSpan span("wait", "stragglers outside the model");
    store().wait(keys, timeout_);
  } else if (end.bitmap[static_cast<size_t>(me_)]) {
    drop_round(round);
  }
  dp_wait_.exposed_seconds += now_seconds() - w0;
  return end;
}

void CodedForwardBackward::drop_round(int round) {
  std::erase_if(held_, [round](const HeldPiece& h) { return h.round == round; });
}

// Adds this rank's kept pieces of every job whose deadline is this round into the step's sum, then frees them.
void CodedForwardBackward::fold_due_jobs(const StragglerCode& code, int round) {
  const int job = round - code.delay();
  if (job < 0 || job >= code.jobs()) return;
  for (const KeptPiece& kp : code.job_decoding(job)) {
    if (kp.worker != me_) continue;
    auto it = std::find_if(held_.begin(), held_.end(),
                           [&](const HeldPiece& h) { return h.round == kp.round && h.index == kp.index; });
    MT_CHECK(it != held_.end(), "straggler coding: the kept piece {} of round {} (job {}) is not held on replica {}",
             kp.index, kp.round, job, me_);
    for (size_t i = 0; i < sum_.size(); ++i) sum_[i] += it->grad[i];
    loss_sum_ += it->loss;
  }
  std::erase_if(held_, [job](const HeldPiece& h) { return h.job == job; });
}

void CodedForwardBackward::note_waits(const StragglerCode& code, int round, const std::vector<bool>& bitmap,
                                      RoundOutcome o) const {
  if (o == RoundOutcome::Accepted || !topo_.main_rank) return;
  std::vector<int> late;
  for (int w = 0; w < n_; ++w)
    if (bitmap[static_cast<size_t>(w)]) late.push_back(w);
  fmt::print("straggler coding: step {} round {} waited for replicas {}: {} (parallel.straggler_coding = \"{}\")\n",
             step_, round, fmt::join(late, ", "),
             o == RoundOutcome::WaitedOutsideModel ? "the pattern is outside the scheme's model"
                                                   : "a job due this round was not decodable without them",
             kind_name(code.config().scheme));
  std::fflush(stdout);
}

float CodedForwardBackward::run_rounds(const BatchSource& batch, Update& /*update*/) {
  std::vector<const Batch*> batches;
  for (int r = 0; r < m_; ++r) batches.push_back(&batch(r));
  StragglerCode code(cfg_.parallel.straggler_code(), n_, m_);
  ParamStore& params = model_.params();
  sum_.assign(params.total_floats(), 0.0f);
  loss_sum_ = 0;
  held_.clear();
  const bool replay = rerunning();
  if (!replay) {
    last_bitmaps_.clear(), ++seq_;
    for (const std::string& key : std::exchange(spent_keys_, {})) store().remove(key);
  }
  for (int r = 0; r < code.rounds(); ++r) {
    RoundEnd end;
    if (replay) {  // every piece, the agreed bitmap of the first run
      const std::vector<Piece> mine = code.tasks()[static_cast<size_t>(me_)];
      for (size_t i = 0; i < mine.size(); ++i) compute_piece(r, static_cast<int>(i), mine[i], batches);
      end.bitmap = last_bitmaps_.at(static_cast<size_t>(r));
      StragglerCode probe = code;
      if (probe.record(end.bitmap) == RoundOutcome::Accepted && end.bitmap[static_cast<size_t>(me_)]) drop_round(r);
    } else {
      end = agreed_round(code, r, batches);
      last_bitmaps_.push_back(end.bitmap);
    }
    const RoundOutcome o = code.record(end.bitmap);
    if (!replay) note_waits(code, r, end.bitmap, o);
    fold_due_jobs(code, r);
  }
  MT_CHECK(held_.empty(), "straggler coding: {} pieces of replica {} outlived their jobs", held_.size(), me_);
  params.zero_grads();
  std::memcpy(params.grads_data(), sum_.data(), sum_.size() * sizeof(float));
  if (!replay) report(code, seq_);
  float loss = static_cast<float>(loss_sum_ / (m_ * micro_));
  if (stack_.embedding_group) {  // pp with tied embeddings: both stages' wte copies take the sum (as uncoded)
    obs::ScopedSpan span("wait", "tied-embedding sum");
    stack_.embedding_group->allreduce(params.grad("wte.weight"))->wait();
  }
  if (host_pp_) host_pp_->allreduce(f32_view(&loss, {1}))->wait();  // the loss exists on the last stage only
  return loss;
}

// The step's metrics; the main rank estimates the seconds saved from every replica's posted finish times.
void CodedForwardBackward::report(const StragglerCode& code, int seq) {
  const StragglerMetrics m = code.metrics();
  StragglerStepReport r;
  r.rounds = code.rounds();
  r.rounds_waited = m.rounds_waited;
  r.microbatches_computed = m.microbatches_computed;
  r.microbatches_recomputed = m.microbatches_recomputed;
  r.redundancy = m.redundancy;
  const StragglerPattern& p = code.pattern();
  for (size_t round = 0; round < p.size(); ++round) {
    bool any = false;
    for (int w = 0; w < n_; ++w) {
      if (!p[round][static_cast<size_t>(w)]) continue;
      r.stragglers.emplace_back(static_cast<int>(round), w);
      any = true;
    }
    if (!any || !topo_.main_rank) continue;
    const RoundKeys k{fmt::format("straggler/{}/{}/{}/", step_, seq, round)};
    std::vector<double> finish(static_cast<size_t>(n_));
    for (int w = 0; w < n_; ++w) {
      const auto until = now_seconds() + static_cast<double>(timeout_.count()) / 1000;
      std::string key;
      while (key.empty() && now_seconds() < until) {
        if (store().check(k.done(w)))
          key = k.done(w);
        else if (store().check(k.late(w)))
          key = k.late(w);
        else
          std::this_thread::sleep_for(kStragglerPoll);
      }
      MT_CHECK(!key.empty(), "straggler coding: replica {} posted no finish time for round {} of step {}", w, round,
               step_);
      finish[static_cast<size_t>(w)] = std::stod(store().get(key, timeout_));
    }
    r.seconds_saved += round_time_saved(finish, p[round], RoundOutcome::Accepted);
  }
  report_ = std::move(r);
}

}  // namespace

std::unique_ptr<ForwardBackward> make_coded_forward_backward(const RunConfig& cfg, Topology& topo, ModelStack& stack) {
  return std::make_unique<CodedForwardBackward>(cfg, topo, stack);
}

}  // namespace mt
