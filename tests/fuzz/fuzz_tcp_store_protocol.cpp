// Fuzzes the tcp:// store server's request decoding (comm/tcp_store_wire.h): the input is the byte stream of one
// connection, decoded frame by frame as TcpStoreServer does it, starting unauthenticated; an AUTH with
// kStoreSecret authenticates the rest, any other AUTH ends the connection as the server would. The caps under
// test are the server's own: kMaxAuthFrame before AUTH, then max_frame (1 KiB here, the least the server allows, so
// oversized frames are within reach of small inputs). What the decoder accepts must be exactly one canonical frame
// (re-encoding gives the same bytes), within the cap, and must not be acted on before all of it has arrived.
#include <fmt/format.h>

#include <cstdint>
#include <string_view>

#include "fuzz_util.h"
#include "megatrain/comm/tcp_store_wire.h"

namespace wire = mt::tcp_store_wire;

namespace {

constexpr uint32_t kMaxFrame = 1024;

const char* kind_name(wire::Decoded::Kind k) {
  return k == wire::Decoded::kNeedMore ? "need-more" : k == wire::Decoded::kRequest ? "request" : "reject";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view stream(reinterpret_cast<const char*>(data), size);
  bool authed = false;
  for (size_t off = 0;;) {
    const std::string_view in = stream.substr(off);
    const wire::Decoded d = wire::decode_request(in, authed, kMaxFrame);
    const uint32_t limit = wire::request_limit(authed, kMaxFrame);
    const uint32_t len = in.size() >= 4 ? wire::load_u32(in.data()) : 0;
    if (d.kind == wire::Decoded::kNeedMore) {
      FUZZ_CHECK(in.size() < 4 || (len <= limit && in.size() - 4 < len),
                 fmt::format("waits for more with {} bytes buffered of a {}-byte frame", in.size(), len));
      break;
    }
    if (d.kind == wire::Decoded::kReject) {
      FUZZ_CHECK(!d.why.empty(), "a rejection without a reason");
      if (len > limit) {  // decided from the length alone: the server buffers nothing of an oversized frame
        const wire::Decoded head = wire::decode_request(in.substr(0, 4), authed, kMaxFrame);
        FUZZ_CHECK(head.kind == wire::Decoded::kReject && head.why == d.why,
                   fmt::format("a {}-byte frame over the {}-byte cap: '{}' on its length alone, '{}' whole", len, limit,
                               head.why, d.why));
      }
      mt::fuzz::rejected(d.why.c_str());
      break;
    }
    // A request: one whole frame, within the cap, in its only encoding.
    FUZZ_CHECK(len <= limit && d.consumed == 4 + size_t(len) && d.consumed <= in.size(),
               fmt::format("consumed {} bytes for a {}-byte frame (cap {}) with {} buffered", d.consumed, len, limit,
                           in.size()));
    const std::string_view frame = in.substr(0, d.consumed);
    FUZZ_CHECK(wire::encode_request(d.request) == frame,
               fmt::format("op {} re-encodes to other bytes than the {}-byte frame it came from", d.request.op,
                           frame.size()));
    FUZZ_CHECK(authed == (d.request.op != wire::kAuth),
               fmt::format("op {} passed {} authentication", d.request.op, authed ? "after" : "before"));
    for (size_t cut : {size_t(0), size_t(3), size_t(4), frame.size() - 1}) {
      if (cut >= frame.size()) continue;
      const wire::Decoded part = wire::decode_request(frame.substr(0, cut), authed, kMaxFrame);
      FUZZ_CHECK(part.kind == wire::Decoded::kNeedMore,
                 fmt::format("{} of the frame's {} bytes decode as {}", cut, frame.size(), kind_name(part.kind)));
    }
    if (d.request.op == wire::kAuth) {
      if (d.request.key != mt::fuzz::kStoreSecret) break;  // the server closes the connection: wrong secret
      authed = true;
    }
    off += d.consumed;
  }
  return 0;
}
