// Store URLs: file://DIR, tcp://HOST:PORT, redis://[[USER]:PASSWORD@]HOST[:PORT][/PREFIX] (HOST may be an [IPv6]
// literal). A tcp:// store's secret comes from MEGATRAIN_STORE_SECRET, never from the URL: URLs get printed.
#include <charconv>

#include "megatrain/core/error.h"
#include "megatrain/comm/store.h"

namespace mt {
namespace {

constexpr const char* kForms = "file://DIR, tcp://HOST:PORT or redis://[[USER]:PASSWORD@]HOST:PORT[/PREFIX]";

// The URL as messages show it: a Redis password replaced by "***".
std::string redacted(const std::string& url) {
  size_t sep = url.find("://"), at = url.rfind('@');
  if (sep == std::string::npos || at == std::string::npos || at < sep) return url;
  size_t colon = url.find(':', sep + 3);
  if (colon == std::string::npos || colon > at) return url;
  return url.substr(0, colon + 1) + "***" + url.substr(at);
}

[[noreturn]] void bad_url(const std::string& url, const std::string& why) {
  fail("malformed store URL '{}': {} (expected {})", redacted(url), why, kForms);
}

// "%40" -> "@": a password may need characters the URL syntax uses.
std::string percent_decode(const std::string& url, const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    auto hex = [&](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      bad_url(url, "'%' in the credentials is not followed by two hex digits");
    };
    if (i + 2 >= s.size()) bad_url(url, "'%' in the credentials is not followed by two hex digits");
    out += char(hex(s[i + 1]) << 4 | hex(s[i + 2]));
    i += 2;
  }
  return out;
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
    std::string secret = store_secret_from_env();
    MT_CHECK(!secret.empty(),
             "store {}: {} is not set; a tcp:// store admits only connections that present the job's secret "
             "(megatrain launch sets it for its ranks; on several nodes every launcher must be given the same one)",
             url, kStoreSecretEnv);
    return make_tcp_store(host, port, connect_timeout, secret);
  }
  if (scheme == "redis") {
    // Credentials end at the last '@' before the path: a password may contain '/', but then must be %-encoded.
    std::string user, password;
    size_t path_start = rest.find('/');
    size_t at = rest.rfind('@', path_start == std::string::npos ? std::string::npos : path_start);
    if (at != std::string::npos) {
      std::string cred = rest.substr(0, at);
      size_t colon = cred.find(':');
      if (colon == std::string::npos) bad_url(url, "credentials must be ':PASSWORD@' or 'USER:PASSWORD@'");
      user = percent_decode(url, cred.substr(0, colon));
      password = percent_decode(url, cred.substr(colon + 1));
      if (password.empty()) bad_url(url, "empty password before '@'");
      rest = rest.substr(at + 1);
    }
    size_t slash = rest.find('/', rest.empty() || rest[0] != '[' ? 0 : rest.find(']'));
    std::string hp = rest.substr(0, slash);
    std::string prefix = slash == std::string::npos ? "megatrain" : rest.substr(slash + 1);
    if (prefix.empty()) bad_url(url, "empty prefix after '/'");
    std::string host;
    int port;
    split_host_port(url, hp, host, port);
    return make_redis_store(host, port < 0 ? 6379 : port, prefix, connect_timeout, user, password);
  }
  bad_url(url, fmt::format("unknown scheme '{}'", scheme));
}

}  // namespace mt
