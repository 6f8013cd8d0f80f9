#include "megatrain/train/config_agreement.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>

#include "megatrain/core/error.h"

namespace mt {

namespace {

// One "key<TAB>value" line per entry: keys and values never hold a newline (TOML keys are bare words here, and a
// value's own newlines are escaped), so the text splits back unambiguously.
std::string encode(const ConfigEntries& e) {
  std::string s;
  for (auto& [k, v] : e) {
    std::string val;
    for (char c : v) val += c == '\n' ? std::string("\\n") : std::string(1, c);
    s += k + '\t' + val + '\n';
  }
  return s;
}

ConfigEntries decode(const std::string& s) {
  ConfigEntries e;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t nl = s.find('\n', pos), tab = s.find('\t', pos);
    MT_CHECK(nl != std::string::npos && tab < nl, "the config published by rank 0 is malformed");
    e.emplace_back(s.substr(pos, tab - pos), s.substr(tab + 1, nl - tab - 1));
    pos = nl + 1;
  }
  return e;
}

// Waits for `keys` (one per rank, in `ranks` order); a rank that never publishes its key is named, as the group
// rendezvous names a member that never arrives.
void wait_for_ranks(Store& store, const std::vector<std::string>& keys, const std::vector<int>& ranks, Millis timeout) {
  try {
    store.wait(keys, timeout);
  } catch (const Error&) {
    const std::vector<std::string> miss = store.missing(keys);
    if (miss.empty()) throw;
    std::string list;
    for (size_t i = 0; i < keys.size(); ++i)
      if (std::find(miss.begin(), miss.end(), keys[i]) != miss.end())
        list += (list.empty() ? "" : ", ") + std::to_string(ranks[i]);
    fail_as(ErrorKind::CommTimeout,
            "ranks {} never arrived within {:g} s (at the start-up check that every rank runs "
            "the same config)",
            list, std::chrono::duration<double>(timeout).count());
  }
}

}  // namespace

std::string config_differences(const ConfigEntries& reference, const ConfigEntries& mine, int rank) {
  std::map<std::string, std::string> ref(reference.begin(), reference.end()), own;
  for (auto& [k, v] : mine) own[k] = v;
  std::string out;
  auto add = [&](const std::string& key, const std::string& a, const std::string& b) {
    out += fmt::format("{}{} (rank 0: {}, rank {}: {})", out.empty() ? "" : "; ", key, a, rank, b);
  };
  for (auto& [k, v] : ref) {
    auto it = own.find(k);
    if (it == own.end())
      add(k, v, "<absent>");
    else if (it->second != v)
      add(k, v, it->second);
  }
  for (auto& [k, v] : own)
    if (!ref.count(k)) add(k, "<absent>", v);
  return out;
}

void agree_on_config(Store& store, int rank, int world, const ConfigEntries& mine, Millis timeout) {
  if (world <= 1) return;
  if (rank == 0) {
    store.set("config/rank0", encode(mine));
    std::vector<std::string> keys;
    std::vector<int> ranks;
    for (int r = 1; r < world; ++r) {
      keys.push_back(fmt::format("config/verdict/{}", r));
      ranks.push_back(r);
    }
    wait_for_ranks(store, keys, ranks, timeout);
    std::vector<std::string> bad;
    for (int r = 1; r < world; ++r) {
      std::string v = store.get(fmt::format("config/verdict/{}", r), timeout);
      if (!v.empty()) bad.push_back(fmt::format("rank {} differs on {}", r, v));
    }
    std::string verdict;
    for (size_t i = 0; i < bad.size() && i < 8; ++i) verdict += (i ? "\n  " : "\n  ") + bad[i];
    if (bad.size() > 8) verdict += fmt::format("\n  ... and {} more ranks", bad.size() - 8);
    store.set("config/verdict", verdict.empty() ? "ok" : verdict);
    if (!verdict.empty())
      fail_as(ErrorKind::Config, "the ranks of this job were started with different configs:{}", verdict);
    return;
  }
  wait_for_ranks(store, {"config/rank0"}, {0}, timeout);
  const std::string diff = config_differences(decode(store.get("config/rank0", timeout)), mine, rank);
  store.set(fmt::format("config/verdict/{}", rank), diff);
  const std::string verdict = store.get("config/verdict", timeout);
  if (verdict != "ok")
    fail_as(ErrorKind::Config, "the ranks of this job were started with different configs:{}", verdict);
}

}  // namespace mt
