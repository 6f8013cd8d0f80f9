#include "megatrain/train/output_dirs.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "megatrain/ckpt/checkpoint.h"
#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"

namespace mt {
namespace {

// A checkpoint is the fp32 parameters and both optimizer moments, about 12 bytes a parameter whatever the layout.
// Up to keep_last + 1 are on disk at once (the oldest goes once the new one is committed). When the file system
// holding ckpt.dir has less room than that, say so at start: a save that does not fit fails, and the run goes on
// without it, which nobody should learn from the first failed save hours in.
void warn_if_checkpoints_will_not_fit(const RunConfig& cfg) {
  std::error_code ec;
  const std::filesystem::space_info sp = std::filesystem::space(cfg.ckpt.dir, ec);
  if (ec) return;
  const double each = 12.0 * static_cast<double>(cfg.model.num_params());
  const int there = static_cast<int>(std::min<size_t>(list_checkpoints(cfg.ckpt.dir).size(), cfg.ckpt.keep_last));
  const int more = cfg.ckpt.keep_last + 1 - there;
  if (static_cast<double>(sp.available) >= each * more) return;
  fmt::print(stderr,
             "warning: ckpt.dir {} has {:.2f} GB free, but a checkpoint of this model takes about {:.2f} GB "
             "and up to {} are on disk at once (ckpt.keep_last {} and the one being written; {} there now): about "
             "{:.2f} GB more. A save that does not fit fails, and the run goes on without it\n",
             cfg.ckpt.dir, static_cast<double>(sp.available) / 1e9, each / 1e9, cfg.ckpt.keep_last + 1,
             cfg.ckpt.keep_last, there, each * more / 1e9);
}

}  // namespace

// The main rank makes the output directories before the first step, and proves the checkpoint directory takes a
// file when the run will write checkpoints. A path that cannot be used (under a file, on a read-only mount, without
// permission) is then a config error at once, not a periodic checkpoint failing at every save while the run goes on
// (it tolerates a failed save: a disk may fill for a while) and the run failing at its end.
void prepare_output_dirs(const RunConfig& cfg) {
  auto usable = [](const char* key, const std::string& dir, bool write) {
    try {
      std::filesystem::create_directories(dir);
      if (write) {
        const std::string probe = dir + "/.megatrain-write-probe";
        write_file_atomic(probe, "ok");
        std::filesystem::remove(probe);
      }
    } catch (const std::exception& e) {
      fail_as(ErrorKind::Config, "{} = '{}' cannot be used: {}", key, dir, e.what());
    }
  };
  usable("train.out_dir", cfg.train.out_dir, false);
  if (cfg.ckpt.every > 0 || cfg.ckpt.save_final) {
    usable("ckpt.dir", cfg.ckpt.dir, true);
    warn_if_checkpoints_will_not_fit(cfg);
  }
}

}  // namespace mt
