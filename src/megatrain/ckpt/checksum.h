// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, init and final xor 0xFFFFFFFF): the checksum of
// checkpoint files and tensors. Chosen over a 64-bit hash because x86 (SSE4.2) and ARMv8 have an instruction
// for it, and because CRCs can be combined: crc(A || B) follows from crc(A), crc(B) and |B|, so one pass over
// the data yields both every tensor's checksum and the whole file's.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace mt {

// Continues a CRC: crc32c_update(crc32c_update(0, a, n), b, m) == crc32c(a||b). Start with crc = 0.
uint32_t crc32c_update(uint32_t crc, const void* data, size_t n);
inline uint32_t crc32c(const void* data, size_t n) { return crc32c_update(0, data, n); }
// crc32c(A || B) from crc_a = crc32c(A), crc_b = crc32c(B), len_b = |B|.
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);
// The table-driven (slice-by-8) version, always compiled: the reference for the hardware path in tests.
uint32_t crc32c_update_portable(uint32_t crc, const void* data, size_t n);
bool crc32c_hardware();  // whether crc32c_update uses a CPU instruction in this build

// "crc32c:0123abcd", the spelling in manifests; parse_checksum throws on anything else.
std::string format_checksum(uint32_t crc);
uint32_t parse_checksum(const std::string& s);

}  // namespace mt
