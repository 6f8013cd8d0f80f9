// Rendezvous stores: the same semantics checked on the tcp:// store (our server) and on redis:// (a real
// redis-server started here), TCP server robustness, store URLs, and rank discovery from launcher variables.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <thread>

#include <gtest/gtest.h>

#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"
#include "megatrain/comm/env.h"
#include "megatrain/comm/store.h"
#include "comm_servers.h"
#include "test_util.h"

using namespace mt;
using namespace std::chrono_literals;

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
    auto s = std::string(kind) == "tcp" ? make_tcp_store("127.0.0.1", port, 5s)
                                        : make_redis_store("127.0.0.1", port, "mt-test", 5s);
    s->set(key, value);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "child: %s\n", e.what());
    ::_exit(1);
  }
  ::_exit(0);
}();

using mt::test::error_of;

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
  TcpStoreServer tcp{"127.0.0.1", 0};
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
    return tcp() ? make_tcp_store("127.0.0.1", port(), 2s) : make_redis_store("127.0.0.1", port(), "mt-test", 2s);
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
  TcpStoreServer server("127.0.0.1", 0);
  constexpr int kClients = 48, kAdds = 40;
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i)
    threads.emplace_back([&, i] {
      try {
        auto s = make_tcp_store("127.0.0.1", server.port(), 5s);
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
  EXPECT_EQ(make_tcp_store("127.0.0.1", server.port(), 1s)->get("counter", 1s), std::to_string(kClients * kAdds));
}

TEST(TcpStore, OneSetReleasesManyParkedGets) {
  TcpStoreServer server("127.0.0.1", 0);
  constexpr int kWaiters = 40;
  std::atomic<int> released{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kWaiters; ++i)
    threads.emplace_back([&] {
      try {
        auto s = make_tcp_store("127.0.0.1", server.port(), 5s);
        if (s->get("go", 60s) == "now") ++released;
      } catch (const std::exception& e) {
        ADD_FAILURE() << e.what();
      }
    });
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(released.load(), 0);
  make_tcp_store("127.0.0.1", server.port(), 1s)->set("go", "now");
  for (auto& t : threads) t.join();
  EXPECT_EQ(released.load(), kWaiters);
}

TEST(TcpStore, DeadServerFailsClientOpsQuickly) {
  auto server = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
  auto s = make_tcp_store("127.0.0.1", server->port(), 1s);
  auto s2 = make_tcp_store("127.0.0.1", server->port(), 1s);
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
  double dt = seconds_of([&] { err = error_of([&] { make_tcp_store("127.0.0.1", port, 300ms); }); });
  EXPECT_NE(err.find(fmt::format("cannot reach tcp store 127.0.0.1:{} after", port)), std::string::npos) << err;
  EXPECT_GE(dt, 0.25);
  EXPECT_LT(dt, 20.0);  // not a speed: the 300 ms timeout was honoured, not ignored (retrying for good)
}

TEST(TcpStore, ClientRetriesUntilServerStarts) {
  int port = free_port();
  std::unique_ptr<TcpStoreServer> server;
  std::thread t([&] {
    std::this_thread::sleep_for(300ms);
    server = std::make_unique<TcpStoreServer>("127.0.0.1", port);
  });
  auto s = make_tcp_store("127.0.0.1", port, 60s);
  t.join();
  s->set("k", "v");
  EXPECT_EQ(s->get("k", 1s), "v");
}

TEST(TcpStore, PortInUseIsAnError) {
  TcpStoreServer a("127.0.0.1", 0);
  std::string err = error_of([&] { TcpStoreServer b("127.0.0.1", a.port()); });
  EXPECT_NE(err.find(fmt::format("cannot listen on 127.0.0.1:{}", a.port())), std::string::npos) << err;
}

TEST(TcpStore, GarbageFromOneClientDoesNotHurtOthers) {
  TcpStoreServer server("127.0.0.1", 0);
  auto s = make_tcp_store("127.0.0.1", server.port(), 1s);
  s->set("k", "v");
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(server.port()));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  const char junk[] = "\xff\xff\xff\xff garbage";  // a frame length far beyond the limit
  ASSERT_GT(::send(fd, junk, sizeof junk, MSG_NOSIGNAL), 0);
  char c;
  EXPECT_EQ(::recv(fd, &c, 1, 0), 0) << "the server should drop a client that sends garbage";
  ::close(fd);
  EXPECT_EQ(s->get("k", 1s), "v");
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
  TcpStoreServer server("127.0.0.1", 0);
  auto via_url = open_store(fmt::format("tcp://127.0.0.1:{}", server.port()), 1s);
  via_url->set("k", "v");
  EXPECT_EQ(make_tcp_store("127.0.0.1", server.port(), 1s)->get("k", 1s), "v");

  auto dir = std::filesystem::temp_directory_path() / ("mt-file-store-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  open_store("file://" + dir.string())->set("k", "file");
  EXPECT_EQ(make_file_store(dir.string())->get("k", 1s), "file");
  std::filesystem::remove_all(dir);
}

TEST(StoreUrl, MalformedUrlsNameTheUrl) {
  for (std::string url : {"", "nourl", "ftp://h:1", "tcp://host", "tcp://host:abc", "tcp://:80", "tcp://h:0",
                          "tcp://h:70000", "tcp://h:", "tcp://[::1", "redis://", "redis://h:1/", "redis://h:x/p",
                          "file://"}) {
    std::string err = error_of([&] { open_store(url, 100ms); });
    EXPECT_NE(err.find("malformed store URL '" + url + "'"), std::string::npos) << url << " -> " << err;
  }
}

// ------------------------------------------------------------------------------------------ environment

const char* const kVars[] = {"RANK",          "WORLD_SIZE",    "LOCAL_RANK",   "LOCAL_WORLD_SIZE",
                             "MASTER_ADDR",   "MASTER_PORT",   "MEGATRAIN_STORE", "SLURM_PROCID",
                             "SLURM_NTASKS",  "SLURM_NPROCS",  "SLURM_LOCALID",   "SLURM_NODEID",
                             "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_NNODES", "SLURM_JOB_NODELIST",
                             "SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_LAUNCH_NODE_IPADDR"};

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
  RankInfo r = with({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
                     {"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "1234"}});
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
  RankInfo r = with({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"},
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
  RankInfo r = with({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "1"},
                     {"SLURM_TASKS_PER_NODE", "4(x2)"}, {"SLURM_JOB_NODELIST", "node[01-03],gpu7"}});
  EXPECT_EQ(r.source, "slurm");
  EXPECT_EQ(r.rank, 5);
  EXPECT_EQ(r.world_size, 8);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_world_size, 4);
  EXPECT_EQ(r.master_addr, "node01");
  EXPECT_EQ(r.master_port, 29500);
  EXPECT_EQ(r.store_url, "tcp://node01:29500");

  // Uneven nodes: this node (id 1) runs 5 tasks.
  r = with({{"SLURM_PROCID", "7"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "4"}, {"SLURM_NODEID", "1"},
            {"SLURM_TASKS_PER_NODE", "3,5"}, {"SLURM_JOB_NODELIST", "gpu7,node[1-2]"}, {"MASTER_PORT", "4000"}});
  EXPECT_EQ(r.local_world_size, 5);
  EXPECT_EQ(r.master_addr, "gpu7");
  EXPECT_EQ(r.store_url, "tcp://gpu7:4000");

  // The uniform count, the launch node's address, an explicit MASTER_ADDR, MEGATRAIN_STORE.
  r = with({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"}, {"SLURM_NTASKS_PER_NODE", "2"},
            {"SLURM_LAUNCH_NODE_IPADDR", "10.0.0.9"}});
  EXPECT_EQ(r.local_world_size, 2);
  EXPECT_EQ(r.master_addr, "10.0.0.9");
  r = with({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "1"}, {"SLURM_JOB_NODELIST", "n[1-2]"},
            {"MASTER_ADDR", "head"}, {"MEGATRAIN_STORE", "file:///shared/rdv"}});
  EXPECT_EQ(r.master_addr, "head");
  EXPECT_EQ(r.local_world_size, 2);  // one node assumed when Slurm gives no per-node count
  EXPECT_EQ(r.store_url, "file:///shared/rdv");
}

TEST_F(EnvTest, SlurmMistakesNameTheVariable) {
  auto expect_mentions = [&](std::map<std::string, std::string> vars, std::vector<std::string> words) {
    std::string err = error_with(vars);
    for (auto& w : words) EXPECT_NE(err.find(w), std::string::npos) << "'" << w << "' not in: " << err;
  };
  std::map<std::string, std::string> ok = {{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
                                           {"SLURM_NODEID", "1"}, {"SLURM_TASKS_PER_NODE", "4(x2)"}};
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
