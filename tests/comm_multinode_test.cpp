// Multi-node without a cluster: two network namespaces joined by a veth pair stand for two hosts (each with its own
// interfaces, routes and loopback). One `megatrain launch --nnodes 2 --node-rank i` runs in each, 2 ranks per node,
// a dp=2 x tp=2 job. Before issue 10 every rank published 127.0.0.1 as its Gloo address, which on the other node is
// that node itself: the job could not connect. Now each node's ranks must pick their veth address (the route to
// MASTER_ADDR), say so, and train to the single process's numbers (noise_floor.h). The store is served on node 0's
// veth address and admits only the job's secret, which both launchers are given in MEGATRAIN_STORE_SECRET.
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>

#include <gtest/gtest.h>

#include "parallel_testutil.h"

using namespace ptest;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// Runs a shell command; returns its exit code and (in `out`) what it printed.
int sh(const std::string& cmd, std::string* out = nullptr) {
  const std::string log = mt::test::temp_root() + "mt_netns_sh_" + std::to_string(::getpid()) + ".log";
  int rc = std::system((cmd + " > " + log + " 2>&1").c_str());
  if (out) *out = slurp(log);
  std::remove(log.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

// Two namespaces "<base>a" / "<base>b" joined by veth "<base>x" / "<base>y" with 10.231.0.1/24 and 10.231.0.2/24,
// loopback up in both (ranks of one node reach each other's veth address through it). Names carry the pid, so
// parallel runs do not collide; the destructor removes both namespaces (and with them the veth pair), also after a
// failed assertion.
struct TwoNodes {
  std::string base = "mtn" + std::to_string(::getpid()), a = base + "a", b = base + "b";
  std::string error;  // why the namespaces could not be made ("" when they were)
  bool made_a = false, made_b = false;

  TwoNodes() {
    std::string out;
    if (::geteuid() != 0) {
      error = "not root";
      return;
    }
    if (sh("ip -V", &out) != 0) {
      error = "no `ip` command: " + out;
      return;
    }
    if (sh("ip netns add " + a, &out) != 0) {
      error = "`ip netns add` failed: " + out;
      return;
    }
    made_a = true;
    if (sh("ip netns add " + b, &out) != 0) {
      error = "`ip netns add` failed: " + out;
      return;
    }
    made_b = true;
    const std::string x = base + "x", y = base + "y";
    const std::string na = "ip -n " + a + " ", nb = "ip -n " + b + " ";
    const std::string setup = "ip link add " + x + " type veth peer name " + y +
                              " && ip link set " + x + " netns " + a +
                              " && ip link set " + y + " netns " + b +
                              " && " + na + "addr add 10.231.0.1/24 dev " + x +
                              " && " + nb + "addr add 10.231.0.2/24 dev " + y +
                              " && " + na + "link set " + x + " up && " + nb + "link set " + y + " up" +
                              " && " + na + "link set lo up && " + nb + "link set lo up";
    if (sh(setup, &out) != 0) error = "cannot set up the veth pair: " + out;
  }
  ~TwoNodes() {
    if (made_a) sh("ip netns del " + a);
    if (made_b) sh("ip netns del " + b);
  }
};

TEST(MultiNode, TwoNamespacesTrainLikeOneProcess) {
  TwoNodes nodes;
  if (!nodes.error.empty())
    GTEST_SKIP() << "cannot make two network namespaces here (" << nodes.error
                 << "); the multi-node test needs root and iproute2";
  prepare();
  const Trio t = fresh_trio("mt_netns", "dp2_tp2");
  const std::string eps = " --optim.eps=1e-6";  // as the tp tests: keeps Adam's ~0-gradient noise still
  run(kBin + " train" + common_args(t.single, 4, 2, eps));
  run(kBin + " train" + common_args(t.alt, 4, 2, eps) + reordered(4, common_args(t.alt, 4, 2, eps)));

  // Both launchers start at once, each in its namespace, with the same secret; `timeout` bounds a hang.
  const std::string secret = "netns-test-secret-" + std::to_string(::getpid()) + "-0123456789";
  const std::string logs = mt::test::temp_root() + "mt_netns_" + std::to_string(::getpid());
  // A short store and group timeout: a job that cannot connect fails in 30 s rather than 120.
  auto node_cmd = [&](int node) {
    const std::string ns = node == 0 ? nodes.a : nodes.b, log = logs + std::to_string(node);
    return "timeout 300 ip netns exec " + ns + " env MEGATRAIN_STORE_SECRET=" + secret + " " + kBin +
           " launch --nproc 2 --nnodes 2 --node-rank " + std::to_string(node) + " --master 10.231.0.1:29500 -- train" +
           common_args(t.multi, 2, 2, eps) + " --parallel.dp=2 --parallel.tp=2 --parallel.timeout_s=30 > " + log +
           ".log 2>&1; echo $? > " + log + ".rc";
  };
  ASSERT_EQ(std::system(("(" + node_cmd(0) + ") & (" + node_cmd(1) + "); wait").c_str()), 0);
  const std::string log0 = slurp(logs + "0.log"), log1 = slurp(logs + "1.log");
  ASSERT_EQ(slurp(logs + "0.rc"), "0\n") << "node 0:\n" << log0 << "\nnode 1:\n" << log1;
  ASSERT_EQ(slurp(logs + "1.rc"), "0\n") << "node 0:\n" << log0 << "\nnode 1:\n" << log1;

  // Each node says which address its ranks communicate on: its own veth address, found by the route to the master.
  EXPECT_NE(log0.find("comm: rank 0 and its node use 10.231.0.1 (" + nodes.base + "x): the route to MASTER_ADDR "
                      "10.231.0.1"),
            std::string::npos)
      << log0;
  EXPECT_NE(log1.find("comm: rank 2 and its node use 10.231.0.2 (" + nodes.base + "y): the route to MASTER_ADDR "
                      "10.231.0.1"),
            std::string::npos)
      << log1;
  // The store listens on node 0's veth address only, not on every interface.
  EXPECT_NE(log0.find("launch: the store listens on 10.231.0.1:29500"), std::string::npos) << log0;
  EXPECT_EQ((log0 + log1).find("127.0.0.1"), std::string::npos) << "loopback showed up:\n" << log0 << log1;
  expect_equivalent(t, "netns dp2 tp2");
}

}  // namespace
