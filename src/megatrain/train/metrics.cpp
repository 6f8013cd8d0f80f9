#include "megatrain/train/metrics.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <sstream>

#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"
#include "megatrain/kernels/ops.h"
#include "megatrain/train/run_config.h"

namespace mt {

void MetricsLog::open(const std::string& path, int resumed_step) {
  if (f_) std::fclose(f_);
  f_ = nullptr;
  if (resumed_step > 0 && file_exists(path)) {
    std::string kept;
    std::istringstream in(read_text_file(path));
    int dropped = 0;
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      // A torn last line (a crash mid-write) is dropped like a step past the resume point.
      const bool past = j.is_discarded() ||
                        (j.contains("step") && j["step"].is_number() && j["step"].get<int>() > resumed_step);
      if (past) {
        ++dropped;
        continue;
      }
      kept += line + "\n";
    }
    if (dropped > 0) write_file_atomic(path, kept);
  }
  f_ = std::fopen(path.c_str(), resumed_step > 0 ? "a" : "w");
  MT_CHECK(f_, "cannot open metrics file {}: {}", path, std::strerror(errno));
}

MetricsLog::~MetricsLog() {
  if (f_) std::fclose(f_);
}

void MetricsLog::write(const nlohmann::json& j) {
  if (!f_) return;
  std::string s = j.dump() + "\n";
  std::fwrite(s.data(), 1, s.size(), f_);
  std::fflush(f_);
}

nlohmann::json MetricsLog::to_json(const StepReport& r) {
  const StepStats& s = r.stats;
  // The loss is also written with 9 significant digits (float round-trip) so runs can be compared exactly.
  nlohmann::json j = {
      {"kind", "train"},
      {"step", s.step},
      {"loss", s.loss},
      {"loss_exact", fmt::format("{:.9g}", s.loss)},
      {"lr", s.lr},
      {"grad_norm", s.grad_norm},
      {"step_seconds", s.step_seconds},
      {"tokens_per_second", s.tokens_per_second},
      {"model_tflops", s.model_flops_per_second / 1e12},
      {"mfu", s.mfu},
      // This rank's communication per plane: busy = the ops' execution time, exposed = the time the
      // step waited for them (not hidden behind compute).
      {"comm_busy_s",
       {{"dp", r.dp.busy_seconds}, {"tp", r.tp.busy_seconds}, {"pp", r.pp.busy_seconds}, {"ep", r.ep.busy_seconds}}},
      {"comm_exposed_s",
       {{"dp", r.dp.exposed_seconds},
        {"tp", r.tp.exposed_seconds},
        {"pp", r.pp.exposed_seconds},
        {"ep", r.ep.exposed_seconds}}},
      {"memory_gb", static_cast<double>(r.memory_bytes) / 1e9}};
  if (!r.blend_epochs.empty()) j["blend_epochs"] = r.blend_epochs;  // how often each source's data has been seen
  if (r.straggler) {                                                // straggler coding (train/coded_forward_backward.h)
    const StragglerStepReport& g = *r.straggler;
    nlohmann::json late = nlohmann::json::array();
    for (const auto& [round, replica] : g.stragglers) late.push_back({{"round", round}, {"replica", replica}});
    j["straggler"] = {{"stragglers", late},
                      {"rounds", g.rounds},
                      {"rounds_waited", g.rounds_waited},
                      {"microbatches_computed", g.microbatches_computed},
                      {"microbatches_recomputed", g.microbatches_recomputed},
                      {"redundancy", g.redundancy},
                      {"seconds_saved", g.seconds_saved}};
  }
  if (!r.moe.empty()) {
    // Per MoE layer: assignments routed to each expert (before any capacity drop) and those dropped.
    nlohmann::json layers = nlohmann::json::array();
    for (const MoeLayerStats& m : r.moe)
      layers.push_back({{"layer", m.layer},
                        {"tokens_per_expert", m.tokens},
                        {"dropped", m.dropped},
                        {"aux", m.forwards ? m.aux / m.forwards : 0.0},
                        {"z", m.forwards ? m.z / m.forwards : 0.0}});
    j["moe"] = layers;
    j["moe_loss"] = r.moe_loss;
  }
  return j;
}

void MetricsLog::on_run_start(const RunStart& r) {
  write({{"kind", "run"},
         {"config", r.cfg ? r.cfg->source : ""},
         {"params", r.params},
         {"peak_flops", r.peak_flops},
         {"peak_source", r.peak_source},
         {"blas_core", r.blas_core},
         {"start_step", r.start_step},
         {"threads", r.threads},
         {"world_size", r.world_size},
         {"dp", r.dp},
         {"pp", r.pp},
         {"tp", r.tp},
         {"resumed_from", r.resumed_from}});
}

void MetricsLog::on_eval(int step, double val_loss) {
  write({{"kind", "val"}, {"step", step}, {"val_loss", val_loss}});
}

// A blend: one line per source before the "val" line ({"kind": "val_source", "dir", "share", "val_loss"}).
void MetricsLog::on_eval_sources(int step, const std::vector<SourceLoss>& losses) {
  for (const SourceLoss& l : losses)
    write({{"kind", "val_source"}, {"step", step}, {"dir", l.dir}, {"share", l.share}, {"val_loss", l.loss}});
}

void MetricsLog::on_checkpoint(int step, const std::string& dir, const std::string& why) {
  write({{"kind", "checkpoint"}, {"step", step}, {"dir", dir}, {"why", why}});
}

// {"kind": "checkpoint_event", "stage": ...}: every stage of every save; the "checkpoint" line above is written only
// for a committed one.
void MetricsLog::on_checkpoint_event(const CheckpointEvent& e) {
  nlohmann::json j = {{"kind", "checkpoint_event"},
                      {"step", e.step},
                      {"stage", kind_name(e.stage)},
                      {"why", kind_name(e.why)},
                      {"seconds", e.seconds}};
  if (!e.dir.empty()) j["dir"] = e.dir;
  if (!e.message.empty())
    j["message"] = nlohmann::json::parse(nlohmann::json(e.message).dump(-1, ' ', false,
                                                                        nlohmann::json::error_handler_t::replace));
  write(j);
}

void MetricsLog::on_sample(int step, const std::string& text, const std::vector<int32_t>& tokens) {
  // A sample may end inside a multi-byte character: the log's copy has invalid UTF-8 replaced (U+FFFD).
  const auto clean = nlohmann::json::parse(nlohmann::json(text).dump(-1, ' ', false,
                                                                     nlohmann::json::error_handler_t::replace));
  write({{"kind", "sample"}, {"step", step}, {"text", clean}, {"tokens", tokens}});
}

void MetricsLog::on_error(int step, ErrorKind kind, const std::string& what) {
  const auto msg = nlohmann::json::parse(nlohmann::json(what).dump(-1, ' ', false,
                                                                   nlohmann::json::error_handler_t::replace));
  write({{"kind", "error"},
         {"step", step},
         {"error_kind", kind_name(kind)},
         {"exit_code", exit_code(kind)},
         {"message", msg}});
}

std::string ProgressPrinter::progress_line(const StepReport& r) {
  const StepStats& s = r.stats;
  return fmt::format("step {:>6}/{} | loss {:.4f} | lr {:.2e} | gnorm {:.3f} | {:>8.0f} tok/s | {:.3f} TFLOP/s | "
                     "MFU {:.1f}% | {:.0f} ms | mem {:.2f} GB",
                     s.step, s.total_steps, s.loss, s.lr, s.grad_norm, s.tokens_per_second,
                     s.model_flops_per_second / 1e12, 100.0 * s.mfu, 1000.0 * s.step_seconds,
                     static_cast<double>(r.memory_bytes) / 1e9);
}

void ProgressPrinter::on_run_start(const RunStart& r) {
  first_ = r.start_step + 1;
  const RunConfig& c = *r.cfg;
  // On a GPU, which attention runs ("auto" resolved): the two differ several-fold in speed.
  const std::string attention =
      c.train.device == Device::CUDA
          ? fmt::format(", attention {}{}{}", resolve_cuda_attention(kind_name(c.train.attention)),
                        c.train.gemm_tuning > 0 ? fmt::format(", GEMMs tuned over {} candidates", c.train.gemm_tuning)
                                                : "",
                        c.train.deterministic ? ", deterministic" : "")
          : "";
  fmt::print("model: {} layers, d_model {}, {} heads, block {}, window {}{}, {:.2f}M params | data: {}, "
             "B={}x{} T={} accum={}{} | {} threads/rank | MFU vs {:.1f} GFLOP/s ({}, {} rank(s)){}\n",
             c.model.n_layer, c.model.d_model, c.model.n_head, kind_name(c.model.block), c.model.window, attention,
             r.params / 1e6,
             c.data.blend.empty() ? fmt::format("{} train tokens", r.train_tokens)
                                  : fmt::format("{} train tokens ({})", r.train_tokens, blend_description(c.data)),
             r.dp, c.data.batch_size, c.data.seq_len, c.train.grad_accum,
             r.pp > 1 ? fmt::format(" | pipeline pp={} v={} microbatches={}{}", r.pp, c.parallel.virtual_stages,
                                    c.pipeline_microbatches(),
                                    c.parallel.stage_layers.empty()
                                        ? std::string()
                                        : fmt::format(" stage layers {}", fmt::join(c.parallel.stage_layers, "+")))
                      : "",
             r.threads, r.peak_flops / 1e9, r.peak_source, r.world_size,
             r.blas_core.empty() ? "" : " | " + r.blas_core);
}

void ProgressPrinter::on_sample(int, const std::string& text, const std::vector<int32_t>&) {
  fmt::print("---- sample ----\n{}\n----------------\n", text);
}

void ProgressPrinter::on_step(const StepReport& r) {
  const StepStats& s = r.stats;
  if (s.step % log_every_ == 0 || s.step == first_ || s.step == s.total_steps) fmt::print("{}\n", progress_line(r));
}

void ProgressPrinter::on_eval(int step, double val_loss) {
  fmt::print("step {:>6} | val loss {:.4f}\n", step, val_loss);
}

void ProgressPrinter::on_eval_sources(int step, const std::vector<SourceLoss>& losses) {
  std::vector<std::string> parts;
  for (const SourceLoss& l : losses) parts.push_back(fmt::format("{} {:.4f} ({:.3g}%)", l.dir, l.loss, 100 * l.share));
  fmt::print("step {:>6} | val loss by source: {}\n", step, fmt::join(parts, ", "));
}

}  // namespace mt
