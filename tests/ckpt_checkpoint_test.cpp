// Checkpoint directories: round trip, the manifest's contents, atomic commit (a save that fails at any stage
// leaves `latest` and the previous checkpoint untouched; stale *.tmp-* directories never count), pruning, and
// refusal of corrupt, truncated, missing or mismatched data with messages that say what is wrong.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <set>
#include <nlohmann/json.hpp>

#include "support/ckpt_testutil.h"
#include "support/files.h"
#include "megatrain/ckpt/checkpoint.h"
#include "megatrain/ckpt/checksum.h"
#include "megatrain/ckpt/reader.h"
#include "megatrain/core/fs.h"
#include "megatrain/core/rng.h"

using namespace mt;
using namespace ckpt_test;
using nlohmann::json;

namespace {

// A model-and-optimizer state whose values depend on `seed`.
struct State {
  std::vector<float> w, b, m;
  std::vector<int64_t> pos;
  explicit State(uint64_t seed) : w(96 * 32), b(96), m(96 * 32), pos(3) {
    Rng r(seed);
    for (auto& x : w) x = r.normal();
    for (auto& x : b) x = r.normal();
    for (auto& x : m) x = r.uniform();
    for (auto& x : pos) x = static_cast<int64_t>(r.next_u64() >> 1);
  }
  CheckpointFiles files() const {
    return {{"model.safetensors",
             {{"h.0.attn.c_attn.weight", DType::F32, {96, 32}, w.data()},
              {"h.0.attn.c_attn.bias", DType::F32, {96}, b.data()}}},
            {"optim.safetensors",
             {{"h.0.attn.c_attn.weight.exp_avg", DType::F32, {96, 32}, m.data()},
              {"data.position", DType::I64, {3}, pos.data()}}}};
  }
};

json extra_of(int64_t step) { return {{"model", {{"n_layer", 1}}}, {"data", {{"shard", 3}, {"offset", step * 7}}}}; }

std::string read_latest(const ScratchDir& d) { return read_text_file(d / "latest"); }

void flip_byte(const std::string& path, uint64_t offset) {
  auto b = read_bytes(path);
  ASSERT_LT(offset, b.size());
  b[offset] ^= 0x40;
  write_bytes(path, b);
}

}  // namespace

TEST(Checkpoint, SaveLoadRoundTrip) {
  ScratchDir root;
  State s(1);
  std::string dir = save_checkpoint(root.path, 100, s.files(), extra_of(100));
  EXPECT_EQ(dir, root / "step_00000100");
  EXPECT_EQ(read_latest(root), "step_00000100\n");
  for (const std::string& where : {root.path, dir}) {
    SCOPED_TRACE(where);
    Checkpoint c = Checkpoint::load(where);
    EXPECT_EQ(c.dir(), dir);
    EXPECT_EQ(c.step(), 100);
    EXPECT_EQ(c.extra(), extra_of(100));
    EXPECT_EQ(c.tensor_names().size(), 4u);
    EXPECT_EQ(c.tensor_names("optim.safetensors"),
              (std::vector<std::string>{"data.position", "h.0.attn.c_attn.weight.exp_avg"}));
    EXPECT_EQ(c.file_of("h.0.attn.c_attn.bias"), "model.safetensors");
    std::vector<float> w(96 * 32);
    c.copy_into("h.0.attn.c_attn.weight", f32_view(w.data(), {96, 32}));
    EXPECT_EQ(w, s.w);
    const auto& pos = c.get("data.position");
    EXPECT_EQ(pos.dtype, DType::I64);
    EXPECT_EQ(std::memcmp(pos.data, s.pos.data(), 24), 0);
    EXPECT_EQ(std::memcmp(c.get("h.0.attn.c_attn.weight.exp_avg").data, s.m.data(), s.m.size() * 4), 0);
  }
}

TEST(Checkpoint, ManifestRecordsSizesChecksumsAndShapes) {
  ScratchDir root;
  State s(2);
  std::string dir = save_checkpoint(root.path, 7, s.files(), extra_of(7));
  json m = json::parse(read_text_file(dir + "/manifest.json"));
  EXPECT_EQ(m["format_version"], 1);
  EXPECT_EQ(m["step"], 7);
  EXPECT_EQ(m["extra"], extra_of(7));
  for (std::string f : {"model.safetensors", "optim.safetensors"}) {
    auto bytes = read_bytes(dir + "/" + f);
    EXPECT_EQ(m["files"][f]["bytes"], bytes.size());
    EXPECT_EQ(m["files"][f]["checksum"], format_checksum(crc32c(bytes.data(), bytes.size())));
  }
  auto& t = m["tensors"]["h.0.attn.c_attn.weight"];
  EXPECT_EQ(t["file"], "model.safetensors");
  EXPECT_EQ(t["dtype"], "F32");
  EXPECT_EQ(t["shape"], json({96, 32}));
  EXPECT_EQ(t["checksum"], format_checksum(crc32c(s.w.data(), s.w.size() * 4)));
  EXPECT_EQ(m["tensors"]["data.position"]["dtype"], "I64");
}

TEST(Checkpoint, FlippedTensorByteFailsItsChecksum) {
  ScratchDir root;
  State s(3);
  std::string dir = save_checkpoint(root.path, 1, s.files(), extra_of(1));
  auto f = SafetensorsFile::open(dir + "/model.safetensors");
  uint64_t off = f.get("h.0.attn.c_attn.bias").offset + 17;
  f = SafetensorsFile();  // unmap before editing
  flip_byte(dir + "/model.safetensors", off);
  EXPECT_ERROR_HAS(Checkpoint::load(root.path), "h.0.attn.c_attn.bias", "model.safetensors", "fails its checksum",
                   "corrupt");
  // Without checksum verification the (corrupt) data loads: the check above is what caught it.
  EXPECT_NO_THROW(Checkpoint::load(dir, false));
}

TEST(Checkpoint, AlteredHeaderFailsTheFileChecksum) {
  ScratchDir root;
  State s(4);
  std::string dir = save_checkpoint(root.path, 5, s.files(), extra_of(5));
  // The header's metadata records the step as the string "5": make it "7", still valid JSON of the same size.
  std::string p = dir + "/optim.safetensors";
  auto b = read_bytes(p);
  std::string text(b.begin(), b.end());
  size_t at = text.find("\"step\":\"5\"");
  ASSERT_NE(at, std::string::npos);
  flip_byte(p, at + 8);  // '5' ^ 0x40 = 'u'
  EXPECT_ERROR_HAS(Checkpoint::load(dir), "'optim.safetensors' fails its checksum");
}

TEST(Checkpoint, MissingTruncatedOrExtraFilesAreRefused) {
  ScratchDir root;
  State s(5);
  std::string dir = save_checkpoint(root.path, 3, s.files(), extra_of(3));
  std::string optim = dir + "/optim.safetensors";
  auto bytes = read_bytes(optim);
  write_bytes(optim, std::vector<uint8_t>(bytes.begin(), bytes.end() - 4));
  EXPECT_ERROR_HAS(Checkpoint::load(dir), "'optim.safetensors'", "truncated");
  std::filesystem::remove(optim);
  EXPECT_ERROR_HAS(Checkpoint::load(dir), "'optim.safetensors'", "missing");
  write_bytes(optim, bytes);
  EXPECT_NO_THROW(Checkpoint::load(dir));
  // A manifest that forgot a tensor the file holds.
  json m = json::parse(read_text_file(dir + "/manifest.json"));
  m["tensors"].erase("data.position");
  write_sealed_manifest(dir, m);
  EXPECT_ERROR_HAS(Checkpoint::load(dir), "'data.position'", "does not list");
  // A shape in the manifest that the file contradicts.
  m = json::parse(read_text_file(dir + "/manifest.json"));
  m["tensors"]["data.position"] = {
      {"file", "optim.safetensors"}, {"dtype", "I64"}, {"shape", {4}}, {"checksum", "crc32c:00000000"}};
  write_sealed_manifest(dir, m);
  EXPECT_ERROR_HAS(Checkpoint::load(dir), "'data.position'", "shape [3]", "[4] in the manifest");
}

TEST(Checkpoint, ManifestVersionAndGarbageAreRefused) {
  ScratchDir root;
  State s(6);
  std::string dir = save_checkpoint(root.path, 3, s.files(), extra_of(3));
  json m = json::parse(read_text_file(dir + "/manifest.json"));
  m["format_version"] = 3;
  write_sealed_manifest(dir, m);
  EXPECT_ERROR_HAS(Checkpoint::load(dir), "format_version 3", "reads 1 and 2");
  write_text(dir + "/manifest.json", "{\"format_version\": 1, \"st");
  EXPECT_ERROR_HAS(Checkpoint::load(dir), "manifest.json is corrupt");
  write_text(dir + "/manifest.json", "{\"format_version\": 1, \"step\": 3}");
  EXPECT_ERROR_HAS(Checkpoint::load(dir), "lacks a valid 'files'");
}

TEST(Checkpoint, NothingToLoad) {
  ScratchDir root;
  EXPECT_ERROR_HAS(Checkpoint::load(root / "nope"), "does not exist");
  EXPECT_ERROR_HAS(Checkpoint::load(root.path), "no checkpoint in");
  EXPECT_FALSE(find_latest(root.path).has_value());
}

TEST(Checkpoint, FailedSaveLeavesLatestAndThePreviousCheckpoint) {
  ScratchDir root;
  State s1(7), s2(8);
  std::string r = root.path;
  save_checkpoint(r, 1, s1.files(), extra_of(1));
  for (std::string stage : {"file:model.safetensors", "file:optim.safetensors", "rename"}) {
    SCOPED_TRACE(stage);
    SaveOptions opt;
    opt.fault_hook = [&](const std::string& at) {
      if (at == stage) throw Error("injected failure at " + at);
    };
    EXPECT_ERROR_HAS(save_checkpoint(r, 2, s2.files(), extra_of(2), opt), "injected failure");
    EXPECT_EQ(read_latest(root), "step_00000001\n");
    EXPECT_FALSE(std::filesystem::exists(root / "step_00000002"));
    // The temporary directory was cleaned up; the previous checkpoint is intact.
    EXPECT_EQ(std::distance(std::filesystem::directory_iterator(root.path), {}), 2);  // step_00000001, latest
    EXPECT_EQ(Checkpoint::load(r).step(), 1);
  }
  // Failing after the directory is committed but before `latest` is rewritten: latest still names step 1.
  SaveOptions opt;
  opt.fault_hook = [](const std::string& at) {
    if (at == "latest") throw Error("injected failure before latest");
  };
  EXPECT_ERROR_HAS(save_checkpoint(r, 2, s2.files(), extra_of(2), opt), "before latest");
  EXPECT_EQ(read_latest(root), "step_00000001\n");
  EXPECT_EQ(*find_latest(r), root / "step_00000001");
  EXPECT_EQ(Checkpoint::load(root / "step_00000002").step(), 2);  // complete, loadable by name
}

TEST(Checkpoint, StaleTmpDirectoryNeverCounts) {
  ScratchDir root;
  State s(9);
  std::string r = root.path;
  std::string good = save_checkpoint(r, 10, s.files(), extra_of(10));
  // A crashed save of step 20: a full copy, manifest and all, under the temporary name.
  std::string stale = root / "step_00000020.tmp-99999";
  std::filesystem::copy(good, stale);
  json m = json::parse(read_text_file(stale + "/manifest.json"));
  m["step"] = 20;
  write_sealed_manifest(stale, m);
  std::filesystem::remove(root / "latest");  // even when scanning, the tmp directory is not a candidate
  EXPECT_EQ(*find_latest(r), good);
  ASSERT_EQ(list_checkpoints(r).size(), 1u);
  EXPECT_EQ(list_checkpoints(r)[0].step, 10);
  EXPECT_EQ(Checkpoint::load(r).step(), 10);
  EXPECT_ERROR_HAS(Checkpoint::load(stale), "incomplete checkpoint");
}

TEST(Checkpoint, LatestNamingAMissingDirectoryFallsBackToTheNewest) {
  ScratchDir root;
  State s(10);
  std::string r = root.path;
  save_checkpoint(r, 1, s.files(), extra_of(1));
  save_checkpoint(r, 2, s.files(), extra_of(2));
  write_text(root / "latest", "step_00000009\n");
  EXPECT_EQ(*find_latest(r), root / "step_00000002");
}

TEST(Checkpoint, KeepLastPrunesOlderButNeverTheNewSave) {
  ScratchDir root;
  State s(11);
  std::string r = root.path;
  SaveOptions opt;
  opt.keep_last = 2;
  for (int step = 1; step <= 5; ++step) save_checkpoint(r, step * 10, s.files(), extra_of(step), opt);
  auto steps = [&] {
    std::vector<int64_t> v;
    for (auto& c : list_checkpoints(r)) v.push_back(c.step);
    return v;
  };
  EXPECT_EQ(steps(), (std::vector<int64_t>{40, 50}));
  // Saving an older step (a run restarted from further back) keeps it and the newest other one.
  save_checkpoint(r, 30, s.files(), extra_of(3), opt);
  EXPECT_EQ(steps(), (std::vector<int64_t>{30, 50}));
  EXPECT_EQ(read_latest(root), "step_00000030\n");
}

TEST(Checkpoint, ResavingAStepReplacesIt) {
  ScratchDir root;
  State a(12), b(13);
  std::string r = root.path;
  save_checkpoint(r, 4, a.files(), extra_of(4));
  save_checkpoint(r, 4, b.files(), {{"second", true}});
  Checkpoint c = Checkpoint::load(r);
  EXPECT_EQ(c.extra(), json({{"second", true}}));
  EXPECT_EQ(std::memcmp(c.get("h.0.attn.c_attn.bias").data, b.b.data(), 96 * 4), 0);
  EXPECT_EQ(list_checkpoints(r).size(), 1u);
}

TEST(Checkpoint, CopyIntoSaysWhatDiffers) {
  ScratchDir root;
  State s(14);
  Checkpoint c = Checkpoint::load(save_checkpoint(root.path, 1, s.files(), extra_of(1)));
  std::vector<float> big(192 * 64);
  EXPECT_ERROR_HAS(c.copy_into("h.0.attn.c_attn.weight", f32_view(big.data(), {192, 64})),
                   "checkpoint tensor h.0.attn.c_attn.weight has shape [96, 32] but the model expects [192, 64]");
  std::vector<int32_t> ints(96);
  EXPECT_ERROR_HAS(c.copy_into("h.0.attn.c_attn.bias", Tensor(ints.data(), {96}, DType::I32)),
                   "checkpoint tensor h.0.attn.c_attn.bias has dtype F32 but the model expects I32");
  EXPECT_ERROR_HAS(c.copy_into("h.1.attn.c_attn.bias", f32_view(big.data(), {96})), "no tensor 'h.1.attn.c_attn.bias'");
}

TEST(Checkpoint, SaveRefusesBadRequests) {
  ScratchDir root;
  State s(15);
  std::string r = root.path;
  auto files = s.files();
  files["optim.safetensors"].push_back(files["model.safetensors"][0]);
  EXPECT_ERROR_HAS(save_checkpoint(r, 1, files, {}), "'h.0.attn.c_attn.weight' appears in more than one place");
  EXPECT_ERROR_HAS(save_checkpoint(r, 1, {{"manifest.json", {}}}, {}), "not allowed");
  EXPECT_ERROR_HAS(save_checkpoint(r, 1, {{"../x", {}}}, {}), "not allowed");
  EXPECT_ERROR_HAS(save_checkpoint(r, -1, s.files(), {}), "negative step");
  EXPECT_TRUE(list_checkpoints(r).empty());
}

// The manifest's own checksum (issue 10, hidden-corruption guard): written on save as the CRC-32C of the manifest's
// canonical dump without the field (recomputed here from the file, independently of seal_manifest), and verified
// before anything in it is used: an edit that leaves valid JSON (a changed step, a changed extra value) is refused
// by both readers, naming the file. A manifest without the field (written before it existed) still loads.
TEST(Checkpoint, TheManifestChecksumGuardsAgainstHiddenEdits) {
  ScratchDir root;
  State s(4);
  const std::string dir = save_checkpoint(root.path, 5, s.files(), extra_of(5));
  const json good = json::parse(read_text_file(dir + "/manifest.json"));
  ASSERT_TRUE(good.contains("manifest_checksum"));
  json bare = good;
  bare.erase("manifest_checksum");
  const std::string canonical = bare.dump();
  EXPECT_EQ(good["manifest_checksum"], format_checksum(crc32c(canonical.data(), canonical.size())));

  const std::vector<std::function<void(json&)>> edits = {
      [](json& m) { m["step"] = 6; },
      [](json& m) { m["extra"]["data"]["offset"] = 36; },
      [](json& m) { m["tensors"]["data.position"]["shape"] = {4}; },
      [](json& m) { m["manifest_checksum"] = "crc32c:00000000"; },
  };
  for (size_t i = 0; i < edits.size(); ++i) {
    SCOPED_TRACE(i);
    json m = good;
    edits[i](m);
    write_text(dir + "/manifest.json", m.dump(1));
    EXPECT_ERROR_HAS(Checkpoint::load(dir), dir.c_str(), "manifest.json fails its checksum");
    EXPECT_ERROR_HAS(CheckpointReader::open(dir), dir.c_str(), "manifest.json fails its checksum");
  }
  json m = good;
  m["manifest_checksum"] = 12;
  write_text(dir + "/manifest.json", m.dump());
  EXPECT_ERROR_HAS(Checkpoint::load(dir), "manifest_checksum is 12, not a string");
  m["manifest_checksum"] = "sha1:x";
  write_text(dir + "/manifest.json", m.dump());
  EXPECT_ERROR_HAS(Checkpoint::load(dir), "manifest_checksum", "bad checksum");

  // An older manifest: no field. Loads, with a warning that names it.
  write_text(dir + "/manifest.json", bare.dump(1));
  ::testing::internal::CaptureStderr();
  Checkpoint c = Checkpoint::load(dir);
  const std::string warned = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(c.step(), 5);
  EXPECT_NE(warned.find(dir + "/manifest.json has no manifest_checksum"), std::string::npos) << warned;
  // Re-saved, the checksum is back; the file as written (indented) verifies.
  write_text(dir + "/manifest.json", good.dump(1));
  EXPECT_NO_THROW(Checkpoint::load(dir));
}

// Every field of a format-1 manifest replaced by a value of each wrong JSON type (re-sealed, so that the field's
// own validation is what answers): opening and loading either work or throw mt::Error naming the checkpoint, never
// a bare nlohmann::json exception.
TEST(Checkpoint, Format1ManifestFieldsOfTheWrongTypeAreClearErrors) {
  ScratchDir root;
  State s(8);
  const std::string dir = save_checkpoint(root.path, 2, s.files(), extra_of(2));
  const json good = json::parse(read_text_file(dir + "/manifest.json"));
  int refused = 0;
  for (const std::string& field : manifest_fields(good)) {
    if (field.rfind("/manifest_checksum", 0) == 0) continue;  // the test above
    const json::json_pointer ptr(field);
    for (const json& w : wrong_typed_values()) {
      json m = good;
      if (m[ptr] == w) continue;
      m[ptr] = w;
      write_sealed_manifest(dir, m);
      refused += refusals_naming_dir(dir, field + " = " + w.dump());
    }
  }
  EXPECT_GT(refused, 0);
}
