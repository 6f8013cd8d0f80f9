#include "megatrain/launch/hang_blame.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

namespace mt::launch {

namespace {

std::string who(const RankStatus& r) {
  return r.coord.empty() ? fmt::format("rank {}", r.rank) : fmt::format("rank {} ({})", r.rank, r.coord);
}

std::string ranks_text(const std::vector<int>& rs) {
  return fmt::format("{} {}", rs.size() == 1 ? "rank" : "ranks", fmt::join(rs, ","));
}

std::string coll_text(const CollectiveState& c) { return fmt::format("{} #{} of group {}", c.op, c.seq, c.group); }

// What a rank is doing, for lines that name no one.
std::string doing(const RankStatus& r) {
  std::string s = fmt::format("{}: step {} {}", who(r), r.step, r.phase.empty() ? "?" : r.phase);
  for (const auto& c : r.colls)
    if (c.in_flight()) s += fmt::format(", {} {}", c.state == "posted" ? "posted" : "waits in", coll_text(c));
  return s;
}

struct Finding {
  CollectiveState coll;               // the collective the lagging ranks never entered
  std::vector<int> lagging, waiting;  // indices into ranks
};

// Rule 1: the ranks silent for longer than stale_after, each with where it was last seen (an empty blame if none).
Blame blame_silent(const std::vector<RankStatus>& ranks, double now, double stale_after) {
  Blame b;
  std::vector<std::string> parts;
  for (const auto& r : ranks) {
    if (!r.heard || now - r.last_heard <= stale_after) continue;
    b.ranks.push_back(r.rank);
    std::string last;
    for (const auto& c : r.colls)
      if (c.in_flight()) last = fmt::format(", in {}", coll_text(c));
    parts.push_back(fmt::format("{} stopped responding: no heartbeat for {:.0f} s (last seen at step {}, {}{})", who(r),
                                now - r.last_heard, r.step, r.phase.empty() ? "?" : r.phase, last));
  }
  b.line = fmt::format("{}", fmt::join(parts, "; "));
  return b;
}

}  // namespace

Blame blame_hang(const std::vector<RankStatus>& ranks, double now, double stale_after) {
  // 1. Silence.
  Blame b = blame_silent(ranks, now, stale_after);
  if (!b.ranks.empty()) return b;
  b.line.clear();
  std::vector<std::string> parts;

  // 2. Lagging members, per group.
  std::map<std::string, std::vector<std::pair<int, CollectiveState>>> groups;
  for (size_t i = 0; i < ranks.size(); ++i)
    for (const auto& c : ranks[i].colls) groups[c.group].push_back({int(i), c});
  std::vector<Finding> findings;
  std::set<int> waiting_anywhere;  // ranks with a collective in flight
  for (size_t i = 0; i < ranks.size(); ++i)
    for (const auto& c : ranks[i].colls)
      if (c.in_flight()) waiting_anywhere.insert(int(i));
  for (const auto& [name, members] : groups) {
    long k = -1;
    const CollectiveState* at_k = nullptr;
    for (const auto& [i, c] : members)
      if (c.in_flight() && c.seq > k) k = c.seq, at_k = &c;
    if (!at_k) continue;
    Finding f{*at_k, {}, {}};
    for (const auto& [i, c] : members) {
      if (c.seq < k)
        f.lagging.push_back(i);
      else if (c.seq == k && c.in_flight())
        f.waiting.push_back(i);
    }
    if (!f.lagging.empty()) findings.push_back(std::move(f));
  }
  // A lagging rank that is itself waiting in a group where someone lags is a victim: keep the findings whose lagging
  // ranks are not (or, in a cycle, all of them).
  // So is a rank running a collective that a member of its group only posted (rule 3's case, met on the way: rank 2
  // waits in tp #7, which its tp peer 3 posted and never started; rank 2 then never enters dp #30, and neither
  // does 3, but only 3 is the root).
  std::set<int> victims;
  for (const auto& f : findings)
    for (int w : f.waiting) victims.insert(w);
  for (const auto& [name, members] : groups)
    for (const auto& [i, c] : members)
      if (c.state == "started" && std::any_of(members.begin(), members.end(), [&](const auto& m) {
            return m.second.seq == c.seq && m.second.state == "posted";
          }))
        victims.insert(i);
  std::vector<const Finding*> roots;
  for (const auto& f : findings)
    if (std::any_of(f.lagging.begin(), f.lagging.end(), [&](int i) { return !victims.count(i); })) roots.push_back(&f);
  if (roots.empty())
    for (const auto& f : findings) roots.push_back(&f);
  if (!roots.empty()) {
    parts.clear();
    for (const Finding* f : roots) {
      std::vector<std::string> names;
      std::vector<int> waiting;
      for (int i : f->lagging) {
        names.push_back(who(ranks[size_t(i)]));
        if (std::find(b.ranks.begin(), b.ranks.end(), ranks[size_t(i)].rank) == b.ranks.end())
          b.ranks.push_back(ranks[size_t(i)].rank);
      }
      for (int i : f->waiting) waiting.push_back(ranks[size_t(i)].rank);
      parts.push_back(fmt::format("{} never entered {}; {} wait{} in it", fmt::join(names, ", "), coll_text(f->coll),
                                  ranks_text(waiting), waiting.size() == 1 ? "s" : ""));
    }
    b.line = fmt::format("{}", fmt::join(parts, "; "));
    return b;
  }

  // 3. Posted but never started, while the others run it.
  for (const auto& [name, members] : groups) {
    std::vector<int> posted, started;
    const CollectiveState* c0 = nullptr;
    for (const auto& [i, c] : members) {
      if (c.state == "posted") posted.push_back(i), c0 = &c;
      if (c.state == "started") started.push_back(i);
    }
    if (posted.empty() || started.empty()) continue;
    std::vector<std::string> names;
    std::vector<int> waiting;
    for (int i : posted) names.push_back(who(ranks[size_t(i)])), b.ranks.push_back(ranks[size_t(i)].rank);
    for (int i : started) waiting.push_back(ranks[size_t(i)].rank);
    b.line = fmt::format("{} posted {} but never started it; {} wait{} in it", fmt::join(names, ", "), coll_text(*c0),
                         ranks_text(waiting), waiting.size() == 1 ? "s" : "");
    return b;
  }

  parts.clear();
  for (const auto& r : ranks) parts.push_back(doing(r));
  b.line = fmt::format("no rank could be blamed from the collectives' states: {}", fmt::join(parts, "; "));
  return b;
}

}  // namespace mt::launch
