#include "megatrain/core/stop_request.h"

#include <atomic>
#include <csignal>

namespace mt {

namespace {

// A lock-free atomic is async-signal-safe to store from a handler.
std::atomic<int> g_stop{0};
std::atomic<int> g_abandon{0};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void on_stop_signal(int sig) {
  if (g_stop.exchange(1) && sig == SIGINT) {
    std::signal(SIGINT, SIG_DFL);  // the second Ctrl-C: die now
    std::raise(SIGINT);
  }
}

extern "C" void on_abandon_signal(int) { g_abandon.store(1); }

}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking reads and waits resume; the flag is seen at the next step boundary
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  struct sigaction ab {};
  ab.sa_handler = on_abandon_signal;
  sigemptyset(&ab.sa_mask);
  ab.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &ab, nullptr);
}

bool stop_requested() { return g_stop.load() != 0; }
void request_stop() { g_stop.store(1); }
void clear_stop_request() { g_stop.store(0); }

bool abandon_requested() { return g_abandon.load() != 0; }
void request_abandon() { g_abandon.store(1); }
void clear_abandon_request() { g_abandon.store(0); }

}  // namespace mt
