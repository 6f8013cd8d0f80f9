#include "megatrain/launch/job_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>

#include "megatrain/comm/local_address.h"
#include "megatrain/core/error.h"
#include "megatrain/launch/process_util.h"

namespace mt::launch {

namespace {

// The tcp store's secret: the user's (a file, or MEGATRAIN_STORE_SECRET), which every node of a multi-node job
// must share; on one node a fresh random one when the user gave none.
std::string choose_secret(const LaunchOptions& opt) {
  std::string s = opt.secret_file.empty() ? store_secret_from_env() : read_store_secret_file(opt.secret_file);
  if (!s.empty()) return s;
  bool tcp = opt.store.empty() || opt.store.rfind("tcp://", 0) == 0;
  MT_CHECK(opt.nnodes + opt.spares == 1 || !tcp,
           "--nnodes {} with a tcp store needs the store secret every node shares: set {} to the same value on "
           "every node (e.g. `export {}=$(openssl rand -hex 16)` in the job script, before the launchers start), "
           "or give --secret-file FILE (mode 600, on a file system every node reads)",
           opt.nnodes, kStoreSecretEnv, kStoreSecretEnv);
  return random_store_secret();
}

}  // namespace

JobStore open_job_store(const LaunchOptions& opt) {
  JobStore js;
  std::string addr = opt.master;
  int port = -1;
  if (size_t colon = addr.rfind(':'); colon != std::string::npos && addr.find(']', colon) == std::string::npos) {
    std::string p = addr.substr(colon + 1);
    addr = addr.substr(0, colon);
    char* end = nullptr;
    long v = std::strtol(p.c_str(), &end, 10);
    MT_CHECK(!p.empty() && *end == '\0' && v >= 1 && v <= 65535, "--master '{}': port '{}' is not in 1..65535",
             opt.master, p);
    port = int(v);
  }
  if (addr.size() > 2 && addr.front() == '[' && addr.back() == ']') addr = addr.substr(1, addr.size() - 2);
  js.master_addr = addr.empty() ? "127.0.0.1" : addr;
  std::string host = js.master_addr.find(':') != std::string::npos ? "[" + js.master_addr + "]" : js.master_addr;

  js.secret = choose_secret(opt);
  if (!opt.store.empty()) {
    js.master_port = port > 0 ? port : 29500;
    js.url = opt.store;
    return js;
  }
  if (opt.node_rank == 0) {
    // Listen on the master address only: loopback by default on one node, on several the address the other
    // nodes were told (never every interface: the store must not be reachable from where the job is not).
    std::string bind = js.master_addr;
    // Every node on this one host (--iface lo): a test, or a machine split into "nodes"; loopback reaches them all.
    const bool one_host = !opt.iface.empty() && is_loopback_address(local_address_of(opt.iface, "--iface").address);
    if (opt.nnodes + opt.spares > 1) {
      bind = resolve_numeric(js.master_addr, "--master");
      MT_CHECK(one_host || !is_loopback_address(bind),
               "--master '{}' is the loopback address {}, which the other {} cannot reach; give node 0's address on "
               "the network they share (this host has: {}), or --iface lo when every node runs on this host",
               opt.master, bind, plural(opt.nnodes - 1, "node"), list_local_addresses());
    }
    TcpStoreLimits limits;
    // Each rank holds a few connections (one per thread blocked in the store at a time); 8 per rank is ample.
    limits.max_connections = std::max(1024, 8 * opt.nnodes * opt.nproc);
    js.server = std::make_unique<TcpStoreServer>(bind, port > 0 ? port : 0, js.secret, limits);
    js.master_port = js.server->port();
    if (opt.nnodes + opt.spares > 1) say(fmt::format("the store listens on {}:{}", bind, js.master_port));
  } else {
    js.master_port = port;
  }
  js.url = fmt::format("tcp://{}:{}", host, js.master_port);
  return js;
}

std::unique_ptr<Store> connect_job_store(const JobStore& js, Millis connect_timeout) {
  if (js.url.rfind("tcp://", 0) == 0) {
    std::string host = js.master_addr;
    int port = js.master_port;
    // A user-given tcp:// store names its own address.
    const std::string rest = js.url.substr(6);
    if (auto colon = rest.rfind(':'); colon != std::string::npos) {
      host = rest.substr(0, colon);
      port = std::atoi(rest.c_str() + colon + 1);
      if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    }
    return make_tcp_store(host, port, connect_timeout, js.secret);
  }
  return open_store(js.url, connect_timeout);
}

}  // namespace mt::launch
