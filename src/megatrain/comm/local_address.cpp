// Choosing the address a rank communicates on (local_address.h).
#include "megatrain/comm/local_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "megatrain/core/error.h"

namespace mt {
namespace {

struct IfAddr {
  std::string name, address;
  int family;
};

std::string numeric(const sockaddr* sa) {
  char host[NI_MAXHOST] = "";
  socklen_t len = sa->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  if (::getnameinfo(sa, len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0) return "";
  std::string s = host;
  return s.substr(0, s.find('%'));  // "fe80::1%eth0": the zone is not part of the address
}

// Every IPv4 / IPv6 address of every interface that is up.
std::vector<IfAddr> interfaces() {
  ifaddrs* list = nullptr;
  MT_CHECK(::getifaddrs(&list) == 0, "cannot list this host's network interfaces: {}", std::strerror(errno));
  std::vector<IfAddr> out;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || !(i->ifa_flags & IFF_UP)) continue;
    int fam = i->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    std::string a = numeric(i->ifa_addr);
    if (!a.empty()) out.push_back({i->ifa_name, a, fam});
  }
  ::freeifaddrs(list);
  return out;
}

std::string owner_of(const std::string& address) {
  for (const IfAddr& i : interfaces())
    if (i.address == address) return i.name;
  return "?";
}

}  // namespace

bool is_loopback_address(const std::string& address) {
  in_addr v4{};
  if (::inet_pton(AF_INET, address.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, address.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    if (IN6_IS_ADDR_V4MAPPED(&v6)) return v6.s6_addr[12] == 127;
  }
  return false;
}

std::string list_local_addresses() {
  std::string s;
  for (const IfAddr& i : interfaces()) s += (s.empty() ? "" : ", ") + i.name + " " + i.address;
  return s.empty() ? "none" : s;
}

std::string resolve_numeric(const std::string& host, const std::string& origin) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  MT_CHECK(rc == 0 && res, "{} '{}' does not resolve: {}", origin, host, rc ? ::gai_strerror(rc) : "no address");
  std::string a = numeric(res->ai_addr);
  ::freeaddrinfo(res);
  MT_CHECK(!a.empty(), "{} '{}' resolves to an address that cannot be printed", origin, host);
  return a;
}

std::string route_source_address(const std::string& host, int port) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  std::string port_s = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), port_s.c_str(), &hints, &res);
  MT_CHECK(rc == 0 && res, "MASTER_ADDR '{}' does not resolve: {}", host, rc ? ::gai_strerror(rc) : "no address");
  std::string why = "no address", out;
  for (addrinfo* a = res; a && out.empty(); a = a->ai_next) {
    int fd = ::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    // connect() on a UDP socket only picks the route and the source address; nothing goes on the wire.
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0)
        out = numeric(reinterpret_cast<sockaddr*>(&ss));
    } else {
      why = std::strerror(errno);
    }
    ::close(fd);
  }
  ::freeaddrinfo(res);
  MT_CHECK(!out.empty(), "no route from this host to MASTER_ADDR '{}': {}", host, why);
  return out;
}

LocalAddress local_address_of(const std::string& name_or_address, const std::string& origin) {
  const std::vector<IfAddr> all = interfaces();
  const IfAddr* pick = nullptr;
  for (const IfAddr& i : all) {
    if (i.address == name_or_address) return {i.address, i.name, fmt::format("{}={}", origin, name_or_address)};
    if (i.name == name_or_address && (!pick || (pick->family != AF_INET && i.family == AF_INET))) pick = &i;
  }
  MT_CHECK(pick, "{}='{}' is neither an interface that is up nor one of its addresses; there are: {}", origin,
           name_or_address, list_local_addresses());
  return {pick->address, pick->name, fmt::format("{}={}", origin, name_or_address)};
}

LocalAddress choose_local_address(const RankInfo& ri) {
  const char* env = std::getenv(kIfaceEnv);
  if (env && *env) return local_address_of(env, kIfaceEnv);
  if (ri.local_world_size >= ri.world_size) return {"127.0.0.1", owner_of("127.0.0.1"), "every rank on this node"};
  LocalAddress a;
  a.address = route_source_address(ri.master_addr, ri.master_port);
  a.iface = owner_of(a.address);
  a.reason = fmt::format("the route to MASTER_ADDR {}", ri.master_addr);
  MT_CHECK(!is_loopback_address(a.address),
           "this multi-node job would communicate on the loopback address {} (the route to MASTER_ADDR {} leaves "
           "through it), which other nodes cannot reach: set {} (or megatrain launch --iface) to the interface they "
           "reach this node by; there are: {}",
           a.address, ri.master_addr, kIfaceEnv, list_local_addresses());
  return a;
}

}  // namespace mt
