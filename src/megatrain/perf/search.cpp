#include "megatrain/perf/search.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "megatrain/core/error.h"
#include "megatrain/perf/memory.h"

namespace mt::perf {

int peak_in_flight_estimate(int pp, int v, int m, int rank) {
  const int warmup = v == 1 ? pp - 1 - rank : (pp - 1 - rank) * 2 + (v - 1) * pp;
  return std::min(warmup + 1, m * v);
}

std::vector<int> expert_parallel_sizes(const ModelConfig& m, int dp) {
  std::vector<int> out;
  for (int ep = 1; ep <= dp; ++ep)
    if (dp % ep == 0 && (ep == 1 || (m.moe() && m.moe_experts % ep == 0))) out.push_back(ep);
  return out;
}

namespace {
// Memory per GPU of pipeline rank 0, or for a MoE model of its fullest rank (the ranks' layers differ).
MemoryBreakdown fullest_rank_memory(const Job& j, int micro) {
  const Layout& L = j.layout;
  const Shape s{L.tp, L.micro_batch, L.seq};
  const int pp = L.pp, v = L.virtual_stages;
  MemoryBreakdown best = memory_per_gpu(j.model, s, j.tech, L.dp, pp, v, peak_in_flight_estimate(pp, v, micro),
                                        L.stage_layers, L.ep);
  for (int r = 1; j.model.moe() && r < pp; ++r) {
    const MemoryBreakdown m = memory_per_gpu(j.model, s, j.tech, L.dp, pp, v, peak_in_flight_estimate(pp, v, micro, r),
                                             L.stage_layers, L.ep, r);
    if (m.total() > best.total()) best = m;
  }
  return best;
}
}  // namespace

SearchResult search_layouts(const ModelConfig& m, const Cluster& c, const SearchOptions& o) {
  if (o.gpus < 1) fail_as(ErrorKind::Config, "--search needs --gpus >= 1 (got {})", o.gpus);
  if (o.global_batch < 1) fail_as(ErrorKind::Config, "--search needs --batch >= 1 (got {})", o.global_batch);
  if (o.seq < 1 || o.seq > m.max_seq_len)
    fail_as(ErrorKind::Config, "--search: data.seq_len = {} must be in [1, model.max_seq_len = {}]", o.seq,
            m.max_seq_len);
  const double limit = (o.memory_limit > 0 ? o.memory_limit : c.memory_gib.value * double(1 << 30)) *
                       (1 - o.memory_reserve);
  SearchResult r;
  std::vector<Candidate> all;
  for (int tp = 1; tp <= std::min(o.gpus, c.node_gpus()); tp *= 2) {
    if (m.n_head % tp || m.kv_heads() % tp || m.ff_dim() % tp) continue;
    for (int pp = 1; pp <= m.n_layer; ++pp) {
      if (o.gpus % (tp * pp)) continue;
      const int dp = o.gpus / (tp * pp);
      for (int ep : expert_parallel_sizes(m, dp))
        for (int mb : o.micro_batches) {
          if (o.global_batch % (dp * mb)) continue;
          const int micro = o.global_batch / (dp * mb);
          for (int v = 1; v <= o.max_virtual_stages; ++v) {
            if (pp * v > m.n_layer || (v > 1 && (pp < 2 || micro % pp))) continue;
            // The layer splits tried: the even one where pp * v divides the layers, and the one that balances the
            // stages' compute (the first stage also embeds, the last computes the head and loss; step_model.h) where
            // it differs. So depths that do not divide the layers are searched too, and a heavy head gets its stage
            // lightened. Where both fit, the faster is kept (the even one on a tie): one row per layout. (The
            // balanced split, not best_stage_layers' refinement, which simulates every move.)
            Job base;
            base.model = m;
            base.layout = Layout{dp, pp, tp, v, micro, mb, o.seq, {}, ep};
            base.tech = o.tech;
            const bool even = m.n_layer % (pp * v) == 0;
            std::vector<std::vector<int>> splits;
            if (even) splits.push_back({});
            if (pp > 1) {
              std::vector<int> b = balanced_stage_layers(base, c);
              if (!even || b != std::vector<int>(size_t(pp * v), m.n_layer / (pp * v))) splits.push_back(std::move(b));
            }
            // Selective recomputation only drops the attention scores, which flash attention never stores: it costs and
            // saves the same as none, so the search tries none and full.
            for (Recompute rc : {Recompute::None, Recompute::Full}) {
              ++r.considered;
              std::optional<Candidate> kept;
              bool over = true;
              for (const std::vector<int>& split : splits) {
                Job j = base;
                j.layout.stage_layers = split;
                j.tech.recompute = rc;
                const MemoryBreakdown mem = fullest_rank_memory(j, micro);
                if (mem.total() > limit) continue;
                over = false;
                ++r.simulated;
                Candidate cand{j, predict_step_seconds(j, c), 0, mem.total()};
                if (!kept || cand.step_seconds < kept->step_seconds) kept = cand;
              }
              if (over) {
                ++r.over_memory;
                continue;
              }
              kept->mfu = m.flops_per_token(o.seq) * double(o.global_batch) * o.seq /
                          (kept->step_seconds * o.gpus * c.peak_flops());
              all.push_back(*kept);
            }
          }
        }
    }
  }
  if (all.empty())
    fail_as(ErrorKind::Config,
            "--search: no layout of {} GPUs fits {:.1f} GiB per GPU for this model at batch {} ({} "
            "layouts considered, {} over the memory limit); raise --mem-limit or the GPU count",
            o.gpus, limit / double(1 << 30), o.global_batch, r.considered, r.over_memory);
  std::stable_sort(all.begin(), all.end(),
                   [](const Candidate& a, const Candidate& b) { return a.step_seconds < b.step_seconds; });
  r.ranked = std::move(all);
  return r;
}

namespace {
// MoE: where the winner's all-to-alls run, what its experts take, and the best layout of each other ep.
std::string explain_ep(const SearchResult& r, const Cluster& c, const Prediction& p) {
  const Candidate& best = r.ranked.front();
  const Layout& L = best.job.layout;
  std::string out = fmt::format(
      "     tp {} x ep {} ({} experts a layer per GPU{}) {}; they expose {:.1f}% of the step; the experts' "
      "weights, gradients and optimizer state take {:.1f} GiB per GPU. MFU counts the active parameters' FLOPs.\n",
      L.tp, L.ep, best.job.model.moe_experts / L.ep,
      L.tp > 1 ? fmt::format(", replicated over tp, each tp rank routing its 1/{} of the tokens", L.tp) : "",
      L.ep == 1 ? "needs no all-to-alls (every GPU holds every expert)"
                : (L.tp * L.ep <= c.node_gpus() ? "keeps the all-to-alls on NVLink inside a node"
                                                : "sends the all-to-alls across nodes"),
      100 * p.breakdown.ep / p.step_seconds, p.memory.experts / double(1 << 30));
  std::map<int, const Candidate*> per_ep;
  for (const Candidate& cand : r.ranked)
    if (!per_ep.count(cand.job.layout.ep)) per_ep[cand.job.layout.ep] = &cand;
  for (auto& [ep, cand] : per_ep)
    if (cand != &best)
      out += fmt::format("     best with ep {}: {:.2f} s ({:+.1f}%), tp {} dp {} pp {}, micro-batch {}, recompute {}\n",
                         ep, cand->step_seconds, 100 * (cand->step_seconds / best.step_seconds - 1),
                         cand->job.layout.tp, cand->job.layout.dp, cand->job.layout.pp, cand->job.layout.micro_batch,
                         recompute_name(cand->job.tech.recompute));
  std::set<int> fitting;
  for (const Candidate& cand : r.ranked) fitting.insert(cand.job.layout.ep);
  if (!fitting.count(1)) out += "     no layout with ep 1 (every expert on every GPU) fits the memory limit\n";
  return out;
}
}  // namespace

std::string explain(const SearchResult& r, const Cluster& c) {
  if (r.ranked.empty()) return "no layout fits\n";
  const Candidate& best = r.ranked.front();
  const Prediction p = predict(best.job, c);
  const Breakdown& b = p.breakdown;
  const Layout& L = best.job.layout;
  std::string out = fmt::format(
      "why: of {} layouts, {} exceed the memory limit; the others took {} simulations (an evenly split layout also "
      "tries the split that balances its stages, and keeps the faster). The winner spends {:.1f}% of its step in "
      "compute, {:.1f}% in the pipeline bubble, {:.1f}% in exposed tp, {:.1f}% pp, {:.1f}% dp communication, {:.1f}% in "
      "the optimizer and {:.1f}% waiting on stragglers; it needs {:.1f} GiB per GPU.\n",
      r.considered, r.over_memory, r.simulated, 100 * b.compute / p.step_seconds, 100 * b.bubble / p.step_seconds,
      100 * b.tp / p.step_seconds, 100 * b.pp / p.step_seconds, 100 * b.dp / p.step_seconds,
      100 * b.optimizer / p.step_seconds, 100 * b.straggler / p.step_seconds, p.memory.total() / double(1 << 30));
  out +=
      fmt::format("     tp {} keeps the tensor-parallel collectives {}; pp {} x v {} with {} micro-batches of {} gives "
                  "a bubble of {:.1f}%.\n",
                  L.tp, L.tp <= c.node_gpus() ? "on NVLink inside a node" : "across nodes", L.pp, L.virtual_stages,
                  L.microbatches, L.micro_batch, 100 * b.bubble / p.step_seconds);
  if (best.job.model.moe()) out += explain_ep(r, c, p);
  // The best layout of each other (tp, pp): what the alternatives would cost.
  std::map<std::pair<int, int>, const Candidate*> per_shape;
  for (const Candidate& cand : r.ranked) {
    auto key = std::make_pair(cand.job.layout.tp, cand.job.layout.pp);
    if (!per_shape.count(key)) per_shape[key] = &cand;
  }
  std::vector<const Candidate*> alts;
  for (auto& [k, cand] : per_shape)
    if (cand != &best) alts.push_back(cand);
  std::sort(alts.begin(), alts.end(), [](auto* a, auto* b) { return a->step_seconds < b->step_seconds; });
  for (size_t i = 0; i < std::min<size_t>(alts.size(), 4); ++i) {
    const Candidate& a = *alts[i];
    out += fmt::format("     best with tp {} pp {}: {:.2f} s ({:+.1f}%), v {}, micro-batch {}, recompute {}\n",
                       a.job.layout.tp, a.job.layout.pp, a.step_seconds, 100 * (a.step_seconds / best.step_seconds - 1),
                       a.job.layout.virtual_stages, a.job.layout.micro_batch, recompute_name(a.job.tech.recompute));
  }
  return out;
}

}  // namespace mt::perf
