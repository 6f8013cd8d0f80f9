// The tcp:// store's wire protocol (tcp_store.cpp has the server and the client): framing, encoding and the decoding
// of one request, with no sockets, so the server's parsing of untrusted bytes can be tested and fuzzed on its own
// (tests/fuzz/fuzz_tcp_store_protocol.cpp).
//
// All integers are little-endian; every message is a frame  u32 length | body.
//   request body:  u8 op | fields        AUTH secret | SET key value | GET key timeout_ms | CHECK key | ADD key delta
//                                        | REMOVE key
//   response body: u8 status | payload   OK [value | u8 exists | i64 sum] | TIMEOUT | FAILED message
// Strings are u32 length | bytes (binary-safe). A request has exactly its op's fields: trailing bytes make it
// malformed, so every request has one encoding.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace mt::tcp_store_wire {

enum Op : uint8_t { kSet = 1, kGet = 2, kCheck = 3, kAdd = 4, kRemove = 5, kAuth = 6 };
enum Status : uint8_t { kOk = 0, kTimeout = 1, kFailed = 2 };
inline constexpr uint32_t kMaxAuthFrame = 2048;  // op, length and a secret of at most 1024 bytes
inline constexpr uint32_t kMaxReply = 1u << 30;  // what the client accepts: replies carry values the server accepted
inline constexpr int64_t kMaxTimeoutMs = int64_t(1) << 40;  // ~35 years: "forever" without overflowing deadlines

// Builds one frame: the fields, then frame() fills in the length.
struct Writer {
  std::string buf = std::string(4, '\0');  // room for the frame length
  void u8(uint8_t v) { buf.push_back(char(v)); }
  void u32(uint32_t v);
  void i64(int64_t v);
  void str(const std::string& s);
  std::string frame();  // fills in the length and hands the frame over
};

uint32_t load_u32(const char* p);

// Reads fields from a body; running past its end clears `ok` and yields zeros / empty strings.
struct Reader {
  const char* p;
  size_t n;
  bool ok = true;
  bool need(size_t k);
  uint8_t u8();
  int64_t i64();
  std::string str();
};

// One request. `key` is the secret for AUTH; `value` is SET's value; `number` is GET's timeout_ms or ADD's delta.
struct Request {
  uint8_t op = 0;
  std::string key, value;
  int64_t number = 0;
  bool operator==(const Request&) const = default;
};

// The largest request body a connection may send: kMaxAuthFrame until it has authenticated, then max_frame.
inline uint32_t request_limit(bool authed, uint32_t max_frame) { return authed ? max_frame : kMaxAuthFrame; }

// What the front of a connection's input holds.
struct Decoded {
  enum Kind { kNeedMore, kRequest, kReject } kind = kNeedMore;
  size_t consumed = 0;  // kRequest: bytes of the frame (4 + its length), to drop from the input
  Request request;      // kRequest
  std::string why;      // kReject: the reason, for the log and the FAILED reply; the connection is then closed
};

// Decodes the first request in `in`. Before authentication only a well-formed AUTH is a request (the secret is the
// caller's to check); after it, AUTH is an unknown op. A length over request_limit() is rejected from the 4 length
// bytes alone, so nothing of an oversized request need be buffered.
Decoded decode_request(std::string_view in, bool authed, uint32_t max_frame);

// The frame decode_request reads back as `r`.
std::string encode_request(const Request& r);

}  // namespace mt::tcp_store_wire
