#include "tiny_checkpoint.h"

#include <cstdint>
#include <filesystem>
#include <vector>

#include "megatrain/ckpt/checkpoint.h"
#include "megatrain/ckpt/config_json.h"
#include "megatrain/ckpt/sharded.h"
#include "megatrain/core/bf16.h"

namespace mt::fuzz {

namespace {

// A one-layer model small enough that its files are a few hundred bytes; the tensors are a sample of a real GPT's
// (names, shapes, an F32 and a BF16 one), not all of them: the reader does not care which tensors a model has.
ModelConfig tiny_model() {
  ModelConfig m;
  m.vocab_size = 16;
  m.vocab_pad_to = 8;
  m.n_layer = 1;
  m.n_head = 2;
  m.d_model = 4;
  m.max_seq_len = 8;
  return m;
}

std::vector<float> ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(i + 1);
  return v;
}

nlohmann::json extra_of(const ModelConfig& m, int tp) {
  return {{"model", model_config_to_json(m)},
          {"optim_name", "adamw"},
          {"step", 1},
          {"data", {{"epoch", 0}, {"cursor", 8}, {"batch_size", 2}, {"seq_len", 4}, {"global_batch_size", 2 * tp}}},
          {"parallel", {{"dp", 1}, {"pp", 1}, {"tp", tp}}}};
}

}  // namespace

TinyCheckpoints write_tiny_checkpoints(const std::string& root) {
  namespace fs = std::filesystem;
  fs::remove_all(root);
  const ModelConfig m = tiny_model();
  const int64_t V = m.padded_vocab(), C = m.d_model;
  const std::vector<float> wte = ramp(V * C, 0.01f), ln = ramp(C, 1.0f), wte_m = ramp(V * C, -0.001f);
  std::vector<uint16_t> qkv(C * 3 * C);
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = float_to_bf16(0.125f * static_cast<float>(i));

  TinyCheckpoints out;
  const std::vector<int64_t> wte_shape{V, C}, ln_shape{C}, qkv_shape{C, 3 * C};
  CheckpointFiles files = {{"model.safetensors",
                            {{"wte", DType::F32, wte_shape, wte.data()},
                             {"h.0.ln_1.weight", DType::F32, ln_shape, ln.data()},
                             {"h.0.attn.c_attn.weight", DType::BF16, qkv_shape, qkv.data()}}},
                           {"optim.safetensors", {{"m.wte", DType::F32, wte_shape, wte_m.data()}}}};
  out.format1_dir = save_checkpoint(root + "/format1", 1, files, extra_of(m, 1));

  // Format 2 as a tp = 2 run writes it: wte split by rows, the qkv weight by columns (two boxes per rank's piece
  // would be what a real column split writes; one box each keeps it small), the norm weight on rank 0 only.
  const std::string root2 = root + "/format2";
  begin_sharded_checkpoint(root2, 1);
  std::vector<std::string> names;
  for (int tp = 0; tp < 2; ++tp) {
    const int64_t r0 = tp * V / 2, c0 = tp * 3 * C / 2;
    std::vector<uint16_t> qkv_half;
    for (int64_t r = 0; r < C; ++r)
      for (int64_t c = 0; c < 3 * C / 2; ++c) qkv_half.push_back(qkv[r * 3 * C + c0 + c]);
    std::vector<ShardPiece> pieces = {
        {"wte", "model.safetensors", wte_shape, Slice{{r0, 0}, {V / 2, C}}, DType::F32, wte.data() + r0 * C},
        {"m.wte", "optim.safetensors", wte_shape, Slice{{r0, 0}, {V / 2, C}}, DType::F32, wte_m.data() + r0 * C},
        {"h.0.attn.c_attn.weight", "model.safetensors", qkv_shape, Slice{{0, c0}, {C, 3 * C / 2}}, DType::BF16,
         qkv_half.data()}};
    if (tp == 0)
      pieces.push_back({"h.0.ln_1.weight", "model.safetensors", ln_shape, Slice{{0}, {C}}, DType::F32, ln.data()});
    names.push_back(shard_file_name(0, tp, 0));
    write_checkpoint_shard(root2, 1, names.back(), pieces);
  }
  out.format2_dir = commit_sharded_checkpoint(root2, 1, names, extra_of(m, 2));
  return out;
}

}  // namespace mt::fuzz
