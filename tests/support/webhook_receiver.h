// A webhook receiver for the tests of `megatrain launch --notify` (launch_notify_test, launch_nodes_test): a real
// HTTP(S) server in the test process that records each POSTed JSON body.
#pragma once
#include <fcntl.h>
#include <httplib.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace mt::test {

using nlohmann::json;

// Records each POSTed body; `answer` picks the status of each request (by its index).
class Receiver {
 public:
  // Listens on 127.0.0.1, or with `netns` (a path under /run/netns) on every address of that network namespace:
  // the server's thread enters it before it makes its socket, and a socket stays in the namespace it was made in.
  explicit Receiver(std::unique_ptr<httplib::Server> server = std::make_unique<httplib::Server>(),
                    const std::string& netns = "")
      : server_(std::move(server)) {
    server_->Post(R"(/hook.*)", [this](const httplib::Request& req, httplib::Response& res) {
      int index;
      {
        std::unique_lock<std::mutex> lock(mu_);
        index = requests_++;
        cv_.notify_all();
        cv_.wait(lock, [&] { return !hold_; });
      }
      res.status = answer ? answer(index) : 200;
      if (res.status / 100 == 2) {
        std::lock_guard<std::mutex> lock(mu_);
        bodies_.push_back(json::parse(req.body));
      }
    });
    EXPECT_TRUE(server_->is_valid()) << "the server's certificate or key did not load";
    std::atomic<int> port{0};
    thread_ = std::thread([this, netns, &port] {
      if (!netns.empty()) {
        const int fd = ::open(netns.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) {
          port = -1;
          if (fd >= 0) ::close(fd);
          return;
        }
        ::close(fd);
      }
      const int p = server_->bind_to_any_port(netns.empty() ? "127.0.0.1" : "0.0.0.0");
      port = p > 0 ? p : -1;
      if (p > 0) server_->listen_after_bind();
    });
    while (port == 0 || (port > 0 && !server_->is_running())) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    port_ = port;
    EXPECT_GT(port_, 0) << "the webhook receiver could not listen" << (netns.empty() ? "" : " in " + netns);
  }
  ~Receiver() {
    release();
    server_->stop();
    thread_.join();
  }
  int port() const { return port_; }
  std::string url(const std::string& scheme = "http", const std::string& host = "127.0.0.1") const {
    return fmt::format("{}://{}:{}/hook/T0/B0", scheme, host, port_);
  }
  std::vector<json> bodies() const {
    std::lock_guard<std::mutex> lock(mu_);
    return bodies_;
  }
  int requests() const {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  // Holds every request in its handler until release(): a webhook that hangs.
  void hold() {
    std::lock_guard<std::mutex> lock(mu_);
    hold_ = true;
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    hold_ = false;
    cv_.notify_all();
  }
  void wait_for_requests(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    ASSERT_TRUE(cv_.wait_for(lock, std::chrono::seconds(60), [&] { return requests_ >= n; }));
  }

  std::function<int(int)> answer;

 private:
  std::unique_ptr<httplib::Server> server_;
  int port_ = 0;
  std::thread thread_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool hold_ = false;
  int requests_ = 0;
  std::vector<json> bodies_;
};

}  // namespace mt::test
