#include "megatrain/ckpt/sharded.h"

#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <chrono>
#include <cstdio>
#include <set>
#include <thread>

#include "megatrain/ckpt/checksum.h"
#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"

namespace mt {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Each writer leaves the list of its pieces beside its file; the committing process merges them into the
// manifest (and removes them), so no piece metadata has to travel over the process groups.
std::string record_name(const std::string& file) { return file + ".pieces.json"; }

std::string piece_name(const ShardPiece& p) { return fmt::format("{}@{}", p.tensor, fmt::join(p.slice.start, ",")); }

}  // namespace

std::string shard_file_name(int pp, int tp, int dp) {
  return fmt::format("shard-pp{}-tp{}-dp{}.safetensors", pp, tp, dp);
}

std::string sharded_staging_dir(const std::string& root, int64_t step) {
  return (fs::path(root) / (checkpoint_dir_name(step) + ".tmp-sharded")).string();
}

std::string begin_sharded_checkpoint(const std::string& root, int64_t step) {
  MT_CHECK(!root.empty(), "sharded checkpoint: empty checkpoint root");
  MT_CHECK(step >= 0, "sharded checkpoint: negative step {}", step);
  const std::string dir = sharded_staging_dir(root, step);
  std::error_code ec;
  fs::remove_all(dir, ec);  // a leftover of a save that died before its commit
  fs::create_directories(dir, ec);
  MT_CHECK(fs::is_directory(dir), "cannot create checkpoint staging directory {}: {}", dir, ec.message());
  return dir;
}

void write_checkpoint_shard(const std::string& root, int64_t step, const std::string& file,
                            const std::vector<ShardPiece>& pieces) {
  const std::string dir = sharded_staging_dir(root, step);
  MT_CHECK(fs::is_directory(dir), "checkpoint staging directory {} does not exist (begin_sharded_checkpoint first)",
           dir);
  write_shard_into(dir, step, file, pieces);
}

void write_shard_into(const std::string& dir, int64_t step, const std::string& file,
                      const std::vector<ShardPiece>& pieces) {
  MT_CHECK(!file.empty() && file.find('/') == std::string::npos && file[0] != '.' && file != "manifest.json",
           "checkpoint shard file name '{}' is not allowed (plain names only)", file);
  std::vector<TensorRef> refs;
  json recs = json::array();
  std::set<std::string> names;
  for (const ShardPiece& p : pieces) {
    MT_CHECK(slice_within(p.slice, p.full_shape) && p.slice.numel() > 0,
             "checkpoint shard {}: piece {} of tensor '{}' is empty or outside its shape {}", file, p.slice.str(),
             p.tensor, shape_str(p.full_shape));
    MT_CHECK(p.data != nullptr, "checkpoint shard {}: piece {} of tensor '{}' has no data", file, p.slice.str(),
             p.tensor);
    const std::string name = piece_name(p);
    MT_CHECK(names.insert(name).second, "checkpoint shard {}: tensor '{}' has two pieces at {}", file, p.tensor,
             p.slice.str());
    refs.push_back(TensorRef{name, p.dtype, p.slice.extent, p.data});
    recs.push_back({{"tensor", p.tensor},
                    {"group", p.group},
                    {"dtype", dtype_name(p.dtype)},
                    {"shape", p.full_shape},
                    {"name", name},
                    {"start", p.slice.start},
                    {"extent", p.slice.extent}});
  }
  auto res = write_safetensors((fs::path(dir) / file).string(), refs,
                               {{"megatrain", "checkpoint-shard"}, {"step", std::to_string(step)}});
  json rec = {{"bytes", res.file_bytes}, {"checksum", format_checksum(res.file_crc)}, {"pieces", recs}};
  write_file_atomic((fs::path(dir) / record_name(file)).string(), rec.dump() + "\n");
}

static std::string failure_name(const std::string& file) { return file + ".failed"; }

void write_shard_failure(const std::string& root, int64_t step, const std::string& file, const std::string& why) {
  // Best effort, on a disk that may be full: the message if it fits, else an empty marker (an inode, no data).
  const std::string path = (fs::path(sharded_staging_dir(root, step)) / failure_name(file)).string();
  try {
    write_file_atomic(path, why + "\n");
  } catch (const Error&) {
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (f) std::fclose(f);
  }
}

std::string wait_for_shards(const std::string& root, int64_t step, const std::vector<std::string>& files,
                            double timeout_s) {
  const fs::path dir = sharded_staging_dir(root, step);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::chrono::milliseconds pause(1);
  for (;;) {
    std::vector<std::string> missing, failed;
    for (const std::string& f : files) {
      if (file_exists((dir / failure_name(f)).string())) {
        std::string why;
        try {
          why = read_text_file((dir / failure_name(f)).string());
        } catch (const Error&) {
        }
        while (!why.empty() && why.back() == '\n') why.pop_back();
        failed.push_back(fmt::format("'{}' failed: {}", f, why.empty() ? "(no message: the disk may be full)" : why));
      } else if (!file_exists((dir / record_name(f)).string())) {
        missing.push_back(f);
      }
    }
    if (!failed.empty()) return fmt::format("{}", fmt::join(failed, "; "));
    if (missing.empty()) return "";
    if (std::chrono::steady_clock::now() >= deadline)
      return fmt::format("shard file(s) {} not written within {:.0f} s", fmt::join(missing, ", "), timeout_s);
    std::this_thread::sleep_for(pause);  // polls a file system: from 1 ms up to 50 ms between looks
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

std::string commit_sharded_checkpoint(const std::string& root, int64_t step, const std::vector<std::string>& files,
                                      const json& extra, const SaveOptions& opt) {
  const std::string dir = sharded_staging_dir(root, step);
  MT_CHECK(fs::is_directory(dir), "sharded checkpoint step {}: staging directory {} does not exist", step, dir);
  MT_CHECK(!files.empty(), "sharded checkpoint step {}: no files to commit", step);
  json files_j = json::object(), tensors_j = json::object();
  std::map<std::string, std::vector<Slice>> slices;
  std::map<std::string, std::string> first_file;  // which file first recorded each tensor (for messages)
  for (const std::string& f : files) {
    const fs::path rpath = fs::path(dir) / record_name(f), fpath = fs::path(dir) / f;
    MT_CHECK(file_exists(rpath.string()) && file_exists(fpath.string()),
             "sharded checkpoint step {}: shard file '{}' was not written (did its rank fail?)", step, f);
    json rec;
    try {
      rec = json::parse(read_text_file(rpath.string()));
    } catch (const json::exception& e) {
      fail("sharded checkpoint step {}: the record of '{}' is corrupt: {}", step, f, e.what());
    }
    // The record is this save's own file, but a disk can corrupt it: a wrong type is an error naming it.
    try {
      std::error_code ec;
      MT_CHECK(rec.value("bytes", uint64_t{0}) == fs::file_size(fpath, ec),
               "sharded checkpoint step {}: shard file '{}' does not have the size its writer recorded", step, f);
      files_j[f] = {{"bytes", rec["bytes"]}, {"checksum", rec["checksum"]}};
      for (const json& p : rec["pieces"]) {
        const std::string t = p["tensor"].get<std::string>();
        json& tj = tensors_j[t];
        if (tj.is_null()) {
          tj = {{"group", p["group"]}, {"dtype", p["dtype"]}, {"shape", p["shape"]}, {"pieces", json::array()}};
          first_file[t] = f;
        }
        MT_CHECK(tj["group"] == p["group"] && tj["dtype"] == p["dtype"] && tj["shape"] == p["shape"],
                 "sharded checkpoint step {}: tensor '{}' is {} {} in '{}' but {} {} in '{}'", step, t,
                 p["dtype"].dump(), p["shape"].dump(), f, tj["dtype"].dump(), tj["shape"].dump(), first_file[t]);
        tj["pieces"].push_back({{"file", f}, {"name", p["name"]}, {"start", p["start"]}, {"extent", p["extent"]}});
        slices[t].push_back(Slice{p["start"].get<std::vector<int64_t>>(), p["extent"].get<std::vector<int64_t>>()});
      }
    } catch (const json::exception& e) {
      fail("sharded checkpoint step {}: the record of '{}' is corrupt: {}", step, f, e.what());
    }
  }
  for (auto& [t, s] : slices) {
    std::vector<int64_t> shape;
    try {
      shape = tensors_j[t]["shape"].get<std::vector<int64_t>>();
    } catch (const json::exception& e) {
      fail("sharded checkpoint step {}: the records give tensor '{}' the shape {}, not a list of integers", step, t,
           tensors_j[t]["shape"].dump());
    }
    const std::string problem = tiling_problem(shape, s);
    MT_CHECK(problem.empty(), "sharded checkpoint step {}: the pieces of tensor '{}' do not make up its shape {}: {}",
             step, t, tensors_j[t]["shape"].dump(), problem);
  }
  json manifest = {{"format_version", kShardedCheckpointFormatVersion},
                   {"step", step},
                   {"files", files_j},
                   {"tensors", tensors_j},
                   {"extra", extra}};
  std::error_code ec;
  for (const std::string& f : files) fs::remove(fs::path(dir) / record_name(f), ec);
  write_file_atomic((fs::path(dir) / "manifest.json").string(), seal_manifest(manifest).dump(1) + "\n");
  return commit_checkpoint_dir(root, step, dir, opt);
}

}  // namespace mt
