#include "megatrain/train/checkpoint/shared_dir.h"

#include <fmt/format.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <system_error>
#include <vector>

#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"

namespace mt {

void check_shared_dir(const RunConfig& cfg, DeviceMesh* mesh, Agreement& agreement) {
  if (!mesh) return;
  const bool main_rank = mesh->rank() == 0;
  const std::string probe = cfg.ckpt.dir + "/.megatrain-shared-probe";
  std::string nonce, err;
  if (main_rank) {
    nonce = std::to_string((uint64_t{std::random_device{}()} << 32) ^ std::random_device{}() ^
                           static_cast<uint64_t>(now_seconds() * 1e6));
    try {
      write_file_atomic(probe, nonce);
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  nonce = agreement.broadcast(nonce, 0);  // rank 0's nonce, everywhere
  if (!main_rank) {
    std::ifstream f(probe);
    std::string seen;
    if (!(f >> seen) || seen != nonce) err = f ? "it holds another run's probe" : "it is not there";
  }
  const std::vector<int> bad = agreement.which_ranks(!err.empty());
  if (main_rank) {
    std::error_code ec;
    std::filesystem::remove(probe, ec);
  }
  if (bad.empty()) return;
  if (!err.empty()) fmt::print(stderr, "ckpt.dir {}: the probe file rank 0 wrote there: {}\n", cfg.ckpt.dir, err);
  fail_as(ErrorKind::Config,
          "ckpt.dir {} is not one directory for every rank: rank(s) {} do not see the file "
          "rank 0 wrote there. Sharded checkpoints need a file system every rank shares (or ckpt.sharded=false: "
          "rank 0 writes them alone)",
          cfg.ckpt.dir, fmt::join(bad, ", "));
}

}  // namespace mt
