#include "megatrain/train/ckpt_async.h"

#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <thread>

#include "megatrain/ckpt/checkpoint.h"
#include "megatrain/core/clock.h"
#include "megatrain/core/fs.h"

namespace mt {

namespace fs = std::filesystem;

void CkptAsyncState::event(CheckpointEvent e) {
  std::lock_guard<std::mutex> lk(mu);
  events.push_back(std::move(e));
}

// The staging directories of saves that never committed (a kill inside stage 2): only one save is in flight at a
// time, so once one has committed every other step_*.tmp-sharded is dead and only holds disk space.
static void remove_stale_staging(const std::string& root) {
  std::error_code ec;
  for (auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("step_", 0) == 0 && n.size() > 12 && n.ends_with(".tmp-sharded")) fs::remove_all(e.path(), ec);
  }
}

void persist_snapshot(CkptAsyncState& st, int slot, SaveWhy why, double t_snapshot) {
  const ShardSnapshot& s = st.own[slot];
  const int step = static_cast<int>(s.step());
  auto ev = [&](CheckpointStage stage, std::string dir = "", std::string msg = "") {
    st.event({step, stage, why, std::move(dir), std::move(msg), now_seconds() - t_snapshot});
  };
  try {
    if (st.stage2_delay_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(st.stage2_delay_s));
    std::string dir;
    if (st.single) {
      // One process: the format-1 checkpoint a synchronous save writes (model.safetensors + optim.safetensors),
      // from the snapshot's memory. save_checkpoint commits it (rename, latest) itself.
      CheckpointFiles files;
      for (const ShardPiece& p : s.pieces())
        files[p.group].push_back(TensorRef{p.tensor, p.dtype, p.slice.extent, p.data});
      SaveOptions so;
      so.keep_last = st.keep_last;
      so.protect = st.protect;
      dir = save_checkpoint(st.root, step, files, s.extra(), so);
      ev(CheckpointStage::Persisted);
    } else {
      s.write_into(sharded_staging_dir(st.root, step));
      ev(CheckpointStage::Persisted);
      if (st.main_rank) {
        const std::string problem = wait_for_shards(st.root, step, st.files, st.commit_timeout_s);
        MT_CHECK(problem.empty(), "{}", problem);
        SaveOptions so;
        so.keep_last = st.keep_last;
        so.protect = st.protect;
        dir = commit_sharded_checkpoint(st.root, step, st.files, s.extra(), so);
        remove_stale_staging(st.root);
      }
    }
    if (st.main_rank) {
      fmt::print("checkpoint ({}) step {} -> {}{} committed {:.2f} s after its snapshot\n", kind_name(why), step, dir,
                 st.single ? "" : fmt::format(" ({} shard files)", st.files.size()), now_seconds() - t_snapshot);
      std::fflush(stdout);
      ev(CheckpointStage::Committed, dir);
    }
    std::lock_guard<std::mutex> lk(st.mu);
    st.persist_failed = false;
    st.committed_dir = dir;
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    if (!st.single) {
      if (!st.main_rank) {
        write_shard_failure(st.root, step, s.file(), msg);
      } else {
        std::error_code ec;  // nothing of it counts; free its space (a full disk is a likely cause)
        fs::remove_all(sharded_staging_dir(st.root, step), ec);
      }
    }
    const auto latest = find_latest(st.root);
    fmt::print(stderr,
               "checkpoint ({}) step {} FAILED in stage 2 ({}): {}; training goes on, the latest checkpoint "
               "is still {}\n",
               kind_name(why), step, st.main_rank ? "writing or committing" : "writing this rank's shard", msg,
               latest ? *latest : std::string("(none)"));
    std::fflush(stderr);
    ev(CheckpointStage::Failed, "", msg);
    std::lock_guard<std::mutex> lk(st.mu);
    st.persist_failed = true;
    st.persist_message = msg;
  }
}

void exchange_snapshot(CkptAsyncState& st, int slot) {
  st.held_ok[slot] = false;
  try {
    st.peers->exchange(st.own[slot], st.held[slot]);
    st.held_ok[slot] = true;
  } catch (const Error& e) {
    std::lock_guard<std::mutex> lk(st.mu);
    st.exchange_error = e.what();
    st.exchange_kind = e.kind == ErrorKind::Internal ? ErrorKind::PeerLost : e.kind;
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lk(st.mu);
    st.exchange_error = e.what();
    st.exchange_kind = ErrorKind::PeerLost;
  }
}

static std::string snapshots_root(const std::string& root) { return (fs::path(root) / "snapshots").string(); }

// The step of the checkpoint `latest` names under root; -1 when there is none.
static int64_t latest_committed_step(const std::string& root) {
  std::error_code ec;
  if (auto latest = find_latest(root)) {
    for (const CheckpointEntry& c : list_checkpoints(root))
      if (fs::equivalent(c.dir, *latest, ec)) return c.step;
  }
  return -1;
}

void persist_survivor_snapshots(CkptAsyncState& st) {
  int written = 0;
  // A snapshot no newer than the latest committed checkpoint can never be used (promote_peer_snapshots removes such
  // sets), so it is not written. That also covers a rank that outlived its job on a thawing host after the job
  // ended: then nobody is left to ask whether the attempt is over (attempt_superseded), but the job's checkpoints say.
  int64_t disk_step = -1;
  try {
    disk_step = latest_committed_step(st.root);
  } catch (const std::exception&) {
    // An unreadable checkpoint directory: write what we hold, the restart decides.
  }
  auto put = [&](const ShardSnapshot& s, const std::atomic<bool>& ok, const char* whose) {
    if (!ok || !s.staged()) return;
    if (s.step() <= disk_step) {
      fmt::print(stderr, "peer snapshot: {} snapshot of step {} not written: the latest checkpoint is step {}\n", whose,
                 s.step(), disk_step);
      return;
    }
    const std::string dir = (fs::path(snapshots_root(st.root)) / checkpoint_dir_name(s.step())).string();
    try {
      fs::create_directories(dir);
      s.write_into(dir);
      write_file_atomic(dir + "/extra.json", s.extra().dump() + "\n");
      fmt::print(stderr, "peer snapshot: wrote {} snapshot of step {} ({}) to {}\n", whose, s.step(), s.file(), dir);
      ++written;
    } catch (const std::exception& e) {
      fmt::print(stderr, "peer snapshot: could not write {} snapshot of step {} to {}: {}\n", whose, s.step(), dir,
                 e.what());
    }
  };
  for (int i = 0; i < 2; ++i) put(st.own[i], st.own_ok[i], "this rank's");
  for (int i = 0; i < 2; ++i) put(st.held[i], st.held_ok[i], "its predecessor's");
  std::fflush(stderr);
}

std::string promote_peer_snapshots(const std::string& root, int keep_last) {
  const fs::path sroot = snapshots_root(root);
  std::error_code ec;
  if (!fs::is_directory(sroot, ec)) return "";
  const int64_t disk_step = latest_committed_step(root);
  std::map<int64_t, fs::path, std::greater<>> sets;
  for (auto& e : fs::directory_iterator(sroot, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("step_", 0) == 0 && n.find('.') == std::string::npos) sets[std::stoll(n.substr(5))] = e.path();
  }
  std::string promoted;
  std::vector<fs::path> unusable;
  for (auto& [step, dir] : sets) {
    if (step <= disk_step) break;
    std::vector<std::string> files, missing;
    nlohmann::json extra;
    try {
      extra = nlohmann::json::parse(read_text_file((dir / "extra.json").string()));
      const auto& par = extra.at("parallel");
      for (int p = 0; p < par.at("pp").get<int>(); ++p)
        for (int t = 0; t < par.at("tp").get<int>(); ++t)
          for (int d = 0; d < par.at("dp").get<int>(); ++d) files.push_back(shard_file_name(p, t, d));
    } catch (const std::exception& e) {
      fmt::print(stderr, "peer snapshots of step {} in {}: unusable ({}); removed\n", step, dir.string(), e.what());
      unusable.push_back(dir);
      continue;
    }
    for (const std::string& f : files)
      if (!file_exists((dir / f).string()) || !file_exists((dir / (f + ".pieces.json")).string())) missing.push_back(f);
    if (!missing.empty()) {
      fmt::print(stderr, "peer snapshots of step {} in {} are incomplete (missing {}); not used, removed\n", step,
                 dir.string(), fmt::join(missing, ", "));
      unusable.push_back(dir);
      continue;
    }
    // Complete: it becomes the staging directory of a sharded save of `step` and is committed like one (sizes and
    // tiling checked now, every file's CRC-32C when it is read).
    const std::string staging = sharded_staging_dir(root, step);
    fs::remove_all(staging, ec);
    fs::rename(dir, staging);
    fs::remove(fs::path(staging) / "extra.json", ec);
    SaveOptions so;
    so.keep_last = keep_last;
    promoted = commit_sharded_checkpoint(root, step, files, extra, so);
    fmt::print("recovered step {} from the peer snapshots that surviving ranks persisted -> {} (the latest checkpoint "
               "on disk was step {})\n",
               step, promoted, disk_step < 0 ? std::string("none") : std::to_string(disk_step));
    break;
  }
  // Sets at or below what is now the latest checkpoint can never be used again, nor can an incomplete or unreadable
  // one: the ranks that wrote it belong to a stopped attempt, and the lost ones that held its missing pieces wrote
  // nothing (a node's lease ends its ranks before the driver goes on; a rank checks the attempt fence before it
  // writes). Left in place, such a set would outlive the job (the next attempt checkpoints past it).
  if (!promoted.empty()) {
    fs::remove_all(sroot, ec);
  } else {
    for (auto& [step, dir] : sets)
      if (step <= disk_step) fs::remove_all(dir, ec);
    for (const fs::path& dir : unusable) fs::remove_all(dir, ec);
  }
  return promoted;
}

}  // namespace mt
