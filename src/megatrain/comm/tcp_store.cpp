// tcp:// stores: a single-threaded poll() server and a synchronous client.
//
// Wire format (all integers little-endian): every message is a frame  u32 length | body.
//   request body:  u8 op | fields        SET key value | GET key timeout_ms | CHECK key | ADD key delta | REMOVE key
//   response body: u8 status | payload   OK [value | u8 exists | i64 sum] | TIMEOUT | FAILED message
// Strings are u32 length | bytes (binary-safe). A GET for a missing key parks the connection on the server until
// a SET/ADD creates the key or the client's timeout passes, so waiting costs no traffic and no spinning.
// The client keeps a small pool of connections: each op takes an idle one (or opens one), so a thread blocked in
// get() never stalls another thread's set() on the same Store.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"
#include "megatrain/comm/store.h"

namespace mt {
namespace {

enum Op : uint8_t { kSet = 1, kGet = 2, kCheck = 3, kAdd = 4, kRemove = 5 };
enum Status : uint8_t { kOk = 0, kTimeout = 1, kFailed = 2 };
constexpr uint32_t kMaxFrame = 1u << 30;
constexpr int64_t kMaxTimeoutMs = int64_t(1) << 40;  // ~35 years: "forever" without overflowing deadlines

struct Writer {
  std::string buf = std::string(4, '\0');  // room for the frame length
  void u8(uint8_t v) { buf.push_back(char(v)); }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) buf.push_back(char((v >> (8 * i)) & 0xff));
  }
  void i64(int64_t v) {
    for (int i = 0; i < 8; ++i) buf.push_back(char((uint64_t(v) >> (8 * i)) & 0xff));
  }
  void str(const std::string& s) {
    u32(uint32_t(s.size()));
    buf += s;
  }
  std::string frame() {  // fills in the length and hands the frame over
    uint32_t n = uint32_t(buf.size() - 4);
    for (int i = 0; i < 4; ++i) buf[i] = char((n >> (8 * i)) & 0xff);
    return std::move(buf);
  }
};

uint32_t load_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(uint8_t(p[i])) << (8 * i);
  return v;
}

struct Reader {
  const char* p;
  size_t n;
  bool ok = true;
  bool need(size_t k) {
    if (n < k) ok = false;
    return ok;
  }
  uint8_t u8() {
    if (!need(1)) return 0;
    n -= 1;
    return uint8_t(*p++);
  }
  int64_t i64() {
    if (!need(8)) return 0;
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t(uint8_t(p[i])) << (8 * i);
    p += 8, n -= 8;
    return int64_t(v);
  }
  std::string str() {
    if (!need(4)) return {};
    uint32_t len = load_u32(p);
    p += 4, n -= 4;
    if (!need(len)) return {};
    std::string s(p, len);
    p += len, n -= len;
    return s;
  }
};

std::string errno_text(int err) { return std::strerror(err); }

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// The integer stored at a key; ADD keeps values as decimal text so GET reads them like any other value.
bool parse_i64(const std::string& s, int64_t& v) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && end == s.data() + s.size();
}

}  // namespace

// ------------------------------------------------------------------------------------------------- server

struct TcpStoreServer::Impl {
  struct Client {
    std::string in, out;
    size_t out_off = 0;
    bool waiting = false;  // parked in a GET
    std::string wait_key;
    double deadline = 0;
  };

  int listen_fd = -1, wake_r = -1, wake_w = -1, port = 0;
  std::unordered_map<std::string, std::string> kv;
  std::map<int, Client> clients;  // by socket
  std::thread thread;

  ~Impl() {
    for (int fd : {listen_fd, wake_r, wake_w})
      if (fd >= 0) ::close(fd);
    for (auto& [fd, c] : clients) ::close(fd);
  }

  void reply(int fd, Client& c, std::string frame) {
    c.out += frame;
    flush(fd, c);
  }
  void reply_status(int fd, Client& c, Status s) {
    Writer w;
    w.u8(s);
    reply(fd, c, w.frame());
  }
  void reply_value(int fd, Client& c, const std::string& v) {
    Writer w;
    w.u8(kOk);
    w.str(v);
    reply(fd, c, w.frame());
  }
  void reply_failed(int fd, Client& c, const std::string& msg) {
    Writer w;
    w.u8(kFailed);
    w.str(msg);
    reply(fd, c, w.frame());
  }

  // Writes what the socket takes now; the rest waits for POLLOUT. Returns false when the peer is gone.
  bool flush(int fd, Client& c) {
    while (c.out_off < c.out.size()) {
      ssize_t k = ::send(fd, c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL);
      if (k < 0) {
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK;
      }
      c.out_off += size_t(k);
    }
    c.out.clear();
    c.out_off = 0;
    return true;
  }

  // A key appeared: answer every connection parked on it.
  void wake_waiters(const std::string& key) {
    std::vector<int> ready;
    for (auto& [fd, c] : clients)
      if (c.waiting && c.wait_key == key) ready.push_back(fd);
    for (int fd : ready) {
      Client& c = clients[fd];
      c.waiting = false;
      reply_value(fd, c, kv[key]);
      process(fd, c);  // it may have pipelined more requests
    }
  }

  // Handles complete request frames until the connection parks in a GET. Returns false on a malformed frame.
  bool process(int fd, Client& c) {
    size_t off = 0;
    bool ok = true;
    while (!c.waiting && c.in.size() - off >= 4) {
      uint32_t len = load_u32(c.in.data() + off);
      if (len > kMaxFrame) {
        ok = false;
        break;
      }
      if (c.in.size() - off - 4 < len) break;
      Reader r{c.in.data() + off + 4, len};
      off += 4 + size_t(len);
      if (!handle(fd, c, r)) {
        ok = false;
        break;
      }
    }
    c.in.erase(0, off);
    return ok;
  }

  bool handle(int fd, Client& c, Reader& r) {
    uint8_t op = r.u8();
    std::string key = r.str();
    if (!r.ok) return false;
    switch (op) {
      case kSet: {
        std::string value = r.str();
        if (!r.ok) return false;
        kv[key] = std::move(value);
        reply_status(fd, c, kOk);
        wake_waiters(key);
        return true;
      }
      case kGet: {
        int64_t timeout_ms = r.i64();
        if (!r.ok) return false;
        auto it = kv.find(key);
        if (it != kv.end()) {
          reply_value(fd, c, it->second);
        } else if (timeout_ms <= 0) {
          reply_status(fd, c, kTimeout);
        } else {
          c.waiting = true;
          c.wait_key = key;
          c.deadline = now_seconds() + double(std::min(timeout_ms, kMaxTimeoutMs)) / 1000.0;
        }
        return true;
      }
      case kCheck: {
        Writer w;
        w.u8(kOk);
        w.u8(kv.count(key) ? 1 : 0);
        reply(fd, c, w.frame());
        return true;
      }
      case kAdd: {
        int64_t delta = r.i64();
        if (!r.ok) return false;
        int64_t cur = 0;
        auto it = kv.find(key);
        if (it != kv.end() && !parse_i64(it->second, cur)) {
          reply_failed(fd, c, fmt::format("add: key '{}' holds a non-integer value", key));
          return true;
        }
        int64_t sum;
        if (__builtin_add_overflow(cur, delta, &sum)) {
          reply_failed(fd, c, fmt::format("add: key '{}' overflows int64 ({} + {})", key, cur, delta));
          return true;
        }
        kv[key] = std::to_string(sum);
        Writer w;
        w.u8(kOk);
        w.i64(sum);
        reply(fd, c, w.frame());
        wake_waiters(key);
        return true;
      }
      case kRemove:
        kv.erase(key);
        reply_status(fd, c, kOk);
        return true;
      default:
        return false;
    }
  }

  void accept_all() {
    for (;;) {
      int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;  // EAGAIN, or out of fds: the client retries / times out
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      clients[fd] = Client{};
    }
  }

  // Returns false when the connection should be closed.
  bool read_from(int fd, Client& c) {
    char buf[65536];
    for (;;) {
      ssize_t k = ::recv(fd, buf, sizeof buf, 0);
      if (k > 0) {
        c.in.append(buf, size_t(k));
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      return false;  // EOF or error
    }
    return process(fd, c);
  }

  void run() {
    std::vector<pollfd> fds;
    for (;;) {
      double now = now_seconds(), next = 1e300;
      for (auto& [fd, c] : clients)
        if (c.waiting) next = std::min(next, c.deadline);
      int timeout_ms = next == 1e300 ? -1 : int(std::clamp((next - now) * 1000.0 + 1.0, 0.0, 1e9));

      fds.clear();
      fds.push_back({wake_r, POLLIN, 0});
      fds.push_back({listen_fd, POLLIN, 0});
      for (auto& [fd, c] : clients) fds.push_back({fd, short(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
      int n = ::poll(fds.data(), fds.size(), timeout_ms);
      if (n < 0 && errno != EINTR) return;
      if (fds[0].revents) return;  // the destructor asks us to stop
      if (fds[1].revents & POLLIN) accept_all();

      std::vector<int> dead;
      for (size_t i = 2; i < fds.size() && n > 0; ++i) {
        if (!fds[i].revents) continue;
        int fd = fds[i].fd;
        auto it = clients.find(fd);
        if (it == clients.end()) continue;
        Client& c = it->second;
        bool alive = true;
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) alive = read_from(fd, c);
        if (alive && (fds[i].revents & POLLOUT)) alive = flush(fd, c);
        if (!alive) dead.push_back(fd);
      }
      for (int fd : dead) {
        ::close(fd);
        clients.erase(fd);
      }

      now = now_seconds();
      std::vector<int> expired;
      for (auto& [fd, c] : clients)
        if (c.waiting && c.deadline <= now) expired.push_back(fd);
      for (int fd : expired) {
        Client& c = clients[fd];
        c.waiting = false;
        reply_status(fd, c, kTimeout);
        process(fd, c);
      }
    }
  }
};

TcpStoreServer::TcpStoreServer(const std::string& bind_host, int port) : impl_(std::make_unique<Impl>()) {
  MT_CHECK(port >= 0 && port <= 65535, "tcp store server: port {} out of range", port);
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  std::string port_s = std::to_string(port);
  int rc = ::getaddrinfo(bind_host.empty() ? nullptr : bind_host.c_str(), port_s.c_str(), &hints, &res);
  MT_CHECK(rc == 0, "tcp store server: cannot resolve {}: {}", bind_host, ::gai_strerror(rc));
  std::string why = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
      impl_->listen_fd = fd;
      break;
    }
    why = errno_text(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  MT_CHECK(impl_->listen_fd >= 0, "tcp store server: cannot listen on {}:{}: {}", bind_host, port, why);
  set_nonblocking(impl_->listen_fd);

  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(impl_->listen_fd, reinterpret_cast<sockaddr*>(&ss), &len);
  impl_->port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                         : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);

  int p[2];
  MT_CHECK(::pipe2(p, O_CLOEXEC) == 0, "tcp store server: pipe: {}", errno_text(errno));
  impl_->wake_r = p[0];
  impl_->wake_w = p[1];
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
}

TcpStoreServer::~TcpStoreServer() {
  char x = 1;
  (void)!::write(impl_->wake_w, &x, 1);
  impl_->thread.join();
}

int TcpStoreServer::port() const { return impl_->port; }

// ------------------------------------------------------------------------------------------------- client

namespace {

// Connects with a non-blocking connect so an unreachable host costs at most the remaining time, not the kernel's
// SYN timeout. Returns the socket or -1 with `why` set.
int try_connect(const std::string& host, int port, double deadline, std::string& why) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  std::string port_s = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), port_s.c_str(), &hints, &res);
  if (rc != 0) {
    why = ::gai_strerror(rc);
    return -1;
  }
  int result = -1;
  for (addrinfo* a = res; a && result < 0; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      why = errno_text(errno);
      continue;
    }
    int err = 0;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd pfd{fd, POLLOUT, 0};
        int ms = int(std::max(0.0, (deadline - now_seconds()) * 1000.0));
        if (::poll(&pfd, 1, ms) == 1) {
          socklen_t len = sizeof err;
          ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        } else {
          err = ETIMEDOUT;
        }
      }
    }
    if (err == 0) {
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      result = fd;
    } else {
      why = errno_text(err);
      ::close(fd);
    }
  }
  ::freeaddrinfo(res);
  return result;
}

class TcpStore final : public Store {
 public:
  TcpStore(std::string host, int port, Millis connect_timeout)
      : host_(std::move(host)), port_(port), connect_timeout_(connect_timeout) {
    idle_.push_back(connect());
  }
  ~TcpStore() override {
    for (int fd : idle_) ::close(fd);
  }

  void set(const std::string& key, const std::string& value) override {
    Writer w;
    w.u8(kSet);
    w.str(key);
    w.str(value);
    expect_ok(call(w.frame(), io_timeout(), "set", key), "set", key);
  }

  std::string get(const std::string& key, Millis timeout) override {
    int64_t ms = std::clamp<int64_t>(timeout.count(), 0, kMaxTimeoutMs);
    std::string v;
    if (!try_get(key, ms, v))
      fail("tcp store {}:{}: timed out after {} ms waiting for key '{}'", host_, port_, ms, key);
    return v;
  }

  // Server-side waits, one key after another: no polling. On timeout the message lists every key still missing.
  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    double deadline = now_seconds() + double(std::clamp<int64_t>(timeout.count(), 0, kMaxTimeoutMs)) / 1000.0;
    std::string ignored;
    for (const std::string& key : keys) {
      int64_t left = std::max<int64_t>(0, int64_t((deadline - now_seconds()) * 1000.0));
      if (!try_get(key, left, ignored)) break;
    }
    std::vector<std::string> left = missing(keys);
    if (left.empty()) return;
    std::string list;
    for (size_t i = 0; i < left.size() && i < 16; ++i) list += (i ? ", " : "") + left[i];
    if (left.size() > 16) list += fmt::format(", ... ({} more)", left.size() - 16);
    fail("tcp store {}:{}: {} of {} keys not set within {:g} s: {}", host_, port_, left.size(), keys.size(),
         double(timeout.count()) / 1000.0, list);
  }

  bool check(const std::string& key) override {
    Writer w;
    w.u8(kCheck);
    w.str(key);
    std::string body = call(w.frame(), io_timeout(), "check", key);
    expect_ok(body, "check", key);
    Reader r{body.data() + 1, body.size() - 1};
    uint8_t exists = r.u8();
    MT_CHECK(r.ok, "tcp store {}:{}: malformed reply to check('{}')", host_, port_, key);
    return exists != 0;
  }

  int64_t add(const std::string& key, int64_t delta) override {
    Writer w;
    w.u8(kAdd);
    w.str(key);
    w.i64(delta);
    std::string body = call(w.frame(), io_timeout(), "add", key);
    expect_ok(body, "add", key);
    Reader r{body.data() + 1, body.size() - 1};
    int64_t v = r.i64();
    MT_CHECK(r.ok, "tcp store {}:{}: malformed reply to add('{}')", host_, port_, key);
    return v;
  }

  void remove(const std::string& key) override {
    Writer w;
    w.u8(kRemove);
    w.str(key);
    expect_ok(call(w.frame(), io_timeout(), "remove", key), "remove", key);
  }

 private:
  // False when the key did not appear within ms; transport failures throw.
  bool try_get(const std::string& key, int64_t ms, std::string& value) {
    Writer w;
    w.u8(kGet);
    w.str(key);
    w.i64(ms);
    // The server answers by the deadline; the extra allowance only matters when the server itself is stuck.
    std::string body = call(w.frame(), double(ms) / 1000.0 + io_timeout(), "get", key);
    if (!body.empty() && uint8_t(body[0]) == kTimeout) return false;
    expect_ok(body, "get", key);
    Reader r{body.data() + 1, body.size() - 1};
    value = r.str();
    MT_CHECK(r.ok, "tcp store {}:{}: malformed reply to get('{}')", host_, port_, key);
    return true;
  }

  // A live server answers everything but a parked GET at once; this only bounds the wait for a stuck one.
  double io_timeout() const { return std::max(30.0, double(connect_timeout_.count()) / 1000.0); }

  int connect() {
    double t0 = now_seconds(), deadline = t0 + double(connect_timeout_.count()) / 1000.0;
    std::string why;
    for (;;) {
      int fd = try_connect(host_, port_, deadline, why);
      if (fd >= 0) return fd;
      if (now_seconds() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the server may still be starting
    }
    fail("cannot reach tcp store {}:{} after {:.1f} s: {}", host_, port_, now_seconds() - t0, why);
  }

  int acquire() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!idle_.empty()) {
        int fd = idle_.back();
        idle_.pop_back();
        return fd;
      }
    }
    return connect();
  }
  void release(int fd) {
    std::lock_guard<std::mutex> lk(mu_);
    idle_.push_back(fd);
  }

  // Sends one request and returns the response body; any transport failure closes the connection and throws.
  std::string call(const std::string& frame, double timeout_s, const char* op, const std::string& key) {
    int fd = acquire();
    double deadline = now_seconds() + timeout_s;
    auto lost = [&](const std::string& why) {
      ::close(fd);
      fail("tcp store {}:{}: {}('{}') failed: {}", host_, port_, op, key, why);
    };
    for (size_t off = 0; off < frame.size();) {
      ssize_t k = ::send(fd, frame.data() + off, frame.size() - off, MSG_NOSIGNAL);
      if (k < 0 && errno == EINTR) continue;
      if (k < 0) lost(fmt::format("connection lost ({})", errno_text(errno)));
      off += size_t(k);
    }
    auto read_exact = [&](char* dst, size_t n) {
      while (n > 0) {
        pollfd pfd{fd, POLLIN, 0};
        double left = deadline - now_seconds();
        int ms = int(std::clamp(left * 1000.0, 0.0, 2e9));
        int pr = ::poll(&pfd, 1, ms);
        if (pr < 0 && errno == EINTR) continue;
        if (pr == 0) lost(fmt::format("no answer from the server within {:.0f} s", timeout_s));
        ssize_t k = ::recv(fd, dst, n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k == 0) lost("the server closed the connection (is it still running?)");
        if (k < 0) lost(fmt::format("connection lost ({})", errno_text(errno)));
        dst += k, n -= size_t(k);
      }
    };
    char hdr[4];
    read_exact(hdr, 4);
    uint32_t len = load_u32(hdr);
    if (len == 0 || len > kMaxFrame) lost(fmt::format("malformed reply (length {})", len));
    std::string body(len, '\0');
    read_exact(body.data(), len);
    release(fd);
    return body;
  }

  void expect_ok(const std::string& body, const char* op, const std::string& key) {
    if (!body.empty() && uint8_t(body[0]) == kOk) return;
    Reader r{body.data(), body.size()};
    uint8_t st = r.u8();
    std::string msg = st == kFailed ? r.str() : fmt::format("unexpected status {}", st);
    fail("tcp store {}:{}: {}('{}') failed: {}", host_, port_, op, key, msg);
  }

  std::string host_;
  int port_;
  Millis connect_timeout_;
  std::mutex mu_;
  std::vector<int> idle_;
};

}  // namespace

std::unique_ptr<Store> make_tcp_store(const std::string& host, int port, Millis connect_timeout) {
  MT_CHECK(port > 0 && port <= 65535, "tcp store: port {} out of range (1..65535)", port);
  return std::make_unique<TcpStore>(host, port, connect_timeout);
}

}  // namespace mt
