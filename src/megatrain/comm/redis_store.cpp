// redis:// stores over hiredis. Keys live under "<prefix>/" so several jobs can share one server; add is
// INCRBY (values stay decimal text, as in the other stores). Redis has no "wait for a key" command that leaves
// the key readable by everyone, so get polls with a backoff from 1 ms to 50 ms: cheap for the server, and a
// rendezvous sees a key at most 50 ms late. With a password (redis://[USER]:PASSWORD@HOST...), every connection
// sends AUTH first; a refusal is an error at once (retrying a wrong password cannot help).
#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"
#include "megatrain/comm/store.h"

namespace mt {
namespace {

timeval to_timeval(double seconds) {
  seconds = std::max(seconds, 0.001);
  timeval tv;
  tv.tv_sec = time_t(seconds);
  tv.tv_usec = suseconds_t((seconds - double(tv.tv_sec)) * 1e6);
  return tv;
}

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

class RedisStore final : public Store {
 public:
  RedisStore(std::string host, int port, std::string prefix, Millis connect_timeout, std::string user,
             std::string password)
      : host_(std::move(host)), port_(port), prefix_(std::move(prefix)), connect_timeout_(connect_timeout),
        user_(std::move(user)), password_(std::move(password)) {
    idle_.push_back(connect());
  }
  ~RedisStore() override {
    for (redisContext* c : idle_) redisFree(c);
  }

  void set(const std::string& key, const std::string& value) override {
    Reply r = command("set", key, {"SET", full(key), value});
    expect(r, REDIS_REPLY_STATUS, "set", key);
  }

  std::string get(const std::string& key, Millis timeout) override {
    double deadline = now_seconds() + double(timeout.count()) / 1000.0;
    double pause = 0.001;
    for (;;) {
      Reply r = command("get", key, {"GET", full(key)});
      if (r->type == REDIS_REPLY_STRING) return std::string(r->str, r->len);
      expect(r, REDIS_REPLY_NIL, "get", key);
      double left = deadline - now_seconds();
      if (left <= 0)
        fail("redis store {}:{}: timed out after {} ms waiting for key '{}'", host_, port_, timeout.count(), key);
      std::this_thread::sleep_for(std::chrono::duration<double>(std::min(pause, left)));
      pause = std::min(pause * 2, 0.05);
    }
  }

  bool check(const std::string& key) override {
    Reply r = command("check", key, {"EXISTS", full(key)});
    expect(r, REDIS_REPLY_INTEGER, "check", key);
    return r->integer != 0;
  }

  int64_t add(const std::string& key, int64_t delta) override {
    Reply r = command("add", key, {"INCRBY", full(key), std::to_string(delta)});
    expect(r, REDIS_REPLY_INTEGER, "add", key);
    return r->integer;
  }

  void remove(const std::string& key) override {
    Reply r = command("remove", key, {"DEL", full(key)});
    expect(r, REDIS_REPLY_INTEGER, "remove", key);
  }

 private:
  std::string full(const std::string& key) const { return prefix_.empty() ? key : prefix_ + "/" + key; }

  // As the tcp store (store.h): refusals are retried for connect_timeout until the server has been reached once,
  // for kStoreGoneAfter after that.
  redisContext* connect() {
    double t0 = now_seconds(), deadline = t0 + double(connect_timeout_.count()) / 1000.0;
    double refused_since = -1;
    std::string why;
    for (;;) {
      redisContext* c = redisConnectWithTimeout(host_.c_str(), port_, to_timeval(deadline - now_seconds()));
      if (c && !c->err) {
        // Bounds every later command: a server that stops answering becomes an error, not a hang.
        redisSetTimeout(c, to_timeval(std::max(30.0, double(connect_timeout_.count()) / 1000.0)));
        authenticate(c);
        reached_ = true;
        return c;
      }
      why = c ? c->errstr : "out of memory";
      const bool refused = c && c->err == REDIS_ERR_IO && why.find("refused") != std::string::npos;
      if (c) redisFree(c);
      const double now = now_seconds();
      if (!refused) {
        refused_since = -1;
      } else if (refused_since < 0) {
        refused_since = now;
      } else if (reached_ && now - refused_since >= double(kStoreGoneAfter.count()) / 1000.0) {
        fail_as(ErrorKind::PeerLost,
                "redis store {}:{} is gone: connections to it were refused for {:.1f} s after it had been reached",
                host_, port_, now - refused_since);
      }
      if (now >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    fail("cannot reach redis store {}:{} after {:.1f} s: {}", host_, port_, now_seconds() - t0, why);
  }

  void authenticate(redisContext* c) {
    if (password_.empty()) return;
    auto* raw = static_cast<redisReply*>(user_.empty() ? redisCommand(c, "AUTH %b", password_.data(), password_.size())
                                                       : redisCommand(c, "AUTH %b %b", user_.data(), user_.size(),
                                                                      password_.data(), password_.size()));
    std::string why = !raw                             ? (c->errstr[0] ? c->errstr : "connection lost")
                      : raw->type == REDIS_REPLY_ERROR ? std::string(raw->str, raw->len)
                                                       : "";
    if (raw) freeReplyObject(raw);
    if (why.empty()) return;
    redisFree(c);
    fail("redis store {}:{}: authentication{} failed: {}", host_, port_,
         user_.empty() ? "" : fmt::format(" as user '{}'", user_), why);
  }

  // Runs one command on a pooled connection (hiredis contexts are not thread-safe; a pool lets threads share the
  // Store). A broken connection is dropped and the op fails with the server's address.
  Reply command(const char* op, const std::string& key, std::initializer_list<std::string> args) {
    redisContext* c = nullptr;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!idle_.empty()) {
        c = idle_.back();
        idle_.pop_back();
      }
    }
    if (!c) c = connect();
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const std::string& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    auto* raw = static_cast<redisReply*>(redisCommandArgv(c, int(argv.size()), argv.data(), lens.data()));
    if (!raw) {
      std::string why = c->errstr[0] ? c->errstr : "connection lost";
      redisFree(c);
      fail("redis store {}:{}: {}('{}') failed: {} (is the server still running?)", host_, port_, op, key, why);
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      idle_.push_back(c);
    }
    return Reply(raw);
  }

  void expect(const Reply& r, int type, const char* op, const std::string& key) {
    if (r->type == type) return;
    std::string what = r->type == REDIS_REPLY_ERROR ? std::string(r->str, r->len)
                                                    : fmt::format("reply type {}", r->type);
    // A server with a password answers NOAUTH to a client that gave none.
    std::string hint = what.rfind("NOAUTH", 0) == 0
                           ? " (the server requires a password: give it in the URL, redis://:PASSWORD@HOST:PORT/)"
                           : "";
    fail("redis store {}:{}: {}('{}') failed: {}{}", host_, port_, op, key, what, hint);
  }

  std::string host_;
  int port_;
  std::string prefix_;
  Millis connect_timeout_;
  std::string user_, password_;
  std::atomic<bool> reached_{false};  // a connection has been made (and authenticated) once
  std::mutex mu_;
  std::vector<redisContext*> idle_;
};

}  // namespace

std::unique_ptr<Store> make_redis_store(const std::string& host, int port, const std::string& prefix,
                                        Millis connect_timeout, const std::string& user, const std::string& password) {
  MT_CHECK(port > 0 && port <= 65535, "redis store: port {} out of range (1..65535)", port);
  MT_CHECK(user.empty() || !password.empty(), "redis store {}:{}: user '{}' given without a password", host, port,
           user);
  return std::make_unique<RedisStore>(host, port, prefix, connect_timeout, user, password);
}

}  // namespace mt
