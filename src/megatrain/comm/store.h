// Rendezvous stores: a small key-value service every rank of a job can reach. Process groups exchange their
// addresses through one; the launcher and (later) the driver use it for control. Three implementations:
//   file://DIR            one host, shared directory (default for local runs)
//   tcp://HOST:PORT       a TCP store served by the launcher; every connection must present the job's secret
//                         (MEGATRAIN_STORE_SECRET, see below)
//   redis://[[USER]:PASSWORD@]HOST:PORT[/PREFIX]  a Redis server (across hosts), with AUTH when a password is given
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mt {

using Millis = std::chrono::milliseconds;

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Blocks until `key` exists, then returns its value; throws mt::Error naming the key after `timeout`.
  virtual std::string get(const std::string& key, Millis timeout) = 0;
  // Non-blocking: does `key` exist?
  virtual bool check(const std::string& key) = 0;
  // Atomically adds delta to the integer stored at key (0 if absent) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  virtual void remove(const std::string& key) = 0;
  // Blocks until every key exists. On timeout throws mt::Error listing the missing keys, e.g. so a rendezvous
  // can say "ranks 3, 5 never arrived".
  virtual void wait(const std::vector<std::string>& keys, Millis timeout);
  // The keys among `keys` that do not exist now.
  std::vector<std::string> missing(const std::vector<std::string>& keys);
};

// The implementations (store URLs map onto these).
std::unique_ptr<Store> make_file_store(const std::string& dir);  // file_store.cpp
// A tcp:// client authenticates every connection with `secret`. Once the server has been reached, connections it
// refuses for kStoreGoneAfter fail the operation at once (the server is gone), instead of retrying for the rest of
// connect_timeout, which stays the startup wait for a server that was never reached.
std::unique_ptr<Store> make_tcp_store(const std::string& host, int port, Millis connect_timeout,
                                      const std::string& secret);  // tcp_store.cpp
inline constexpr Millis kStoreGoneAfter{5000};
// Redis AUTH is sent on every connection when `password` is not empty (with `user` too, when that is not empty).
std::unique_ptr<Store> make_redis_store(const std::string& host, int port, const std::string& prefix,
                                        Millis connect_timeout, const std::string& user = "",
                                        const std::string& password = "");  // redis_store.cpp

// What one tcp:// store server accepts (tcp_store.cpp says why these sizes).
struct TcpStoreLimits {
  uint32_t max_frame = 4u << 20;  // bytes of one authenticated request
  int max_connections = 1024;     // open connections, authenticated or not (also capped by the fd limit)
  double auth_timeout_s = 10;     // a connection that has not authenticated by then is closed
};

// The server side of tcp:// stores, run by the launcher on a background thread until destroyed. It listens on
// bind_host only (an address; "" would be every interface, which nothing in megatrain asks for), and closes, with
// a line on stderr naming the peer and the reason, every connection that does not present `secret` first, sends
// an oversized or unknown request, or comes beyond the connection limit.
class TcpStoreServer {
 public:
  TcpStoreServer(const std::string& bind_host, int port, std::string secret,
                 TcpStoreLimits limits = {});  // port 0 = pick a free one
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The per-job secret of tcp:// stores (store_secret.cpp). `megatrain launch` generates one per job (or takes the
// user's, which every node of a multi-node job must share) and passes it to its ranks in this variable.
inline constexpr const char* kStoreSecretEnv = "MEGATRAIN_STORE_SECRET";
std::string random_store_secret();  // 128 bits from the kernel's CSPRNG, as 32 hex digits
// Throws mt::Error naming `origin` (where it came from) unless the secret has 16..1024 printable, non-space bytes.
// `what` names the kind of secret in the message ("store secret", "dashboard token").
void check_secret(const std::string& secret, const std::string& what, const std::string& origin);
void check_store_secret(const std::string& secret, const std::string& origin);
// The secret in MEGATRAIN_STORE_SECRET, checked; "" when the variable is unset or empty.
std::string store_secret_from_env();
// The first line of FILE, checked; the file must not be readable by others (mode 0600 or stricter).
std::string read_secret_file(const std::string& path, const std::string& what);
std::string read_store_secret_file(const std::string& path);
// Compares in time that depends only on the length of `expected`, not on where the two first differ.
bool secrets_equal(const std::string& given, const std::string& expected);

// Opens a store from its URL (see above); a tcp:// store takes its secret from MEGATRAIN_STORE_SECRET. Throws
// mt::Error for a malformed URL, a missing secret or an unreachable server (after connect_timeout).
std::unique_ptr<Store> open_store(const std::string& url, Millis connect_timeout = Millis(30000));

// A store that prefixes every key (one namespace per group / per restart): key k becomes "<prefix>/k".
std::unique_ptr<Store> prefixed_store(Store& base, const std::string& prefix);
// The same, owning its base.
std::unique_ptr<Store> prefixed_store(std::unique_ptr<Store> base, const std::string& prefix);

}  // namespace mt
