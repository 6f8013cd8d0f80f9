#include "megatrain/parallel/straggler_code.h"

#include <algorithm>
#include <numeric>

#include "megatrain/core/error.h"

namespace mt {

const std::array<const char*, 4>& kind_names(StragglerScheme) {
  static const std::array<const char*, 4> names{"none", "gc", "sr-sgc", "m-sgc"};
  return names;
}

Fraction Fraction::of(int64_t num, int64_t den) {
  MT_CHECK(den > 0, "fraction with denominator {}", den);
  const int64_t g = std::gcd(num, den);
  return g == 0 ? Fraction{0, 1} : Fraction{num / g, den / g};
}

namespace {

int sr_sgc_s(const BurstyModel& b) {  // ceil(B lambda / (W - 1 + B))
  const int den = b.W - 1 + b.B;
  return (b.B * b.lambda + den - 1) / den;
}

// m-sgc: micro-batches of one D1 chunk (and of one worker's piece of a D2 group).
int msgc_chunk(const BurstyModel& b, int n) { return b.lambda < n ? b.lambda + 1 : 1; }

void require_divides(int k, int n, const char* what) {
  if (n % k != 0) {
    fail_as(ErrorKind::Config,
            "parallel.straggler_coding: fractional repetition needs {} + 1 = {} to divide the {} data-parallel "
            "replicas (cyclic repetition, which would not, is not built)",
            what, k, n);
  }
}

}  // namespace

Fraction paper_load(const StragglerCodeConfig& c, int n) {
  const BurstyModel& b = c.bursty;
  switch (c.scheme) {
    case StragglerScheme::None: return Fraction::of(1, n);
    case StragglerScheme::Gc: return Fraction::of(c.s + 1, n);
    case StragglerScheme::SrSgc: return Fraction::of(sr_sgc_s(b) + 1, n);
    case StragglerScheme::MSgc:
      if (b.lambda == n) return Fraction::of(b.W - 1 + b.B, int64_t{n} * (b.W - 1));
      return Fraction::of(int64_t{b.lambda + 1} * (b.W - 1 + b.B),
                          int64_t{n} * (b.B + int64_t{b.W - 1} * (b.lambda + 1)));
  }
  return Fraction::of(1, n);
}

StragglerCode::StragglerCode(const StragglerCodeConfig& c, int n, int m) : c_(c), n_(n), m_(m) {
  if (n < 1) fail_as(ErrorKind::Config, "straggler coding: the data-parallel replicas must be >= 1 (got {})", n);
  if (m < 1) fail_as(ErrorKind::Config, "straggler coding: train.grad_accum must be >= 1 (got {})", m);
  const BurstyModel& b = c.bursty;
  jobs_ = m;
  job_size_ = n;
  switch (c.scheme) {
    case StragglerScheme::None: s_ = 0; break;
    case StragglerScheme::Gc:
      if (c.s < 0 || c.s >= n) {
        fail_as(ErrorKind::Config, "parallel.straggler_s must be in 0..{} (one less than the replicas; got {})", n - 1,
                c.s);
      }
      s_ = c.s;
      require_divides(s_ + 1, n, "parallel.straggler_s");
      break;
    case StragglerScheme::SrSgc:
      validate_bursty_model(b, n);
      if ((b.W - 1) % b.B != 0) {
        fail_as(ErrorKind::Config,
                "parallel.straggler_coding = 'sr-sgc' needs parallel.straggler_burst = {} to divide "
                "parallel.straggler_window - 1 = {}",
                b.B, b.W - 1);
      }
      s_ = sr_sgc_s(b);
      if (s_ >= n) {
        fail_as(ErrorKind::Config, "sr-sgc: s = ceil(B lambda / (W - 1 + B)) = {} must be below the {} replicas", s_,
                n);
      }
      require_divides(s_ + 1, n, "sr-sgc's s = ceil(B lambda / (W - 1 + B))");
      if (b.B > m - 1) {  // the delay stays below the step's rounds (m-sgc's always does: T < (W-1)(lambda+1)+B <= m)
        fail_as(
            ErrorKind::Config,
            "parallel.straggler_coding = 'sr-sgc' delays a job by parallel.straggler_burst = {} rounds, which must be "
            "at most train.grad_accum - 1 = {}",
            b.B, m - 1);
      }
      delay_ = b.B;
      break;
    case StragglerScheme::MSgc: {
      validate_bursty_model(b, n);
      if (b.lambda < n) require_divides(b.lambda + 1, n, "parallel.straggler_lambda");
      s_ = b.lambda;
      const int chunk = msgc_chunk(b, n);
      const int per_worker = (b.W - 1) * chunk + (b.lambda < n ? b.B : 0);  // job size / n
      job_size_ = n * per_worker;
      if (m % per_worker != 0) {
        fail_as(ErrorKind::Config,
                "parallel.straggler_coding = 'm-sgc' codes jobs of {} micro-batches ({} per replica); the step's "
                "train.grad_accum = {} must be a multiple of {}",
                job_size_, per_worker, m, per_worker);
      }
      jobs_ = m / per_worker;
      delay_ = b.W - 2 + b.B;
      blocks_ = n * (b.W - 1) + (b.lambda < n ? b.B * (n / chunk) : 0);
      d1_done_.assign(jobs_, std::vector<int>(n, 0));
      break;
    }
  }
  if (c.scheme != StragglerScheme::MSgc) blocks_ = n / (s_ + 1);
  block_arrivals_.assign(jobs_, std::vector<int>(blocks_, 0));
  delivered_.assign(jobs_, std::vector<bool>(n, false));
  metrics_.peak_load = Fraction::of(0, 1);
  plan_round();
}

bool StragglerCode::inside_model(const StragglerPattern& p) const {
  if (c_.scheme == StragglerScheme::SrSgc || c_.scheme == StragglerScheme::MSgc) {
    return inside_bursty_model(p, c_.bursty);
  }
  return inside_per_round_model(p, s_);
}

void StragglerCode::plan_round() {
  tasks_.assign(n_, {});
  if (round_ >= rounds()) return;
  if (c_.scheme == StragglerScheme::MSgc) {
    plan_msgc_round();
  } else {
    plan_gc_round();
  }
}

// gc, none, sr-sgc: worker w's piece of job j is its fractional-repetition block w / (s+1) of round j's n
// micro-batches; sr-sgc adds the reattempts of job round-B.
void StragglerCode::plan_gc_round() {
  const auto piece = [&](int job, int w, bool repeat) {
    Piece p{job, w / (s_ + 1), {}, repeat};
    for (int i = 0; i <= s_; ++i) p.microbatches.push_back(job * n_ + p.block * (s_ + 1) + i);
    return p;
  };
  if (round_ < jobs_) {
    for (int w = 0; w < n_; ++w) tasks_[w].push_back(piece(round_, w, false));
  }
  const int u = round_ - delay_;
  if (c_.scheme != StragglerScheme::SrSgc || u < 0 || u >= jobs_) return;
  std::vector<int> missing;  // workers whose job-u piece did not arrive in round u
  for (int w = 0; w < n_; ++w) {
    if (!delivered_[u][w]) missing.push_back(w);
  }
  const int v = static_cast<int>(missing.size());
  for (int i = 0; i < v - s_; ++i) tasks_[missing[i]] = {piece(u, missing[i], true)};
}

// m-sgc: slot i of round r serves job r - i; the next undelivered D1 chunk, else (slots W-1+g) D2 group g.
void StragglerCode::plan_msgc_round() {
  const BurstyModel& b = c_.bursty;
  const int chunk = msgc_chunk(b, n_);
  const int d1_blocks = n_ * (b.W - 1);
  for (int w = 0; w < n_; ++w) {
    for (int i = 0; i <= delay_; ++i) {
      const int j = round_ - i;
      if (j < 0 || j >= jobs_) continue;
      const int base = j * job_size_, done = d1_done_[j][w];
      Piece p{j, -1, {}, false};
      if (done < b.W - 1) {
        p.block = w * (b.W - 1) + done;
        for (int k = 0; k < chunk; ++k) p.microbatches.push_back(base + p.block * chunk + k);
        p.repeat = i > 0 && pattern_[round_ - 1][w];  // the chunk this worker lost in its previous slot
      } else if (i >= b.W - 1 && b.lambda < n_) {
        const int g = i - (b.W - 1), fr_blocks = n_ / chunk;
        p.block = d1_blocks + g * fr_blocks + w / chunk;
        const int first = base + d1_blocks * chunk + g * n_ + (w / chunk) * chunk;
        for (int k = 0; k < chunk; ++k) p.microbatches.push_back(first + k);
      } else {
        continue;  // lambda = n: a slot kept for repeats, none owed
      }
      tasks_[w].push_back(std::move(p));
    }
  }
}

std::vector<int> StragglerCode::due_jobs(int round) const {
  const int j = round - delay_;
  if (j >= 0 && j < jobs_) return {j};
  return {};
}

bool StragglerCode::decodable(int job, const std::vector<bool>& stragglers) const {
  std::vector<int> have = block_arrivals_[job];
  for (int w = 0; w < n_; ++w) {
    if (stragglers[w]) continue;
    for (const Piece& p : tasks_[w]) {
      if (p.job == job) ++have[p.block];
    }
  }
  return std::all_of(have.begin(), have.end(), [](int k) { return k > 0; });
}

RoundOutcome StragglerCode::record(const std::vector<bool>& stragglers) {
  if (round_ >= rounds()) fail("straggler coding: record() after the step's last round {}", rounds() - 1);
  if (static_cast<int>(stragglers.size()) != n_) {
    fail("straggler coding: the straggler bitmap has {} entries for {} replicas", stragglers.size(), n_);
  }
  StragglerPattern p = pattern_;
  p.push_back(stragglers);
  RoundOutcome o = RoundOutcome::Accepted;
  if (!inside_model(p)) {
    o = RoundOutcome::WaitedOutsideModel;
  } else {
    for (int j : due_jobs(round_)) {
      if (!decodable(j, stragglers)) o = RoundOutcome::WaitedUndecodable;
    }
  }
  const std::vector<bool> none(n_, false);
  const std::vector<bool>& effective = o == RoundOutcome::Accepted ? stragglers : none;
  for (int j : due_jobs(round_)) {
    MT_CHECK(decodable(j, effective), "straggler coding: job {} cannot be decoded at its deadline, round {}", j,
             round_);
  }
  apply(effective);
  if (o != RoundOutcome::Accepted) ++metrics_.rounds_waited;
  ++round_;
  plan_round();
  return o;
}

void StragglerCode::apply(const std::vector<bool>& stragglers) {
  const int d1_blocks = c_.scheme == StragglerScheme::MSgc ? n_ * (c_.bursty.W - 1) : 0;
  for (int w = 0; w < n_; ++w) {
    int64_t assigned = 0;
    for (const Piece& p : tasks_[w]) {
      const auto size = static_cast<int64_t>(p.microbatches.size());
      assigned += size;
      if (p.repeat) metrics_.microbatches_recomputed += size;
      if (stragglers[w]) continue;
      ++block_arrivals_[p.job][p.block];
      delivered_[p.job][w] = true;
      if (p.block < d1_blocks) ++d1_done_[p.job][w];
    }
    metrics_.microbatches_computed += assigned;
    if (stragglers[w]) ++metrics_.stragglers;
    const Fraction load = Fraction::of(assigned, job_size_);
    if (!(load <= metrics_.peak_load)) metrics_.peak_load = load;
  }
  metrics_.redundancy = static_cast<double>(metrics_.microbatches_computed) / (static_cast<double>(n_) * m_);
  pattern_.push_back(stragglers);
  history_.push_back(tasks_);
}

std::vector<KeptPiece> StragglerCode::job_decoding(int job) const {
  MT_CHECK(job >= 0 && job < jobs_, "straggler coding: job {} of {}", job, jobs_);
  MT_CHECK(round_ > job + delay_, "straggler coding: job {} is due at the end of round {}; round {} is running", job,
           job + delay_, round_);
  std::vector<KeptPiece> kept;
  std::vector<bool> taken(blocks_, false);
  for (int r = job; r <= job + delay_; ++r) {
    for (int w = 0; w < n_; ++w) {
      if (pattern_[r][w]) continue;
      for (size_t i = 0; i < history_[r][w].size(); ++i) {
        const Piece& p = history_[r][w][i];
        if (p.job != job || taken[p.block]) continue;
        taken[p.block] = true;
        kept.push_back({r, w, static_cast<int>(i)});
      }
    }
  }
  for (int k = 0; k < blocks_; ++k) MT_CHECK(taken[k], "straggler coding: job {} block {} never arrived", job, k);
  return kept;
}

Decoding StragglerCode::decode() const {
  if (round_ < rounds()) {
    fail("straggler coding: decode() before the step's last round ({} of {} run)", round_, rounds());
  }
  Decoding d;
  d.coefficient.resize(history_.size());
  for (size_t r = 0; r < history_.size(); ++r) {
    d.coefficient[r].resize(n_);
    for (int w = 0; w < n_; ++w) d.coefficient[r][w].assign(history_[r][w].size(), 0);
  }
  for (int j = 0; j < jobs_; ++j) {
    for (const KeptPiece& k : job_decoding(j)) d.coefficient[k.round][k.worker][k.index] = 1;
  }
  return d;
}

StragglerMetrics StragglerCode::metrics() const { return metrics_; }

std::vector<bool> late_workers(const std::vector<double>& finish_s, double slack) {
  if (finish_s.empty()) return {};
  if (!(slack >= 0)) fail_as(ErrorKind::Config, "straggler deadline: the slack must be >= 0 (got {})", slack);
  const double fastest = *std::min_element(finish_s.begin(), finish_s.end());
  std::vector<bool> late(finish_s.size());
  for (size_t w = 0; w < finish_s.size(); ++w) late[w] = finish_s[w] > fastest * (1 + slack);
  return late;
}

double round_time_saved(const std::vector<double>& finish_s, const std::vector<bool>& stragglers, RoundOutcome o) {
  MT_CHECK(finish_s.size() == stragglers.size(), "round_time_saved: {} times for {} workers", finish_s.size(),
           stragglers.size());
  if (o != RoundOutcome::Accepted || finish_s.empty()) return 0;
  double all = 0, kept = 0;
  for (size_t w = 0; w < finish_s.size(); ++w) {
    all = std::max(all, finish_s[w]);
    if (!stragglers[w]) kept = std::max(kept, finish_s[w]);
  }
  return all - kept;
}

}  // namespace mt
