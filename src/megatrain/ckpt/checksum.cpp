#include "megatrain/ckpt/checksum.h"

#include <fmt/format.h>

#include <array>
#include <cstring>

#include "megatrain/core/error.h"

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#define MT_CRC_HW_X86 1
#elif defined(__ARM_FEATURE_CRC32)
#include <arm_acle.h>
#define MT_CRC_HW_ARM 1
#endif

namespace mt {

static constexpr uint32_t kPoly = 0x82F63B78u;  // Castagnoli, bit-reflected

namespace {

// table[k][b]: the CRC register after feeding byte b followed by k zero bytes (slice-by-8).
struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  Tables() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t c = b;
      for (int i = 0; i < 8; ++i) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[0][b] = c;
    }
    for (int k = 1; k < 8; ++k)
      for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
  }
};
const Tables kTables;

}  // namespace

uint32_t crc32c_update_portable(uint32_t crc, const void* data, size_t n) {
  const auto& t = kTables.t;
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);  // little-endian load (the build targets x86-64 and little-endian ARM)
    w ^= c;
    c = t[7][w & 0xFF] ^ t[6][(w >> 8) & 0xFF] ^ t[5][(w >> 16) & 0xFF] ^ t[4][(w >> 24) & 0xFF] ^
        t[3][(w >> 32) & 0xFF] ^ t[2][(w >> 40) & 0xFF] ^ t[1][(w >> 48) & 0xFF] ^ t[0][w >> 56];
  }
  for (; n > 0; --n, ++p) c = (c >> 8) ^ t[0][(c ^ *p) & 0xFF];
  return ~c;
}

bool crc32c_hardware() {
#if defined(MT_CRC_HW_X86) || defined(MT_CRC_HW_ARM)
  return true;
#else
  return false;
#endif
}

// Combination works in GF(2)[x] modulo the CRC polynomial, in the reflected bit order (bit 31 = x^0).
// Appending |B| bytes to A multiplies A's CRC register by x^(8|B|); the init/final xors cancel out.
// `a` must be nonzero (it is always a power of x here).
static uint32_t mul_mod_p(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, prod = 0;
  for (;;) {
    if (a & m) {
      prod ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return prod;
}

namespace {
// x^(2^k) mod p for k = 0..63, so x^(8n) costs one multiplication per set bit of n.
struct PowTable {
  std::array<uint32_t, 64> x2k{};
  PowTable() {
    uint32_t p = 1u << 30;  // x^1
    for (auto& v : x2k) {
      v = p;
      p = mul_mod_p(p, p);
    }
  }
};
const PowTable kPow;
}  // namespace

// x^(8n) mod p: walk the bits of n, starting at 2^3.
static uint32_t x_pow_8n(uint64_t n) {
  uint32_t xn = 1u << 31;  // x^0
  for (int k = 3; n != 0 && k < 64; ++k, n >>= 1)
    if (n & 1) xn = mul_mod_p(kPow.x2k[k], xn);
  return xn;
}

uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  return mul_mod_p(x_pow_8n(len_b), crc_a) ^ crc_b;
}

#if defined(MT_CRC_HW_X86) || defined(MT_CRC_HW_ARM)
static inline uint64_t hw_crc_u64(uint64_t c, const uint8_t* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
#if defined(MT_CRC_HW_X86)
  return _mm_crc32_u64(c, w);
#else
  return __crc32cd(static_cast<uint32_t>(c), w);
#endif
}
#endif

uint32_t crc32c_update(uint32_t crc, const void* data, size_t n) {
#if defined(MT_CRC_HW_X86) || defined(MT_CRC_HW_ARM)
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t c = ~crc;
  // The crc32 instruction has a latency of ~3 cycles but issues every cycle: three independent streams over
  // adjacent blocks keep it busy, and the three registers are merged by linearity,
  // reg(A||B||C) = reg(A) x^(16 kBlock) + reg0(B) x^(8 kBlock) + reg0(C)  (mod p).
  constexpr size_t kBlock = 8192;
  static const uint32_t shift1 = x_pow_8n(kBlock), shift2 = x_pow_8n(2 * kBlock);
  for (; n >= 3 * kBlock; n -= 3 * kBlock, p += 3 * kBlock) {
    uint64_t c1 = 0, c2 = 0;
    for (size_t i = 0; i < kBlock; i += 8) {
      c = hw_crc_u64(c, p + i);
      c1 = hw_crc_u64(c1, p + kBlock + i);
      c2 = hw_crc_u64(c2, p + 2 * kBlock + i);
    }
    c = mul_mod_p(shift2, static_cast<uint32_t>(c)) ^ mul_mod_p(shift1, static_cast<uint32_t>(c1)) ^
        static_cast<uint32_t>(c2);
  }
  for (; n >= 8; n -= 8, p += 8) c = hw_crc_u64(c, p);
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; n > 0; --n, ++p) {
#if defined(MT_CRC_HW_X86)
    c32 = _mm_crc32_u8(c32, *p);
#else
    c32 = __crc32cb(c32, *p);
#endif
  }
  return ~c32;
#else
  return crc32c_update_portable(crc, data, n);
#endif
}

std::string format_checksum(uint32_t crc) { return fmt::format("crc32c:{:08x}", crc); }

uint32_t parse_checksum(const std::string& s) {
  MT_CHECK(s.size() == 15 && s.rfind("crc32c:", 0) == 0, "bad checksum '{}' (expected crc32c:xxxxxxxx)", s);
  uint32_t v = 0;
  for (size_t i = 7; i < s.size(); ++i) {
    char ch = s[i];
    int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
    MT_CHECK(d >= 0, "bad checksum '{}' (expected crc32c:xxxxxxxx)", s);
    v = v << 4 | static_cast<uint32_t>(d);
  }
  return v;
}

}  // namespace mt
