// Rendezvous servers for multi-process tests: a tcp:// store server and a real redis-server, each in a process of
// its own (so the test process forks its ranks without a server thread running in it), killed on destruction and
// with the test process should it crash.
#pragma once
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "megatrain/core/error.h"
#include "megatrain/comm/store.h"

extern char** environ;

namespace comm_test {

// The store secret the tests' tcp servers and clients share (a job gets a random one from its launcher).
inline const std::string kSecret = "comm-test-secret-0123456789abcdef";

inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Starts a program with stdout to /dev/null; it is killed if this process dies (no stray servers).
inline pid_t spawn(const std::vector<std::string>& args, const std::vector<std::string>& extra_env = {}) {
  std::vector<std::string> env = extra_env;
  for (char** e = environ; *e; ++e) env.push_back(*e);
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid == 0) {  // only async-signal-safe calls until exec: other threads may be running
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::execvpe(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  if (pid < 0) throw mt::Error("cannot fork for " + args[0] + ": " + std::strerror(errno));
  return pid;
}

inline int wait_exit(pid_t pid) {
  int st = 0;
  ::waitpid(pid, &st, 0);
  return st;
}

// A private redis-server on a free port; with a password, it requires AUTH (--requirepass).
class RedisServer {
 public:
  explicit RedisServer(const std::string& password = "") {
    dir_ = std::filesystem::temp_directory_path() /
           ("mt-redis-" + std::to_string(::getpid()) + "-" + std::to_string(count_++));
    std::filesystem::create_directories(dir_);
    port_ = free_port();
    std::vector<std::string> args = {
        "redis-server", "--port", std::to_string(port_), "--bind",      "127.0.0.1", "--save", "", "--appendonly",
        "no",           "--dir",  dir_.string(),         "--daemonize", "no"};
    if (!password.empty()) args.insert(args.end(), {"--requirepass", password});
    pid_ = spawn(args);
    // Wait until it accepts connections (a client with a connect timeout retries for us).
    mt::make_redis_store("127.0.0.1", port_, "", mt::Millis(10000), "", password);
  }
  ~RedisServer() { stop(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;
  void stop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      wait_exit(pid_);
      pid_ = -1;
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }

 private:
  static inline int count_ = 0;
  std::filesystem::path dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

// Our tcp:// store server (TcpStoreServer) on a free port, run by a forked child of this process.
class TcpServerProcess {
 public:
  TcpServerProcess(const std::string& secret = kSecret) {
    int p[2];
    if (::pipe(p) != 0) throw mt::Error("pipe failed");
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ < 0) throw mt::Error(std::string("cannot fork the tcp store server: ") + std::strerror(errno));
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(3);
      ::close(p[0]);
      int port = -1;
      try {
        mt::TcpStoreServer server("127.0.0.1", 0, secret);
        port = server.port();
        if (::write(p[1], &port, sizeof port) != sizeof port) ::_exit(2);
        for (;;) ::pause();  // serves on its thread until killed
      } catch (...) {
        ssize_t w = ::write(p[1], &port, sizeof port);
        (void)w;
        ::_exit(1);
      }
    }
    ::close(p[1]);
    ssize_t n = ::read(p[0], &port_, sizeof port_);
    ::close(p[0]);
    if (n != sizeof port_ || port_ <= 0) {
      stop();
      throw mt::Error("the tcp store server process did not start");
    }
  }
  ~TcpServerProcess() { stop(); }
  TcpServerProcess(const TcpServerProcess&) = delete;
  TcpServerProcess& operator=(const TcpServerProcess&) = delete;
  void stop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      wait_exit(pid_);
      pid_ = -1;
    }
  }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace comm_test
