// The coded forward/backward: straggler-tolerant data parallelism by gradient coding (parallel/straggler_code.h),
// behind the ForwardBackward interface, chosen by make_forward_backward when parallel.straggler_coding is not none.
// Under tp and pp a replica is all its ranks (its tp groups, its whole pipeline): the store keys, the deadline's
// decisions and the bitmap are per replica, its tp-and-pp rank 0 posts its finish, and its ranks agree on
// abandoning (see below). One of the code's micro-batches is one pipeline run (parallel.microbatches x
// data.batch_size rows) under pp, data.batch_size rows otherwise.
//
// Data. Every replica reads the whole step's global batch: train.grad_accum batches of parallel.dp x
// data.batch_size rows, the rows the uncoded run's replicas read, in the same order (open_train_loader gives a
// coded run one loader of dp x data.batch_size rows per rank), so the loader's position after a step, and thus
// checkpoints and resume, are the uncoded run's. Micro-batch id r n + w (the core's numbering) is rows
// [w B, (w+1) B) of round r's batch.
//
// A step, on every rank alike (rank w is worker w):
//   1. entering round r, the core's tasks(r)[w] are this rank's pieces; each is computed into the model's gradient
//      buffer from zero (ParamStore::begin_grads), with loss scale 1/train.grad_accum per micro-batch as the uncoded
//      run, and copied out into a piece buffer kept apart;
//   2. the round's agreement over the job's rendezvous store, under keys of (step, run, round): a rank that has
//      finished its pieces posts done/w; the first rank to see every replica done, or to pass its deadline
//      (parallel.straggler_deadline x the median per-micro-batch compute time of its recent rounds x the round's
//      largest task, from its own round start; no deadline until it has 3 rounds of history), takes the decider
//      counter and writes the decision: the bitmap of the replicas not done then. A finished rank never waits for
//      a straggler's compute unless the decision says so. A straggler looks for the decision before each piece
//      and between layers (the model's hooks, at most once a millisecond, and during an injected sleep: the
//      slowburst fault makes each of its micro-batches take F x its median compute time, the extra slept at the
//      first layer boundary of the forward): marked straggler in a decision the core accepts, it abandons the
//      round there (a typed exception out of the layer loop; the piece's partial gradient and its finished pieces
//      of the round are dropped);
//   3. every rank calls record(bitmap): Accepted, the round ends without the stragglers; outside the model, the
//      round waits for them (they finish their pieces and post done; every rank waits for those keys) and a line
//      says so on the main rank;
//   4. at each job's deadline round its coefficients are final (job_decoding): this rank adds its kept pieces
//      into the step's sum (coefficient 1; the others are dropped, never multiplied) and frees the job's pieces;
//   5. after the last round the sum is written into the gradient buffer, and the step's loss is the kept pieces'
//      loss sum / train.grad_accum: the Update's finish_gradients sums both over the replicas and divides by dp,
//      so gradient and loss are the uncoded step's (the same terms, summed in another order). No bucket of ZeRO-2
//      is reduced during a backward under coding (the pieces are not final there): the reduction is in
//      finish_gradients.
// Under tp or pp the replica's ranks must leave the round's collectives at the same point: they abandon only at
// micro-batch boundaries, after a max-reduction over the replica's tp group, then its pp group, of "this rank saw a
// decision that lets us go"; between layers a straggler only stops its injected sleep. Each piece's replicated
// tensors are summed over tp in its last micro-batch's backward, so every piece is whole; under pp the tied
// embedding's two copies are summed once, on the step's sum, and the loss (on the last stage) over the pipeline.
//
// rerun() (train/sdc_rerun.h) replays the last run's agreed bitmaps without the store or the deadline: every
// piece is computed, the same pieces are kept and summed in the same order, so a healthy rerun is bit-identical.
#pragma once
#include <memory>

#include "megatrain/train/forward_backward.h"

namespace mt {

std::unique_ptr<ForwardBackward> make_coded_forward_backward(const RunConfig& cfg, Topology& topo, ModelStack& stack);

}  // namespace mt
