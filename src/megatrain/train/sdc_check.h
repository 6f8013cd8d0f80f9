// The silent-data-corruption check across data-parallel replicas (train.sdc_check_every; docs/robust-training.md).
// A GPU that computes wrong without failing makes its replica's parameters drift from the others', which under
// data parallelism must stay bit-identical: after the optimizer update (and under ZeRO-2 the all-gather of the
// updated parameters, waited for here) every replica holds the same parameters of its (pp, tp) slice.
//
// Protocol (collective over every rank, at the same steps on every rank: the steps come from the config):
//  1. each rank hashes its own parameters, tensor by tensor (core/bits_hash.h through Ops::bits_hash: exact, over
//     the float bits, computed where they live: on a GPU one pass over device memory), without touching them: the
//     check never changes what the run computes;
//  2. the hashes (one per tensor, then the whole replica's) are all-gathered over the host plane's dp group: the
//     ranks with the same (pp, tp) coordinate, which hold the same slice;
//  3. each dp group judges its replicas (judge_replicas: odd ones by majority; with dp = 2 both of a disagreeing
//     pair are suspects); an odd replica sends the heartbeat event
//       sdc {"step":S,"tensor":NAME,"hash":"<hex>","majority":"<hex>"|null,"suspects":[global ranks],
//            "no_majority":bool}
//     naming the first tensor whose hash differs;
//  4. every rank agrees (comm/agreement.h) whether any group disagreed, so all of them fail together with an
//     ErrorKind::Sdc error (restartable: a supervisor restarts the job from the newest checkpoint, and a checkpoint
//     is only ever written after a check that agreed: the trainer checks at every checkpoint step too).
// With dp = 1 or a single process there is nothing to compare: no hashing, no communication.
//
// The rerun (dp = 2, or any disagreement without a majority): the lowest suspect records every replica's hash as
//   <ckpt.dir>/sdc/step_<S>-pp<P>-tp<T>.json  {"step":S,"hashes":["<hex>", ...]}  (by dp rank in the group)
// and the restarted attempt, which reruns step S from an earlier checkpoint (bit-identical: the same data, the same
// arithmetic), checks step S again on every rank (rank 0's list of recorded steps, broadcast at start, so all take
// part). When the rerun's replicas agree, a replica whose recorded hash differs from the rerun's, while another
// replica's recorded hash equals it, did not reproduce its own result: it sends
//   sdc_culprit {"step":S,"recorded":"<hex>","rerun":"<hex>","reproduced_by":[global ranks]}
// (the event log: a fault with reason sdc_culprit and that rank). The record is removed once settled.
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "megatrain/train/run_config.h"
#include "megatrain/train/topology.h"

namespace mt {

class GPT;
class Update;

class SdcCheck {
 public:
  // Collective over every rank when dp > 1: reads the rerun records (above) and takes rank 0's list of their steps.
  SdcCheck(const RunConfig& cfg, Topology& topo, GPT& model, Update& update);

  // Whether the check runs after step `step` by itself: the interval (train.sdc_check_every; 0: never), or a step
  // a rerun record names.
  bool due(int step) const;
  // Runs the check after `step` (once per step: a second call for the same step returns at once). Throws kind Sdc
  // on every rank when any replicas disagree.
  void run(int step);
  // The step of the last check that passed, and this replica's hash there (what a checkpoint of that step records).
  int agreed_step() const { return agreed_step_; }
  uint64_t agreed_hash() const { return agreed_hash_; }
  // Seconds the checks took so far (hashing and exchange), for the cost figures.
  double seconds() const { return seconds_; }

 private:
  std::vector<uint64_t> tensor_hashes();  // this rank's, then the whole replica's last
  std::string record_path(int step) const;
  void load_records();
  void record_disagreement(int step, const std::vector<uint64_t>& whole);
  void settle_rerun(int step, const std::vector<uint64_t>& whole);

  const RunConfig& cfg_;
  Topology& topo_;
  GPT& model_;
  Update& update_;
  bool active_ = false;  // dp > 1
  int checked_step_ = -1;
  int agreed_step_ = -1;
  uint64_t agreed_hash_ = 0;
  double seconds_ = 0;
  std::map<int, std::vector<uint64_t>> records_;  // step -> the recorded hashes of my (pp, tp) group, by dp rank
  std::set<int> record_steps_;                    // the steps any group recorded (every rank checks them)
};

}  // namespace mt
