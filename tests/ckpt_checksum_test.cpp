// CRC-32C against published test vectors (RFC 3720 B.4, the "123456789" check value) and a bit-at-a-time
// oracle written here; the hardware and table paths against each other; incremental use and combination.
#include <gtest/gtest.h>
#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

#include <cstring>
#include <string>
#include <vector>

#include "support/ckpt_testutil.h"
#include "megatrain/ckpt/checksum.h"
#include "megatrain/core/rng.h"

using namespace mt;

namespace {

// The definition: reflected CRC over polynomial 0x1EDC6F41 (reversed 0x82F63B78), init ~0, final xor ~0.
uint32_t crc_bitwise(const uint8_t* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
  }
  return ~c;
}

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(r.next_u32());
  return v;
}

}  // namespace

TEST(Crc32c, KnownAnswers) {
  const char* s = "123456789";
  EXPECT_EQ(crc32c(s, 9), 0xE3069283u);
  EXPECT_EQ(crc32c(s, 0), 0u);
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xFF), inc(32), dec(32);
  for (int i = 0; i < 32; ++i) inc[i] = static_cast<uint8_t>(i), dec[i] = static_cast<uint8_t>(31 - i);
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c(inc.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(crc32c(dec.data(), 32), 0x113FDB5Cu);
  EXPECT_EQ(crc32c_update_portable(0, s, 9), 0xE3069283u);
}

TEST(Crc32c, BothPathsMatchTheDefinitionAtEveryLengthAndAlignment) {
  auto buf = random_bytes(400, 1);
  for (size_t off = 0; off < 8; ++off)
    for (size_t n = 0; n + off <= 300; ++n) {
      uint32_t want = crc_bitwise(buf.data() + off, n);
      ASSERT_EQ(crc32c(buf.data() + off, n), want) << "off " << off << " n " << n;
      ASSERT_EQ(crc32c_update_portable(0, buf.data() + off, n), want) << "off " << off << " n " << n;
    }
  auto big = random_bytes((1 << 20) + 3, 2);
  EXPECT_EQ(crc32c(big.data(), big.size()), crc_bitwise(big.data(), big.size()));
  EXPECT_EQ(crc32c_update_portable(0, big.data(), big.size()), crc32c(big.data(), big.size()));
}

TEST(Crc32c, IncrementalEqualsOneShot) {
  auto buf = random_bytes(10000, 3);
  uint32_t whole = crc32c(buf.data(), buf.size());
  Rng r(4);
  for (int trial = 0; trial < 50; ++trial) {
    size_t a = r.below(buf.size() + 1), b = a + r.below(buf.size() - a + 1);
    uint32_t c = crc32c_update(0, buf.data(), a);
    c = crc32c_update(c, buf.data() + a, b - a);
    c = crc32c_update(c, buf.data() + b, buf.size() - b);
    ASSERT_EQ(c, whole);
  }
}

TEST(Crc32c, CombineEqualsCrcOfConcatenation) {
  auto buf = random_bytes((1 << 20) + 77, 5);
  Rng r(6);
  std::vector<std::pair<size_t, size_t>> cases = {{0, 0}, {0, 5}, {5, 0}, {1, 1}, {3, (1 << 20) + 74}};
  for (int i = 0; i < 40; ++i) {
    size_t a = r.below(5000), b = r.below(5000);
    cases.push_back({a, b});
  }
  for (auto [na, nb] : cases) {
    uint32_t ca = crc32c(buf.data(), na), cb = crc32c(buf.data() + na, nb);
    ASSERT_EQ(crc32c_combine(ca, cb, nb), crc32c(buf.data(), na + nb)) << na << " + " << nb;
  }
}

TEST(Crc32c, ChecksumStrings) {
  EXPECT_EQ(format_checksum(0xE3069283u), "crc32c:e3069283");
  EXPECT_EQ(format_checksum(0x1u), "crc32c:00000001");
  EXPECT_EQ(parse_checksum("crc32c:e3069283"), 0xE3069283u);
  EXPECT_ERROR_HAS(parse_checksum("crc32:e3069283"), "bad checksum");
  EXPECT_ERROR_HAS(parse_checksum("crc32c:e30692g3"), "bad checksum");
  EXPECT_ERROR_HAS(parse_checksum("crc32c:e306928"), "bad checksum");
}

// The CRC instruction is chosen at compile time (SSE4.2 on x86-64, the CRC extension on ARMv8), so a build for this
// CPU (-march=native, the default) must use it where the CPU has it; and it must agree with the table-driven path.
TEST(Crc32c, HardwarePathIsUsedWhereTheCpuHasIt) {
  std::printf("crc32c: %s\n", crc32c_hardware() ? "hardware" : "slice-by-8");
#if MT_NATIVE_BUILD && defined(__x86_64__)
  if (__builtin_cpu_supports("sse4.2")) {
    EXPECT_TRUE(crc32c_hardware()) << "the CPU has SSE4.2";
  }
#elif MT_NATIVE_BUILD && defined(__aarch64__) && defined(__linux__)
  if (::getauxval(AT_HWCAP) & HWCAP_CRC32) {
    EXPECT_TRUE(crc32c_hardware()) << "the CPU has the CRC32 extension";
  }
#endif
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  auto big = random_bytes((4 << 20) + 5, 7);  // many of the hardware path's 24 KiB three-stream blocks, and a tail
  const uint32_t want = crc_bitwise(big.data(), big.size());
  EXPECT_EQ(crc32c(big.data(), big.size()), want);
  EXPECT_EQ(crc32c_update_portable(0, big.data(), big.size()), want);
}
