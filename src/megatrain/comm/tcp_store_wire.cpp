// The tcp:// store's framing and request decoding (the format is in tcp_store_wire.h).
#include "megatrain/comm/tcp_store_wire.h"

#include <fmt/format.h>

namespace mt::tcp_store_wire {

void Writer::u32(uint32_t v) {
  for (int i = 0; i < 4; ++i) buf.push_back(char((v >> (8 * i)) & 0xff));
}
void Writer::i64(int64_t v) {
  for (int i = 0; i < 8; ++i) buf.push_back(char((uint64_t(v) >> (8 * i)) & 0xff));
}
void Writer::str(const std::string& s) {
  u32(uint32_t(s.size()));
  buf += s;
}
std::string Writer::frame() {
  uint32_t n = uint32_t(buf.size() - 4);
  for (int i = 0; i < 4; ++i) buf[i] = char((n >> (8 * i)) & 0xff);
  return std::move(buf);
}

uint32_t load_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(uint8_t(p[i])) << (8 * i);
  return v;
}

bool Reader::need(size_t k) {
  if (n < k) ok = false;
  return ok;
}
uint8_t Reader::u8() {
  if (!need(1)) return 0;
  n -= 1;
  return uint8_t(*p++);
}
int64_t Reader::i64() {
  if (!need(8)) return 0;
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(uint8_t(p[i])) << (8 * i);
  p += 8, n -= 8;
  return int64_t(v);
}
std::string Reader::str() {
  if (!need(4)) return {};
  uint32_t len = load_u32(p);
  p += 4, n -= 4;
  if (!need(len)) return {};
  std::string s(p, len);
  p += len, n -= len;
  return s;
}

Decoded decode_request(std::string_view in, bool authed, uint32_t max_frame) {
  Decoded d;
  if (in.size() < 4) return d;
  const uint32_t len = load_u32(in.data()), limit = request_limit(authed, max_frame);
  if (len > limit) {
    d.kind = Decoded::kReject;
    d.why = fmt::format("a request of {} bytes exceeds the limit of {} bytes{}", len, limit,
                        authed ? "" : " before authentication");
    return d;
  }
  if (in.size() - 4 < len) return d;
  Reader r{in.data() + 4, len};
  Request& q = d.request;
  q.op = r.u8();
  q.key = r.str();  // the secret for AUTH
  bool known = true;
  if (!authed) {
    if (q.op != kAuth || !r.ok || r.n != 0) {
      d.kind = Decoded::kReject;
      d.why = q.op == kAuth ? "malformed authentication request"
                            : fmt::format("request (op {}) before authentication", q.op);
      return d;
    }
  } else {
    switch (q.op) {
      case kSet: q.value = r.str(); break;
      case kGet:
      case kAdd: q.number = r.i64(); break;
      case kCheck:
      case kRemove: break;
      default: known = false;
    }
  }
  if (!known || !r.ok || r.n != 0) {
    d.kind = Decoded::kReject;
    d.why = fmt::format("{} request (op {})", known ? "malformed" : "unknown", q.op);
    return d;
  }
  d.kind = Decoded::kRequest;
  d.consumed = 4 + size_t(len);
  return d;
}

std::string encode_request(const Request& q) {
  Writer w;
  w.u8(q.op);
  w.str(q.key);
  if (q.op == kSet) w.str(q.value);
  if (q.op == kGet || q.op == kAdd) w.i64(q.number);
  return w.frame();
}

}  // namespace mt::tcp_store_wire
