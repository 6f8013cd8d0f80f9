#include "megatrain/train/ckpt_worker.h"

#include <chrono>

namespace mt {

CkptWorker::CkptWorker() : thread_([this] { loop(); }) {}

CkptWorker::~CkptWorker() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CkptWorker::post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_all();
}

bool CkptWorker::idle() {
  std::lock_guard<std::mutex> lk(mu_);
  return tasks_.empty() && !running_;
}

void CkptWorker::wait_idle() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return tasks_.empty() && !running_; });
}

bool CkptWorker::wait_idle_for(double seconds) {
  std::unique_lock<std::mutex> lk(mu_);
  return cv_.wait_for(lk, std::chrono::duration<double>(seconds), [&] { return tasks_.empty() && !running_; });
}

void CkptWorker::loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stop_ and nothing left
    std::function<void()> t = std::move(tasks_.front());
    tasks_.pop_front();
    running_ = true;
    lk.unlock();
    t();
    lk.lock();
    running_ = false;
    cv_.notify_all();
  }
}

}  // namespace mt
