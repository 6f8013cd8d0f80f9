// Writes the fuzz targets' seed corpora (tests/fuzz/corpus/<target>/) from the project's own writers, so every seed
// is a real file megatrain produces, plus the regression inputs of issue 10 as edits of those seeds:
//   cmake --build build/fuzz --target fuzz_seed_corpus && build/fuzz/fuzz_seed_corpus [corpus dir]
// Files it writes are named seed-* and regress-*; it leaves any other file (a crash input added by hand) alone.
#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "megatrain/ckpt/checkpoint.h"
#include "megatrain/ckpt/safetensors.h"
#include "megatrain/comm/tcp_store_wire.h"
#include "megatrain/core/fs.h"
#include "megatrain/tokenizer/bpe_train.h"
#include "megatrain/data/shard.h"
#include "fuzz_util.h"
#include "tiny_checkpoint.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

void put(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  fmt::print("{:6} bytes  {}\n", bytes.size(), path.string());
}

std::string slurp(const fs::path& p) {
  std::vector<uint8_t> b = mt::read_binary_file(p.string());
  return std::string(b.begin(), b.end());
}

void manifests(const fs::path& out, const mt::fuzz::TinyCheckpoints& tiny) {
  const json f1 = mt::read_manifest(tiny.format1_dir), f2 = mt::read_manifest(tiny.format2_dir);
  put(out / "seed-format1.json", f1.dump(1));
  put(out / "seed-format2.json", f2.dump(1));
  // Issue 10, item 1: a piece with extent/0 deleted, and a piece whose extent is shorter than its start (both made
  // Slice::str() read out of bounds in tiling_problem); item 2: a start of 2^63-1 (start + extent overflowed, the
  // piece was never read and the tensor loaded as zeros).
  json m = f2;
  m["tensors"]["wte"]["pieces"][0]["extent"].erase(0);
  put(out / "regress-v2-extent-deleted.json", m.dump(1));
  m = f2;
  m["tensors"]["wte"]["pieces"][1]["extent"] = json::array({8});
  put(out / "regress-v2-extent-shorter-than-start.json", m.dump(1));
  m = f2;
  m["tensors"]["wte"]["pieces"][1]["start"][0] = INT64_MAX;
  put(out / "regress-v2-start-int64-max.json", m.dump(1));
  // Items 2 and 7: extra.model values the manifest's reader trusted (norm_eps = -1 silently changed the output;
  // window = 2^31-1 crashed generate).
  for (const json* base : {&f1, &f2}) {
    const std::string fmt_tag = base == &f1 ? "v1" : "v2";
    m = *base;
    m["extra"]["model"]["window"] = 2147483647;
    put(out / fmt::format("regress-{}-model-window-int32-max.json", fmt_tag), m.dump(1));
    m = *base;
    m["extra"]["model"]["norm_eps"] = -1;
    put(out / fmt::format("regress-{}-model-norm-eps-negative.json", fmt_tag), m.dump(1));
  }
}

void safetensors(const fs::path& out, const mt::fuzz::TinyCheckpoints& tiny, const fs::path& scratch) {
  put(out / "seed-format1-model.safetensors", slurp(fs::path(tiny.format1_dir) / "model.safetensors"));
  put(out / "seed-format2-shard.safetensors", slurp(fs::path(tiny.format2_dir) / "shard-pp0-tp1-dp0.safetensors"));
  // HF-style: metadata, and dtypes megatrain reads but does not train in.
  const std::vector<uint16_t> h{0x3C00, 0xC000, 0x7BFF, 0x0001};
  const std::vector<int32_t> ids{1, -2, 3};
  const std::string p = (scratch / "hf.safetensors").string();
  mt::write_safetensors(p,
                        {{"h.0.mlp.c_fc.weight", mt::DType::F16, {2, 2}, h.data()},
                         {"position_ids", mt::DType::I32, {3}, ids.data()},
                         {"empty", mt::DType::F32, {0, 3}, nullptr}},
                        {{"format", "pt"}});
  put(out / "seed-hf-metadata.safetensors", slurp(p));
  // Found by this target: an empty tensor whose other dimensions multiply past int64 (numel() overflowed).
  const std::string header = R"({"z":{"dtype":"F32","shape":[4611686018427387904,4,0],"data_offsets":[0,0]}})";
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>(static_cast<uint64_t>(header.size()) >> (8 * i));
  put(out / "regress-empty-tensor-numel-overflow.safetensors", file + header);
}

void shards(const fs::path& out, const fs::path& scratch) {
  struct Case {
    const char* name;
    int vocab, eot;
  };
  for (const Case& c : {Case{"seed-v1-gpt2-vocab.bin", 50257, 50256}, Case{"seed-v2-large-vocab.bin", 100000, 99999}}) {
    const fs::path dir = scratch / c.name;
    mt::ShardWriter w(dir.string(), "train", c.vocab, c.eot, 1000);
    w.add_document(std::vector<int32_t>{464, 1332, 318, 257, 1332, 13});
    w.add_document(std::vector<int32_t>{});
    w.add_document(std::vector<int32_t>{c.vocab - 2, 0, 7, 7});
    put(out / c.name, slurp(w.finish().at(0)));
  }
  // llm.c leaves header slots 3..5 (vocabulary, EOT, documents) zero: "not recorded".
  std::string llmc = slurp(out / "seed-v1-gpt2-vocab.bin");
  std::memset(llmc.data() + 12, 0, 12);
  put(out / "seed-v1-llmc-header.bin", llmc);
}

void run_configs(const fs::path& out, const fs::path& root) {
  const std::string sep = "#--overrides--\n";
  const std::string tiny = mt::read_text_file((root / "configs/tiny.toml").string());
  put(out / "seed-tiny.toml", tiny);
  put(out / "seed-gpt2-124m.toml", mt::read_text_file((root / "configs/gpt2-124m.toml").string()));
  put(out / "seed-tiny-overrides.toml",
      tiny + sep +
          "--train.steps=50\n--model.block=parallel\n--optim.name=lamb\n--model.recompute=[0, 2]\n"
          "--parallel.tp=2\n--model.pos=\"rope\"\n--data.shuffle=false\n");
  // Keys the config files leave at their defaults, so that mutations reach their values too.
  put(out / "seed-tiny-more-keys.toml",
      tiny + sep +
          "--model.vocab_pad_to=64\n--model.n_kv_head=2\n--model.d_ff=1024\n--model.rope_theta=10000.0\n"
          "--model.tied_embeddings=false\n--model.bias=false\n--model.norm_eps=1e-5\n--model.init_std=0.02\n"
          "--model.norm=rmsnorm\n--model.mlp=swiglu\n--train.threads=2\n--parallel.pp=2\n"
          "--parallel.virtual_stages=2\n--parallel.microbatches=4\n");
}

void tokenizer(const fs::path& out) {
  const mt::BpeVocab v = mt::train_bpe({"the cat sat on the mat; the rat ate the cat's hat. 1234 1234!",
                                        "It's the  end\n\n of   the   text \xc3\xa9t\xc3\xa9 \xe2\x82\xac"},
                                       300);
  put(out / "seed-trained.txt", mt::gpt2_encoder_json(v) + "\n#--vocab.bpe--\n" + mt::gpt2_vocab_bpe(v));

  // HF tokenizer.json files (fuzz_tokenizer.cpp's second kind): the same vocabulary as a byte-level BPE, and a
  // small SentencePiece-style one (Llama 2's layout: byte fallback, the Prepend normalizer, <s> before a text).
  const std::string text = "\n#--text--\nThe cat's hat \xc3\xa9t\xc3\xa9 \xe2\x82\xac\xff  end\n";
  nlohmann::json vocab = nlohmann::json::parse(mt::gpt2_encoder_json(v)), merges = nlohmann::json::array();
  const std::string bpe = mt::gpt2_vocab_bpe(v);
  for (size_t p = bpe.find('\n') + 1; p < bpe.size();) {
    const size_t e = bpe.find('\n', p);
    if (e > p) merges.push_back(bpe.substr(p, e - p));
    p = e + 1;
  }
  const nlohmann::json byte_level = {
      {"added_tokens", {{{"id", vocab.size() - 1}, {"content", "<|endoftext|>"}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", {{"type", "ByteLevel"}, {"trim_offsets", true}}},
      {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"vocab", vocab}, {"merges", merges}}}};
  put(out / "seed-hf-byte-level.txt", "#tokenizer.json\n" + byte_level.dump(1) + text);
  nlohmann::json sp_vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) sp_vocab[fmt::format("<0x{:02X}>", b)] = 3 + b;
  int id = 259;
  for (const char* piece :
       {"\u2581", "t", "h", "e", "a", "c", "\u2581t", "he", "\u2581the", "at", "\u2581c", "\u2581cat"})
    sp_vocab[piece] = id++;
  const nlohmann::json sp = {
      {"added_tokens",
       {{{"id", 0}, {"content", "<unk>"}, {"special", true}},
        {{"id", 1}, {"content", "<s>"}, {"special", true}},
        {{"id", 2}, {"content", "</s>"}, {"special", true}}}},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", "\u2581"}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}}}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
      {"model",
       {{"type", "BPE"},
        {"byte_fallback", true},
        {"fuse_unk", true},
        {"unk_token", "<unk>"},
        {"vocab", sp_vocab},
        {"merges", {"\u2581 t", "h e", "\u2581t he", "a t", "\u2581 c", "\u2581c at"}}}}};
  put(out / "seed-hf-sentencepiece.txt", "#tokenizer.json\n" + sp.dump(1) + text);
}

// Connections to the TCP store, as the client writes them (TcpStore's set/get/wait/check/add/remove all encode with
// encode_request), plus the frames the server must refuse.
void tcp_store_sessions(const fs::path& out) {
  namespace wire = mt::tcp_store_wire;
  const std::string auth = wire::encode_request({wire::kAuth, mt::fuzz::kStoreSecret});
  put(out / "seed-session.bin", auth + wire::encode_request({wire::kSet, "group/addr/0", "10.0.0.1:29500"}) +
                                    wire::encode_request({wire::kGet, "group/addr/0", "", 30000}) +
                                    wire::encode_request({wire::kAdd, "group/arrived", "", 1}) +
                                    wire::encode_request({wire::kCheck, "group/addr/1"}) +
                                    // wait(): one parked GET per key
                                    wire::encode_request({wire::kGet, "group/addr/1", "", 5000}) +
                                    wire::encode_request({wire::kGet, "group/addr/2", "", 4000}) +
                                    wire::encode_request({wire::kRemove, "group/addr/0"}));
  std::string huge_len = "\xf0\xff\xff\xff";  // ~4 GiB announced
  put(out / "seed-huge-length-after-auth.bin", auth + huge_len + std::string(1, char(wire::kSet)));
  put(out / "seed-huge-length-before-auth.bin", "\xff\xff\xff\x7f" + std::string(1, char(wire::kAuth)));
  put(out / "seed-unknown-op.bin", auth + wire::encode_request({99, "key"}));
  put(out / "seed-set-before-auth.bin", wire::encode_request({wire::kSet, "key", "value"}) + auth);
  put(out / "seed-wrong-secret.bin",
      wire::encode_request({wire::kAuth, "not-the-secret-0123456789"}) + wire::encode_request({wire::kCheck, "k"}));
}

}  // namespace

int main(int argc, char** argv) {
  const fs::path root = MT_ROOT;
  const fs::path out = argc > 1 ? fs::path(argv[1]) : root / "tests/fuzz/corpus";
  const fs::path scratch = fs::temp_directory_path() / fmt::format("megatrain-seed-corpus-{}", ::getpid());
  fs::remove_all(scratch);
  fs::create_directories(scratch);
  const mt::fuzz::TinyCheckpoints tiny = mt::fuzz::write_tiny_checkpoints((scratch / "tiny").string());
  manifests(out / "manifest", tiny);
  safetensors(out / "safetensors", tiny, scratch);
  shards(out / "shard_header", scratch);
  run_configs(out / "run_config", root);
  tokenizer(out / "tokenizer");
  tcp_store_sessions(out / "tcp_store_protocol");
  fs::remove_all(scratch);
  return 0;
}
