#include "megatrain/perf/report.h"

#include <fmt/format.h>

#include <cmath>
#include <map>

namespace mt::perf {

using nlohmann::json;

namespace {
constexpr double kGiB = double(1 << 30);

json breakdown_json(const Breakdown& b) {
  return {{"compute", b.compute},
          {"tp", b.tp},
          {"ep", b.ep},
          {"pp", b.pp},
          {"dp", b.dp},
          {"bubble", b.bubble},
          {"optimizer", b.optimizer},
          {"straggler", b.straggler},
          {"shared_cores", b.shared_cores},
          {"dp_sync", b.dp_sync},
          {"interference", b.interference}};
}

std::string layout_str(const Layout& L) {
  return fmt::format("dp {}{} x pp {} x tp {} (v {}, {} micro-batches of {}{})", L.dp,
                     L.ep > 1 ? fmt::format(" (ep {})", L.ep) : std::string(), L.pp, L.tp, L.virtual_stages,
                     L.microbatches, L.micro_batch,
                     L.stage_layers.empty() ? std::string()
                                            : fmt::format(", stage layers {}", fmt::join(L.stage_layers, "+")));
}

std::string switches(const Job& j) {
  std::string s;
  auto add = [&](bool on, const std::string& name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(j.model.block == BlockKind::Parallel, "ptb");
  add(j.model.window > 0, fmt::format("swa({})", j.model.window));
  add(j.tech.tp_overlap, "tp-overlap");
  add(j.tech.pp_overlap, "pp-overlap");
  add(j.tech.dp_overlap, "dp-overlap");
  add(j.tech.fused_ops, "fused-ops");
  add(j.tech.misc, "misc");
  add(j.model.moe() && j.layout.ep > 1 && j.tech.ep_overlap, "ep-overlap");
  return (s.empty() ? "none" : s) + ", recompute " + recompute_name(j.tech.recompute);
}
}  // namespace

json to_json(const Job& j) {
  const Layout& L = j.layout;
  return {{"dp", L.dp},
          {"pp", L.pp},
          {"tp", L.tp},
          {"ep", L.ep},
          {"ep_overlap", j.tech.ep_overlap},
          {"virtual_stages", L.virtual_stages},
          {"stage_layers", L.stage_layers},
          {"microbatches", L.microbatches},
          {"micro_batch", L.micro_batch},
          {"seq", L.seq},
          {"gpus", L.gpus()},
          {"global_batch", L.global_batch()},
          {"ptb", j.model.block == BlockKind::Parallel},
          {"window", j.model.window},
          {"tp_overlap", j.tech.tp_overlap},
          {"pp_overlap", j.tech.pp_overlap},
          {"dp_overlap", j.tech.dp_overlap},
          {"fused_ops", j.tech.fused_ops},
          {"misc", j.tech.misc},
          {"recompute", recompute_name(j.tech.recompute)}};
}

json to_json(const Prediction& p) {
  const MemoryBreakdown& m = p.memory;
  return {{"step_seconds", p.step_seconds},
          {"mfu", p.mfu},
          {"tokens_per_second", p.tokens_per_second},
          {"model_flops_per_step", p.model_flops_per_step},
          {"global_batch", p.global_batch},
          {"breakdown", breakdown_json(p.breakdown)},
          {"memory_bytes",
           {{"params", m.params},
            {"grads", m.grads},
            {"optimizer", m.optimizer},
            {"activations", m.activations},
            {"experts", m.experts},
            {"total", m.total()}}},
          {"peak_in_flight_chunks", p.peak_in_flight},
          {"memory_rank", p.memory_rank}};
}

std::string format_prediction(const Job& j, const Prediction& p, const Cluster& c) {
  const Breakdown& b = p.breakdown;
  const MemoryBreakdown& m = p.memory;
  auto row = [&](const char* name, double s) {
    return fmt::format("  {:<22} {:>10.4f} s  {:>5.1f}%\n", name, s, 100 * s / p.step_seconds);
  };
  std::string out = fmt::format("cluster   {} ({})\nlayout    {} = {} GPUs, global batch {} x {} tokens\n", c.name,
                                c.path, layout_str(j.layout), j.layout.gpus(), p.global_batch, j.layout.seq);
  out += fmt::format("switches  {}\n\n", switches(j));
  out += fmt::format("step time {:.4f} s   MFU {:.1f}%{}   {:.4g} tokens/s\n\nbreakdown (busiest pipeline rank)\n",
                     p.step_seconds, 100 * p.mfu, j.model.moe() ? " (on the active parameters' FLOPs)" : "",
                     p.tokens_per_second);
  out += row("compute", b.compute) + row("exposed tp comm", b.tp) +
         (j.model.moe() ? row("exposed ep all-to-all", b.ep) : std::string()) + row("exposed pp comm", b.pp) +
         row("exposed dp comm", b.dp) + row("pipeline bubble", b.bubble) + row("optimizer", b.optimizer) +
         row("stragglers (expected)", b.straggler);
  if (b.shared_cores > 0) out += row("waiting for a core", b.shared_cores);
  if (b.dp_sync > 0) out += row("dp sync (calibrated)", b.dp_sync);
  if (b.interference > 0) out += row("overlap interference", b.interference);
  out += fmt::format("\nmemory per GPU (pipeline rank {}, {} chunks in flight{})\n", p.memory_rank, p.peak_in_flight,
                     j.model.moe() ? "; the fullest rank" : "");
  auto mrow = [&](const char* name, double bytes) {
    return fmt::format("  {:<22} {:>8.2f} GiB\n", name, bytes / kGiB);
  };
  out += mrow("parameters (bf16)", m.params) + mrow("gradients (fp32)", m.grads) +
         mrow(j.model.moe() ? "optimizer (ZeRO)" : "optimizer (ZeRO/dp)", m.optimizer) +
         mrow("activations", m.activations) + mrow("total", m.total());
  if (j.model.moe())
    out += fmt::format("  of which the routed experts' weights, gradients and optimizer state {:.2f} GiB ({} of {} "
                       "experts a layer; optimizer state over dp / ep = {})\n",
                       m.experts / kGiB, j.model.moe_experts / j.layout.ep, j.model.moe_experts,
                       j.layout.dp / j.layout.ep);
  if (m.total() > c.memory_gib.value * kGiB)
    out += fmt::format("  WARNING: exceeds the {} GiB of one GPU\n", c.memory_gib.value);
  return out;
}

json table2_json(const std::vector<PresetRow>& rows, const std::vector<Prediction>& preds) {
  json out = json::array();
  for (size_t i = 0; i < rows.size(); ++i)
    out.push_back({{"gpus", rows[i].gpus},
                   {"batch", rows[i].batch},
                   {"system", rows[i].label},
                   {"mfu_predicted", preds[i].mfu},
                   {"mfu_paper", rows[i].paper_mfu},
                   {"mfu_error_points", 100 * (preds[i].mfu - rows[i].paper_mfu)},
                   {"step_seconds_predicted", preds[i].step_seconds},
                   {"step_seconds_paper", rows[i].paper_seconds},
                   {"breakdown", breakdown_json(preds[i].breakdown)}});
  return out;
}

std::string format_table2(const std::vector<PresetRow>& rows, const std::vector<Prediction>& preds) {
  std::string out = "MegaScale Table 2: 175B, tp 8, pp 8, v 6, seq 2048 (paper figures beside predictions)\n";
  out += fmt::format("{:<10} {:>6} {:>6} | {:>8} {:>8} {:>7} | {:>7} {:>7} {:>7}\n", "system", "GPUs", "batch",
                     "s pred", "s paper", "err %", "MFU pr", "MFU pa", "err pt");
  double worst = 0, sum = 0;
  int within = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const double e = 100 * (preds[i].mfu - rows[i].paper_mfu);
    worst = std::max(worst, std::fabs(e));
    sum += std::fabs(e);
    within += std::fabs(e) <= 2.0;
    out += fmt::format("{:<10} {:>6} {:>6} | {:>8.2f} {:>8.2f} {:>+7.1f} | {:>6.1f}% {:>6.1f}% {:>+7.1f}\n",
                       rows[i].label, rows[i].gpus, rows[i].batch, preds[i].step_seconds, rows[i].paper_seconds,
                       100 * (preds[i].step_seconds / rows[i].paper_seconds - 1), 100 * preds[i].mfu,
                       100 * rows[i].paper_mfu, e);
  }
  out += fmt::format("{} of {} rows within 2 MFU points; mean |error| {:.2f} points, worst {:.2f}\n", within,
                     rows.size(), sum / rows.size(), worst);
  return out;
}

json table3_json(const std::vector<PresetRow>& rows, const std::vector<Prediction>& preds) {
  json out = json::array();
  for (size_t i = 0; i < rows.size(); ++i) {
    json r = {{"step", rows[i].label},
              {"gpus", rows[i].gpus},
              {"batch", rows[i].batch},
              {"mfu_predicted", preds[i].mfu},
              {"mfu_paper", rows[i].paper_mfu},
              {"step_seconds_predicted", preds[i].step_seconds},
              {"breakdown", breakdown_json(preds[i].breakdown)}};
    if (i > 0) {
      r["delta_predicted"] = preds[i].mfu - preds[i - 1].mfu;
      r["delta_paper"] = rows[i].paper_mfu - rows[i - 1].paper_mfu;
    }
    out.push_back(r);
  }
  return out;
}

std::string format_table3(const std::vector<PresetRow>& rows, const std::vector<Prediction>& preds) {
  std::string out = "MegaScale Table 3: ablation, 175B on 256 GPUs, batch 256 (last row: batch 768)\n";
  out += fmt::format("{:<24} | {:>7} {:>7} | {:>8} {:>8}\n", "step", "MFU pr", "MFU pa", "step pr", "step pa");
  for (size_t i = 0; i < rows.size(); ++i) {
    std::string dp = i ? fmt::format("{:+.1f}", 100 * (preds[i].mfu - preds[i - 1].mfu)) : "";
    std::string dq = i ? fmt::format("{:+.1f}", 100 * (rows[i].paper_mfu - rows[i - 1].paper_mfu)) : "";
    out += fmt::format("{:<24} | {:>6.1f}% {:>6.1f}% | {:>8} {:>8}\n", rows[i].label, 100 * preds[i].mfu,
                       100 * rows[i].paper_mfu, dp, dq);
  }
  return out;
}

json to_json(const SearchResult& r, int top) {
  json ranked = json::array();
  for (size_t i = 0; i < r.ranked.size() && int(i) < top; ++i)
    ranked.push_back({{"layout", to_json(r.ranked[i].job)},
                      {"step_seconds", r.ranked[i].step_seconds},
                      {"mfu", r.ranked[i].mfu},
                      {"memory_bytes", r.ranked[i].memory_bytes}});
  return {{"considered", r.considered}, {"over_memory", r.over_memory}, {"simulated", r.simulated}, {"ranked", ranked}};
}

// A split as runs, e.g. [1, 2x40, 1x15]; "even" for none.
static std::string stage_layers_text(const std::vector<int>& k) {
  if (k.empty()) return "even";
  std::string out;
  for (size_t i = 0; i < k.size();) {
    size_t j = i;
    while (j < k.size() && k[j] == k[i]) ++j;
    out += fmt::format("{}{}{}", out.empty() ? "" : ", ", k[i], j - i > 1 ? fmt::format("x{}", j - i) : "");
    i = j;
  }
  return "[" + out + "]";
}

std::string format_search(const SearchResult& r, const Cluster& c, int top) {
  const bool moe = !r.ranked.empty() && r.ranked.front().job.model.moe();
  std::string out = fmt::format("{:>3} {:>5} {:>3} {:>3}{} {:>2} {:>5} {:>3} {:<10} | {:>8} {:>6} {:>8} | {}\n", "#",
                                "dp", "pp", "tp", moe ? "  ep" : "", "v", "micro", "mbs", "recompute", "step s",
                                moe ? "MFU*" : "MFU", "mem GiB", "layers");
  for (size_t i = 0; i < r.ranked.size() && int(i) < top; ++i) {
    const Candidate& cand = r.ranked[i];
    const Layout& L = cand.job.layout;
    out += fmt::format("{:>3} {:>5} {:>3} {:>3}{} {:>2} {:>5} {:>3} {:<10} | {:>8.3f} {:>5.1f}% {:>8.1f} | {}\n", i + 1,
                       L.dp, L.pp, L.tp, moe ? fmt::format(" {:>3}", L.ep) : std::string(), L.virtual_stages,
                       L.microbatches, L.micro_batch, recompute_name(cand.job.tech.recompute), cand.step_seconds,
                       100 * cand.mfu, cand.memory_bytes / kGiB, stage_layers_text(L.stage_layers));
  }
  if (moe) out += "(* MFU on the active parameters' FLOPs: router, top-k and shared experts per token)\n";
  return out + explain(r, c);
}

json to_json(const GroupInitCost& g, const CheckpointCost& k, const Availability& a, const Cluster& c) {
  json basis = json::object();
  for (const FigureBasis& b : figure_bases(c)) basis[b.figure] = {{"prediction", b.prediction}, {"note", b.note}};
  return {{"group_init",
           {{"groups", g.groups},
            {"requests_quadratic", g.requests_quadratic},
            {"requests_linear", g.requests_linear},
            {"seconds_tcpstore_quadratic", g.seconds_quadratic},
            {"seconds_redis_quadratic", g.seconds_async},
            {"seconds_redis_linear", g.seconds_linear}}},
          {"checkpoint",
           {{"bytes_per_gpu", k.bytes_per_gpu},
            {"stall_seconds", k.stall_seconds},
            {"persist_seconds", k.persist_seconds},
            {"recovery_naive_seconds", k.recovery_naive_seconds},
            {"recovery_seconds", k.recovery_seconds}}},
          {"availability",
           {{"job_mtbf_hours", a.job_mtbf_hours},
            {"checkpoint_interval_seconds", a.interval_seconds},
            {"lost_per_failure_seconds", a.lost_per_failure_s},
            {"effective_training_fraction", a.effective_fraction}}},
          {"basis", basis}};
}

std::string format_scale(const GroupInitCost& g, const CheckpointCost& k, const Availability& a, const Layout& L,
                         const Cluster& c) {
  std::map<std::string, std::string> why;
  for (const FigureBasis& b : figure_bases(c)) why[b.figure] = "      (" + b.note + ")\n";
  std::string out = fmt::format("scale costs at {} GPUs\n", L.gpus());
  out += fmt::format("  group init: {:.0f} groups; O(n^2) store traffic {:.3g} requests: {:.1f} s on TCPStore, {:.1f} "
                     "s on Redis; O(n) {:.3g} requests: {:.2f} s\n",
                     g.groups, g.requests_quadratic, g.seconds_quadratic, g.seconds_async, g.requests_linear,
                     g.seconds_linear) +
         why["group_init"];
  out += fmt::format("  checkpoint: {:.2f} GiB per GPU; stall {:.1f} s (device -> host)\n", k.bytes_per_gpu / kGiB,
                     k.stall_seconds) +
         why["checkpoint_stall"];
  out += fmt::format("    persist {:.0f} s in the background\n", k.persist_seconds) + why["checkpoint_persist"];
  out += fmt::format("    recovery {:.0f} s (one reader per dp group) against {:.0f} s (every GPU reads)\n",
                     k.recovery_seconds, k.recovery_naive_seconds) +
         why["recovery"];
  out += fmt::format("  failures: job MTBF {:.1f} h; checkpoint every {:.0f} s; {:.0f} s lost per failure; effective "
                     "training time {:.1f}%\n",
                     a.job_mtbf_hours, a.interval_seconds, a.lost_per_failure_s, 100 * a.effective_fraction) +
         why["availability"];
  return out;
}

std::string format_constants(const Cluster& c) {
  std::string out = fmt::format("constants of {} ({}):\n", c.name, c.path);
  for (auto& [k, s] : c.constants())
    out += s.value != 0 || k.rfind("efficiency.gemm", 0) != 0
               ? fmt::format("  {} = {:g}\n      source: {}\n", k, s.value, s.source)
               : fmt::format("  {}\n      source: {}\n", k, s.source);
  return out;
}

}  // namespace mt::perf
