// Store URLs: file://DIR, tcp://HOST:PORT, redis://HOST[:PORT][/PREFIX] (HOST may be an [IPv6] literal).
#include <charconv>

#include "megatrain/core/error.h"
#include "megatrain/comm/store.h"

namespace mt {
namespace {

constexpr const char* kForms = "file://DIR, tcp://HOST:PORT or redis://HOST:PORT[/PREFIX]";

[[noreturn]] void bad_url(const std::string& url, const std::string& why) {
  fail("malformed store URL '{}': {} (expected {})", url, why, kForms);
}

// Splits "HOST:PORT" (or "[V6]:PORT"); port is -1 when absent.
void split_host_port(const std::string& url, const std::string& hp, std::string& host, int& port) {
  std::string rest;
  if (!hp.empty() && hp[0] == '[') {
    size_t close = hp.find(']');
    if (close == std::string::npos) bad_url(url, "unclosed '[' in the host");
    host = hp.substr(1, close - 1);
    rest = hp.substr(close + 1);
    if (!rest.empty() && rest[0] != ':') bad_url(url, "expected ':PORT' after ']'");
  } else {
    size_t colon = hp.rfind(':');
    host = hp.substr(0, colon);
    if (colon != std::string::npos) rest = hp.substr(colon);
  }
  if (host.empty()) bad_url(url, "no host");
  port = -1;
  if (rest.empty()) return;
  std::string p = rest.substr(1);
  int v = 0;
  auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), v);
  if (p.empty() || ec != std::errc() || end != p.data() + p.size() || v < 1 || v > 65535)
    bad_url(url, fmt::format("port '{}' is not a number in 1..65535", p));
  port = v;
}

}  // namespace

std::unique_ptr<Store> open_store(const std::string& url, Millis connect_timeout) {
  size_t sep = url.find("://");
  if (sep == std::string::npos) bad_url(url, "no scheme");
  std::string scheme = url.substr(0, sep), rest = url.substr(sep + 3);
  if (scheme == "file") {
    if (rest.empty()) bad_url(url, "no directory");
    return make_file_store(rest);
  }
  if (scheme == "tcp") {
    std::string host;
    int port;
    split_host_port(url, rest, host, port);
    if (port < 0) bad_url(url, "no port");
    return make_tcp_store(host, port, connect_timeout);
  }
  if (scheme == "redis") {
    size_t slash = rest.find('/', rest.empty() || rest[0] != '[' ? 0 : rest.find(']'));
    std::string hp = rest.substr(0, slash);
    std::string prefix = slash == std::string::npos ? "megatrain" : rest.substr(slash + 1);
    if (prefix.empty()) bad_url(url, "empty prefix after '/'");
    std::string host;
    int port;
    split_host_port(url, hp, host, port);
    return make_redis_store(host, port < 0 ? 6379 : port, prefix, connect_timeout);
  }
  bad_url(url, fmt::format("unknown scheme '{}'", scheme));
}

}  // namespace mt
