// The job's rendezvous store as a launch sees it: node 0 serves a tcp store on the master address (unless the
// user named a store), every node learns its URL, and the secret every connection must present is chosen.
#pragma once
#include <memory>
#include <string>

#include "megatrain/comm/store.h"
#include "megatrain/launch/options.h"

namespace mt::launch {

struct JobStore {
  std::string url;                         // MEGATRAIN_STORE for the ranks
  std::string master_addr;                 // MASTER_ADDR (without brackets)
  int master_port = 0;                     // MASTER_PORT
  std::string secret;                      // MEGATRAIN_STORE_SECRET
  std::unique_ptr<TcpStoreServer> server;  // node 0's own server; null when the store lives elsewhere
};

// Throws mt::Error naming the option at fault: a malformed --master, a loopback master on several nodes, or
// several nodes on a tcp store without a shared secret.
JobStore open_job_store(const LaunchOptions& opt);

// A new client of the job's store for the launcher itself (the driver, an agent's control and liveness), with the
// job's secret.
// connect_timeout: how long a tcp:// client waits for a server that does not answer yet (see make_tcp_store).
std::unique_ptr<Store> connect_job_store(const JobStore& js, Millis connect_timeout = Millis(30000));

}  // namespace mt::launch
