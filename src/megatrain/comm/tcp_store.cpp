// tcp:// stores: a single-threaded poll() server and a synchronous client.
//
// The wire format and the decoding of requests are in tcp_store_wire.h. A GET for a missing key parks the
// connection on the server until a SET/ADD creates the key or the client's timeout passes, so waiting costs no
// traffic and no spinning.
// The first request of every connection must be AUTH with the job's secret; anything else, a wrong secret, an
// unknown op or an oversized frame closes the connection with a logged reason (and a FAILED reply naming it).
// The client keeps a small pool of connections: each op takes an idle one (or opens one), so a thread blocked in
// get() never stalls another thread's set() on the same Store.
//
// Memory the server can be made to hold: before AUTH a connection may send at most kMaxAuthFrame bytes, so anyone
// who can reach the port costs it at most max_connections x 2 KiB. After AUTH one request may carry max_frame bytes
// (4 MiB by default): the store holds Gloo addresses (~300 bytes per group member), rendezvous and control keys of a
// few bytes, and config fingerprints of a few KiB; 4 MiB is three orders of magnitude above all of them and still
// small next to a training process. A connection's buffers stay below about twice that: the server stops reading
// from a connection whose unanswered input or unsent output reaches the limit (TCP pushes back on the client).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
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
#include "megatrain/comm/tcp_store_wire.h"

namespace mt {
namespace {

using namespace tcp_store_wire;

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
    std::string peer;  // "address:port", for the log
    std::string in, out;
    size_t out_off = 0;
    bool authed = false;
    double auth_deadline = 0;
    bool waiting = false;  // parked in a GET
    bool dead = false;     // to be closed by the loop
    std::string wait_key;
    double deadline = 0;
  };

  int listen_fd = -1, wake_r = -1, wake_w = -1, port = 0;
  std::string secret;
  TcpStoreLimits limits;
  std::unordered_map<std::string, std::string> kv;
  std::map<int, Client> clients;  // by socket
  std::thread thread;

  ~Impl() {
    for (int fd : {listen_fd, wake_r, wake_w})
      if (fd >= 0) ::close(fd);
    for (auto& [fd, c] : clients) ::close(fd);
  }

  uint32_t frame_limit(const Client& c) const { return request_limit(c.authed, limits.max_frame); }
  // Past these the server stops reading from the connection until it drains.
  size_t in_limit(const Client& c) const { return size_t(frame_limit(c)) + 4; }
  size_t out_limit() const { return size_t(limits.max_frame) + 64; }

  static void log(const std::string& peer, const std::string& why) {
    fmt::print(stderr, "tcp store: closing the connection from {}: {}\n", peer, why);
  }

  // Logs the reason, tells the peer (best effort: it may not be reading) and marks the connection for closing.
  void reject(int fd, Client& c, const std::string& why) {
    log(c.peer, why);
    Writer w;
    w.u8(kFailed);
    w.str(why);
    std::string f = w.frame();
    (void)!::send(fd, f.data(), f.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    c.dead = true;
  }

  void reply(int fd, Client& c, std::string frame) {
    c.out += frame;
    if (!flush(fd, c)) c.dead = true;
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
      if (c.waiting && c.wait_key == key && !c.dead) ready.push_back(fd);
    for (int fd : ready) {
      Client& c = clients[fd];
      c.waiting = false;
      reply_value(fd, c, kv[key]);
      process(fd, c);  // it may have pipelined more requests
    }
  }

  // Handles complete request frames until the connection parks in a GET or is rejected.
  void process(int fd, Client& c) {
    size_t off = 0;
    while (!c.waiting && !c.dead && c.out.size() < out_limit()) {
      Decoded d = decode_request(std::string_view(c.in).substr(off), c.authed, limits.max_frame);
      if (d.kind == Decoded::kNeedMore) break;
      if (d.kind == Decoded::kReject) {
        reject(fd, c, d.why);
        break;
      }
      off += d.consumed;
      handle(fd, c, d.request);
    }
    c.in.erase(0, off);
  }

  void handle(int fd, Client& c, Request& q) {
    const std::string& key = q.key;
    switch (q.op) {
      case kAuth:  // decode_request passes AUTH only before authentication
        if (!secrets_equal(q.key, secret)) return reject(fd, c, "wrong store secret");
        c.authed = true;
        return reply_status(fd, c, kOk);
      case kSet:
        kv[key] = std::move(q.value);
        reply_status(fd, c, kOk);
        wake_waiters(key);
        return;
      case kGet: {
        auto it = kv.find(key);
        if (it != kv.end()) {
          reply_value(fd, c, it->second);
        } else if (q.number <= 0) {
          reply_status(fd, c, kTimeout);
        } else {
          c.waiting = true;
          c.wait_key = key;
          c.deadline = now_seconds() + double(std::min(q.number, kMaxTimeoutMs)) / 1000.0;
        }
        return;
      }
      case kCheck: {
        Writer w;
        w.u8(kOk);
        w.u8(kv.count(key) ? 1 : 0);
        return reply(fd, c, w.frame());
      }
      case kAdd: {
        int64_t cur = 0;
        auto it = kv.find(key);
        if (it != kv.end() && !parse_i64(it->second, cur))
          return reply_failed(fd, c, fmt::format("add: key '{}' holds a non-integer value", key));
        int64_t sum;
        if (__builtin_add_overflow(cur, q.number, &sum))
          return reply_failed(fd, c, fmt::format("add: key '{}' overflows int64 ({} + {})", key, cur, q.number));
        kv[key] = std::to_string(sum);
        Writer w;
        w.u8(kOk);
        w.i64(sum);
        reply(fd, c, w.frame());
        wake_waiters(key);
        return;
      }
      case kRemove: kv.erase(key); return reply_status(fd, c, kOk);
    }
  }

  void accept_all() {
    for (;;) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;  // EAGAIN, or out of fds: the client retries / times out
      char host[NI_MAXHOST] = "?", serv[NI_MAXSERV] = "?";
      ::getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof host, serv, sizeof serv,
                    NI_NUMERICHOST | NI_NUMERICSERV);
      Client c;
      c.peer = fmt::format("{}:{}", host, serv);
      if (int(clients.size()) >= limits.max_connections) {
        reject(fd, c, fmt::format("too many connections (the limit is {})", limits.max_connections));
        ::close(fd);
        continue;
      }
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      c.auth_deadline = now_seconds() + limits.auth_timeout_s;
      clients[fd] = std::move(c);
    }
  }

  // Reads what the connection has sent, up to its input limit, and handles the complete requests.
  void read_from(int fd, Client& c) {
    char buf[65536];
    while (c.in.size() < in_limit(c)) {
      ssize_t k = ::recv(fd, buf, std::min(sizeof buf, in_limit(c) - c.in.size()), 0);
      if (k > 0) {
        c.in.append(buf, size_t(k));
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      c.dead = true;  // EOF or error
      return;
    }
    process(fd, c);
  }

  // Reading pauses while the connection has a full frame's worth of unhandled input (it is parked in a GET with
  // requests pipelined behind) or of unsent output (it does not read its replies).
  bool wants_input(const Client& c) const { return c.in.size() < in_limit(c) && c.out.size() < out_limit(); }

  void run() {
    std::vector<pollfd> fds;
    for (;;) {
      double now = now_seconds(), next = 1e300;
      for (auto& [fd, c] : clients) {
        if (c.waiting) next = std::min(next, c.deadline);
        if (!c.authed) next = std::min(next, c.auth_deadline);
      }
      int timeout_ms = next == 1e300 ? -1 : int(std::clamp((next - now) * 1000.0 + 1.0, 0.0, 1e9));

      fds.clear();
      fds.push_back({wake_r, POLLIN, 0});
      fds.push_back({listen_fd, POLLIN, 0});
      for (auto& [fd, c] : clients)
        fds.push_back({fd, short((wants_input(c) ? POLLIN : 0) | (c.out.empty() ? 0 : POLLOUT)), 0});
      int n = ::poll(fds.data(), fds.size(), timeout_ms);
      if (n < 0 && errno != EINTR) return;
      if (fds[0].revents) return;  // the destructor asks us to stop
      if (fds[1].revents & POLLIN) accept_all();

      for (size_t i = 2; i < fds.size() && n > 0; ++i) {
        if (!fds[i].revents) continue;
        int fd = fds[i].fd;
        auto it = clients.find(fd);
        if (it == clients.end()) continue;
        Client& c = it->second;
        if (c.dead) continue;
        if (fds[i].revents & (POLLHUP | POLLERR))
          c.dead = true;
        else if (fds[i].revents & POLLIN)
          read_from(fd, c);
        if (!c.dead && (fds[i].revents & POLLOUT) && !flush(fd, c)) c.dead = true;
        // Output drained: requests that waited behind it can go on.
        if (!c.dead && !c.waiting && c.out.empty() && !c.in.empty()) process(fd, c);
      }

      now = now_seconds();
      for (auto& [fd, c] : clients) {
        if (c.dead) continue;
        if (!c.authed && c.auth_deadline <= now) {
          reject(fd, c, fmt::format("no authentication within {:g} s", limits.auth_timeout_s));
        } else if (c.waiting && c.deadline <= now) {
          c.waiting = false;
          reply_status(fd, c, kTimeout);
          process(fd, c);
        }
      }
      for (auto it = clients.begin(); it != clients.end();) {
        if (it->second.dead) {
          ::close(it->first);
          it = clients.erase(it);
        } else {
          ++it;
        }
      }
    }
  }
};

TcpStoreServer::TcpStoreServer(const std::string& bind_host, int port, std::string secret, TcpStoreLimits limits)
    : impl_(std::make_unique<Impl>()) {
  MT_CHECK(port >= 0 && port <= 65535, "tcp store server: port {} out of range", port);
  check_store_secret(secret, "the tcp store server's caller");
  MT_CHECK(limits.max_frame >= 1024 && limits.max_frame <= (1u << 30),
           "tcp store server: max_frame {} is outside 1 KiB..1 GiB", limits.max_frame);
  MT_CHECK(limits.max_connections >= 1, "tcp store server: max_connections {} must be at least 1",
           limits.max_connections);
  MT_CHECK(limits.auth_timeout_s > 0, "tcp store server: auth_timeout_s {} must be positive", limits.auth_timeout_s);
  // Beyond the fd limit accept() fails and the connection would wait in the backlog unanswered; below it every
  // connection over the limit gets its refusal. A few descriptors stay for the rest of the process.
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY)
    limits.max_connections = int(std::min<rlim_t>(rlim_t(limits.max_connections),
                                                  std::max<rlim_t>(16, nofile.rlim_cur / 2)));
  impl_->secret = std::move(secret);
  impl_->limits = limits;
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
    if (errno == EADDRNOTAVAIL) why += " (the address is not one of this host's)";
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
// SYN timeout. Returns the socket or -1 with `why` set (and `err` to the errno, 0 for a name lookup failure).
int try_connect(const std::string& host, int port, double deadline, std::string& why, int& last_err) {
  last_err = 0;
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
      last_err = errno;
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
      last_err = err;
      why = errno_text(err);
      ::close(fd);
    }
  }
  ::freeaddrinfo(res);
  return result;
}

class TcpStore final : public Store {
 public:
  TcpStore(std::string host, int port, Millis connect_timeout, std::string secret)
      : host_(std::move(host)), port_(port), connect_timeout_(connect_timeout), secret_(std::move(secret)) {
    idle_.push_back(connect());
  }
  ~TcpStore() override {
    for (int fd : idle_) ::close(fd);
  }

  void set(const std::string& key, const std::string& value) override {
    expect_ok(call(encode_request({kSet, key, value, 0}), io_timeout(), "set", key), "set", key);
  }

  std::string get(const std::string& key, Millis timeout) override {
    int64_t ms = std::clamp<int64_t>(timeout.count(), 0, kMaxTimeoutMs);
    std::string v;
    if (!try_get(key, ms, v))
      fail_as(ErrorKind::CommTimeout, "tcp store {}:{}: timed out after {} ms waiting for key '{}'", host_, port_, ms,
              key);
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
    std::string body = call(encode_request({kCheck, key, "", 0}), io_timeout(), "check", key);
    expect_ok(body, "check", key);
    Reader r{body.data() + 1, body.size() - 1};
    uint8_t exists = r.u8();
    MT_CHECK(r.ok, "tcp store {}:{}: malformed reply to check('{}')", host_, port_, key);
    return exists != 0;
  }

  int64_t add(const std::string& key, int64_t delta) override {
    std::string body = call(encode_request({kAdd, key, "", delta}), io_timeout(), "add", key);
    expect_ok(body, "add", key);
    Reader r{body.data() + 1, body.size() - 1};
    int64_t v = r.i64();
    MT_CHECK(r.ok, "tcp store {}:{}: malformed reply to add('{}')", host_, port_, key);
    return v;
  }

  void remove(const std::string& key) override {
    expect_ok(call(encode_request({kRemove, key, "", 0}), io_timeout(), "remove", key), "remove", key);
  }

 private:
  // False when the key did not appear within ms; transport failures throw.
  bool try_get(const std::string& key, int64_t ms, std::string& value) {
    // The server answers by the deadline; the extra allowance only matters when the server itself is stuck.
    std::string body = call(encode_request({kGet, key, "", ms}), double(ms) / 1000.0 + io_timeout(), "get", key);
    if (!body.empty() && uint8_t(body[0]) == kTimeout) return false;
    expect_ok(body, "get", key);
    Reader r{body.data() + 1, body.size() - 1};
    value = r.str();
    MT_CHECK(r.ok, "tcp store {}:{}: malformed reply to get('{}')", host_, port_, key);
    return true;
  }

  // A live server answers everything but a parked GET at once; this only bounds the wait for a stuck one.
  double io_timeout() const { return std::max(30.0, double(connect_timeout_.count()) / 1000.0); }

  // Opens and authenticates a connection. Until the server has been reached once, refusals are retried for
  // connect_timeout (ranks may start before the launcher's server listens); after that, refusals for
  // kStoreGoneAfter mean the server is gone, and waiting out the rest of a long timeout would only delay the report.
  int connect() {
    double t0 = now_seconds(), deadline = t0 + double(connect_timeout_.count()) / 1000.0;
    double refused_since = -1;
    std::string why;
    for (;;) {
      int err = 0;
      int fd = try_connect(host_, port_, deadline, why, err);
      if (fd >= 0) {
        authenticate(fd);
        reached_ = true;
        return fd;
      }
      double now = now_seconds();
      if (err == ECONNREFUSED) {
        if (refused_since < 0) refused_since = now;
        if (reached_ && now - refused_since >= double(kStoreGoneAfter.count()) / 1000.0)
          fail_as(ErrorKind::PeerLost,
                  "tcp store {}:{} is gone: connections to it were refused for {:.1f} s after it had been reached "
                  "(did the launcher of node 0 exit?)",
                  host_, port_, now - refused_since);
      } else {
        refused_since = -1;
      }
      if (now >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the server may still be starting
    }
    fail("cannot reach tcp store {}:{} after {:.1f} s: {}", host_, port_, now_seconds() - t0, why);
  }

  // The first request on a connection: the server answers OK, or FAILED with its reason and closes it.
  void authenticate(int fd) {
    std::string body = exchange(fd, encode_request({kAuth, secret_, "", 0}), io_timeout(), "authenticate", "");
    if (!body.empty() && uint8_t(body[0]) == kOk) return;
    ::close(fd);
    Reader r{body.data(), body.size()};
    uint8_t st = r.u8();
    std::string msg = st == kFailed ? r.str() : fmt::format("unexpected status {}", st);
    fail("tcp store {}:{} refused the connection: {}{}", host_, port_, msg,
         msg == "wrong store secret"
             ? fmt::format(" (every rank must have the launcher's {}; on several nodes, every node's launcher the same "
                           "one)",
                           kStoreSecretEnv)
             : "");
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
    std::string body = exchange(fd, frame, timeout_s, op, key);
    release(fd);
    return body;
  }

  // One request and its reply on `fd`; a transport failure closes fd and throws.
  std::string exchange(int fd, const std::string& frame, double timeout_s, const char* op, const std::string& key) {
    double deadline = now_seconds() + timeout_s;
    // The server went away (PeerLost) or stopped answering (CommTimeout).
    auto lost = [&](const std::string& why, ErrorKind kind = ErrorKind::PeerLost) {
      ::close(fd);
      fail_as(kind, "tcp store {}:{}: {}('{}') failed: {}", host_, port_, op, key, why);
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
        if (pr == 0) lost(fmt::format("no answer from the server within {:.0f} s", timeout_s), ErrorKind::CommTimeout);
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
    if (len == 0 || len > kMaxReply) lost(fmt::format("malformed reply (length {})", len), ErrorKind::Internal);
    std::string body(len, '\0');
    read_exact(body.data(), len);
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
  std::string secret_;
  std::atomic<bool> reached_{false};  // a connection has been made and authenticated once
  std::mutex mu_;
  std::vector<int> idle_;
};

}  // namespace

std::unique_ptr<Store> make_tcp_store(const std::string& host, int port, Millis connect_timeout,
                                      const std::string& secret) {
  MT_CHECK(port > 0 && port <= 65535, "tcp store: port {} out of range (1..65535)", port);
  MT_CHECK(!secret.empty(),
           "tcp store {}:{}: no store secret: set {} to the launcher's (megatrain launch sets it for "
           "its ranks)",
           host, port, kStoreSecretEnv);
  return std::make_unique<TcpStore>(host, port, connect_timeout, secret);
}

}  // namespace mt
