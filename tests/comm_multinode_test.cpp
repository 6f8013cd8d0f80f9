// Multi-node without a cluster: two hosts of a test network (net_hosts.h: network namespaces on one bridge, each
// with its own interfaces, routes and loopback) stand for two machines. One `megatrain launch --nnodes 2
// --node-rank i` runs in each, 2 ranks per node, a dp=2 x tp=2 job. Before issue 10 every rank published 127.0.0.1 as its Gloo address, which on the other node is
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

#include "support/files.h"
#include "support/megatrain.h"
#include "support/net_hosts.h"
#include "support/parallel_testutil.h"

using namespace ptest;

namespace {

using mt::test::slurp;

TEST(MultiNode, TwoNamespacesTrainLikeOneProcess) {
  mt::test::NetHosts nodes(2);
  if (!nodes.ok())
    GTEST_SKIP() << "cannot make two network namespaces here (" << nodes.why()
                 << "); the multi-node test needs root and iproute2";
  prepare();
  const Trio t = fresh_trio("mt_netns", "dp2_tp2");
  const std::string eps = " --optim.eps=1e-6";  // as the tp tests: keeps Adam's ~0-gradient noise still
  run(kMegatrain + " train" + common_args(t.single, 4, 2, eps));
  run_twin(4, common_args(t.alt, 4, 2, eps));

  // Both launchers start at once, each in its namespace, with the same secret; `timeout` bounds a hang.
  const std::string secret = "netns-test-secret-" + std::to_string(::getpid()) + "-0123456789";
  const std::string logs = mt::test::temp_root() + "mt_netns_" + std::to_string(::getpid());
  // A short store and group timeout: a job that cannot connect fails in 30 s rather than 120.
  auto node_cmd = [&](int node) {
    const std::string log = logs + std::to_string(node);
    return "timeout 300 ip netns exec " + nodes.netns(node) + " env MEGATRAIN_STORE_SECRET=" + secret + " " +
           kMegatrain + " launch --nproc 2 --nnodes 2 --node-rank " + std::to_string(node) + " --master " +
           nodes.address(0) + ":29500 -- train" + common_args(t.multi, 2, 2, eps) +
           " --parallel.dp=2 --parallel.tp=2 --parallel.timeout_s=30 > " + log + ".log 2>&1; echo $? > " + log + ".rc";
  };
  ASSERT_EQ(std::system(("(" + node_cmd(0) + ") & (" + node_cmd(1) + "); wait").c_str()), 0);
  const std::string log0 = slurp(logs + "0.log"), log1 = slurp(logs + "1.log");
  ASSERT_EQ(slurp(logs + "0.rc"), "0\n") << "node 0:\n" << log0 << "\nnode 1:\n" << log1;
  ASSERT_EQ(slurp(logs + "1.rc"), "0\n") << "node 0:\n" << log0 << "\nnode 1:\n" << log1;

  // Each node says which address its ranks communicate on: its own veth address, found by the route to the master.
  const std::string route = "): the route to MASTER_ADDR " + nodes.address(0);
  EXPECT_NE(log0.find("comm: rank 0 and its node use " + nodes.address(0) + " (" + nodes.interface(0) + route),
            std::string::npos)
      << log0;
  EXPECT_NE(log1.find("comm: rank 2 and its node use " + nodes.address(1) + " (" + nodes.interface(1) + route),
            std::string::npos)
      << log1;
  // The store listens on node 0's veth address only, not on every interface.
  EXPECT_NE(log0.find("launch: the store listens on " + nodes.address(0) + ":29500"), std::string::npos) << log0;
  EXPECT_EQ((log0 + log1).find("127.0.0.1"), std::string::npos) << "loopback showed up:\n" << log0 << log1;
  expect_equivalent(t, "netns dp2 tp2");
}

}  // namespace
