// Rendezvous stores: a small key-value service every rank of a job can reach. Process groups exchange their
// addresses through one; the launcher and (later) the driver use it for control. Three implementations:
//   file://DIR            one host, shared directory (default for local runs)
//   tcp://HOST:PORT       a TCP store served by the launcher (or by rank 0 when no launcher)
//   redis://HOST:PORT[/PREFIX]  a Redis server (across hosts)
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
std::unique_ptr<Store> make_tcp_store(const std::string& host, int port, Millis connect_timeout);  // tcp_store.cpp
std::unique_ptr<Store> make_redis_store(const std::string& host, int port, const std::string& prefix,
                                        Millis connect_timeout);  // redis_store.cpp

// The server side of tcp:// stores, run by the launcher (or rank 0) on a background thread until destroyed.
class TcpStoreServer {
 public:
  TcpStoreServer(const std::string& bind_host, int port);  // port 0 = pick a free one
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Opens a store from its URL (see above). Throws mt::Error for a malformed URL or an unreachable server
// (after connect_timeout).
std::unique_ptr<Store> open_store(const std::string& url, Millis connect_timeout = Millis(30000));

// A store that prefixes every key (one namespace per group / per restart): key k becomes "<prefix>/k".
std::unique_ptr<Store> prefixed_store(Store& base, const std::string& prefix);

}  // namespace mt
