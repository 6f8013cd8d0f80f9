// Fuzzes checkpoint manifests (format 1 and format 2): the input is a manifest.json, placed in a step directory
// beside the data files of the tiny checkpoints (tiny_checkpoint.h) that the seed manifests describe, then loaded
// the ways megatrain loads a checkpoint: Checkpoint::load (generate, convert, init_from), CheckpointReader reading
// every tensor whole and with a padded first dimension (resume in any layout), and the model config in
// extra.model (generate and resume build the model from it). An accepted manifest must be served consistently.
// Each input is loaded as given and again sealed with seal_manifest (a valid manifest_checksum), so that mutations
// also reach the fields' validation behind a verified checksum, not only the path of unsealed manifests.
#include <fmt/format.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fuzz_util.h"
#include "megatrain/ckpt/checkpoint.h"
#include "megatrain/ckpt/config_json.h"
#include "megatrain/ckpt/reader.h"
#include "megatrain/core/error.h"
#include "tiny_checkpoint.h"

namespace {

namespace fs = std::filesystem;

// A step directory holding the data files of both tiny checkpoints (their names differ), made once per process.
const std::string& step_dir() {
  static const std::string dir = [] {
    const std::string base = mt::fuzz::scratch_dir();
    const mt::fuzz::TinyCheckpoints tiny = mt::fuzz::write_tiny_checkpoints(base + "/tiny");
    const std::string d = base + "/ckpt/step_00000001";
    fs::create_directories(d);
    for (const std::string& from : {tiny.format1_dir, tiny.format2_dir})
      for (const auto& e : fs::directory_iterator(from))
        if (e.path().extension() == ".safetensors") fs::copy_file(e.path(), d / e.path().filename());
    return d;
  }();
  return dir;
}

// The input sealed as a writer seals a manifest (seal_manifest: manifest_checksum set to the CRC-32C of the rest),
// when it is a JSON object; nullopt otherwise. As given, a mutated manifest either lacks the checksum (read as one
// written before manifests had it, with a warning) or carries one that no longer matches (refused at once); sealed,
// it passes the check and reaches the validation of its fields on the checksum-verified path, the one every
// manifest that megatrain writes takes.
std::optional<std::string> sealed(std::string_view manifest) {
  nlohmann::json m = nlohmann::json::parse(manifest, nullptr, /*allow_exceptions=*/false);
  if (m.is_discarded() || !m.is_object()) return std::nullopt;
  return mt::seal_manifest(std::move(m)).dump(1);
}

constexpr int64_t kMaxBytes = 1 << 20;  // larger tensors are skipped: the tiny files hold a few hundred bytes

// Reads `name` into a buffer of dst_shape (the tensor's shape, or larger), as a rank of some layout would.
void read_whole(mt::CheckpointReader& r, const std::string& name, int64_t pad_rows) {
  std::vector<int64_t> shape = r.shape(name);
  if (!shape.empty()) shape[0] += pad_rows;
  const std::optional<int64_t> n = mt::checked_numel(shape);
  if (!n || *n > kMaxBytes / static_cast<int64_t>(mt::dtype_size(r.dtype(name)))) return;
  std::vector<uint8_t> buf(static_cast<size_t>(*n) * mt::dtype_size(r.dtype(name)) + 1, 0xAB);
  r.read(name, mt::whole_slice(shape), buf.data(), shape, std::vector<int64_t>(shape.size(), 0));
  FUZZ_CHECK(buf.back() == 0xAB, fmt::format("reading '{}' wrote past its destination", name));
}

// Loads the manifest at step_dir() every way megatrain does.
void load_all_ways(const std::string& dir) {
  FUZZ_ACCEPT_MT_ERRORS({
    const mt::Checkpoint ck = mt::Checkpoint::load(dir);
    for (const std::string& name : ck.tensor_names()) {
      const mt::TensorData& t = ck.get(name);
      const std::optional<int64_t> n = mt::checked_numel(t.shape);
      FUZZ_CHECK(n && t.supported && static_cast<uint64_t>(*n) * mt::dtype_size(t.dtype) == t.nbytes,
                 fmt::format("tensor '{}' {} {} holds {} bytes", name, t.dtype_str, t.shape_str(), t.nbytes));
    }
  });
  FUZZ_ACCEPT_MT_ERRORS({
    mt::CheckpointReader r = mt::CheckpointReader::open(dir);
    for (const std::string& name : r.tensor_names()) {
      read_whole(r, name, 0);
      read_whole(r, name, 3);  // a layout with more vocabulary padding: the rows beyond the shape read as zeros
    }
  });
  FUZZ_ACCEPT_MT_ERRORS({
    const nlohmann::json m = mt::read_manifest(dir);
    if (m.is_object() && m.contains("extra") && m["extra"].is_object() && m["extra"].contains("model")) {
      const mt::ModelConfig cfg = mt::model_config_from_json(m["extra"]["model"]);
      (void)cfg.padded_vocab();  // what building the model computes first (UBSan reports an overflow)
      (void)cfg.num_params();
    }
  });
}

}  // namespace

// Each input twice: as given (the checksum's own handling: absent, malformed or wrong), and sealed (everything
// behind the checksum). The committed seeds are unsealed manifests, so the sealed pass is what takes each seed and
// its mutations through the field validation.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dir = step_dir();
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  mt::fuzz::write_scratch("ckpt/step_00000001/manifest.json", input);
  load_all_ways(dir);
  if (const std::optional<std::string> s = sealed(input)) {
    mt::fuzz::write_scratch("ckpt/step_00000001/manifest.json", *s);
    load_all_ways(dir);
  }
  return 0;
}
