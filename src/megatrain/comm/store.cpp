#include "megatrain/comm/store.h"

#include <algorithm>
#include <chrono>

#include "megatrain/core/error.h"

namespace mt {

std::vector<std::string> Store::missing(const std::vector<std::string>& keys) {
  std::vector<std::string> out;
  for (const auto& k : keys)
    if (!check(k)) out.push_back(k);
  return out;
}

void Store::wait(const std::vector<std::string>& keys, Millis timeout) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  // get() already blocks until its key exists (on the server, for a networked store), so waiting key by key costs
  // one operation per key instead of a poll of every missing key per round.
  for (const auto& key : keys) {
    auto left = std::chrono::ceil<Millis>(deadline - Clock::now());  // up: get gives up no earlier than we do
    try {
      get(key, std::max(left, Millis(0)));
    } catch (const Error&) {
      if (Clock::now() < deadline) throw;  // not a timeout
      auto miss = missing(keys);
      if (miss.empty()) continue;  // it came just after the deadline
      std::string list;
      const size_t shown = std::min<size_t>(miss.size(), 16);
      for (size_t i = 0; i < shown; ++i) {
        if (i) list += ", ";
        list += miss[i];
      }
      if (shown < miss.size()) list += fmt::format(", ... ({} more)", miss.size() - shown);
      fail("store: {} of {} keys not set within {:g} s: {}", miss.size(), keys.size(), timeout.count() / 1000.0, list);
    }
  }
}

namespace {

class PrefixedStore : public Store {
 public:
  PrefixedStore(Store& base, std::string prefix) : base_(base), prefix_(std::move(prefix)) {}
  PrefixedStore(std::unique_ptr<Store> owned, std::string prefix)
      : owned_(std::move(owned)), base_(*owned_), prefix_(std::move(prefix)) {}

  void set(const std::string& key, const std::string& value) override { base_.set(k(key), value); }
  std::string get(const std::string& key, Millis timeout) override { return base_.get(k(key), timeout); }
  bool check(const std::string& key) override { return base_.check(k(key)); }
  int64_t add(const std::string& key, int64_t delta) override { return base_.add(k(key), delta); }
  void remove(const std::string& key) override { base_.remove(k(key)); }
  // Delegate so a base with a server-side wait keeps it.
  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const auto& key : keys) full.push_back(k(key));
    base_.wait(full, timeout);
  }

 private:
  std::string k(const std::string& key) const { return prefix_ + key; }
  std::unique_ptr<Store> owned_;  // set when this store owns its base
  Store& base_;
  std::string prefix_;
};

}  // namespace

namespace {
// "run3" and "run3/" both give keys "run3/<key>".
std::string with_slash(std::string p) {
  if (!p.empty() && p.back() != '/') p += '/';
  return p;
}
}  // namespace

std::unique_ptr<Store> prefixed_store(Store& base, const std::string& prefix) {
  return std::make_unique<PrefixedStore>(base, with_slash(prefix));
}

std::unique_ptr<Store> prefixed_store(std::unique_ptr<Store> base, const std::string& prefix) {
  return std::make_unique<PrefixedStore>(std::move(base), with_slash(prefix));
}

}  // namespace mt
