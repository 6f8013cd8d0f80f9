#include "megatrain/perf/step_model.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "megatrain/core/error.h"
#include "megatrain/model/layout.h"
#include "megatrain/model/params.h"
#include "megatrain/parallel/schedule.h"
#include "megatrain/perf/collectives.h"
#include "megatrain/perf/moe_cost.h"
#include "megatrain/perf/pipeline_sim.h"

namespace mt::perf {

namespace {

struct Plan {
  Schedule schedule;
  PipelineCosts costs;
  std::vector<double> compute_per_rank, tp_per_rank;  // per micro-batch sums, per rank
  std::vector<double> ep_per_rank;                    // per micro-batch, per rank: exposed expert all-to-alls
  std::vector<double> dp_blocking_per_rank;           // reduce-scatter + all-gather when not overlapped
  std::vector<double> tp_sync_per_rank;               // once a step: the replicated tensors' gradients summed over tp
  // Per step, per rank: the communication that ran behind compute (tp overlapped with GEMMs, asynchronous p2p,
  // dp reduce-scatter / all-gather inside the step). Hidden from the critical path, but its kernels share the SMs and
  // the HBM with the compute; Cluster::overlap_interference says how much of it the step still pays.
  std::vector<double> hidden_comm_per_rank;
  double optimizer = 0;
};

// True when the ranks of a CPU run use every core of the host: communication then competes with compute for
// the same cores (Gloo's copies, reductions and socket work), and nothing overlaps.
bool saturated_host(const Job& job, const Cluster& c) {
  return c.topology == "single-host" && c.host_cores.value > 0 && job.layout.gpus() >= c.host_cores.value;
}

Techniques effective_techniques(const Job& job, const Cluster& c) {
  Techniques t = job.tech;
  if (saturated_host(job, c)) {
    t.comm_overlaps_compute = false;
    t.pp_overlap = t.dp_overlap = false;
  }
  return t;
}

// Floats of the replicated tensors (norms, row-parallel biases, positions; on a MoE layer the router, the routed
// experts this rank holds (E / ep of them) and the shared experts) in each layer and outside the layers, from the
// real parameter layout: megatrain sums each layer's (and the final norm's, and the embedding's) in one all-reduce
// over tp in the step's last backward.
struct Replicated {
  std::vector<double> layer;  // per layer
  double head = 0, embedding = 0;
};
Replicated replicated_floats(const ModelConfig& m, int tp, int ep) {
  ParamStore store;
  declare_gpt_params(m, store, tp, 0);
  Replicated r;
  r.layer.assign(m.n_layer, 0);
  for (int i = 0; i < static_cast<int>(store.size()); ++i) {
    const ParamInfo& p = store.info(i);
    if (p.shard.sharded()) continue;
    if (p.name.rfind("h.", 0) == 0) {
      const bool expert = p.name.find(".moe.experts.") != std::string::npos;
      r.layer[std::stoi(p.name.substr(2))] += double(p.numel) / (expert ? ep : 1);
    } else if (p.name.rfind("ln_f", 0) == 0) {
      r.head += double(p.numel);
    } else {
      r.embedding += double(p.numel);
    }
  }
  return r;
}

// The first layer of each virtual stage, and how many of each stage's layers are MoE layers.
struct StageKinds {
  std::vector<int> first, moe;
};
StageKinds stage_kinds(const ModelConfig& m, const std::vector<int>& layers) {
  StageKinds k;
  int l = 0;
  for (int n : layers) {
    k.first.push_back(l);
    int moe = 0;
    for (int i = 0; i < n; ++i) moe += m.moe_layer(l + i) ? 1 : 0;
    k.moe.push_back(moe);
    l += n;
  }
  return k;
}

// Per virtual stage, the forward and backward times of its layers (the first stage's with the embedding, the last's
// with the head), and per rank the compute and exposed tp and ep time they sum to.
void plan_stage_costs(Plan& p, const Job& job, const Cluster& c, const Techniques& t, const std::vector<int>& layers) {
  const Layout& L = job.layout;
  const ModelConfig& m = job.model;
  const Shape shape{L.tp, L.micro_batch, L.seq};
  const int S = L.pp * L.virtual_stages;
  const LayerCost layer = layer_cost(m, c, shape, t);
  const LayerCost moe = m.moe() ? moe_layer_cost(m, c, shape, t, L.ep) : LayerCost{};
  const LayerCost emb = embedding_cost(m, c, shape, t), head = head_cost(m, c, shape, t);
  const StageKinds kinds = stage_kinds(m, layers);
  p.costs.fwd.assign(S, 0);
  p.costs.bwd.assign(S, 0);
  p.compute_per_rank.assign(L.pp, 0);
  p.tp_per_rank.assign(L.pp, 0);
  p.ep_per_rank.assign(L.pp, 0);
  p.hidden_comm_per_rank.assign(L.pp, 0);
  auto hidden = [](const LayerCost& x) {
    return std::max(0.0, x.fwd.tp_comm - x.fwd.tp_exposed) + std::max(0.0, x.bwd.tp_comm - x.bwd.tp_exposed) +
           std::max(0.0, x.fwd.ep_comm - x.fwd.ep_exposed) + std::max(0.0, x.bwd.ep_comm - x.bwd.ep_exposed);
  };
  for (int st = 0; st < S; ++st) {
    const int nm = kinds.moe[st], nd = layers[st] - nm;  // MoE and dense layers of the stage
    double compute = nd * (layer.fwd.compute + layer.bwd.compute) + nm * (moe.fwd.compute + moe.bwd.compute);
    double tp = nd * (layer.fwd.tp_exposed + layer.bwd.tp_exposed) + nm * (moe.fwd.tp_exposed + moe.bwd.tp_exposed);
    double tp_hidden = nd * hidden(layer) + nm * hidden(moe) + (st == 0 ? hidden(emb) : 0) +
                       (st == S - 1 ? hidden(head) : 0);
    p.costs.fwd[st] = nd * layer.fwd.total() + nm * moe.fwd.total();
    p.costs.bwd[st] = nd * layer.bwd.total() + nm * moe.bwd.total();
    if (st == 0) {
      p.costs.fwd[st] += emb.fwd.total();
      p.costs.bwd[st] += emb.bwd.total();
      compute += emb.fwd.compute + emb.bwd.compute;
      tp += emb.fwd.tp_exposed + emb.bwd.tp_exposed;
    }
    if (st == S - 1) {
      p.costs.fwd[st] += head.fwd.total();
      p.costs.bwd[st] += head.bwd.total();
      compute += head.fwd.compute + head.bwd.compute;
      tp += head.fwd.tp_exposed + head.bwd.tp_exposed;
    }
    p.compute_per_rank[st % L.pp] += compute;
    p.tp_per_rank[st % L.pp] += tp;
    p.ep_per_rank[st % L.pp] += nm * (moe.fwd.ep_exposed + moe.bwd.ep_exposed);
    p.hidden_comm_per_rank[st % L.pp] += tp_hidden * L.microbatches;
  }
}

// Parameters of one transformer layer: the model's, less the embedding, learned positions and an untied head.
double params_per_layer(const ModelConfig& m) {
  double total = double(m.num_params()) - double(m.vocab_size) * m.d_model -
                 (m.pos == PosKind::Learned ? double(m.max_seq_len) * m.d_model : 0) -
                 (m.tied_embeddings ? 0 : double(m.vocab_size) * m.d_model);
  return total / m.n_layer;
}

// The parameters of virtual stage st on one GPU: the dense ones (over tp, but a MoE layer's router and shared
// experts whole; the embedding on the first stage, the LM head or its copy on the last) and the routed experts'
// (over ep; replicated over tp).
struct StageParams {
  double dense = 0, experts = 0;
};
StageParams stage_params(const Job& job, const std::vector<int>& layers, const StageKinds& kinds, int st) {
  const Layout& L = job.layout;
  const ModelConfig& m = job.model;
  const int S = L.pp * L.virtual_stages;
  StageParams p;
  if (!m.moe()) {
    p.dense = layers[st] * params_per_layer(m) / L.tp;
  } else {
    for (int l = kinds.first[st]; l < kinds.first[st] + layers[st]; ++l) {
      const LayerParams lp = layer_params(m, l);
      p.dense += lp.dense_per_gpu(L.tp);
      p.experts += lp.experts / L.ep;
    }
  }
  const double vocab_rows = double(m.padded_vocab(L.tp)) * m.d_model / L.tp;
  if (st == 0) p.dense += vocab_rows;                                       // the embedding
  if (st == S - 1 && (S > 1 || !m.tied_embeddings)) p.dense += vocab_rows;  // the LM head (or its copy)
  return p;
}

// Data parallel: the chunk's gradients reduce-scattered, its weights (compute dtype) all-gathered, on the dp group
// (the experts' on the dp / ep ranks that hold the same experts, after the dense ones on the same stream).
// Fills the per-chunk costs and their per-rank sums (as if not overlapped); returns the largest rank's parameter shard.
double plan_dp_traffic(Plan& p, const Job& job, const Cluster& c, const Techniques& t, const std::vector<int>& layers) {
  const Layout& L = job.layout;
  const StageKinds kinds = stage_kinds(job.model, layers);
  const Link dl = group_link(c, L.dp, L.tp * L.pp);
  const int edp = L.dp / L.ep;  // ranks holding the same experts
  const Link el = group_link(c, edp, L.tp * L.ep * L.pp);
  p.dp_blocking_per_rank.assign(L.pp, 0);
  double max_shard = 0;
  if (L.dp > 1) {
    p.costs.dp_all_gather.assign(L.pp, std::vector<double>(L.virtual_stages, 0));
    p.costs.dp_reduce_scatter.assign(L.pp, std::vector<double>(L.virtual_stages, 0));
  }
  for (int r = 0; r < L.pp; ++r) {
    double rank_params = 0;
    for (int k = 0; k < L.virtual_stages; ++k) {
      const StageParams sp = stage_params(job, layers, kinds, k * L.pp + r);
      const double params = sp.dense;
      rank_params += params + sp.experts / edp * L.dp;  // the shard: dense / dp + experts / edp
      if (L.dp > 1) {
        double rs = ring_reduce_scatter_seconds(L.dp, params * t.grad_bytes, dl);
        double ag = ring_all_gather_seconds(L.dp, params * c.dtype_bytes.value, dl);
        if (sp.experts > 0 && edp > 1) {
          rs += ring_reduce_scatter_seconds(edp, sp.experts * t.grad_bytes, el);
          ag += ring_all_gather_seconds(edp, sp.experts * c.dtype_bytes.value, el);
        }
        p.costs.dp_reduce_scatter[r][k] = rs;
        p.costs.dp_all_gather[r][k] = ag;
        p.dp_blocking_per_rank[r] += rs + ag;
      }
    }
    max_shard = std::max(max_shard, rank_params / L.dp);
  }
  return max_shard;
}

// What of the dp traffic blocks each rank after its pipeline: the tied embeddings' all-reduce, and the
// reduce-scatters and all-gathers unless they overlap (then they run inside the simulation).
void plan_dp_blocking(Plan& p, const Job& job, const Cluster& c, const Techniques& t) {
  const Layout& L = job.layout;
  const ModelConfig& m = job.model;
  // Tied embeddings across pipeline ends: the first and last stage all-reduce the embedding gradient.
  if (L.pp > 1 && m.tied_embeddings) {
    const double bytes = double(m.padded_vocab(L.tp)) * m.d_model / L.tp * t.grad_bytes;
    const double ar = ring_allreduce_seconds(2, bytes, group_link(c, 2, (L.pp - 1) * L.tp * L.ep));
    p.dp_blocking_per_rank[0] += ar;
    p.dp_blocking_per_rank[L.pp - 1] += ar;
  }
  if (t.dp_overlap && L.dp > 1) {
    // reduce-scatter / all-gather run inside the simulation; only the embedding all-reduce stays outside
    for (int r = 0; r < L.pp; ++r)
      for (int k = 0; k < L.virtual_stages; ++k) {
        const double chunk = p.costs.dp_reduce_scatter[r][k] + p.costs.dp_all_gather[r][k];
        p.dp_blocking_per_rank[r] -= chunk;
        p.hidden_comm_per_rank[r] += chunk;
      }
  } else {
    p.costs.dp_all_gather.clear();
    p.costs.dp_reduce_scatter.clear();
  }
  for (double& x : p.dp_blocking_per_rank) x = std::max(0.0, x);
}

// Once a step, per rank: the replicated tensors' gradients summed over tp (on a MoE layer the router's and the
// experts' too: megatrain runs these all-reduces in the last micro-batch's backward and waits for them, so the
// model charges them after the pipeline, on the critical path).
void plan_tp_sync(Plan& p, const Job& job, const Cluster& c, const std::vector<int>& layers) {
  const Layout& L = job.layout;
  const int S = L.pp * L.virtual_stages;
  p.tp_sync_per_rank.assign(L.pp, 0);
  if (L.tp > 1) {
    const Replicated rep = replicated_floats(job.model, L.tp, L.ep);
    const StageKinds kinds = stage_kinds(job.model, layers);
    const Link tl = group_link(c, L.tp, 1);
    auto sum = [&](double floats) { return floats > 0 ? ring_allreduce_seconds(L.tp, floats * 4, tl) : 0.0; };
    for (int st = 0; st < S; ++st) {
      double x = 0;
      for (int l = kinds.first[st]; l < kinds.first[st] + layers[st]; ++l) x += sum(rep.layer[l]);
      if (st == 0) x += sum(rep.embedding);
      if (st == S - 1) x += sum(rep.head);
      p.tp_sync_per_rank[st % L.pp] += x;
    }
  }
}

Plan make_plan(const Job& job, const Cluster& c) {
  const Layout& L = job.layout;
  const ModelConfig& m = job.model;
  const Techniques t = effective_techniques(job, c);
  const std::vector<int> layers = stage_layer_counts(m, L.pp, L.virtual_stages, L.stage_layers);
  Plan p;
  p.schedule = make_interleaved_1f1b(L.pp, L.virtual_stages, L.microbatches);
  plan_stage_costs(p, job, c, t, layers);
  // Activations (and their gradients) cross between stages in the sequence-parallel layout: each tp rank sends
  // its 1/tp slice to its peer in the next stage (tp x ep ranks further on).
  const Link pl = group_link(c, L.pp, L.tp * L.ep);
  p.costs.p2p_seconds = L.pp > 1
                            ? p2p_seconds(double(L.micro_batch) * L.seq * m.d_model * c.dtype_bytes.value / L.tp, pl)
                            : 0;
  p.costs.p2p_overlap = t.pp_overlap;
  // Asynchronous p2p: each micro-batch sends an activation and a gradient per virtual stage of the rank.
  if (t.pp_overlap && L.pp > 1)
    for (double& h : p.hidden_comm_per_rank) h += 2.0 * L.virtual_stages * L.microbatches * p.costs.p2p_seconds;
  const double max_shard = plan_dp_traffic(p, job, c, t, layers);
  plan_dp_blocking(p, job, c, t);
  plan_tp_sync(p, job, c, layers);
  p.optimizer = max_shard * c.optimizer_bytes_per_param.value / (c.hbm_bytes_per_s() * c.memory_bound.value) +
                allreduce_seconds(c, L.gpus(), 1, 8);
  return p;
}

// The step time overlapped communication still costs: the calibrated share of the busiest rank's hidden traffic.
double interference_seconds(const Plan& p, const Cluster& c) {
  double most = 0;
  for (double h : p.hidden_comm_per_rank) most = std::max(most, h);
  return c.overlap_interference.value * most;
}

// When the last rank is done: its pipeline finish plus what runs after it (dp traffic that was not overlapped and,
// unless with_tp_sync is false, the replicated gradients' tp sums).
double step_end(const PipelineResult& r, const Plan& p, bool with_tp_sync = true) {
  double end = 0;
  for (size_t i = 0; i < r.finish.size(); ++i)
    end = std::max(end, r.finish[i] + (with_tp_sync ? p.tp_sync_per_rank[i] : 0.0) + p.dp_blocking_per_rank[i]);
  return end;
}

// With more ranks than cores, ranks take turns: a step lasts at least every rank's compute divided by the cores,
// even when the schedule leaves some rank idle (a waiting rank gives its core to another). Returns that bound
// (0 when every rank has a core of its own). The optimizer runs on every rank at once, so it shares the cores too.
double shared_cores_bound(const Job& job, const Cluster& c, const Plan& p) {
  const Layout& L = job.layout;
  if (c.topology != "single-host" || c.host_cores.value <= 0 || L.gpus() <= c.host_cores.value) return 0;
  double work = 0;
  for (double x : p.compute_per_rank) work += x * L.microbatches;
  work = work * L.dp * L.tp + p.optimizer * L.gpus();
  return work / c.host_cores.value;
}

double straggler_fraction(const Job& job, const Cluster& c) {
  // A synchronous step waits for its slowest GPU. Healthy GPUs differ in speed (silicon, cooling): model their
  // speeds as normal with the spread seen on one node (the expected range of 8 normal draws is 2.847 sigma); the
  // slowest of n is then about sigma * sqrt(2 ln n) behind the typical one a microbenchmark measures.
  const double n = job.layout.gpus();
  const double sigma = c.gpu_speed_range.value / 2.847;
  const double healthy = n >= 2 ? sigma * std::sqrt(2 * std::log(n)) : 0;
  // Faulty slow nodes (§5.1, §6.3), unless they were found and evicted (MegaScale's misc optimizations). The step
  // waits for the slowest GPU of all, so a faulty node costs its slowdown in place of the healthy maximum, not on
  // top of it. (The paper's own check, §6.3: evicting the ~10%-slow hosts gained about 0.7 MFU points; the
  // difference of the two is what eviction can gain.)
  if (job.tech.misc) return healthy;
  const double nodes = std::ceil(n / c.node_gpus());
  const double any_slow = 1 - std::pow(1 - c.straggler_node_fraction.value, nodes);
  return any_slow * std::max(healthy, c.straggler_slowdown.value) + (1 - any_slow) * healthy;
}

}  // namespace

std::vector<int> balanced_stage_layers(const Job& job, const Cluster& c) {
  const Layout& L = job.layout;
  const ModelConfig& m = job.model;
  const Techniques t = effective_techniques(job, c);
  const Shape shape{L.tp, L.micro_batch, L.seq};
  const int S = L.pp * L.virtual_stages;
  MT_CHECK(m.n_layer >= S, "{} layers cannot give each of {} virtual stages one", m.n_layer, S);
  auto total = [](const LayerCost& x) { return x.fwd.total() + x.bwd.total(); };
  // MoE: the mean layer (the greedy below assumes every layer costs the same; best_stage_layers refines).
  const double layer = m.moe() ? (total(layer_cost(m, c, shape, t)) * (m.n_layer - m.moe_layers()) +
                                  total(moe_layer_cost(m, c, shape, t, L.ep)) * m.moe_layers()) /
                                     m.n_layer
                               : total(layer_cost(m, c, shape, t));
  std::vector<double> extra(S, 0);
  extra[0] += total(embedding_cost(m, c, shape, t));
  extra[S - 1] += total(head_cost(m, c, shape, t));
  std::vector<int> n(S, 1);
  for (int given = S; given < m.n_layer; ++given) {
    int best = 0;
    for (int s = 1; s < S; ++s)
      if ((n[s] + 1) * layer + extra[s] < (n[best] + 1) * layer + extra[best]) best = s;
    ++n[best];
  }
  // Prefer the even split (no key to set) when it is as balanced.
  if (m.n_layer % S == 0) {
    const std::vector<int> even(S, m.n_layer / S);
    auto busiest = [&](const std::vector<int>& k) {
      double x = 0;
      for (int s = 0; s < S; ++s) x = std::max(x, k[s] * layer + extra[s]);
      return x;
    };
    if (busiest(even) <= busiest(n)) return even;
  }
  return n;
}

std::vector<int> best_stage_layers(const Job& job, const Cluster& c) {
  Job j = job;
  auto step = [&](const std::vector<int>& k) {
    j.layout.stage_layers = k;
    return predict_step_seconds(j, c);
  };
  std::vector<int> best = balanced_stage_layers(job, c);
  double best_s = step(best);
  const int S = static_cast<int>(best.size());
  if (job.model.n_layer % S == 0) {
    const std::vector<int> even(S, job.model.n_layer / S);
    if (const double e = step(even); e <= best_s) best = even, best_s = e;
  }
  for (bool improved = true; improved;) {
    improved = false;
    for (int s = 0; s + 1 < S; ++s)
      for (const auto& [from, to] : {std::pair{s, s + 1}, std::pair{s + 1, s}}) {
        if (best[from] == 1) continue;
        std::vector<int> k = best;
        --k[from];
        ++k[to];
        if (const double t = step(k); t < best_s) best = k, best_s = t, improved = true;
      }
  }
  return best;
}

namespace {
template <typename Bad>
void validate_ep(const Job& job, Bad bad) {
  const Layout& L = job.layout;
  const ModelConfig& m = job.model;
  if (L.ep < 1) bad(fmt::format("parallel.ep must be >= 1 (got {})", L.ep));
  if (L.ep > 1 && !m.moe())
    bad(fmt::format("parallel.ep = {} needs a mixture-of-experts model (model.moe_experts > 0): expert parallelism "
                    "shards the experts",
                    L.ep));
  if (L.dp % L.ep != 0)
    bad(fmt::format("parallel.ep = {} must divide parallel.dp = {} (the expert-parallel ranks are carved out of the "
                    "data-parallel ones)",
                    L.ep, L.dp));
  if (m.moe() && m.moe_experts % L.ep != 0)
    bad(fmt::format("parallel.ep = {} must divide model.moe_experts = {} (each rank holds moe_experts / ep experts)",
                    L.ep, m.moe_experts));
}
}  // namespace

void validate_job(const Job& job, const Cluster& c, int gpus) {
  const Layout& L = job.layout;
  const ModelConfig& m = job.model;
  auto bad = [](const std::string& what) { throw Error(what, ErrorKind::Config); };
  if (L.dp < 1 || L.pp < 1 || L.tp < 1)
    bad(fmt::format("parallel.dp, parallel.pp and parallel.tp must be >= 1 (got {}, {}, {})", L.dp, L.pp, L.tp));
  if (gpus > 0 && L.gpus() != gpus)
    bad(fmt::format("parallel.dp * parallel.pp * parallel.tp = {} * {} * {} = {} but --gpus is {}", L.dp, L.pp, L.tp,
                    L.gpus(), gpus));
  if (L.virtual_stages < 1) bad(fmt::format("parallel.virtual_stages must be >= 1 (got {})", L.virtual_stages));
  if (L.virtual_stages > 1 && L.pp < 2)
    bad(fmt::format("parallel.virtual_stages = {} needs parallel.pp >= 2", L.virtual_stages));
  if (L.stage_layers.empty() && m.n_layer % (L.pp * L.virtual_stages) != 0)
    bad(fmt::format("model.n_layer = {} is not divisible by parallel.pp * parallel.virtual_stages = {} * {}", m.n_layer,
                    L.pp, L.virtual_stages));
  try {
    stage_layer_counts(m, L.pp, L.virtual_stages, L.stage_layers);
  } catch (const Error& e) {
    bad(e.what());
  }
  if (L.microbatches < 1) bad(fmt::format("parallel.microbatches must be >= 1 (got {})", L.microbatches));
  if (L.virtual_stages > 1 && L.microbatches % L.pp != 0)
    bad(fmt::format("interleaved schedule: parallel.microbatches ({}) must be a multiple of parallel.pp ({})",
                    L.microbatches, L.pp));
  if (L.micro_batch < 1) bad(fmt::format("data.batch_size (the micro-batch) must be >= 1 (got {})", L.micro_batch));
  if (L.seq < 1 || L.seq > m.max_seq_len)
    bad(fmt::format("data.seq_len = {} must be in [1, model.max_seq_len = {}]", L.seq, m.max_seq_len));
  if (c.topology == "rail-clos" && L.tp > c.node_gpus() && L.tp % c.node_gpus() != 0)
    bad(fmt::format("parallel.tp = {} spans nodes of {} GPUs unevenly ({})", L.tp, c.node_gpus(), c.path));
  try {
    m.validate_tp(L.tp);
  } catch (const Error& e) {
    bad(e.what());
  }
  validate_ep(job, bad);
}

double predict_step_seconds(const Job& job, const Cluster& c, int* peak_in_flight) {
  validate_job(job, c);
  const Plan p = make_plan(job, c);
  const PipelineResult r = simulate_pipeline(p.schedule, p.costs);
  if (peak_in_flight) *peak_in_flight = r.peak_in_flight.empty() ? 1 : r.peak_in_flight[0];
  const double base = std::max(step_end(r, p) + p.optimizer, shared_cores_bound(job, c, p)) +
                      interference_seconds(p, c);
  return base * (1 + straggler_fraction(job, c)) + c.dp_sync_seconds(job.layout.dp);
}

Prediction predict(const Job& job, const Cluster& c) {
  validate_job(job, c);
  const Layout& L = job.layout;
  Plan p = make_plan(job, c);
  const PipelineResult full = simulate_pipeline(p.schedule, p.costs);
  const double t_full = step_end(full, p);

  // Again without data-parallel traffic, then also without point-to-point time.
  Plan q = p;
  q.costs.dp_all_gather.clear();
  q.costs.dp_reduce_scatter.clear();
  std::fill(q.dp_blocking_per_rank.begin(), q.dp_blocking_per_rank.end(), 0.0);
  std::fill(q.tp_sync_per_rank.begin(), q.tp_sync_per_rank.end(), 0.0);
  const PipelineResult no_dp = simulate_pipeline(q.schedule, q.costs);
  q.costs.p2p_seconds = 0;
  const PipelineResult no_comm = simulate_pipeline(q.schedule, q.costs);

  int busiest = 0;
  for (int r = 1; r < L.pp; ++r)
    if (no_comm.busy[r] > no_comm.busy[busiest]) busiest = r;
  const double m = L.microbatches;
  Prediction out;
  Breakdown& b = out.breakdown;
  b.compute = p.compute_per_rank[busiest] * m;
  // The replicated gradients' tp sums sit at the end of the step like the dp traffic; they count as tp.
  const double t_no_sync = step_end(full, p, false);
  b.tp = p.tp_per_rank[busiest] * m + std::max(0.0, t_full - t_no_sync);
  b.ep = p.ep_per_rank[busiest] * m;
  b.bubble = std::max(0.0, no_comm.makespan - no_comm.busy[busiest]);
  b.pp = std::max(0.0, no_dp.makespan - no_comm.makespan);
  b.dp = std::max(0.0, t_no_sync - no_dp.makespan);
  b.optimizer = p.optimizer;
  const double bound = shared_cores_bound(job, c, p);
  b.shared_cores = std::max(0.0, bound - (t_full + p.optimizer));
  b.interference = interference_seconds(p, c);
  const double base = std::max(t_full + p.optimizer, bound) + b.interference;
  b.straggler = base * straggler_fraction(job, c);
  b.dp_sync = c.dp_sync_seconds(L.dp);
  out.step_seconds = base + b.straggler + b.dp_sync;
  out.global_batch = L.global_batch();
  const double tokens = double(out.global_batch) * L.seq;
  out.model_flops_per_step = job.model.flops_per_token(L.seq) * tokens;
  out.tokens_per_second = tokens / out.step_seconds;
  out.mfu = out.model_flops_per_step / (out.step_seconds * L.gpus() * c.peak_flops());
  out.peak_in_flight = full.peak_in_flight.empty() ? 1 : full.peak_in_flight[0];
  out.memory = memory_per_gpu(job.model, Shape{L.tp, L.micro_batch, L.seq}, job.tech, L.dp, L.pp, L.virtual_stages,
                              out.peak_in_flight, L.stage_layers, L.ep);
  // A MoE model's pipeline ranks hold different layers (dense first layers, experts): the fullest one.
  for (int r = 1; job.model.moe() && r < L.pp && r < int(full.peak_in_flight.size()); ++r) {
    const MemoryBreakdown mr = memory_per_gpu(job.model, Shape{L.tp, L.micro_batch, L.seq}, job.tech, L.dp, L.pp,
                                              L.virtual_stages, full.peak_in_flight[r], L.stage_layers, L.ep, r);
    if (mr.total() > out.memory.total())
      out.memory = mr, out.memory_rank = r, out.peak_in_flight = full.peak_in_flight[r];
  }
  return out;
}

}  // namespace mt::perf
