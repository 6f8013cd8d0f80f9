// Sharded checkpoints in one process: the slice geometry (flat ranges to boxes, box copies, tensor-parallel
// placements) against naive element-by-element references, and checkpoints written in pieces by several simulated
// ranks read back under other slicings and compared with the original tensors; holes, overlaps, missing or corrupt
// files and a missing manifest are clear errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "support/ckpt_testutil.h"
#include "support/files.h"
#include "megatrain/ckpt/checkpoint.h"
#include "megatrain/ckpt/reader.h"
#include "megatrain/ckpt/sharded.h"
#include "megatrain/ckpt/slice.h"
#include "megatrain/model/shard.h"

using namespace mt;
using ckpt_test::ScratchDir;

namespace {

// ---- geometry ---------------------------------------------------------------------------------------------------

// Calls f(index) for every index of a box, in row-major order.
template <typename F>
void for_each_index(const Slice& s, F&& f) {
  const size_t n = s.start.size();
  if (s.numel() == 0) return;
  std::vector<int64_t> idx = s.start;
  while (true) {
    f(idx);
    size_t k = n;
    while (k > 0) {
      if (++idx[k - 1] < s.start[k - 1] + s.extent[k - 1]) break;
      idx[k - 1] = s.start[k - 1];
      --k;
    }
    if (k == 0) return;
  }
}

TEST(Slice, FlatRangesBecomeBoxesCoveringExactlyTheRange) {
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{7}, std::vector<int64_t>{3, 5}, std::vector<int64_t>{2, 3, 4}, std::vector<int64_t>{}}) {
    const int64_t n = shape_numel(shape);
    for (int64_t b = 0; b <= n; ++b)
      for (int64_t e = b; e <= n; ++e) {
        std::vector<int> hits(static_cast<size_t>(n), 0);
        std::vector<Slice> boxes = flat_range_slices(shape, b, e);
        EXPECT_LE(boxes.size(), std::max<size_t>(1, 2 * shape.size() - 1));
        int64_t next = b;  // boxes come in flat order, each contiguous
        for (const Slice& s : boxes) {
          ASSERT_TRUE(slice_within(s, shape)) << s.str();
          EXPECT_TRUE(slice_contiguous(s, shape)) << s.str();
          EXPECT_EQ(flat_index(s.start, shape), next) << s.str();
          next += s.numel();
          for_each_index(s, [&](const std::vector<int64_t>& i) { ++hits[flat_index(i, shape)]; });
        }
        for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i], (i >= b && i < e) ? 1 : 0) << "range " << b << ".." << e;
      }
  }
  EXPECT_NE(ckpt_test::error_of([] {
              flat_range_slices({3, 5}, 4, 16);
            }).find("outside a tensor of 15 elements"),
            std::string::npos);
}

TEST(Slice, CopyBoxMatchesAnElementwiseCopy) {
  std::mt19937 rng(7);
  const std::vector<int64_t> ss = {4, 5, 6}, ds = {3, 7, 5};
  std::vector<float> src(shape_numel(ss));
  std::iota(src.begin(), src.end(), 0.0f);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<int64_t> ext(3), a(3), b(3);
    for (int d = 0; d < 3; ++d) {
      ext[d] = 1 + rng() % std::min(ss[d], ds[d]);
      a[d] = rng() % (ss[d] - ext[d] + 1);
      b[d] = rng() % (ds[d] - ext[d] + 1);
    }
    std::vector<float> got(shape_numel(ds), -1.0f), want = got;
    copy_box(src.data(), ss, a, got.data(), ds, b, ext, sizeof(float));
    for_each_index(Slice{std::vector<int64_t>(3, 0), ext}, [&](const std::vector<int64_t>& i) {
      want[flat_index({b[0] + i[0], b[1] + i[1], b[2] + i[2]}, ds)] =
          src[flat_index({a[0] + i[0], a[1] + i[1], a[2] + i[2]}, ss)];
    });
    ASSERT_EQ(got, want) << "trial " << trial;
  }
}

TEST(Slice, ShardPlacementsAgreeWithShardSlice) {
  // c_attn-like rows in three parts, a column split, and a replicated tensor.
  std::vector<ShardSpec> specs = {split_spec(ShardSpec::Kind::Rows, {16, 3}, {8, 4, 4}, 2, 1, "rows"),
                                  split_spec(ShardSpec::Kind::Cols, {4, 6}, {6}, 3, 2, "cols"), replicated_spec({5})};
  for (const ShardSpec& spec : specs) {
    std::vector<float> full(spec.full_numel()), local(spec.local_numel());
    std::iota(full.begin(), full.end(), 0.0f);
    shard_slice(spec, full.data(), local.data());  // the oracle
    const std::vector<int64_t> ls = spec.local_shape();
    // The whole shard and every flat-range box of it: the placements cover the box once and point at the values.
    std::vector<Slice> boxes = {whole_slice(ls)};
    for (const Slice& s : flat_range_slices(ls, 1, spec.local_numel() - 1)) boxes.push_back(s);
    for (const Slice& box : boxes) {
      int64_t covered = 0;
      for (const Placement& pl : shard_placements(spec, box)) {
        ASSERT_EQ(pl.full.extent, pl.local.extent);
        ASSERT_TRUE(slice_within(pl.full, spec.full_shape)) << pl.full.str();
        ASSERT_TRUE(intersect(pl.local, box) == pl.local) << pl.local.str() << " in " << box.str();
        covered += pl.local.numel();
        std::vector<float> a(pl.full.numel()), b(pl.full.numel());
        const std::vector<int64_t> z(ls.size(), 0);
        copy_box(full.data(), spec.full_shape, pl.full.start, a.data(), pl.full.extent, z, pl.full.extent, 4);
        copy_box(local.data(), ls, pl.local.start, b.data(), pl.local.extent, z, pl.local.extent, 4);
        EXPECT_EQ(a, b) << spec.describe() << " " << pl.full.str();
      }
      EXPECT_EQ(covered, box.numel()) << spec.describe() << " " << box.str();
    }
  }
}

TEST(Slice, TilingProblemsAreNamed) {
  const std::vector<int64_t> shape = {4, 4};
  EXPECT_EQ(tiling_problem(shape, {Slice{{0, 0}, {2, 4}}, Slice{{2, 0}, {2, 2}}, Slice{{2, 2}, {2, 2}}}), "");
  EXPECT_NE(tiling_problem(shape, {Slice{{0, 0}, {3, 4}}, Slice{{2, 0}, {2, 4}}}).find("overlap"), std::string::npos);
  EXPECT_NE(tiling_problem(shape, {Slice{{0, 0}, {2, 4}}, Slice{{2, 0}, {2, 2}}})
                .find("4 of 16 elements are in no piece"),
            std::string::npos);
  EXPECT_NE(tiling_problem(shape, {Slice{{0, 0}, {5, 4}}}).find("outside"), std::string::npos);
}

// ---- sharded checkpoints ---------------------------------------------------------------------------------------

// Two tensors of known values, written by three simulated ranks:
//   "w" [6, 8] (model group): rank 0 rows 0-2 whole; ranks 1 and 2 split rows 3-5 as the flat ranges
//        [24, 35) and [35, 48) (ZeRO-like slices, several boxes each);
//   "m.w" [10] (optim group): rank 0 [0, 3), rank 2 [3, 10); rank 1 holds none of it.
struct Fixture {
  ScratchDir scratch;
  std::string root = scratch / "ckpt";
  std::vector<float> w = std::vector<float>(48), mw = std::vector<float>(10);
  std::vector<std::string> files = {shard_file_name(0, 0, 0), shard_file_name(0, 0, 1), shard_file_name(0, 0, 2)};

  Fixture() {
    std::iota(w.begin(), w.end(), 100.0f);
    std::iota(mw.begin(), mw.end(), -5.0f);
  }
  std::vector<ShardPiece> pieces(int rank) const {
    std::vector<ShardPiece> p;
    const std::vector<int64_t> ws = {6, 8};
    auto add_w = [&](const Slice& s) {
      p.push_back({"w", "model.safetensors", ws, s, DType::F32, w.data() + flat_index(s.start, ws)});
    };
    auto add_m = [&](int64_t b, int64_t e) {
      p.push_back({"m.w", "optim.safetensors", {10}, Slice{{b}, {e - b}}, DType::F32, mw.data() + b});
    };
    if (rank == 0) {
      add_w(Slice{{0, 0}, {3, 8}});
      add_m(0, 3);
    } else if (rank == 1) {
      for (const Slice& s : flat_range_slices(ws, 24, 35)) add_w(s);
    } else {
      for (const Slice& s : flat_range_slices(ws, 35, 48)) add_w(s);
      add_m(3, 10);
    }
    return p;
  }
  std::string save(int64_t step, int skip_rank = -1) {
    begin_sharded_checkpoint(root, step);
    for (int r = 0; r < 3; ++r)
      if (r != skip_rank) write_checkpoint_shard(root, step, files[r], pieces(r));
    return commit_sharded_checkpoint(root, step, files, {{"note", "test"}});
  }
};

TEST(ShardedCheckpoint, PiecesOfSeveralRanksReadBackUnderAnotherSlicing) {
  Fixture f;
  const std::string dir = f.save(5);
  EXPECT_EQ(find_latest(f.root), dir);
  for (const std::string& file : f.files) EXPECT_TRUE(std::filesystem::exists(dir + "/" + file)) << file;
  EXPECT_FALSE(std::filesystem::exists(dir + "/" + f.files[0] + ".pieces.json"));

  CheckpointReader r = CheckpointReader::open(f.root);
  EXPECT_EQ(r.format_version(), 2);
  EXPECT_EQ(r.step(), 5);
  EXPECT_EQ(r.extra()["note"], "test");
  EXPECT_EQ(r.tensor_names(), (std::vector<std::string>{"m.w", "w"}));
  EXPECT_EQ(r.shape("w"), (std::vector<int64_t>{6, 8}));
  EXPECT_EQ(r.group("m.w"), "optim.safetensors");

  // A slice inside rank 0's rows opens rank 0's file only.
  std::vector<float> top(2 * 3);
  r.read("w", Slice{{1, 2}, {2, 3}}, top.data(), {2, 3}, {0, 0});
  EXPECT_EQ(top, (std::vector<float>{110, 111, 112, 118, 119, 120}));
  EXPECT_EQ(r.files_read(), std::vector<std::string>{f.files[0]});

  // Column halves across all three ranks' pieces, each into its place in a [6, 8] destination.
  std::vector<float> all(48, 0.0f);
  r.read("w", Slice{{0, 4}, {6, 4}}, all.data(), {6, 8}, {0, 4});
  r.read("w", Slice{{0, 0}, {6, 4}}, all.data(), {6, 8}, {0, 0});
  EXPECT_EQ(all, f.w);
  EXPECT_EQ(r.files_read(), f.files);

  // Beyond the saved shape reads zeros (a layout with more vocabulary padding).
  std::vector<float> pad(3 * 8, -1.0f);
  r.read("w", Slice{{4, 0}, {3, 8}}, pad.data(), {3, 8}, {0, 0});
  for (int i = 0; i < 16; ++i) EXPECT_EQ(pad[i], f.w[32 + i]);
  for (int i = 16; i < 24; ++i) EXPECT_EQ(pad[i], 0.0f);

  std::vector<float> m(4);
  r.read("m.w", Slice{{1}, {4}}, m.data(), {4}, {0});
  EXPECT_EQ(m, (std::vector<float>{-4, -3, -2, -1}));

  // Single-process tools get full tensors, grouped as in an unsharded checkpoint.
  Checkpoint ck = Checkpoint::load(dir);
  EXPECT_EQ(ck.tensor_names("model.safetensors"), std::vector<std::string>{"w"});
  EXPECT_EQ(ck.tensor_names("optim.safetensors"), std::vector<std::string>{"m.w"});
  std::vector<float> full(48);
  ck.copy_into("w", f32_view(full.data(), {6, 8}));
  EXPECT_EQ(full, f.w);
  const TensorData& t = ck.get("m.w");
  EXPECT_EQ(std::vector<float>(static_cast<const float*>(t.data), static_cast<const float*>(t.data) + 10), f.mw);
}

TEST(ShardedCheckpoint, ARankWithNothingUniqueWritesAnEmptyFile) {
  Fixture f;
  begin_sharded_checkpoint(f.root, 2);
  std::vector<ShardPiece> all = f.pieces(0);
  for (int r : {1, 2})
    for (const ShardPiece& p : f.pieces(r)) all.push_back(p);
  write_checkpoint_shard(f.root, 2, f.files[0], all);
  write_checkpoint_shard(f.root, 2, f.files[1], {});
  const std::string dir = commit_sharded_checkpoint(f.root, 2, {f.files[0], f.files[1]}, {});
  Checkpoint ck = Checkpoint::load(dir);
  std::vector<float> w(48);
  ck.copy_into("w", f32_view(w.data(), {6, 8}));
  EXPECT_EQ(w, f.w);
}

TEST(ShardedCheckpoint, SingleFileCheckpointsReadThroughTheSameReader) {
  ScratchDir s;
  std::vector<float> w(12);
  std::iota(w.begin(), w.end(), 1.0f);
  save_checkpoint(s / "ckpt", 2, {{"model.safetensors", {tensor_ref("w", f32_view(w.data(), {3, 4}))}}}, {});
  CheckpointReader r = CheckpointReader::open(s / "ckpt");
  EXPECT_EQ(r.format_version(), 1);
  EXPECT_EQ(r.group("w"), "model.safetensors");
  std::vector<float> col(3);
  r.read("w", Slice{{0, 1}, {3, 1}}, col.data(), {3, 1}, {0, 0});
  EXPECT_EQ(col, (std::vector<float>{2, 6, 10}));
}

TEST(ShardedCheckpoint, AMissingWriterOrAHoleStopsTheCommit) {
  Fixture f;
  EXPECT_ERROR_HAS(f.save(1, 1), "shard file 'shard-pp0-tp0-dp1.safetensors' was not written");
  EXPECT_FALSE(find_latest(f.root).has_value());  // nothing committed: the staging directory does not count

  // Rank 1 writes, but leaves out its last box of w: a hole.
  begin_sharded_checkpoint(f.root, 1);
  for (int r = 0; r < 3; ++r) {
    std::vector<ShardPiece> p = f.pieces(r);
    if (r == 1) p.pop_back();
    write_checkpoint_shard(f.root, 1, f.files[r], p);
  }
  EXPECT_ERROR_HAS(commit_sharded_checkpoint(f.root, 1, f.files, {}), "tensor 'w'", "in no piece (a hole)");
  // Two ranks writing the same elements: an overlap.
  begin_sharded_checkpoint(f.root, 1);
  for (int r = 0; r < 3; ++r) write_checkpoint_shard(f.root, 1, f.files[r], f.pieces(r == 1 ? 0 : r));
  EXPECT_ERROR_HAS(commit_sharded_checkpoint(f.root, 1, f.files, {}), "tensor 'm.w'", "overlap");
  EXPECT_FALSE(find_latest(f.root).has_value());
}

TEST(ShardedCheckpoint, CorruptOrMissingFilesAreNamed) {
  Fixture f;
  const std::string dir = f.save(3);
  // Flip one byte at the end of rank 2's file (its data region).
  const std::string victim = dir + "/" + f.files[2];
  std::vector<uint8_t> bytes = ckpt_test::read_bytes(victim);
  bytes[bytes.size() - 3] ^= 0x40;
  ckpt_test::write_bytes(victim, bytes);
  CheckpointReader r = CheckpointReader::open(dir);
  std::vector<float> top(8);
  r.read("w", Slice{{0, 0}, {1, 8}}, top.data(), {1, 8}, {0, 0});  // rank 0's file is fine
  std::vector<float> all(48);
  EXPECT_ERROR_HAS(r.read("w", whole_slice({6, 8}), all.data(), {6, 8}, {0, 0}), f.files[2].c_str(), "checksum",
                   "corrupt");
  EXPECT_ERROR_HAS(Checkpoint::load(dir), f.files[2].c_str(), "corrupt");

  f.save(3);  // whole again
  std::filesystem::remove(dir + "/" + f.files[1]);
  EXPECT_ERROR_HAS(Checkpoint::load(dir), f.files[1].c_str(), "missing");
}

TEST(ShardedCheckpoint, AManifestWithAHoleOrWithoutItIsRefused) {
  Fixture f;
  const std::string dir = f.save(4);
  nlohmann::json m = nlohmann::json::parse(ckpt_test::read_bytes(dir + "/manifest.json"));
  m["tensors"]["w"]["pieces"].erase(1);
  ckpt_test::write_sealed_manifest(dir, m);
  EXPECT_ERROR_HAS(CheckpointReader::open(dir), "tensor 'w'", "hole");

  std::filesystem::remove(dir + "/manifest.json");
  EXPECT_FALSE(find_latest(f.root).has_value());
  EXPECT_ERROR_HAS(Checkpoint::load(f.root), "no checkpoint in");
  EXPECT_ERROR_HAS(CheckpointReader::open(f.root), "no checkpoint in");
}


// A valid checkpoint whose manifest.json is then corrupted one way at a time (the data files stay intact, so only
// the manifest's own validation stands between a bad entry and a crash or a silently wrong tensor). Each must be
// refused by open and by load, naming the checkpoint, the tensor and the problem.
TEST(ShardedCheckpoint, ACorruptManifestIsRefusedWithTheProblemNamed) {
  using nlohmann::json;
  Fixture f;
  const std::string dir = f.save(6);
  const json good = json::parse(ckpt_test::read_bytes(dir + "/manifest.json"));
  // pieces[0] of "w" is rank 0's rows [0:3, 0:8]; pieces[1] of "m.w" is rank 2's [3:10].
  ASSERT_EQ(good["tensors"]["w"]["pieces"][0]["extent"], json({3, 8}));
  ASSERT_EQ(good["tensors"]["m.w"]["pieces"][1]["start"], json({3}));
  struct Mutation {
    const char* what;
    std::function<void(json&)> edit;
    std::vector<const char*> expect;  // substrings of the error
  };
  const std::vector<Mutation> mutations = {
      {"extent with fewer dimensions than the shape",
       [](json& m) { m["tensors"]["w"]["pieces"][0]["extent"].erase(0); },
       {"tensor 'w'", "rank"}},
      {"extent shorter than start",
       [](json& m) {
         m["tensors"]["w"]["pieces"][0]["start"] = {0, 0, 0};
       },
       {"tensor 'w'", "rank"}},
      {"start + extent overflows",
       [](json& m) { m["tensors"]["m.w"]["pieces"][1]["start"] = {INT64_MAX}; },
       {"tensor 'm.w'", "9223372036854775807", "outside"}},
      {"negative start",
       [](json& m) {
         m["tensors"]["w"]["pieces"][0]["start"] = {-1, 0};
       },
       {"tensor 'w'", "'start'", "negative"}},
      {"extent past the dimension",
       [](json& m) { m["tensors"]["m.w"]["pieces"][1]["extent"] = {8}; },
       {"tensor 'm.w'", "outside"}},
      {"shape whose size overflows",
       [](json& m) {
         m["tensors"]["w"]["shape"] = {int64_t{1} << 62, 8};
       },
       {"tensor 'w'", "overflow"}},
      {"a shape larger than its files can hold",
       [](json& m) {
         m["tensors"]["m.w"]["shape"] = {int64_t{1} << 40};
         m["tensors"]["m.w"]["pieces"][1]["extent"] = {(int64_t{1} << 40) - 3};
       },
       {"tensor 'm.w'", "bytes"}},
      {"a number for a piece's file name",
       [](json& m) { m["tensors"]["w"]["pieces"][0]["file"] = 7; },
       {"tensor 'w'", "'file'", "not a string"}},
      {"a number for a dtype",
       [](json& m) { m["tensors"]["m.w"]["dtype"] = 4; },
       {"tensor 'm.w'", "'dtype'", "not a string"}},
      {"a fractional shape",
       [](json& m) {
         m["tensors"]["w"]["shape"] = {6, 8.5};
       },
       {"tensor 'w'", "'shape'", "not an integer"}},
  };
  for (const Mutation& mu : mutations) {
    SCOPED_TRACE(mu.what);
    json m = good;
    mu.edit(m);
    ckpt_test::write_sealed_manifest(dir, m);
    for (const std::string& msg : {ckpt_test::error_of([&] { CheckpointReader::open(dir); }),
                                   ckpt_test::error_of([&] { Checkpoint::load(dir); })}) {
      EXPECT_NE(msg.find(dir), std::string::npos) << msg;
      for (const char* s : mu.expect)
        EXPECT_NE(msg.find(s), std::string::npos) << "message: " << msg << "\nlacks: " << s;
    }
  }
  ckpt_test::write_text(dir + "/manifest.json", good.dump());
  std::vector<float> w(48);
  Checkpoint::load(dir).copy_into("w", f32_view(w.data(), {6, 8}));
  EXPECT_EQ(w, f.w);
}

// Every field of the manifest replaced by a value of each wrong JSON type: opening and loading either work or throw
// mt::Error naming the manifest, never a bare nlohmann::json exception (or worse).
TEST(ShardedCheckpoint, ManifestFieldsOfTheWrongTypeAreClearErrors) {
  using nlohmann::json;
  Fixture f;
  const std::string dir = f.save(7);
  const json good = json::parse(ckpt_test::read_bytes(dir + "/manifest.json"));
  int refused = 0;
  for (const std::string& field : ckpt_test::manifest_fields(good)) {
    const json::json_pointer ptr(field);
    for (const json& w : ckpt_test::wrong_typed_values()) {
      json m = good;
      if (m[ptr] == w) continue;
      m[ptr] = w;
      // Re-sealed, so that the field's own validation is what refuses it (the checksum field itself stays as set).
      if (field.rfind("/manifest_checksum", 0) == 0)
        ckpt_test::write_text(dir + "/manifest.json", m.dump());
      else
        ckpt_test::write_sealed_manifest(dir, m);
      refused += ckpt_test::refusals_naming_dir(dir, field + " = " + w.dump());
    }
  }
  EXPECT_GT(refused, 0);
}

}  // namespace

// A format-2 manifest carries its own checksum too: the silent wrong load (a piece start of 2^63-1) and a
// one-digit change that would still tile (a piece moved onto another) are refused as a corrupt manifest, by name,
// before any piece is looked at.
TEST(ShardedCheckpoint, TheManifestChecksumRefusesAnEditedManifest) {
  using nlohmann::json;
  Fixture f;
  const std::string dir = f.save(8);
  const json good = json::parse(ckpt_test::read_bytes(dir + "/manifest.json"));
  ASSERT_TRUE(good.contains("manifest_checksum"));
  for (auto edit : std::vector<std::function<void(json&)>>{
           [](json& m) { m["tensors"]["m.w"]["pieces"][1]["start"] = {INT64_MAX}; },
           [](json& m) { std::swap(m["tensors"]["w"]["pieces"][0]["name"], m["tensors"]["w"]["pieces"][1]["name"]); },
           [](json& m) {
             m["extra"] = {{"note", "edited"}};
           }}) {
    json m = good;
    edit(m);
    ckpt_test::write_text(dir + "/manifest.json", m.dump(1));
    EXPECT_ERROR_HAS(CheckpointReader::open(dir), dir.c_str(), "manifest.json fails its checksum");
    EXPECT_ERROR_HAS(Checkpoint::load(dir), dir.c_str(), "manifest.json fails its checksum");
  }
  ckpt_test::write_text(dir + "/manifest.json", good.dump(1));
  EXPECT_NO_THROW(CheckpointReader::open(dir));
}
