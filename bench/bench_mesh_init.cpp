// Communication-group start-up as the world grows, per rendezvous store: forks 4, 8, 16, 32 local ranks that each
// build the full 3D mesh (tp, dp and pp groups over Gloo) through a store - a file store in a temporary directory,
// our tcp:// store server, or a real redis-server (each server in a process of its own, started here) - and reports
// per store and world size the slowest rank's DeviceMesh init time and the store traffic of all ranks together,
// counted by a Store wrapper. Store operations should grow linearly with the world for fixed group sizes (no world
// group, no global barrier): per rank they follow dp + pp + tp, the members of its own groups, which the check
// compares across sizes (a world group would instead cost every rank world - 1 address reads).
// First, per server store (tcp, redis), the service time of one request: 1, 8, 32 client processes issue blocking
// requests back to back, and the bench reports wall time and the server process's CPU time per request (the
// constants store_op_us / store_async_op_us of the cluster files come from these). Prints JSON.
//   bench_mesh_init [--reps N] [--sizes 4,8,16,32] [--store file|tcp|redis|all] [--clients 1,8,32]
//                   [--requests N (per client)] [--skip-init]
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "megatrain/core/error.h"
#include "megatrain/comm/mesh.h"
#include "megatrain/comm/store.h"
// The server processes the multi-process tests use (free port, killed with this process).
#include "../tests/support/comm_servers.h"

using namespace mt;
using nlohmann::json;

namespace {

// Counts every store operation that reaches the backing store. wait() is not overridden, so the base class's polling
// shows up as the check() calls it makes.
class CountingStore : public Store {
 public:
  explicit CountingStore(Store& base) : base_(base) {}
  void set(const std::string& k, const std::string& v) override {
    ++sets;
    base_.set(k, v);
  }
  std::string get(const std::string& k, Millis t) override {
    ++gets;
    return base_.get(k, t);
  }
  bool check(const std::string& k) override {
    ++checks;
    return base_.check(k);
  }
  int64_t add(const std::string& k, int64_t d) override {
    ++adds;
    return base_.add(k, d);
  }
  void remove(const std::string& k) override {
    ++removes;
    base_.remove(k);
  }
  // Forwarded, so a store with server-side waits (tcp) keeps them; counted as one operation.
  void wait(const std::vector<std::string>& keys, Millis t) override {
    ++waits;
    base_.wait(keys, t);
  }
  long total() const { return sets + gets + checks + adds + removes + waits; }
  std::atomic<long> sets{0}, gets{0}, checks{0}, adds{0}, removes{0}, waits{0};

 private:
  Store& base_;
};

MeshShape shape_for(int world) {
  switch (world) {
    case 4: return {2, 1, 2};
    case 8: return {2, 2, 2};
    case 16: return {2, 2, 4};
    case 32: return {4, 2, 4};
    case 64: return {4, 4, 4};
  }
  fail("no mesh shape chosen for world size {} (choose from 4, 8, 16, 32, 64)", world);
}

struct RankResult {
  double init_seconds = 0;
  long sets = 0, gets = 0, checks = 0, waits = 0;
  bool ok = false;
  std::string error;
};

// Child processes released together: fork_children forks n, each runs body(i, wait_for_start) - which opens what
// it needs, calls wait_for_start() once everything before the clock is done, and returns one line of report (an
// exception becomes "error <what>") - and writes that line to a pipe. start() releases them all at once; read_report
// waits for child i and returns its line.
class Children {
 public:
  using Body = std::function<std::string(int i, const std::function<void()>& wait_for_start)>;
  Children(int n, const Body& body) {
    MT_CHECK(::pipe(go_) == 0, "pipe failed");
    const pid_t parent = ::getpid();
    for (int i = 0; i < n; ++i) {
      int p[2];
      MT_CHECK(::pipe(p) == 0, "pipe failed");
      const pid_t pid = ::fork();
      MT_CHECK(pid >= 0, "fork failed");
      if (pid == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != parent) ::_exit(3);
        ::close(p[0]);
        ::close(go_[1]);
        std::string line;
        try {
          line = body(i, [this] {
            char b;
            MT_CHECK(::read(go_[0], &b, 1) == 1, "no start signal");
          });
        } catch (const std::exception& e) {
          line = std::string("error ") + e.what() + "\n";
        }
        ssize_t w = ::write(p[1], line.data(), line.size());
        (void)w;
        ::_exit(0);
      }
      ::close(p[1]);
      kids_.push_back({pid, p[0]});
    }
    ::close(go_[0]);
  }
  void start() {
    std::string g(kids_.size(), 'g');
    MT_CHECK(::write(go_[1], g.data(), g.size()) == static_cast<ssize_t>(g.size()), "start signal failed");
    ::close(go_[1]);
  }
  std::string read_report(int i) {
    auto [pid, fd] = kids_[static_cast<size_t>(i)];
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
    ::close(fd);
    int status = 0;
    ::waitpid(pid, &status, 0);
    return out;
  }
  int size() const { return static_cast<int>(kids_.size()); }

 private:
  int go_[2];
  std::vector<std::pair<pid_t, int>> kids_;
};

// One run: fork `world` ranks, release them together, collect one line per rank. Each rank opens the store at
// `url`, under the key prefix `prefix` (so that repeated runs on one server do not see each other's keys).
std::vector<RankResult> run_world(int world, const std::string& url, const std::string& prefix) {
  const MeshShape shape = shape_for(world);
  Children kids(world, [&](int rank, const std::function<void()>& wait_for_start) {
    auto base = open_store(url, Millis(30000));
    auto scoped = prefixed_store(*base, prefix);
    CountingStore store(*scoped);
    wait_for_start();  // all ranks exist before anyone starts
    GroupOptions opt;
    opt.timeout = Millis(30000);
    DeviceMesh mesh(store, shape, rank, opt);
    float x = 1;
    allreduce_all(mesh, f32_view(&x, {1}));  // the mesh works end to end
    MT_CHECK(x == static_cast<float>(world), "allreduce_all gave {}", x);
    return fmt::format("ok {} {} {} {} {}\n", mesh.init_seconds(), store.sets.load(), store.gets.load(),
                       store.checks.load(), store.waits.load());
  });
  kids.start();
  std::vector<RankResult> res(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    // Ranks wait for each other inside, so a blocking read per rank in order is fine; the 30 s group timeout
    // bounds a broken run.
    const std::string out = kids.read_report(r);
    std::istringstream in(out);
    std::string tag;
    in >> tag;
    auto& rr = res[static_cast<size_t>(r)];
    if (tag == "ok") {
      in >> rr.init_seconds >> rr.sets >> rr.gets >> rr.checks >> rr.waits;
      rr.ok = true;
    } else {
      rr.error = out.empty() ? "rank exited without a report" : out;
    }
  }
  return res;
}

// Every world size of `sizes` on one store kind: the rows of the report plus the linearity check.
json bench_store(const std::string& kind, const std::vector<int>& sizes, int reps) {
  // A server per store kind, in a process of its own, shared by the runs (each under its own key prefix).
  std::unique_ptr<comm_test::TcpServerProcess> tcp;
  std::unique_ptr<comm_test::RedisServer> redis;
  if (kind == "tcp") tcp = std::make_unique<comm_test::TcpServerProcess>();
  if (kind == "redis") redis = std::make_unique<comm_test::RedisServer>();
  json rows = json::array();
  double first_ops_per_rank = 0, min_ratio = 1e300, max_ratio = 0;
  for (int world : sizes) {
    MeshShape s = shape_for(world);
    std::vector<double> max_init;
    long ops = 0, sets = 0, gets = 0, checks = 0, waits = 0;
    for (int rep = 0; rep < reps; ++rep) {
      std::string dir, url;
      if (kind == "file") {
        dir = (std::filesystem::temp_directory_path() / "mt-mesh-bench-XXXXXX").string();
        MT_CHECK(::mkdtemp(dir.data()), "mkdtemp failed");
        url = "file://" + dir;
      } else if (kind == "tcp") {
        url = fmt::format("tcp://127.0.0.1:{}", tcp->port());
        ::setenv(mt::kStoreSecretEnv, comm_test::kSecret.c_str(), 1);  // the ranks' open_store presents it
      } else {
        url = fmt::format("redis://127.0.0.1:{}", redis->port());
      }
      auto res = run_world(world, url, fmt::format("w{}-r{}", world, rep));
      if (!dir.empty()) std::filesystem::remove_all(dir);
      double mx = 0;
      long o = 0;
      std::string errors;
      for (size_t r = 0; r < res.size(); ++r)
        if (!res[r].ok) errors += fmt::format("\n  rank {}: {}", r, res[r].error);
      MT_CHECK(errors.empty(), "{} store, world {} failed:{}", kind, world, errors);
      for (size_t r = 0; r < res.size(); ++r) {
        mx = std::max(mx, res[r].init_seconds);
        o += res[r].sets + res[r].gets + res[r].checks + res[r].waits;
      }
      max_init.push_back(mx);
      if (rep == 0 || o < ops) {  // report the run with the least polling, the protocol's own traffic
        ops = o;
        sets = gets = checks = waits = 0;
        for (auto& r : res) {
          sets += r.sets;
          gets += r.gets;
          checks += r.checks;
          waits += r.waits;
        }
      }
    }
    std::sort(max_init.begin(), max_init.end());
    const double ops_per_rank = static_cast<double>(ops) / world;
    const int members = s.dp + s.pp + s.tp;  // a rank's peers over its three groups, plus itself three times
    if (first_ops_per_rank == 0) first_ops_per_rank = ops_per_rank;
    rows.push_back({{"world", world},
                    {"shape", fmt::format("dp{} x pp{} x tp{}", s.dp, s.pp, s.tp)},
                    {"max_init_seconds_median", max_init[max_init.size() / 2]},
                    {"max_init_seconds_all", max_init},
                    {"store_ops_total", ops},
                    {"store_sets", sets},
                    {"store_gets", gets},
                    {"store_checks", checks},
                    {"store_waits", waits},
                    {"store_ops_per_rank", ops_per_rank},
                    {"ops_per_rank_vs_smallest", ops_per_rank / first_ops_per_rank},
                    {"group_members_per_rank", members},
                    {"store_ops_per_rank_per_member", ops_per_rank / members},
                    {"world_group_address_gets_for_comparison", static_cast<long>(world) * (world - 1)}});
    min_ratio = std::min(min_ratio, ops_per_rank / members);
    max_ratio = std::max(max_ratio, ops_per_rank / members);
  }
  json out;
  out["store"] = kind;
  out["results"] = rows;
  // Linear: the traffic per rank follows the size of that rank's own groups (dp + pp + tp), not the world size.
  out["store_ops_per_rank_per_member_spread"] = max_ratio / min_ratio;
  out["store_ops_linear"] = max_ratio / min_ratio < 1.5;
  return out;
}

// CPU seconds a process has run, all its threads together (the kernel's scheduler statistics, in nanoseconds).
double process_cpu_seconds(pid_t pid) {
  double ns = 0;
  const std::filesystem::path tasks = fmt::format("/proc/{}/task", pid);
  for (const auto& t : std::filesystem::directory_iterator(tasks)) {
    std::ifstream f(t.path() / "schedstat");
    double on_cpu = 0;
    if (f >> on_cpu) ns += on_cpu;
  }
  return ns * 1e-9;
}

double now_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);  // one clock for every process of the host
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// The store's service time per request: `clients` processes connect, wait for a common start, then each issues
// `per_client` blocking requests back to back (a set of its own key, then a get of it, alternately), as the ranks of
// a group creation do. Measured: the wall time from the first start to the last finish, each client's own time, and
// the CPU time the server process spent meanwhile (/proc/PID/task/*/schedstat). With many clients the server is
// never idle, so wall / requests is its throughput limit on this host - an upper bound on the service time, since
// the clients' own CPU shares the host's cores - and server CPU / requests is what one request costs the server
// itself (its share of the kernel's loopback TCP work included), which is what queues when the clients are on
// other hosts.
json request_service(const std::string& url, pid_t server, int clients, int per_client, const std::string& prefix) {
  Children kids(clients, [&](int c, const std::function<void()>& wait_for_start) {
    auto base = open_store(url, Millis(30000));
    auto store = prefixed_store(*base, prefix);
    const std::string key = fmt::format("c{}", c);
    store->set(key, "0");  // the connection is open and authenticated before the clock starts
    wait_for_start();
    const double t0 = now_seconds();
    for (int i = 0; i < per_client; ++i) {
      if (i % 2 == 0)
        store->set(key, "v");
      else
        MT_CHECK(store->get(key, Millis(30000)) == "v", "get returned another value");
    }
    return fmt::format("ok {:.9f} {:.9f}\n", t0, now_seconds());
  });
  ::usleep(200000);  // every client connected (each waits on the start signal after its first set)
  const double cpu0 = process_cpu_seconds(server);
  kids.start();
  double first = 1e300, last = 0;
  std::vector<double> own;
  std::string errors;
  for (int c = 0; c < kids.size(); ++c) {
    const std::string out = kids.read_report(c);
    std::istringstream in(out);
    std::string tag;
    double t0 = 0, t1 = 0;
    in >> tag >> t0 >> t1;
    if (tag != "ok") {
      errors += "\n  " + (out.empty() ? std::string("a client exited without a report") : out);
      continue;
    }
    first = std::min(first, t0);
    last = std::max(last, t1);
    own.push_back(t1 - t0);
  }
  const double cpu = process_cpu_seconds(server) - cpu0;
  MT_CHECK(errors.empty(), "request service at {} clients failed:{}", clients, errors);
  const double requests = static_cast<double>(clients) * per_client, wall = last - first;
  return {{"clients", clients},
          {"requests", requests},
          {"wall_seconds", wall},
          {"wall_us_per_request", 1e6 * wall / requests},
          {"server_cpu_us_per_request", 1e6 * cpu / requests},
          {"client_latency_us_median", 1e6 * median_of(own) / per_client}};
}

// request_service at each client count, `reps` times each; the medians.
json bench_request_service(const std::string& kind, const std::vector<int>& clients, int per_client, int reps) {
  std::unique_ptr<comm_test::TcpServerProcess> tcp;
  std::unique_ptr<comm_test::RedisServer> redis;
  std::string url;
  pid_t server = -1;
  if (kind == "tcp") {
    tcp = std::make_unique<comm_test::TcpServerProcess>();
    url = fmt::format("tcp://127.0.0.1:{}", tcp->port());
    server = tcp->pid();
    ::setenv(mt::kStoreSecretEnv, comm_test::kSecret.c_str(), 1);
  } else if (kind == "redis") {
    redis = std::make_unique<comm_test::RedisServer>();
    url = fmt::format("redis://127.0.0.1:{}", redis->port());
    server = redis->pid();
  } else {
    return json();  // a file store has no server
  }
  json rows = json::array();
  for (int n : clients) {
    std::vector<double> wall, cpu, lat;
    json runs = json::array();
    for (int rep = 0; rep < reps; ++rep) {
      json r = request_service(url, server, n, per_client, fmt::format("rate-{}-{}", n, rep));
      wall.push_back(r["wall_us_per_request"]);
      cpu.push_back(r["server_cpu_us_per_request"]);
      lat.push_back(r["client_latency_us_median"]);
      runs.push_back(r);
    }
    rows.push_back({{"clients", n},
                    {"requests_per_client", per_client},
                    {"wall_us_per_request_median", median_of(wall)},
                    {"server_cpu_us_per_request_median", median_of(cpu)},
                    {"client_latency_us_median", median_of(lat)},
                    {"runs", runs}});
  }
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 3, per_client = 2000;
  bool skip_init = false;
  std::vector<int> sizes{4, 8, 16, 32}, clients{1, 8, 32};
  std::vector<std::string> stores{"file", "tcp", "redis"};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (a == "--sizes" && i + 1 < argc) {
      sizes.clear();
      std::stringstream ss(argv[++i]);
      std::string tok;
      while (std::getline(ss, tok, ',')) sizes.push_back(std::atoi(tok.c_str()));
    } else if (a == "--clients" && i + 1 < argc) {
      clients.clear();
      std::stringstream ss(argv[++i]);
      std::string tok;
      while (std::getline(ss, tok, ',')) clients.push_back(std::atoi(tok.c_str()));
    } else if (a == "--requests" && i + 1 < argc) {
      per_client = std::atoi(argv[++i]);
    } else if (a == "--skip-init") {
      skip_init = true;
    } else if (a == "--store" && i + 1 < argc) {
      std::string k = argv[++i];
      if (k == "all") {
        stores = {"file", "tcp", "redis"};
      } else if (k == "file" || k == "tcp" || k == "redis") {
        stores = {k};
      } else {
        std::cerr << "bench_mesh_init: --store must be file, tcp, redis or all, got '" << k << "'\n";
        return 2;
      }
    } else {
      std::cerr << "usage: bench_mesh_init [--reps N] [--sizes 4,8,16,32] [--store file|tcp|redis|all] "
                   "[--clients 1,8,32] [--requests N] [--skip-init]\n";
      return 2;
    }
  }
  if (reps < 1 || per_client < 2) {
    std::cerr << "bench_mesh_init: --reps must be >= 1 and --requests >= 2\n";
    return 2;
  }
  try {
    json out;
    out["bench"] = "mesh_init";
    out["cpus"] = static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
    {
      std::ifstream f("/proc/cpuinfo");
      for (std::string line; std::getline(f, line);)
        if (line.rfind("model name", 0) == 0) {
          out["cpu"] = line.substr(line.find(':') + 2);
          break;
        }
    }
    double load[1] = {-1};
    if (::getloadavg(load, 1) == 1) out["load_average_1min_at_start"] = load[0];  // other work on a shared machine
    json per_store = json::object(), table = json::array(), service = json::object();
    for (const std::string& k : stores)
      if (k != "file") service[k] = bench_request_service(k, clients, per_client, reps);
    out["request_service"] = service;
    if (!skip_init)
      for (const std::string& k : stores) per_store[k] = bench_store(k, sizes, reps);
    // One row per world size: the median of the slowest rank's init time under each store.
    for (size_t i = 0; !skip_init && i < sizes.size(); ++i) {
      json row = {{"world", sizes[i]}};
      for (const std::string& k : stores)
        row[k + "_max_init_seconds_median"] = per_store[k]["results"][i]["max_init_seconds_median"];
      table.push_back(row);
    }
    out["stores"] = per_store;
    out["init_seconds_by_store"] = table;
    std::cout << out.dump(2) << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "bench_mesh_init: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
