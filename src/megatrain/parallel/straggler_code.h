// Straggler-tolerant data parallelism by gradient coding: which micro-batches each data-parallel replica computes
// in each round of a step, which results the step may go on without, and the coefficients that decode the exact
// full-batch gradient from the results that arrived. Pure: no processes, no communication; the training loop's
// integration (abandoning a task, agreeing the straggler bitmap, the sum and reduction) is
// train/coded_forward_backward.h.
//
// Papers. GC: Tandon, Lei, Dimakis, Karampatziakis, "Gradient Coding", ICML 2017 (its fractional repetition
// scheme). SR-SGC and M-SGC: Krishnan, Ebrahimi, Khisti, "Sequential Gradient Coding For Straggler Mitigation",
// ICLR 2023, arXiv 2211.13802: the setting, the (B, W, lambda)-bursty model and the computational load (its Section
// 2), selective-reattempt SGC (Section 3.1), multiplexed SGC (Section 3.2). The section numbers are recalled, not
// checked: only the paper's abstract was readable where this was written, so the rules below were checked against a
// public simulator of both schemes (its reattempt rule, slot multiplexing, decodability and load formulas) and, here,
// exhaustively against every pattern of the model on small sizes (tests/parallel_straggler_code_test.cpp).
//
// Adaptation to one model. The paper computes a sequence of jobs (gradients), job t starting in round t and due by
// the end of round t + T. Here the rounds are the micro-batch rounds inside one optimizer step, and the jobs are
// slices of the step's global batch, so every step ends with the exact gradient of the same global batch as the
// uncoded run (n replicas x m = train.grad_accum micro-batches, ids 0..n*m-1; id r*n + w is the micro-batch replica
// w computes in round r of the uncoded run). A task is one micro-batch's gradient; a piece is what a worker returns
// for one job in one round: the plain sum of its micro-batches' gradients (every encoding coefficient is 1).
//   - none: uncoded; job r = round r's n micro-batches, one per worker; no straggler is tolerated.
//   - gc (T = 0): job r = round r's n micro-batches. Fractional repetition: workers and micro-batches form n/(s+1)
//     blocks of s+1; every worker of block b computes the s+1 micro-batches of block b (its own and its block
//     peers'). Any s stragglers leave every block a worker. Needs (s+1) | n; load (s+1)/n.
//   - sr-sgc (T = B): the gc code with s = ceil(B lambda / (W - 1 + B)), jobs as for gc. In round t every worker
//     computes its job-t piece, except: if v > s workers did not deliver job t-B in round t-B, the v - s of them
//     with the lowest ids reattempt their own job-(t-B) piece instead (a worker recomputes only its own work). Job u
//     is decoded at the end of round u + B from rounds u and u + B. The step has m + B rounds; the last B carry only
//     reattempts (none when nothing is owed). Needs (s+1) | n and B | (W - 1), as the authors' construction does,
//     and B <= m - 1.
//   - m-sgc (T = W - 2 + B): a job is n((W-1)(lambda+1) + B) micro-batches: a D1 part of W-1 chunks of lambda+1
//     micro-batches per worker, sent uncoded, and a D2 part of B groups of n micro-batches, each coded by
//     fractional repetition with tolerance lambda. In round r a worker has one slot per job in flight (job r - i
//     in slot i = 0..T); in every slot it computes its next undelivered D1 chunk of that job (so a chunk lost to a
//     straggle is repeated by the same worker in its next slot), except that in slot W-1+g, once all its D1 chunks
//     arrived, it computes its piece of D2 group g. Job j is decoded at the end of round j + T from its D1 chunks
//     and n - lambda pieces of each D2 group. The step has J + T rounds, J = n m / job size (a whole number: else
//     a Config error names the grad_accum that fits). With lambda = n there is no D2 part (chunks of one
//     micro-batch, the extra B slots only repeat). Needs (lambda+1) | n.
// Fractional repetition keeps every decoding coefficient 0 or 1; cyclic repetition (Tandon's code for any n) is not
// built, so a layout it would need is a Config error naming the divisibility.
//
// The protocol, per step, on every rank alike:
//   1. entering round r, tasks(r) is the work of every worker (adaptive for the SGC schemes: it depends on the
//      stragglers of earlier rounds);
//   2. at the round's deadline the ranks agree on one straggler bitmap over the host plane (comm/agreement.h): a
//      result "arrives" when its rank reported the round's pieces finished in time; the gradients themselves stay
//      on their rank until the step's all-reduce. A straggler then abandons its task: it stops the round's
//      backward at the next layer boundary (the loop checks between layers), drops that round's partial pieces
//      (never summed) and starts its next round's tasks; its pieces of earlier rounds stay valid. So a straggler
//      falls behind by at most the round it abandoned, and still joins the step's one all-reduce;
//   3. record(bitmap) applies the model check: stragglers inside the scheme's model (and leaving every job due this
//      round decodable) are accepted, and the round ends without them; otherwise the round waits for them as an
//      uncoded step would (RoundOutcome says which), so a pattern the scheme does not tolerate costs time, never a
//      wrong gradient;
//   4. after the last round, decode() gives a coefficient (0 or 1) for every piece; each rank adds its own pieces
//      of coefficient 1 into its gradient buffer (skipping the others, never multiplying by 0: an abandoned piece
//      may hold NaN), and one all-reduce sums the buffers: the result is the sum over every micro-batch of the
//      global batch, each counted exactly once (divide by n m for the mean, as the uncoded step does).
// Every rank runs this same pure decoder on the same agreed bitmaps, so no coefficient travels. A job's
// coefficients are final at its deadline, the end of round job + T (job_decoding), so a rank may fold a job's
// pieces into its buffer then and free them. A replica computes micro-batches the uncoded run gave its peers: the
// data loader's integration must let every replica read any micro-batch of the step's global batch.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "megatrain/parallel/straggler_model.h"

namespace mt {

enum class StragglerScheme { None, Gc, SrSgc, MSgc };
const std::array<const char*, 4>& kind_names(StragglerScheme);  // "none", "gc", "sr-sgc", "m-sgc"

struct StragglerCodeConfig {
  StragglerScheme scheme = StragglerScheme::None;
  int s = 0;           // gc: stragglers tolerated per round
  BurstyModel bursty;  // sr-sgc, m-sgc
};

// A fraction in lowest terms (loads are rationals; compared exactly).
struct Fraction {
  int64_t num = 0, den = 1;
  static Fraction of(int64_t num, int64_t den);
  bool operator==(const Fraction&) const = default;
  bool operator<=(const Fraction& o) const { return num * o.den <= o.num * den; }
  double value() const { return static_cast<double>(num) / static_cast<double>(den); }
};

// The paper's normalised computational load: the largest fraction of one job's data a worker is given in one round
// (uncoded: 1/n). gc (s+1)/n; sr-sgc (s+1)/n with s = ceil(B lambda / (W-1+B)); m-sgc
// (lambda+1)(W-1+B) / (n (B + (W-1)(lambda+1))), or (W-1+B) / (n (W-1)) when lambda = n.
Fraction paper_load(const StragglerCodeConfig& c, int workers);

struct Piece {
  int job = -1;
  int block = -1;                 // the job's block this piece sums (pieces of one block are interchangeable)
  std::vector<int> microbatches;  // ids in the global batch; the piece is the plain sum of their gradients
  bool repeat = false;            // work owed from an earlier round (sr-sgc reattempt, m-sgc repeated D1 chunk)
};

enum class RoundOutcome {
  Accepted,            // the round ended without its stragglers
  WaitedOutsideModel,  // the stragglers are outside the scheme's model: the round waited for them
  WaitedUndecodable,   // inside the model, yet a job due this round could not be decoded: waited (a bug if seen)
};

struct StragglerMetrics {
  int stragglers = 0;                   // (worker, round) straggles the step went on without
  int rounds_waited = 0;                // rounds that waited for stragglers outside the model
  int64_t microbatches_computed = 0;    // every assigned micro-batch, abandoned ones included
  int64_t microbatches_recomputed = 0;  // those of repeat pieces
  double redundancy = 1;                // microbatches_computed / (n m): the work paid against the uncoded step
  Fraction peak_load;                   // the largest per (worker, round) share of a job actually assigned
};

// A piece that counts in the decoded sum: piece `index` of `worker`'s list in `round`.
struct KeptPiece {
  int round = 0, worker = 0, index = 0;
  bool operator==(const KeptPiece&) const = default;
};

// The decoding: coefficient[r][w][i] for piece i of worker w in round r (0 for pieces that did not arrive).
struct Decoding {
  std::vector<std::vector<std::vector<int>>> coefficient;
};

class StragglerCode {
 public:
  // n data-parallel replicas, m = train.grad_accum. Config errors name the setting and the bound it breaks.
  StragglerCode(const StragglerCodeConfig& c, int n, int m);

  const StragglerCodeConfig& config() const { return c_; }
  int workers() const { return n_; }
  int jobs() const { return jobs_; }
  int delay() const { return delay_; }           // T, rounds
  int rounds() const { return jobs_ + delay_; }  // of one step
  int job_microbatches() const { return job_size_; }
  int global_microbatches() const { return n_ * m_; }  // n m: the uncoded step's global batch
  int s() const { return s_; }                         // the per-round code's tolerance (gc, sr-sgc; m-sgc lambda)
  int round() const { return round_; }                 // the round being run; rounds() once the step is over

  // The current round's work: [worker] -> pieces. Empty lists are idle workers (drain rounds).
  const std::vector<std::vector<Piece>>& tasks() const { return tasks_; }
  // Ends the current round with the agreed straggler bitmap ([worker]); returns what the step did with it.
  RoundOutcome record(const std::vector<bool>& stragglers);
  // Whether the pattern (the whole step's, or a prefix) is inside the scheme's model.
  bool inside_model(const StragglerPattern& p) const;

  // After the last round: the coefficients. Throws an Internal error if a job cannot be decoded (record() never
  // lets that happen).
  Decoding decode() const;
  // The pieces that decode job j, one per block (the earliest that arrived, lowest worker first): final once the
  // job's deadline round j + delay() has been recorded; an Internal error before.
  std::vector<KeptPiece> job_decoding(int job) const;
  StragglerMetrics metrics() const;
  // The effective pattern so far (waited rounds have no stragglers) and every round's pieces, for tests and logs.
  const StragglerPattern& pattern() const { return pattern_; }
  const std::vector<std::vector<std::vector<Piece>>>& history() const { return history_; }

 private:
  void plan_round();
  void plan_gc_round();
  void plan_msgc_round();
  bool decodable(int job, const std::vector<bool>& stragglers) const;
  std::vector<int> due_jobs(int round) const;
  void apply(const std::vector<bool>& stragglers);

  StragglerCodeConfig c_;
  int n_ = 0, m_ = 0, s_ = 0, jobs_ = 0, delay_ = 0, job_size_ = 0, blocks_ = 0;
  int round_ = 0;
  std::vector<std::vector<Piece>> tasks_;
  StragglerPattern pattern_;
  std::vector<std::vector<std::vector<Piece>>> history_;  // [round][worker][piece]
  std::vector<std::vector<int>> block_arrivals_;          // [job][block]: pieces of that block that arrived
  std::vector<std::vector<int>> d1_done_;                 // m-sgc: [job][worker] D1 chunks delivered
  std::vector<std::vector<bool>> delivered_;              // sr-sgc: [job][worker] its piece of the job arrived
  StragglerMetrics metrics_;
};

// Stragglers by a deadline: a worker is late when it finished more than `slack` x the fastest's time after the
// round started (the authors' simulator's rule, mu = slack). finish_s: [worker] seconds since the round started.
std::vector<bool> late_workers(const std::vector<double>& finish_s, double slack);
// Seconds a round saved against waiting for everyone: max over all workers minus max over those the round kept
// (0 when it waited).
double round_time_saved(const std::vector<double>& finish_s, const std::vector<bool>& stragglers, RoundOutcome o);

}  // namespace mt
