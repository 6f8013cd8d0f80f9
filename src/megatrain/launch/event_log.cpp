#include "megatrain/launch/event_log.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"

namespace mt::launch {

EventLog::~EventLog() {
  if (f_) std::fclose(f_);
}

void EventLog::open(const std::string& path, int node) {
  node_ = node;
  if (path.empty()) return;
  const auto parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  f_ = std::fopen(path.c_str(), "a");
  MT_CHECK(f_, "--events {}: cannot open it for appending: {}", path, std::strerror(errno));
}

void EventLog::write(const std::string& event, nlohmann::json fields) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!f_ && observers_.empty()) return;
  nlohmann::json j = {{"t", unix_seconds()}, {"event", event}, {"attempt", attempt_}, {"node", node_}};
  for (auto& [k, v] : fields.items()) j[k] = v;
  if (f_) {
    const std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    std::fwrite(line.data(), 1, line.size(), f_);
    std::fflush(f_);
  }
  for (const auto& observe : observers_) observe(j);
}

}  // namespace mt::launch
