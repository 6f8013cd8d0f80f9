#include "megatrain/train/sdc_check.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "megatrain/comm/agreement.h"
#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"
#include "megatrain/model/gpt.h"
#include "megatrain/train/heartbeat.h"
#include "megatrain/train/sdc_verdict.h"
#include "megatrain/train/update.h"

namespace mt {

namespace {

std::string sdc_hex(uint64_t h) { return fmt::format("{:016x}", h); }

// The first tensor where replica a's hashes differ from replica b's (the last entry is the whole replica's).
int first_differing_tensor(const std::vector<uint64_t>& all, size_t per, int a, int b) {
  for (size_t t = 0; t + 1 < per; ++t)
    if (all[a * per + t] != all[b * per + t]) return static_cast<int>(t);
  return -1;
}

}  // namespace

SdcCheck::SdcCheck(const RunConfig& cfg, Topology& topo, GPT& model, Update& update)
    : cfg_(cfg), topo_(topo), model_(model), update_(update), active_(topo.host_mesh && topo.shape.dp > 1) {
  if (!active_) return;
  load_records();
  // Which steps are rechecked must be the same on every rank (the check is collective), whatever each rank's view
  // of ckpt.dir (not shared by every node when nothing is checkpointed): rank 0's list, to everyone.
  nlohmann::json steps(record_steps_);
  const nlohmann::json agreed = nlohmann::json::parse(Agreement(topo.host_mesh.get()).broadcast(steps.dump(), 0));
  record_steps_ = agreed.get<std::set<int>>();
}

bool SdcCheck::due(int step) const {
  return (cfg_.train.sdc_check_every > 0 && step % cfg_.train.sdc_check_every == 0) || record_steps_.count(step) > 0;
}

std::string SdcCheck::record_path(int step) const {
  return fmt::format("{}/sdc/step_{}-pp{}-tp{}.json", cfg_.ckpt.dir, step, topo_.coord.pp, topo_.coord.tp);
}

void SdcCheck::load_records() {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path dir = fs::path(cfg_.ckpt.dir) / "sdc";
  if (!fs::is_directory(dir, ec)) return;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    // A record that cannot be read is no reason to stop training (it only names a culprit): it is skipped.
    try {
      const nlohmann::json j = nlohmann::json::parse(read_text_file(e.path().string()));
      const int step = j.at("step").get<int>();
      std::vector<uint64_t> hashes;
      for (const auto& h : j.at("hashes")) hashes.push_back(std::stoull(h.get<std::string>(), nullptr, 16));
      record_steps_.insert(step);
      if (e.path().string() == record_path(step)) records_[step] = hashes;
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "warning: skipping the unreadable sdc record %s: %s\n", e.path().c_str(), ex.what());
    }
  }
}

void SdcCheck::record_disagreement(int step, const std::vector<uint64_t>& whole) {
  nlohmann::json hashes = nlohmann::json::array();
  for (uint64_t h : whole) hashes.push_back(sdc_hex(h));
  std::filesystem::create_directories(std::filesystem::path(cfg_.ckpt.dir) / "sdc");
  write_file_atomic(record_path(step), nlohmann::json{{"step", step}, {"hashes", hashes}}.dump() + "\n");
}

void SdcCheck::settle_rerun(int step, const std::vector<uint64_t>& whole) {
  auto it = records_.find(step);
  if (it == records_.end()) return;
  const std::vector<uint64_t> recorded = it->second;
  records_.erase(it);
  ProcessGroup& dp = topo_.host_mesh->dp();
  const int me = dp.rank();
  if (recorded.size() != whole.size()) return;  // another layout recorded it: nothing to compare with
  nlohmann::ordered_json reproduced = nlohmann::ordered_json::array();
  for (size_t r = 0; r < recorded.size(); ++r)
    if (recorded[r] == whole[me]) reproduced.push_back(dp.global_rank(static_cast<int>(r)));
  // Named only against a replica that did reproduce its result: a rerun that matches no recorded hash (a stale
  // record, another run's) names nobody.
  if (recorded[me] != whole[me] && !reproduced.empty()) {
    heartbeat_event("sdc_culprit",
                    {{"step", step},
                     {"recorded", sdc_hex(recorded[me])},
                     {"rerun", sdc_hex(whole[me])},
                     {"reproduced_by", reproduced}},
                    /*sync=*/true);
    std::fprintf(stderr,
                 "silent data corruption settled by the rerun of step %d: rank %d did not reproduce its own result "
                 "(recorded %s, rerun %s); replicas that did: %s\n",
                 step, topo_.rank_info.rank, sdc_hex(recorded[me]).c_str(), sdc_hex(whole[me]).c_str(),
                 reproduced.dump().c_str());
    std::fflush(stderr);
  }
  if (me == 0) std::filesystem::remove(record_path(step));
}

std::vector<uint64_t> SdcCheck::tensor_hashes() {
  ParamStore& p = model_.params();
  std::vector<uint64_t> h;
  uint64_t all = kHashSeed;
  for (size_t i = 0; i < p.size(); ++i) {
    // Where the parameters live (one pass over device memory on a GPU, not a copy to the host): the same bits as
    // param_hash on the host (core/bits_hash.h), so replicas on any backend compare.
    // An expert-parallel shard differs between the dp replicas (they hold different experts): not compared, a
    // constant in its place.
    const bool replicated = !p.info(static_cast<int>(i)).shard.ep_sharded();
    h.push_back(replicated ? model_.ops().bits_hash(p.param(static_cast<int>(i))) : kHashSeed);
    all = combine_hash(all, h.back());
  }
  h.push_back(all);
  return h;
}

void SdcCheck::run(int step) {
  if (!active_ || step == checked_step_) return;
  checked_step_ = step;
  const double t0 = now_seconds();
  update_.sync_params();  // ZeRO-2: the updated parameters' all-gather completes before they are read
  const std::vector<uint64_t> mine = tensor_hashes();
  const size_t per = mine.size();
  ProcessGroup& dp = topo_.host_mesh->dp();
  const int n = dp.size();
  // Each hash as two int32 halves: the host plane's all_gather moves fp32 or int32, and int32 keeps every bit.
  std::vector<uint64_t> all(per * static_cast<size_t>(n));
  dp.all_gather(Tensor(all.data(), {static_cast<int64_t>(2 * all.size())}, DType::I32),
                Tensor(const_cast<uint64_t*>(mine.data()), {static_cast<int64_t>(2 * per)}, DType::I32))
      ->wait();
  std::vector<uint64_t> whole;
  for (int r = 0; r < n; ++r) whole.push_back(all[r * per + per - 1]);
  const ReplicaVerdict v = judge_replicas(whole);
  const int me = dp.rank();
  const bool odd = std::find(v.odd.begin(), v.odd.end(), me) != v.odd.end();
  std::string mine_why;
  if (odd) {
    // Against the majority's holder, or (no majority) the first replica that differs from this one.
    int other = -1;
    for (int r = 0; r < n && other < 0; ++r)
      if (r != me && (v.no_majority ? whole[r] != whole[me] : whole[r] == v.majority)) other = r;
    const int t = other < 0 ? -1 : first_differing_tensor(all, per, me, other);
    const std::string tensor = t < 0 ? "?" : model_.params().info(t).name;
    nlohmann::ordered_json suspects = nlohmann::ordered_json::array();
    for (int r : v.odd) suspects.push_back(dp.global_rank(r));
    heartbeat_event("sdc",
                    {{"step", step},
                     {"tensor", tensor},
                     {"hash", sdc_hex(whole[me])},
                     {"majority",
                      v.no_majority ? nlohmann::ordered_json() : nlohmann::ordered_json(sdc_hex(v.majority))},
                     {"suspects", suspects},
                     {"no_majority", v.no_majority}},
                    /*sync=*/true);
    mine_why = v.no_majority
                   ? fmt::format("rank {} and its data-parallel replicas (ranks {}) hold different parameters, first "
                                 "in {}, and no majority says which is right",
                                 topo_.rank_info.rank, suspects.dump(), tensor)
                   : fmt::format("rank {} holds parameters that differ from the majority of its data-parallel "
                                 "replicas' (hash {} against {}), first in {}",
                                 topo_.rank_info.rank, sdc_hex(whole[me]), sdc_hex(v.majority), tensor);
    std::fprintf(stderr, "silent data corruption detected after step %d: %s\n", step, mine_why.c_str());
    std::fflush(stderr);
    if (v.no_majority && me == v.odd.front()) record_disagreement(step, whole);  // for the rerun to settle
  }
  const std::vector<int> bad = Agreement(topo_.host_mesh.get()).which_ranks(odd);
  seconds_ += now_seconds() - t0;
  if (!bad.empty())
    fail_as(ErrorKind::Sdc, "step {}: silent data corruption: {}", step,
            odd ? mine_why
                : fmt::format("the parameters of rank(s) {} differ from their data-parallel replicas' (their errors "
                              "name the tensors)",
                              fmt::join(bad, ", ")));
  agreed_step_ = step;
  agreed_hash_ = whole[me];
  settle_rerun(step, whole);
}

}  // namespace mt
