// safetensors: the writer's bytes checked against the format description by hand-parsing them, files built byte
// by byte read back, a round trip over every dtype, and every kind of damage refused with a message that names
// the file and the tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "support/ckpt_testutil.h"
#include "support/files.h"
#include "megatrain/ckpt/safetensors.h"

using namespace mt;
using namespace ckpt_test;
using nlohmann::json;

namespace {

// header JSON + data -> file bytes: 8-byte little-endian length, the header padded with spaces, the data.
std::vector<uint8_t> make_file(std::string header, const std::vector<uint8_t>& data, bool pad = true) {
  if (pad) header.append((8 - header.size() % 8) % 8, ' ');
  const uint64_t n = header.size();
  std::vector<uint8_t> out(8 + n + data.size());
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + 8, header.data(), n);
  if (!data.empty()) std::memcpy(out.data() + 8 + n, data.data(), data.size());
  return out;
}

template <typename T>
void append(std::vector<uint8_t>& v, T x) {
  uint8_t b[sizeof(T)];
  std::memcpy(b, &x, sizeof(T));
  v.insert(v.end(), b, b + sizeof(T));
}

// A valid two-tensor file: a F32 [2] = {1.5, -2}, b I64 [1] = {42}; returns its data bytes.
std::vector<uint8_t> two_tensor_data() {
  std::vector<uint8_t> d;
  append(d, 1.5f);
  append(d, -2.0f);
  append<int64_t>(d, 42);
  return d;
}

}  // namespace

TEST(Safetensors, ReadsAHandBuiltFile) {
  ScratchDir dir;
  std::string p = dir / "hand.safetensors";
  write_bytes(p, make_file(R"({"__metadata__":{"format":"pt","note":"hi"},)"
                           R"("b":{"dtype":"I64","shape":[1],"data_offsets":[8,16]},)"
                           R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                           two_tensor_data()));
  auto f = SafetensorsFile::open(p);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "hi");
  const auto& a = f.get("a");
  EXPECT_EQ(a.dtype, DType::F32);
  EXPECT_EQ(a.shape, std::vector<int64_t>{2});
  EXPECT_EQ(a.nbytes, 8u);
  float av[2];
  std::memcpy(av, a.data, 8);
  EXPECT_EQ(av[0], 1.5f);
  EXPECT_EQ(av[1], -2.0f);
  int64_t bv;
  std::memcpy(&bv, f.get("b").data, 8);
  EXPECT_EQ(bv, 42);
  EXPECT_EQ(f.get("b").dtype, DType::I64);
  EXPECT_FALSE(f.has("c"));
  EXPECT_ERROR_HAS(f.get("c"), p.c_str(), "'c'");
}

TEST(Safetensors, OpensFilesWithDtypesWeDoNotComputeIn) {
  ScratchDir dir;
  std::string p = dir / "f64.safetensors";
  std::vector<uint8_t> d;
  append(d, 2.5);
  append<uint8_t>(d, 1);
  write_bytes(p, make_file(R"({"d":{"dtype":"F64","shape":[],"data_offsets":[0,8]},)"
                           R"("m":{"dtype":"BOOL","shape":[1],"data_offsets":[8,9]}})",
                           d));
  auto f = SafetensorsFile::open(p);
  EXPECT_EQ(f.names().size(), 2u);
  EXPECT_FALSE(f.tensors().at("d").supported);
  EXPECT_EQ(f.tensors().at("d").dtype_str, "F64");
  EXPECT_ERROR_HAS(f.get("d"), "'d'", "F64", "does not handle");
}

TEST(Safetensors, WriterOutputFollowsTheFormat) {
  ScratchDir dir;
  std::string p = dir / "w.safetensors";
  std::vector<float> w = {1, 2, 3, 4, 5, 6};
  std::vector<uint16_t> h = {7, 8, 9};
  std::vector<uint8_t> u = {250};
  write_safetensors(p,
                    {{"u", DType::U8, {1}, u.data()},
                     {"w", DType::F32, {2, 3}, w.data()},
                     {"h", DType::BF16, {3}, h.data()}},
                    {{"k", "v"}});
  // Parse the bytes by hand, without SafetensorsFile.
  auto bytes = read_bytes(p);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  EXPECT_EQ((8 + n) % 8, 0u) << "the data region starts 8-byte aligned";
  std::string header(bytes.begin() + 8, bytes.begin() + 8 + n);
  json j = json::parse(header);
  EXPECT_EQ(j["__metadata__"], json({{"k", "v"}}));
  // Bigger elements first, then by name: w (F32), h (BF16), u (U8); contiguous from 0.
  EXPECT_EQ(j["w"]["data_offsets"], json({0, 24}));
  EXPECT_EQ(j["h"]["data_offsets"], json({24, 30}));
  EXPECT_EQ(j["u"]["data_offsets"], json({30, 31}));
  EXPECT_EQ(j["w"]["dtype"], "F32");
  EXPECT_EQ(j["h"]["dtype"], "BF16");
  EXPECT_EQ(j["w"]["shape"], json({2, 3}));
  ASSERT_EQ(bytes.size(), 8 + n + 31);
  const uint8_t* data = bytes.data() + 8 + n;
  EXPECT_EQ(std::memcmp(data, w.data(), 24), 0);
  EXPECT_EQ(std::memcmp(data + 24, h.data(), 6), 0);
  EXPECT_EQ(data[30], 250);
  // No temporary file is left behind.
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
}

TEST(Safetensors, RoundTripOfEveryDtypeWithMetadata) {
  ScratchDir dir;
  std::string p = dir / "all.safetensors";
  std::vector<float> f32 = {0.5f, -1.25f, 3e38f, -0.0f};
  std::vector<uint16_t> bf16 = {0x3F80, 0xC000, 0x7F80}, f16 = {0x3C00, 0x8001};
  std::vector<int32_t> i32 = {-7, 1 << 30};
  std::vector<int64_t> i64 = {-(1ll << 60), 5, 6, 7, 8, 9};
  std::vector<uint16_t> u16 = {65535};
  std::vector<uint8_t> u8 = {1, 2, 3, 4, 5};
  std::vector<TensorRef> t = {
      {"w.f32", DType::F32, {2, 2}, f32.data()}, {"w.bf16", DType::BF16, {3}, bf16.data()},
      {"w.f16", DType::F16, {2, 1}, f16.data()}, {"n.i32", DType::I32, {2}, i32.data()},
      {"n.i64", DType::I64, {2, 3}, i64.data()}, {"n.u16", DType::U16, {}, u16.data()},
      {"n.u8", DType::U8, {5}, u8.data()},       {"empty", DType::F32, {0, 4}, nullptr},
  };
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"step", "12"}, {"unicode", "\xc3\xa9t\xc3\xa9"}};
  auto res = write_safetensors(p, t, meta);
  EXPECT_EQ(res.file_bytes, std::filesystem::file_size(p));
  auto f = SafetensorsFile::open(p);
  EXPECT_EQ(f.metadata(), meta);
  EXPECT_EQ(f.names().size(), t.size());
  for (auto& r : t) {
    SCOPED_TRACE(r.name);
    const auto& d = f.get(r.name);
    EXPECT_EQ(d.dtype, r.dtype);
    EXPECT_EQ(d.shape, r.shape);
    size_t nb = dtype_size(r.dtype);
    for (auto s : r.shape) nb *= static_cast<size_t>(s);
    ASSERT_EQ(d.nbytes, nb);
    if (nb) {
      EXPECT_EQ(std::memcmp(d.data, r.data, nb), 0);
    }
    EXPECT_EQ(reinterpret_cast<uintptr_t>(d.data) % dtype_size(r.dtype), 0u) << "our files keep elements aligned";
  }
}

TEST(Safetensors, OutputIsDeterministic) {
  ScratchDir dir;
  std::vector<float> a = {1, 2}, b = {3};
  std::vector<int32_t> c = {4, 5, 6};
  write_safetensors(dir / "1.safetensors", {{"a", DType::F32, {2}, a.data()},
                                            {"b", DType::F32, {1}, b.data()},
                                            {"c", DType::I32, {3}, c.data()}});
  write_safetensors(dir / "2.safetensors", {{"c", DType::I32, {3}, c.data()},
                                            {"b", DType::F32, {1}, b.data()},
                                            {"a", DType::F32, {2}, a.data()}});
  EXPECT_EQ(read_bytes(dir / "1.safetensors"), read_bytes(dir / "2.safetensors"));
}

TEST(Safetensors, WriterRefusesBadInputAndLeavesNothingBehind) {
  ScratchDir dir;
  std::vector<float> a = {1};
  std::string p = dir / "bad.safetensors";
  EXPECT_ERROR_HAS(write_safetensors(p, {{"a", DType::F32, {1}, a.data()}, {"a", DType::F32, {1}, a.data()}}),
                   "'a' appears twice");
  EXPECT_ERROR_HAS(write_safetensors(p, {{"a", DType::F32, {3}, nullptr}}), "'a' has no data");
  EXPECT_ERROR_HAS(write_safetensors(p, {{"a", DType::F32, {-1}, a.data()}}), "negative dimension");
  EXPECT_ERROR_HAS(write_safetensors(p, {{"__metadata__", DType::F32, {1}, a.data()}}), "reserved");
  EXPECT_ERROR_HAS(write_safetensors(dir / "no/such/dir/x.safetensors", {{"a", DType::F32, {1}, a.data()}}),
                   "cannot create");
  EXPECT_TRUE(std::filesystem::is_empty(dir.path));
}

// Each case: header, data, and words the error must contain.
struct BadCase {
  const char* what;
  std::string header;
  std::vector<uint8_t> data;
  std::vector<const char*> words;
};

TEST(Safetensors, RefusesCorruptFiles) {
  ScratchDir dir;
  const auto d = two_tensor_data();
  const std::string b_ok = R"("b":{"dtype":"I64","shape":[1],"data_offsets":[8,16]})";
  std::vector<BadCase> cases = {
      {"not json", R"({"a":{"dtype":"F32",)", d, {"corrupt header"}},
      {"not an object", R"([1,2])", d, {"corrupt header"}},
      {"missing dtype", R"({"a":{"shape":[2],"data_offsets":[0,8]},)" + b_ok + "}", d, {"'a'", "dtype"}},
      {"missing shape", R"({"a":{"dtype":"F32","data_offsets":[0,8]},)" + b_ok + "}", d, {"'a'", "shape"}},
      {"missing offsets", R"({"a":{"dtype":"F32","shape":[2]},)" + b_ok + "}", d, {"'a'", "data_offsets"}},
      {"unknown dtype",
       R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]},)" + b_ok + "}",
       d,
       {"'a'", "unknown dtype 'F33'"}},
      {"negative dim", R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]},)" + b_ok + "}", d, {"'a'", "shape"}},
      {"reversed", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]},)" + b_ok + "}", d, {"'a'", "reversed"}},
      {"out of range",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("b":{"dtype":"I64","shape":[1],"data_offsets":[16,24]}})",
       d,
       {"'b'", "past the data region"}},
      {"size mismatch",
       R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]},)" + b_ok + "}",
       d,
       {"'a'", "needs 12"}},
      {"overflowing shape",
       R"({"a":{"dtype":"F32","shape":[4611686018427387904,4611686018427387904],"data_offsets":[0,8]},)" + b_ok + "}",
       d,
       {"'a'", "more than 2^64"}},
      // Zero bytes, but numel() of the shape overflows int64 (found by tests/fuzz/fuzz_safetensors).
      {"empty tensor of overflowing shape",
       R"({"z":{"dtype":"F32","shape":[4611686018427387904,4,0],"data_offsets":[0,0]},)"
       R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)" +
           b_ok + "}",
       d,
       {"'z'", "more elements than int64"}},
      // Empty (a zero dimension), but the other dimensions' product overflows int64: element counts computed left
      // to right (shape_numel) would overflow before reaching the zero. Accepted before.
      {"empty tensor with an overflowing shape",
       R"({"z":{"dtype":"F32","shape":[4611686018427387904,4611686018427387904,0],"data_offsets":[0,0]},)"
       R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)" +
           b_ok + "}",
       d,
       {"'z'", "more elements than int64 can count"}},
      {"overlap",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("b":{"dtype":"I64","shape":[1],"data_offsets":[4,12]}})",
       d,
       {"'b'", "overlaps"}},
      {"hole", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)" + b_ok + "}", d, {"'b'", "unused bytes"}},
      {"trailing bytes", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", d, {"8 bytes after"}},
      {"bad metadata",
       R"({"__metadata__":{"k":1},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)" + b_ok + "}",
       d,
       {"__metadata__", "'k'"}},
  };
  for (auto& c : cases) {
    SCOPED_TRACE(c.what);
    std::string p = dir / "bad.safetensors";
    write_bytes(p, make_file(c.header, c.data));
    std::string msg = error_of([&] { SafetensorsFile::open(p); });
    EXPECT_NE(msg.find(p), std::string::npos) << msg;
    for (auto* w : c.words) EXPECT_NE(msg.find(w), std::string::npos) << msg << "\nlacks: " << w;
  }
}

TEST(Safetensors, RefusesTruncatedAndMalformedLengths) {
  ScratchDir dir;
  std::string good = dir / "good.safetensors", p = dir / "t.safetensors";
  std::vector<float> w(100, 1.0f);
  write_safetensors(good, {{"w", DType::F32, {100}, w.data()}});
  auto bytes = read_bytes(good);
  // Truncated by one byte: the last tensor runs past the end.
  write_bytes(p, std::vector<uint8_t>(bytes.begin(), bytes.end() - 1));
  EXPECT_ERROR_HAS(SafetensorsFile::open(p), p.c_str(), "'w'", "truncated");
  // Truncated inside the header.
  write_bytes(p, std::vector<uint8_t>(bytes.begin(), bytes.begin() + 20));
  EXPECT_ERROR_HAS(SafetensorsFile::open(p), p.c_str(), "exceeds the file size");
  // Shorter than the length field.
  write_bytes(p, std::vector<uint8_t>(bytes.begin(), bytes.begin() + 5));
  EXPECT_ERROR_HAS(SafetensorsFile::open(p), p.c_str(), "too short");
  // An absurd header length.
  auto big = bytes;
  big[5] = 0x01;
  write_bytes(p, big);
  EXPECT_ERROR_HAS(SafetensorsFile::open(p), p.c_str(), "implausible");
  EXPECT_ERROR_HAS(SafetensorsFile::open(dir / "missing.safetensors"), "cannot open", "missing.safetensors");
  EXPECT_ERROR_HAS(SafetensorsFile::open(dir.path), "not a regular file");
}

TEST(Safetensors, ToF32ConvertsHalfFormats) {
  ScratchDir dir;
  // F16: 1.0, -2.0, 0.5, smallest subnormal 2^-24, 65504 (max), +inf. BF16: 1.0, -3.0.
  std::vector<uint16_t> f16 = {0x3C00, 0xC000, 0x3800, 0x0001, 0x7BFF, 0x7C00}, bf16 = {0x3F80, 0xC040};
  std::vector<int32_t> i = {1};
  std::string p = dir / "h.safetensors";
  write_safetensors(p, {{"h", DType::F16, {6}, f16.data()},
                        {"b", DType::BF16, {2}, bf16.data()},
                        {"i", DType::I32, {1}, i.data()}});
  auto f = SafetensorsFile::open(p);
  float out[6];
  to_f32(f.get("h"), out);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], 0.5f);
  EXPECT_EQ(out[3], std::ldexp(1.0f, -24));
  EXPECT_EQ(out[4], 65504.0f);
  EXPECT_TRUE(std::isinf(out[5]));
  to_f32(f.get("b"), out);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -3.0f);
  EXPECT_ERROR_HAS(to_f32(f.get("i"), out), "'i'", "I32");
}
