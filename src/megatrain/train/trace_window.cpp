#include "megatrain/train/trace_window.h"

#include <fmt/format.h>

#include <filesystem>

#include "megatrain/comm/agreement.h"
#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"
#include "megatrain/obs/chrome_trace.h"
#include "megatrain/obs/timeline.h"
#include "megatrain/obs/trace_check.h"

namespace mt {

TraceWindow::TraceWindow(const RunConfig& cfg, Topology& topo) : cfg_(cfg), topo_(topo) {
  if (cfg.train.trace_steps.size() != 2) return;
  first_ = cfg.train.trace_steps[0];
  last_ = cfg.train.trace_steps[1];
  dir_ = cfg.train.out_dir + "/trace";
  with_kind(ErrorKind::IO, [&] { std::filesystem::create_directories(dir_); });
  if (topo.host_mesh) clock_ = clock_offset_to_rank0(*topo.host_mesh);
  if (topo.main_rank)
    fmt::print("timeline: steps {}-{} -> {}/rank<R>.json, merged into {}/trace.json\n", first_, last_, dir_,
               cfg.train.out_dir);
}

TraceWindow::~TraceWindow() {
  if (!open_) return;
  obs::timeline().set_on(false);
  try {
    write();
  } catch (const std::exception& e) {
    fmt::print(stderr, "timeline: could not write this rank's trace: {}\n", e.what());
  }
}

void TraceWindow::before_step(int step) {
  if (!enabled() || done_ || open_ || step < first_ || step > last_) return;
  obs::timeline().take();  // nothing from before the window
  device_ = topo_.ops->device() != Device::CPU;
  if (device_) {
    topo_.ops->synchronize();  // an idle device: the first timed op starts as it is enqueued (op_timing_base)
    topo_.ops->set_op_timing(true);
  }
  obs::timeline().set_on(true);
  open_ = true;
  first_recorded_ = step;
}

void TraceWindow::drain_device() {
  if (!device_) return;
  const double base = topo_.ops->op_timing_base();
  for (const OpTiming& t : topo_.ops->take_op_timings()) {
    const double t0 = base + t.start_ms / 1e3;
    obs::timeline().add(obs::Span{t.name, "device", "device", t0, t0 + t.ms / 1e3, nullptr});
  }
}

void TraceWindow::after_step(int step) {
  if (!open_) return;
  last_recorded_ = step;
  drain_device();  // every step, so the backend's ring of event pairs (4096 ops) never fills
  if (step < last_) return;
  finish();
}

void TraceWindow::finish() {
  if (!open_) return;
  if (device_) {
    topo_.ops->synchronize();
    drain_device();
    topo_.ops->set_op_timing(false);
  }
  obs::timeline().set_on(false);
  open_ = false;
  done_ = true;
  // The timeline is for looking at a run, never a reason to end one: a file that cannot be written or merged is
  // reported, and training goes on (and this rank still meets the others below).
  try {
    write();
  } catch (const Error& e) {
    fmt::print(stderr, "timeline: rank {} could not write its trace ({}); training goes on\n", topo_.rank_info.rank,
               e.what());
  }
  // Every rank closes the window at the same step, so they all meet here before the main rank reads their files.
  Agreement(topo_.host_mesh.get()).barrier();
  if (!topo_.main_rank) return;
  try {
    merge();
  } catch (const Error& e) {
    fmt::print(stderr, "timeline: could not merge the ranks' traces ({}); training goes on\n", e.what());
  }
}

void TraceWindow::write() {
  obs::RankTrace info;
  info.rank = topo_.rank_info.rank;
  info.world = topo_.rank_info.world_size;
  info.label = fmt::format("rank {} (dp {}, pp {}, tp {})", info.rank, topo_.coord.dp, topo_.coord.pp, topo_.coord.tp);
  info.dp = topo_.coord.dp, info.pp = topo_.coord.pp, info.tp = topo_.coord.tp;
  info.clock_offset_s = clock_.offset_s;
  info.clock_error_s = clock_.error_s;
  info.dropped = obs::timeline().dropped();
  info.first_step = first_recorded_;
  info.last_step = last_recorded_;
  const auto spans = obs::timeline().take();
  with_kind(ErrorKind::IO, [&] { obs::write_rank_trace(fmt::format("{}/rank{}.json", dir_, info.rank), info, spans); });
  if (info.dropped)
    fmt::print(stderr, "timeline: rank {} dropped {} spans beyond the limit of {}\n", info.rank, info.dropped,
               obs::Timeline::kDefaultLimit);
}

void TraceWindow::merge() {
  // The merge runs on the main rank's training thread while the others go on to the next step and wait for it in
  // their first collective, so a large job's traces are left to `megatrain trace merge`, off the job's clock.
  constexpr uintmax_t kAutoMergeBytes = uintmax_t{256} << 20;
  const int world = topo_.rank_info.world_size;
  uintmax_t bytes = 0;
  for (int r = 0; r < world; ++r) {
    const std::string f = fmt::format("{}/rank{}.json", dir_, r);
    std::error_code ec;
    const uintmax_t n = std::filesystem::file_size(f, ec);
    if (ec) {
      fmt::print("timeline: rank {}'s trace is not in {} (another host?); gather the rank files and run "
                 "`megatrain trace merge DIR...`\n",
                 r, dir_);
      return;
    }
    bytes += n;
  }
  if (bytes > kAutoMergeBytes) {
    fmt::print("timeline: the {} rank files in {} hold {:.0f} MiB, more than is merged during training ({} MiB); "
               "run `megatrain trace merge {}`\n",
               world, dir_, bytes / 1048576.0, kAutoMergeBytes >> 20, dir_);
    return;
  }
  const obs::MergedTrace m = obs::merge_rank_traces({dir_});
  const std::string out = cfg_.train.out_dir + "/trace.json";
  with_kind(ErrorKind::IO, [&] { write_file_atomic(out, obs::to_chrome(m).dump()); });
  fmt::print("timeline: {} spans of {} ranks, steps {}-{} -> {} (open in ui.perfetto.dev)\n", m.events.size(),
             m.ranks.size(), first_recorded_, last_recorded_, out);
  fmt::print("{}", obs::format_report(m, obs::check_trace(m)));
}

}  // namespace mt
