// Rendezvous stores: the same semantics checked on the tcp:// store (our server) and on redis:// (a real
// redis-server started here), TCP server robustness, store URLs, and rank discovery from launcher variables.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <thread>

#include <gtest/gtest.h>

#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"
#include "megatrain/comm/env.h"
#include "megatrain/comm/local_address.h"
#include "megatrain/comm/store.h"
#include "support/comm_fork_util.h"
#include "support/comm_servers.h"
#include "support/files.h"
#include "support/test_util.h"

using namespace mt;
using namespace std::chrono_literals;
using comm_test::kSecret;

namespace {

// Child mode: this binary re-run with MT_STORE_TEST_CHILD="tcp|redis PORT DELAY_MS KEY VALUE" sleeps, sets one
// key and exits, so a blocking get can be released from another process.
const int kChildMode = [] {
  const char* spec = std::getenv("MT_STORE_TEST_CHILD");
  if (!spec) return 0;
  char kind[16], key[256], value[256];
  int port = 0, delay = 0;
  if (std::sscanf(spec, "%15s %d %d %255s %255s", kind, &port, &delay, key, value) != 5) ::_exit(2);
  try {
    std::this_thread::sleep_for(std::chrono::milliseconds(delay));
    auto s = std::string(kind) == "tcp" ? make_tcp_store("127.0.0.1", port, 5s, kSecret)
                                        : make_redis_store("127.0.0.1", port, "mt-test", 5s);
    s->set(key, value);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "child: %s\n", e.what());
    ::_exit(1);
  }
  ::_exit(0);
}();

using mt::test::error_of;

uint32_t load_le32(const std::string& s) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(uint8_t(s[i])) << (8 * i);
  return v;
}

double seconds_of(const std::function<void()>& f) {
  double t0 = now_seconds();
  f();
  return now_seconds() - t0;
}

using comm_test::RedisServer;

using comm_test::free_port;
using comm_test::spawn;
using comm_test::wait_exit;

// One tcp server and one redis server shared by the parameterised tests; every test uses its own keys.
struct Servers {
  TcpStoreServer tcp{"127.0.0.1", 0, kSecret};
  RedisServer redis;
};
Servers* g_servers = nullptr;

class StoreTest : public ::testing::TestWithParam<std::string> {
 public:
  static void SetUpTestSuite() {
    if (!g_servers) g_servers = new Servers;
  }
  static void TearDownTestSuite() {
    delete g_servers;
    g_servers = nullptr;
  }

 protected:
  bool tcp() const { return GetParam() == "tcp"; }
  int port() const { return tcp() ? g_servers->tcp.port() : g_servers->redis.port(); }
  std::unique_ptr<Store> open() const {
    return tcp() ? make_tcp_store("127.0.0.1", port(), 2s, kSecret)
                 : make_redis_store("127.0.0.1", port(), "mt-test", 2s);
  }
  // A key unique to this test and backend.
  std::string k(const std::string& name) const {
    return std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "/" + name;
  }
};

TEST_P(StoreTest, SetGetCheckRemove) {
  auto s = open();
  EXPECT_FALSE(s->check(k("a")));
  s->set(k("a"), "one");
  EXPECT_TRUE(s->check(k("a")));
  EXPECT_EQ(s->get(k("a"), 1s), "one");
  s->set(k("a"), "two");
  EXPECT_EQ(s->get(k("a"), 1s), "two");
  std::string binary("x\0y\xff", 4);
  std::string big(1 << 20, 'q');
  big[12345] = '\0';
  s->set(k("bin"), binary);
  s->set(k("big"), big);
  s->set(k("empty"), "");
  EXPECT_EQ(s->get(k("bin"), 1s), binary);
  EXPECT_EQ(s->get(k("big"), 1s), big);
  EXPECT_EQ(s->get(k("empty"), 1s), "");
  EXPECT_TRUE(s->check(k("empty")));
  s->remove(k("a"));
  EXPECT_FALSE(s->check(k("a")));
  s->remove(k("never-set"));  // removing a missing key is not an error
  // Another client sees the same data.
  EXPECT_EQ(open()->get(k("bin"), 1s), binary);
}

TEST_P(StoreTest, AddIsAtomicIntegerArithmetic) {
  auto s = open();
  EXPECT_EQ(s->add(k("n"), 5), 5);
  EXPECT_EQ(s->add(k("n"), -7), -2);
  EXPECT_EQ(s->get(k("n"), 1s), "-2");  // stored as decimal text, readable by get
  s->set(k("m"), "40");
  EXPECT_EQ(s->add(k("m"), 2), 42);
  s->set(k("text"), "abc");
  std::string err = error_of([&] { s->add(k("text"), 1); });
  EXPECT_NE(err.find(k("text")), std::string::npos) << err;
}

TEST_P(StoreTest, GetTimesOutNamingTheKey) {
  auto s = open();
  std::string err;
  double t = seconds_of([&] { err = error_of([&] { s->get(k("missing"), 150ms); }); });
  EXPECT_NE(err.find("'" + k("missing") + "'"), std::string::npos) << err;
  EXPECT_NE(err.find("timed out"), std::string::npos) << err;
  EXPECT_GE(t, 0.14);
  EXPECT_LT(t, 20.0);  // not a speed: the 150 ms timeout was honoured, not ignored (which would block for good)
}

TEST_P(StoreTest, GetBlocksUntilAnotherThreadSets) {
  auto waiter = open(), setter = open();
  std::thread t([&] {
    std::this_thread::sleep_for(200ms);
    setter->set(k("late"), "here");
  });
  std::string v;
  double dt = seconds_of([&] { v = waiter->get(k("late"), 60s); });
  t.join();
  EXPECT_EQ(v, "here");
  EXPECT_GE(dt, 0.15);
  EXPECT_LT(dt, 20.0);  // not a speed: the set released the get, rather than the 60 s timeout
}

TEST_P(StoreTest, OneStoreObjectSharedByThreads) {
  // A get blocked on one Store must not stop another thread's set on the same Store (no deadlock).
  auto s = open();
  std::thread t([&] {
    std::this_thread::sleep_for(100ms);
    s->set(k("shared"), "ok");
  });
  EXPECT_EQ(s->get(k("shared"), 60s), "ok");
  t.join();
}

TEST_P(StoreTest, GetBlocksUntilAnotherProcessSets) {
  auto s = open();
  pid_t child = spawn({"/proc/self/exe"},
                      {fmt::format("MT_STORE_TEST_CHILD={} {} 200 {} from-child", GetParam(), port(), k("xproc"))});
  std::string v;
  double dt = seconds_of([&] { v = s->get(k("xproc"), 60s); });
  int st = wait_exit(child);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  EXPECT_EQ(v, "from-child");
  EXPECT_GE(dt, 0.15);
}

TEST_P(StoreTest, WaitAndMissing) {
  auto s = open();
  s->set(k("a"), "1");
  s->set(k("b"), "2");
  EXPECT_EQ(s->missing({k("a"), k("b"), k("c")}), std::vector<std::string>{k("c")});
  s->wait({k("a"), k("b")}, 1s);
  std::string err = error_of([&] { s->wait({k("a"), k("c"), k("b"), k("d")}, 150ms); });
  EXPECT_NE(err.find(k("c")), std::string::npos) << err;
  EXPECT_NE(err.find(k("d")), std::string::npos) << err;
  EXPECT_EQ(err.find(k("a")), std::string::npos) << err;

  auto other = open();
  std::thread t([&] {
    std::this_thread::sleep_for(150ms);
    other->set(k("c"), "3");
    other->set(k("d"), "4");
  });
  double dt = seconds_of([&] { s->wait({k("a"), k("c"), k("d")}, 60s); });
  t.join();
  EXPECT_GE(dt, 0.1);
  EXPECT_LT(dt, 20.0);  // not a speed: the sets released the wait, rather than the 60 s timeout
}

INSTANTIATE_TEST_SUITE_P(Backends, StoreTest, ::testing::Values("tcp", "redis"),
                         [](const auto& info) { return info.param; });

// ------------------------------------------------------------------------------------------ tcp server

TEST(TcpStore, ManyConcurrentClients) {
  TcpStoreServer server("127.0.0.1", 0, kSecret);
  constexpr int kClients = 48, kAdds = 40;
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i)
    threads.emplace_back([&, i] {
      try {
        auto s = make_tcp_store("127.0.0.1", server.port(), 5s, kSecret);
        for (int j = 0; j < kAdds; ++j) s->add("counter", 1);
        s->set("client/" + std::to_string(i), std::to_string(i * i));
        // Everybody waits for everybody: many connections parked in get at once.
        for (int j = 0; j < kClients; ++j)
          if (s->get("client/" + std::to_string(j), 60s) != std::to_string(j * j)) ++bad;
      } catch (const std::exception& e) {
        ADD_FAILURE() << "client " << i << ": " << e.what();
        ++bad;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(make_tcp_store("127.0.0.1", server.port(), 1s, kSecret)->get("counter", 1s),
            std::to_string(kClients * kAdds));
}

TEST(TcpStore, OneSetReleasesManyParkedGets) {
  TcpStoreServer server("127.0.0.1", 0, kSecret);
  constexpr int kWaiters = 40;
  std::atomic<int> released{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kWaiters; ++i)
    threads.emplace_back([&] {
      try {
        auto s = make_tcp_store("127.0.0.1", server.port(), 5s, kSecret);
        if (s->get("go", 60s) == "now") ++released;
      } catch (const std::exception& e) {
        ADD_FAILURE() << e.what();
      }
    });
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(released.load(), 0);
  make_tcp_store("127.0.0.1", server.port(), 1s, kSecret)->set("go", "now");
  for (auto& t : threads) t.join();
  EXPECT_EQ(released.load(), kWaiters);
}

TEST(TcpStore, DeadServerFailsClientOpsQuickly) {
  auto server = std::make_unique<TcpStoreServer>("127.0.0.1", 0, kSecret);
  auto s = make_tcp_store("127.0.0.1", server->port(), 1s, kSecret);
  auto s2 = make_tcp_store("127.0.0.1", server->port(), 1s, kSecret);
  s->set("k", "v");
  std::string blocked_err;
  std::thread t([&] { blocked_err = error_of([&] { s2->get("never", 60s); }); });
  std::this_thread::sleep_for(100ms);
  double dt = seconds_of([&] {
    server.reset();
    t.join();
  });
  // Not a speed: the alternative is the get's 60 s timeout.
  EXPECT_LT(dt, 20.0) << "a get parked on a dead server must fail, not wait out its timeout";
  EXPECT_NE(blocked_err.find("tcp store 127.0.0.1:"), std::string::npos) << blocked_err;
  EXPECT_NE(blocked_err.find("'never'"), std::string::npos) << blocked_err;
  std::string err = error_of([&] { s->set("k", "v2"); });
  EXPECT_NE(err.find("tcp store"), std::string::npos) << err;
}

TEST(TcpStore, UnreachableServerErrorsAfterConnectTimeout) {
  int port = free_port();
  std::string err;
  double dt = seconds_of([&] { err = error_of([&] { make_tcp_store("127.0.0.1", port, 300ms, kSecret); }); });
  EXPECT_NE(err.find(fmt::format("cannot reach tcp store 127.0.0.1:{} after", port)), std::string::npos) << err;
  EXPECT_GE(dt, 0.25);
  EXPECT_LT(dt, 20.0);  // not a speed: the 300 ms timeout was honoured, not ignored (retrying for good)
}

TEST(TcpStore, ClientRetriesUntilServerStarts) {
  int port = free_port();
  std::unique_ptr<TcpStoreServer> server;
  std::thread t([&] {
    std::this_thread::sleep_for(300ms);
    server = std::make_unique<TcpStoreServer>("127.0.0.1", port, kSecret);
  });
  auto s = make_tcp_store("127.0.0.1", port, 60s, kSecret);
  t.join();
  s->set("k", "v");
  EXPECT_EQ(s->get("k", 1s), "v");
}

TEST(TcpStore, PortInUseIsAnError) {
  TcpStoreServer a("127.0.0.1", 0, kSecret);
  std::string err = error_of([&] { TcpStoreServer b("127.0.0.1", a.port(), kSecret); });
  EXPECT_NE(err.find(fmt::format("cannot listen on 127.0.0.1:{}", a.port())), std::string::npos) << err;
}

// A raw connection to a server on this host, for speaking the wire protocol by hand.
int raw_connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) throw Error("raw connect failed");
  timeval tv{10, 0};  // a bound on every recv below, so a server that keeps a connection open fails the test
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// Frames of the wire protocol (tcp_store.cpp), built independently of the client.
std::string le32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = char((v >> (8 * i)) & 0xff);
  return s;
}
std::string wire_str(const std::string& s) { return le32(uint32_t(s.size())) + s; }
std::string frame(const std::string& body) { return le32(uint32_t(body.size())) + body; }
std::string auth_frame(const std::string& secret) { return frame(std::string(1, char(6)) + wire_str(secret)); }
std::string set_frame(const std::string& k, const std::string& v) {
  return frame(std::string(1, char(1)) + wire_str(k) + wire_str(v));
}
std::string get_frame(const std::string& k) {
  return frame(std::string(1, char(2)) + wire_str(k) + std::string(8, '\0'));  // timeout 0
}

void send_all(int fd, const std::string& s) {
  ASSERT_EQ(::send(fd, s.data(), s.size(), MSG_NOSIGNAL), ssize_t(s.size()));
}

// Everything the server sends until it closes the connection ("<timeout>" if it does not within 10 s).
std::string read_until_closed(int fd) {
  std::string got;
  char buf[4096];
  for (;;) {
    ssize_t k = ::recv(fd, buf, sizeof buf, 0);
    if (k > 0) {
      got.append(buf, size_t(k));
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return got + "<timeout>";
    return got;  // closed (or reset)
  }
}

// One complete reply frame's body.
std::string read_reply(int fd) {
  std::string got;
  char buf[4096];
  while (got.size() < 4 || got.size() < 4 + load_le32(got)) {
    ssize_t k = ::recv(fd, buf, sizeof buf, 0);
    if (k <= 0) return "<closed>";
    got.append(buf, size_t(k));
  }
  return got.substr(4);
}

TEST(TcpStore, GarbageFromOneClientDoesNotHurtOthers) {
  TcpStoreServer server("127.0.0.1", 0, kSecret);
  auto s = make_tcp_store("127.0.0.1", server.port(), 1s, kSecret);
  s->set("k", "v");
  int fd = raw_connect(server.port());
  const char junk[] = "\xff\xff\xff\xff garbage";  // a frame length far beyond the limit
  ASSERT_GT(::send(fd, junk, sizeof junk, MSG_NOSIGNAL), 0);
  std::string got = read_until_closed(fd);
  EXPECT_EQ(got.find("<timeout>"), std::string::npos) << "the server should drop a client that sends garbage";
  ::close(fd);
  EXPECT_EQ(s->get("k", 1s), "v");
}

// The attack: any local process could read keys and forge "<group>/arrived/<rank>" so that ranks skipped the
// member wait. Without the secret, nothing is read or written, and the server logs why it closed the connection.
TEST(TcpStore, ClientWithoutTheSecretCannotReadOrWriteKeys) {
  TcpStoreServer server("127.0.0.1", 0, kSecret);
  auto s = make_tcp_store("127.0.0.1", server.port(), 1s, kSecret);
  s->set("secret-key", "the-value");
  ::testing::internal::CaptureStderr();
  // 1. No authentication at all: a forged arrival, then a read.
  int fd = raw_connect(server.port());
  send_all(fd, set_frame("dp[0-3]/arrived/1", "1") + get_frame("secret-key"));
  std::string got1 = read_until_closed(fd);
  ::close(fd);
  // 2. A wrong secret of the right length, then the same.
  fd = raw_connect(server.port());
  std::string wrong = kSecret;
  wrong.back() ^= 1;
  send_all(fd, auth_frame(wrong) + set_frame("dp[0-3]/arrived/2", "1") + get_frame("secret-key"));
  std::string got2 = read_until_closed(fd);
  ::close(fd);
  // 3. Our own client with a wrong secret.
  std::string err = error_of([&] { make_tcp_store("127.0.0.1", server.port(), 1s, wrong + "x"); });
  std::string log = ::testing::internal::GetCapturedStderr();

  for (const std::string& got : {got1, got2}) {
    EXPECT_EQ(got.find("the-value"), std::string::npos) << "the value leaked: " << got;
    EXPECT_EQ(got.find("<timeout>"), std::string::npos) << "the connection was left open";
  }
  EXPECT_NE(got1.find("before authentication"), std::string::npos) << got1;
  EXPECT_NE(got2.find("wrong store secret"), std::string::npos) << got2;
  EXPECT_FALSE(s->check("dp[0-3]/arrived/1")) << "a forged key was written without the secret";
  EXPECT_FALSE(s->check("dp[0-3]/arrived/2")) << "a forged key was written with a wrong secret";
  EXPECT_NE(err.find(fmt::format("tcp store 127.0.0.1:{} refused the connection: wrong store secret", server.port())),
            std::string::npos)
      << err;
  EXPECT_NE(log.find("tcp store: closing the connection from 127.0.0.1:"), std::string::npos) << log;
  EXPECT_NE(log.find("request (op 1) before authentication"), std::string::npos) << log;
  EXPECT_NE(log.find("wrong store secret"), std::string::npos) << log;
  EXPECT_EQ(s->get("secret-key", 1s), "the-value");  // and the store still serves its own
}

// VmRSS of a process, in bytes.
int64_t rss_bytes(pid_t pid) {
  std::ifstream f(fmt::format("/proc/{}/status", pid));
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return -1;
}

// A request that claims to be 1 GiB long is refused on its length alone: the server closes the connection before
// buffering the body, whether the client has authenticated or not. (Before: each connection could make the server
// buffer up to 1 GiB; the launcher grew from 161 to 809 MB under two connections.)
TEST(TcpStore, HugeLengthPrefixIsRefusedWithoutBuffering) {
  comm_test::TcpServerProcess server;  // a process of its own, so its memory is its own
  make_tcp_store("127.0.0.1", server.port(), 5s, kSecret)->set("warm", "up");
  const int64_t before = rss_bytes(server.pid());
  ASSERT_GT(before, 0);
  const std::string chunk(1 << 20, 'x');
  for (bool authed : {false, true}) {
    int fd = raw_connect(server.port());
    if (authed) {
      send_all(fd, auth_frame(kSecret));
      ASSERT_EQ(read_reply(fd), std::string(1, '\0')) << "authentication should succeed";
    }
    std::string hdr = le32(1u << 30) + std::string(1, char(1));  // a SET of 1 GiB
    ASSERT_EQ(::send(fd, hdr.data(), hdr.size(), MSG_NOSIGNAL), ssize_t(hdr.size()));
    // Stream 64 MiB of the body; a server that buffers it grows by as much. A server that closed the connection
    // makes these sends fail (EPIPE / ECONNRESET) once the kernel learns of it.
    size_t sent = 0;
    for (int i = 0; i < 64; ++i) {
      ssize_t k = ::send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL);
      if (k < 0) break;
      sent += size_t(k);
    }
    std::string got = read_until_closed(fd);
    ::close(fd);
    EXPECT_EQ(got.find("<timeout>"), std::string::npos) << "the connection was kept open (authed=" << authed << ")";
    EXPECT_LT(sent, size_t(64) << 20) << "the server took all 64 MiB of an oversized request (authed=" << authed << ")";
  }
  const int64_t after = rss_bytes(server.pid());
  // 16 MiB: far above the allocator's noise for two small connections, far below the 64 MiB a buffering server holds.
  EXPECT_LT(after - before, int64_t(16) << 20) << "server RSS grew from " << before << " to " << after << " bytes";
  // And it still serves.
  EXPECT_EQ(make_tcp_store("127.0.0.1", server.port(), 5s, kSecret)->get("warm", 1s), "up");
}

TEST(TcpStore, TooManyConnectionsAreRefused) {
  TcpStoreLimits limits;
  limits.max_connections = 3;
  TcpStoreServer server("127.0.0.1", 0, kSecret, limits);
  ::testing::internal::CaptureStderr();
  std::vector<std::unique_ptr<Store>> clients;
  for (int i = 0; i < 3; ++i) clients.push_back(make_tcp_store("127.0.0.1", server.port(), 2s, kSecret));
  // The fourth is refused: the server says why (or resets the connection before the client read the reason).
  std::string err = error_of([&] { make_tcp_store("127.0.0.1", server.port(), 2s, kSecret); });
  clients.pop_back();                  // frees a slot
  std::this_thread::sleep_for(200ms);  // the server notices the close on its next poll
  auto again = make_tcp_store("127.0.0.1", server.port(), 2s, kSecret);
  again->set("k", "v");
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find(fmt::format("tcp store 127.0.0.1:{}", server.port())), std::string::npos) << err;
  EXPECT_NE(log.find("too many connections (the limit is 3)"), std::string::npos) << log;
  EXPECT_EQ(clients[0]->get("k", 1s), "v");
}

TEST(TcpStore, UnknownRequestIsRejectedWithAReason) {
  TcpStoreServer server("127.0.0.1", 0, kSecret);
  ::testing::internal::CaptureStderr();
  int fd = raw_connect(server.port());
  send_all(fd, auth_frame(kSecret));
  ASSERT_EQ(read_reply(fd), std::string(1, '\0'));
  send_all(fd, frame(std::string(1, char(99)) + wire_str("k")));
  std::string got = read_until_closed(fd);
  ::close(fd);
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(got.find("unknown request (op 99)"), std::string::npos) << got;
  EXPECT_EQ(got.find("<timeout>"), std::string::npos) << "the connection was left open";
  EXPECT_NE(log.find("unknown request (op 99)"), std::string::npos) << log;
}

// Item 8 of the issue: a store that dies under its clients used to be reported only after the whole connect timeout
// (timeout_s, 120 s by default) of retrying refused connections. Once it had been reached, refusals for a few seconds
// (kStoreGoneAfter) are enough to say it is gone.
TEST(TcpStore, DeadStoreIsReportedWithinSecondsNotTheTimeout) {
  comm_test::TcpServerProcess server;
  const int port = server.port();
  auto s = make_tcp_store("127.0.0.1", port, 120s, kSecret);
  s->set("k", "v");
  server.stop();  // SIGKILL: the port now refuses connections
  // The first op may fail on its pooled connection at once; the next must open a connection to a dead server.
  for (int op = 0; op < 2; ++op) {
    std::string err;
    double dt = seconds_of([&] { err = error_of([&] { s->set("k", "v2"); }); });
    // 20 s: generous for a busy machine, and far below the 120 s timeout the client was given.
    EXPECT_LT(dt, 20.0) << "op " << op << ": " << err;
    EXPECT_NE(err.find(fmt::format("tcp store 127.0.0.1:{}", port)), std::string::npos) << err;
  }
  try {
    s->get("k", 1s);
    ADD_FAILURE() << "no error from a dead store";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is gone: connections to it were refused"), std::string::npos) << e.what();
    EXPECT_EQ(e.kind, ErrorKind::PeerLost) << "exit code 22: a supervisor may restart the job";
  }
}

TEST(TcpStore, ServerNeedsAValidSecret) {
  EXPECT_NE(error_of([&] { TcpStoreServer("127.0.0.1", 0, ""); }).find("has 0 bytes"), std::string::npos);
  EXPECT_NE(error_of([&] { TcpStoreServer("127.0.0.1", 0, "short"); }).find("must have 16..1024"), std::string::npos);
  EXPECT_NE(error_of([&] { TcpStoreServer("127.0.0.1", 0, "has a space in it, 123456"); }).find("space"),
            std::string::npos);
  EXPECT_NE(error_of([&] { make_tcp_store("127.0.0.1", 1, 1s, ""); }).find("MEGATRAIN_STORE_SECRET"),
            std::string::npos);
}

TEST(StoreSecret, RandomSecretsDifferAndCompareCorrectly) {
  const std::string a = random_store_secret(), b = random_store_secret();
  EXPECT_EQ(a.size(), 32u);
  EXPECT_NE(a, b);
  check_store_secret(a, "test");
  EXPECT_TRUE(secrets_equal(a, a));
  EXPECT_FALSE(secrets_equal(b, a));
  EXPECT_FALSE(secrets_equal(a.substr(0, 31), a));
  EXPECT_FALSE(secrets_equal(a + "0", a));
  EXPECT_FALSE(secrets_equal("", a));
}

TEST(StoreSecret, FileMustBePrivate) {
  mt::test::ScratchDir dir;
  const std::string path = dir.path + "/secret";
  { std::ofstream(path) << "abcdefghijklmnopqrstuvwxyz\n"; }
  ::chmod(path.c_str(), 0644);
  EXPECT_NE(error_of([&] { read_store_secret_file(path); }).find("chmod 600"), std::string::npos);
  ::chmod(path.c_str(), 0600);
  EXPECT_EQ(read_store_secret_file(path), "abcdefghijklmnopqrstuvwxyz");
}

// ------------------------------------------------------------------------------------------ redis specifics

TEST(RedisStore, PrefixSeparatesNamespaces) {
  RedisServer redis;
  auto a = make_redis_store("127.0.0.1", redis.port(), "jobA", 2s);
  auto b = make_redis_store("127.0.0.1", redis.port(), "jobB", 2s);
  auto raw = make_redis_store("127.0.0.1", redis.port(), "", 2s);
  a->set("k", "from-a");
  EXPECT_FALSE(b->check("k"));
  EXPECT_EQ(raw->get("jobA/k", 1s), "from-a");  // the key layout other tools see
  auto via_url = open_store(fmt::format("redis://127.0.0.1:{}/jobA", redis.port()), 2s);
  EXPECT_EQ(via_url->get("k", 1s), "from-a");
}

// Item 6: a password in the URL is sent with AUTH on every connection; without it, or with a wrong one, the store
// fails at once with an error that says so.
TEST(RedisStore, PasswordInTheUrlIsSentWithAuth) {
  const std::string pw = "pa:ss@word/1";  // characters the URL syntax uses, %-encoded below
  RedisServer redis(pw);
  const int port = redis.port();
  auto s = open_store(fmt::format("redis://:pa%3Ass%40word%2F1@127.0.0.1:{}/jobA", port), 2s);
  s->set("k", "v");
  EXPECT_EQ(s->get("k", 1s), "v");
  // Redis 6's ACL names the password user "default".
  EXPECT_EQ(open_store(fmt::format("redis://default:pa%3Ass%40word%2F1@127.0.0.1:{}/jobA", port), 2s)->get("k", 1s),
            "v");
  std::string wrong = error_of([&] { open_store(fmt::format("redis://:nope@127.0.0.1:{}/jobA", port), 2s); });
  EXPECT_NE(wrong.find(fmt::format("redis store 127.0.0.1:{}: authentication failed", port)), std::string::npos)
      << wrong;
  EXPECT_EQ(wrong.find("nope"), std::string::npos) << "the password must not appear in messages: " << wrong;
  std::string none = error_of([&] { open_store(fmt::format("redis://127.0.0.1:{}/jobA", port), 2s)->get("k", 1s); });
  EXPECT_NE(none.find("NOAUTH"), std::string::npos) << none;
  EXPECT_NE(none.find("give it in the URL"), std::string::npos) << none;
  std::string bad = error_of([&] { open_store(fmt::format("redis://:bad%zz@127.0.0.1:{}/x", port), 2s); });
  EXPECT_NE(bad.find("malformed store URL 'redis://:***@127.0.0.1"), std::string::npos) << bad;
}

// As the tcp store's: a Redis server that dies under its clients is reported within seconds, not after the 120 s
// the client was given to wait for a server that has not started yet.
TEST(RedisStore, DeadStoreIsReportedWithinSecondsNotTheTimeout) {
  auto redis = std::make_unique<RedisServer>();
  const int port = redis->port();
  auto s = make_redis_store("127.0.0.1", port, "x", 120s);
  s->set("k", "v");
  redis.reset();
  for (int op = 0; op < 2; ++op) {
    std::string err;
    double dt = seconds_of([&] { err = error_of([&] { s->set("k", "v2"); }); });
    EXPECT_LT(dt, 20.0) << "op " << op << ": " << err;  // generous for a busy machine; far below 120 s
    EXPECT_NE(err.find(fmt::format("redis store 127.0.0.1:{}", port)), std::string::npos) << err;
  }
}

TEST(RedisStore, DeadServerAndUnreachableServerAreErrors) {
  auto redis = std::make_unique<RedisServer>();
  int port = redis->port();
  auto s = make_redis_store("127.0.0.1", port, "x", 1s);
  s->set("k", "v");
  redis.reset();
  std::string err = error_of([&] { s->get("k", 5s); });
  EXPECT_NE(err.find(fmt::format("redis store 127.0.0.1:{}", port)), std::string::npos) << err;
  double dt = seconds_of([&] { err = error_of([&] { make_redis_store("127.0.0.1", port, "x", 300ms); }); });
  EXPECT_NE(err.find(fmt::format("cannot reach redis store 127.0.0.1:{}", port)), std::string::npos) << err;
  EXPECT_LT(dt, 20.0);  // not a speed: the 300 ms timeout was honoured, not ignored (retrying for good)
}

// ------------------------------------------------------------------------------------------ URLs

TEST(StoreUrl, OpensEachKind) {
  TcpStoreServer server("127.0.0.1", 0, kSecret);
  ::unsetenv(kStoreSecretEnv);
  std::string err = error_of([&] { open_store(fmt::format("tcp://127.0.0.1:{}", server.port()), 1s); });
  EXPECT_NE(err.find("MEGATRAIN_STORE_SECRET is not set"), std::string::npos) << err;
  ::setenv(kStoreSecretEnv, kSecret.c_str(), 1);
  auto via_url = open_store(fmt::format("tcp://127.0.0.1:{}", server.port()), 1s);
  ::unsetenv(kStoreSecretEnv);
  via_url->set("k", "v");
  EXPECT_EQ(make_tcp_store("127.0.0.1", server.port(), 1s, kSecret)->get("k", 1s), "v");

  auto dir = std::filesystem::temp_directory_path() / ("mt-file-store-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  open_store("file://" + dir.string())->set("k", "file");
  EXPECT_EQ(make_file_store(dir.string())->get("k", 1s), "file");
  std::filesystem::remove_all(dir);
}

TEST(StoreUrl, MalformedUrlsNameTheUrl) {
  for (std::string url :
       {"", "nourl", "ftp://h:1", "tcp://host", "tcp://host:abc", "tcp://:80", "tcp://h:0", "tcp://h:70000",
        "tcp://h:", "tcp://[::1", "redis://", "redis://h:1/", "redis://h:x/p", "file://"}) {
    std::string err = error_of([&] { open_store(url, 100ms); });
    EXPECT_NE(err.find("malformed store URL '" + url + "'"), std::string::npos) << url << " -> " << err;
  }
}

// ------------------------------------------------------------------------------------------ environment

const char* const kVars[] = {"RANK",
                             "WORLD_SIZE",
                             "LOCAL_RANK",
                             "LOCAL_WORLD_SIZE",
                             "MASTER_ADDR",
                             "MASTER_PORT",
                             "MEGATRAIN_STORE",
                             "SLURM_PROCID",
                             "SLURM_NTASKS",
                             "SLURM_NPROCS",
                             "SLURM_LOCALID",
                             "SLURM_NODEID",
                             "SLURM_TASKS_PER_NODE",
                             "SLURM_NTASKS_PER_NODE",
                             "SLURM_NNODES",
                             "SLURM_JOB_NODELIST",
                             "SLURM_STEP_NODELIST",
                             "SLURM_NODELIST",
                             "SLURM_LAUNCH_NODE_IPADDR"};

// Clears every variable rank discovery reads, sets the given ones, restores the originals afterwards.
class EnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) {
      if (const char* x = std::getenv(v)) saved_[v] = x;
      ::unsetenv(v);
    }
  }
  void TearDown() override {
    for (const char* v : kVars) ::unsetenv(v);
    for (auto& [k, v] : saved_) ::setenv(k.c_str(), v.c_str(), 1);
  }
  RankInfo with(std::map<std::string, std::string> vars) {
    for (const char* v : kVars) ::unsetenv(v);
    for (auto& [k, v] : vars) ::setenv(k.c_str(), v.c_str(), 1);
    return rank_info_from_env();
  }
  std::string error_with(std::map<std::string, std::string> vars) {
    return error_of([&] { with(std::move(vars)); });
  }
  std::map<std::string, std::string> saved_;
};

TEST_F(EnvTest, NothingSetIsASingleProcess) {
  RankInfo r = with({});
  EXPECT_EQ(r.source, "single");
  EXPECT_EQ(r.rank, 0);
  EXPECT_EQ(r.world_size, 1);
  EXPECT_EQ(r.store_url, "");
}

TEST_F(EnvTest, Torchrun) {
  RankInfo r = with({{"RANK", "3"},
                     {"WORLD_SIZE", "8"},
                     {"LOCAL_RANK", "1"},
                     {"LOCAL_WORLD_SIZE", "2"},
                     {"MASTER_ADDR", "10.1.2.3"},
                     {"MASTER_PORT", "1234"}});
  EXPECT_EQ(r.source, "torchrun");
  EXPECT_EQ(r.rank, 3);
  EXPECT_EQ(r.world_size, 8);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_world_size, 2);
  EXPECT_EQ(r.master_addr, "10.1.2.3");
  EXPECT_EQ(r.master_port, 1234);
  EXPECT_EQ(r.store_url, "tcp://10.1.2.3:1234");

  r = with({{"RANK", "2"}, {"WORLD_SIZE", "4"}});  // a hand-made environment: one node, default master
  EXPECT_EQ(r.local_rank, 2);
  EXPECT_EQ(r.local_world_size, 4);
  EXPECT_EQ(r.store_url, "tcp://127.0.0.1:29500");
}

TEST_F(EnvTest, MegatrainLaunchAddsTheStore) {
  RankInfo r = with({{"RANK", "0"},
                     {"WORLD_SIZE", "2"},
                     {"LOCAL_RANK", "0"},
                     {"LOCAL_WORLD_SIZE", "2"},
                     {"MEGATRAIN_STORE", "redis://h:6379/job"}});
  EXPECT_EQ(r.source, "megatrain");
  EXPECT_EQ(r.store_url, "redis://h:6379/job");
}

TEST_F(EnvTest, TorchrunMistakesNameTheVariable) {
  auto expect_mentions = [&](std::map<std::string, std::string> vars, std::vector<std::string> words) {
    std::string err = error_with(vars);
    for (auto& w : words) EXPECT_NE(err.find(w), std::string::npos) << "'" << w << "' not in: " << err;
  };
  expect_mentions({{"RANK", "abc"}, {"WORLD_SIZE", "2"}}, {"RANK='abc'", "not an integer"});
  expect_mentions({{"RANK", "2"}, {"WORLD_SIZE", "2"}}, {"RANK=2", "WORLD_SIZE=2"});
  expect_mentions({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}, {"RANK=-1"});
  expect_mentions({{"RANK", "0"}, {"WORLD_SIZE", "0"}}, {"WORLD_SIZE=0"});
  expect_mentions({{"RANK", "1"}}, {"WORLD_SIZE"});
  expect_mentions({{"WORLD_SIZE", "4"}}, {"RANK"});
  expect_mentions({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}},
                  {"LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2"});
  expect_mentions({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "8"}}, {"LOCAL_WORLD_SIZE=8"});
  expect_mentions({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "99999"}}, {"MASTER_PORT=99999"});
  expect_mentions({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "12ab"}}, {"MASTER_PORT='12ab'"});
}

TEST_F(EnvTest, Slurm) {
  RankInfo r = with({{"SLURM_PROCID", "5"},
                     {"SLURM_NTASKS", "8"},
                     {"SLURM_LOCALID", "1"},
                     {"SLURM_NODEID", "1"},
                     {"SLURM_TASKS_PER_NODE", "4(x2)"},
                     {"SLURM_JOB_NODELIST", "node[01-03],gpu7"}});
  EXPECT_EQ(r.source, "slurm");
  EXPECT_EQ(r.rank, 5);
  EXPECT_EQ(r.world_size, 8);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_world_size, 4);
  EXPECT_EQ(r.master_addr, "node01");
  EXPECT_EQ(r.master_port, 29500);
  EXPECT_EQ(r.store_url, "tcp://node01:29500");

  // Uneven nodes: this node (id 1) runs 5 tasks.
  r = with({{"SLURM_PROCID", "7"},
            {"SLURM_NTASKS", "8"},
            {"SLURM_LOCALID", "4"},
            {"SLURM_NODEID", "1"},
            {"SLURM_TASKS_PER_NODE", "3,5"},
            {"SLURM_JOB_NODELIST", "gpu7,node[1-2]"},
            {"MASTER_PORT", "4000"}});
  EXPECT_EQ(r.local_world_size, 5);
  EXPECT_EQ(r.master_addr, "gpu7");
  EXPECT_EQ(r.store_url, "tcp://gpu7:4000");

  // The uniform count, the launch node's address, an explicit MASTER_ADDR, MEGATRAIN_STORE.
  r = with({{"SLURM_PROCID", "1"},
            {"SLURM_NTASKS", "4"},
            {"SLURM_LOCALID", "1"},
            {"SLURM_NTASKS_PER_NODE", "2"},
            {"SLURM_LAUNCH_NODE_IPADDR", "10.0.0.9"}});
  EXPECT_EQ(r.local_world_size, 2);
  EXPECT_EQ(r.master_addr, "10.0.0.9");
  r = with({{"SLURM_PROCID", "1"},
            {"SLURM_NTASKS", "2"},
            {"SLURM_LOCALID", "1"},
            {"SLURM_JOB_NODELIST", "n[1-2]"},
            {"MASTER_ADDR", "head"},
            {"MEGATRAIN_STORE", "file:///shared/rdv"}});
  EXPECT_EQ(r.master_addr, "head");
  EXPECT_EQ(r.local_world_size, 2);  // one node assumed when Slurm gives no per-node count
  EXPECT_EQ(r.store_url, "file:///shared/rdv");
}

TEST_F(EnvTest, SlurmMistakesNameTheVariable) {
  auto expect_mentions = [&](std::map<std::string, std::string> vars, std::vector<std::string> words) {
    std::string err = error_with(vars);
    for (auto& w : words) EXPECT_NE(err.find(w), std::string::npos) << "'" << w << "' not in: " << err;
  };
  std::map<std::string, std::string> ok = {{"SLURM_PROCID", "5"},
                                           {"SLURM_NTASKS", "8"},
                                           {"SLURM_LOCALID", "1"},
                                           {"SLURM_NODEID", "1"},
                                           {"SLURM_TASKS_PER_NODE", "4(x2)"}};
  auto with_var = [&](const std::string& k, const std::string& v) {
    auto m = ok;
    m[k] = v;
    return m;
  };
  expect_mentions(with_var("SLURM_TASKS_PER_NODE", "4(x"), {"SLURM_TASKS_PER_NODE='4(x'", "malformed"});
  expect_mentions(with_var("SLURM_TASKS_PER_NODE", "3(x2)"), {"SLURM_TASKS_PER_NODE='3(x2)'", "SLURM_NTASKS=8"});
  expect_mentions(with_var("SLURM_NODEID", "2"), {"SLURM_NODEID=2"});
  expect_mentions(with_var("SLURM_PROCID", "8"), {"SLURM_PROCID=8", "SLURM_NTASKS"});
  expect_mentions(with_var("SLURM_LOCALID", "x"), {"SLURM_LOCALID='x'"});
  expect_mentions(with_var("SLURM_JOB_NODELIST", "node[01-03"), {"SLURM_JOB_NODELIST='node[01-03'"});
  auto no_ntasks = ok;
  no_ntasks.erase("SLURM_NTASKS");
  no_ntasks.erase("SLURM_TASKS_PER_NODE");
  expect_mentions(no_ntasks, {"SLURM_NTASKS"});
  auto uneven = with_var("SLURM_TASKS_PER_NODE", "3,5");
  uneven.erase("SLURM_NODEID");
  expect_mentions(uneven, {"SLURM_NODEID"});
}

TEST(SlurmLists, TasksPerNode) {
  EXPECT_EQ(parse_slurm_tasks_per_node("4(x2),3"), (std::vector<int>{4, 4, 3}));
  EXPECT_EQ(parse_slurm_tasks_per_node("1"), (std::vector<int>{1}));
  EXPECT_EQ(parse_slurm_tasks_per_node("4,4"), (std::vector<int>{4, 4}));
  EXPECT_EQ(parse_slurm_tasks_per_node("2(x3),1(x2)"), (std::vector<int>{2, 2, 2, 1, 1}));
  for (std::string bad : {"", "0", "4(x0)", "4(y2)", "4,", ",4", "a", "4(x2", "4(x2)3", "-1"}) {
    std::string err = error_of([&] { parse_slurm_tasks_per_node(bad); });
    EXPECT_NE(err.find("SLURM_TASKS_PER_NODE='" + bad + "' is malformed"), std::string::npos) << bad << ": " << err;
  }
}

TEST(SlurmLists, FirstHost) {
  EXPECT_EQ(slurm_first_host("node[01-03],gpu7"), "node01");
  EXPECT_EQ(slurm_first_host("gpu7,node[1-2]"), "gpu7");
  EXPECT_EQ(slurm_first_host("n[007,009-010]"), "n007");
  EXPECT_EQ(slurm_first_host("n[12,3]"), "n12");
  EXPECT_EQ(slurm_first_host("rack[1-2]-n[03-04],x"), "rack1-n03");
  EXPECT_EQ(slurm_first_host("single"), "single");
  for (std::string bad : {"", ",x", "node[01-03", "node]", "n[a-b]", "n[[1]]", "n[]"}) {
    std::string err = error_of([&] { slurm_first_host(bad); });
    EXPECT_NE(err.find("SLURM_JOB_NODELIST='" + bad + "' is malformed"), std::string::npos) << bad << ": " << err;
  }
}

}  // namespace

namespace {

// Which address a rank's Gloo device listens on (the two-namespace test in comm_multinode_test.cpp checks the route
// to a real remote master; these are the choices that need no second host).
TEST(LocalAddress, LoopbackForOneNodeAnInterfaceOrAnErrorOtherwise) {
  ::unsetenv(kIfaceEnv);
  RankInfo one_node;
  one_node.world_size = one_node.local_world_size = 4;
  EXPECT_EQ(choose_local_address(one_node).address, "127.0.0.1");

  // Several nodes, but the route to the master leaves through loopback: other nodes could not reach this one.
  RankInfo two_nodes = one_node;
  two_nodes.local_world_size = 2;
  two_nodes.master_addr = "127.0.0.1";
  std::string err = error_of([&] { choose_local_address(two_nodes); });
  EXPECT_NE(err.find("would communicate on the loopback address 127.0.0.1"), std::string::npos) << err;
  EXPECT_NE(err.find("MEGATRAIN_IFACE"), std::string::npos) << err;

  // MEGATRAIN_IFACE names an interface or one of its addresses; anything else lists what there is.
  ::setenv(kIfaceEnv, "lo", 1);
  LocalAddress lo = choose_local_address(two_nodes);
  EXPECT_EQ(lo.address, "127.0.0.1");
  EXPECT_EQ(lo.iface, "lo");
  ::setenv(kIfaceEnv, "127.0.0.1", 1);
  EXPECT_EQ(choose_local_address(two_nodes).iface, "lo");
  ::setenv(kIfaceEnv, "nosuchif0", 1);
  err = error_of([&] { choose_local_address(one_node); });
  EXPECT_NE(err.find("MEGATRAIN_IFACE='nosuchif0' is neither an interface"), std::string::npos) << err;
  ::unsetenv(kIfaceEnv);

  EXPECT_TRUE(is_loopback_address("127.0.1.1"));
  EXPECT_TRUE(is_loopback_address("::1"));
  EXPECT_FALSE(is_loopback_address("10.0.0.1"));
  EXPECT_EQ(route_source_address("127.0.0.1", 29500), "127.0.0.1");
}

}  // namespace
