// The checkpointer's background thread (stage 2 of a save, peer copies): one thread running posted tasks in order.
// The training thread posts and, before it reuses the memory a task reads, waits until the thread is idle: a save
// waits only when the previous one is still in flight.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace mt {

class CkptWorker {
 public:
  CkptWorker();
  // Waits for the posted tasks. (A task that may never return, a copy to a dead peer blocked until its group's
  // timeout, is the owner's problem: the checkpointer leaks the worker on the failure path instead of destroying
  // it; the tasks own what they use through shared_ptr.)
  ~CkptWorker();
  CkptWorker(const CkptWorker&) = delete;
  CkptWorker& operator=(const CkptWorker&) = delete;

  void post(std::function<void()> task);  // a task must not throw: it reports through its own state
  void wait_idle();
  bool wait_idle_for(double seconds);  // false when still busy after that long
  bool idle();

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool running_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace mt
