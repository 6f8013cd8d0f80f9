// Which of this host's addresses a rank's Gloo device listens on, and so which interface its collectives use.
// Single-node jobs keep loopback. Multi-node jobs must not: every rank publishes its address in the store for the
// others to connect to, and 127.0.0.1 on another node is that node itself.
#pragma once
#include <string>
#include <vector>

#include "megatrain/comm/env.h"

namespace mt {

inline constexpr const char* kIfaceEnv = "MEGATRAIN_IFACE";

struct LocalAddress {
  std::string address;  // numeric IP, what Gloo binds and publishes
  std::string iface;    // the interface that owns it, e.g. "eth1" ("?" if none claims it)
  std::string reason;   // how it was chosen, for the start-up line
};

// MEGATRAIN_IFACE when set (an interface name, or one of this host's addresses); else loopback when every rank
// runs on this node; else the address of the interface the kernel routes MASTER_ADDR through. Throws mt::Error
// naming the variable and the interfaces there are when MEGATRAIN_IFACE names none of them, and when a multi-node
// job would end up on loopback (other nodes could not reach it).
LocalAddress choose_local_address(const RankInfo& ri);

// The interface `name_or_address` names (an interface name such as "eth1", or an address one of them has);
// `origin` (e.g. "--iface") goes into the error. IPv4 is preferred when an interface has both.
LocalAddress local_address_of(const std::string& name_or_address, const std::string& origin);

// The local address the kernel would send from to reach host:port (no packet is sent: a UDP socket is connected
// and asked its name). Throws mt::Error naming the host when it does not resolve or has no route.
std::string route_source_address(const std::string& host, int port);

// "eth0 10.0.0.2, lo 127.0.0.1, ...": for messages.
std::string list_local_addresses();

// Whether a numeric address is a loopback one (127.0.0.0/8, ::1).
bool is_loopback_address(const std::string& address);

// `host` resolved to a numeric address (the first the resolver gives); throws mt::Error naming `origin`.
std::string resolve_numeric(const std::string& host, const std::string& origin);

}  // namespace mt
