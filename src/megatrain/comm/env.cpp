// Rank discovery from launcher environment variables (see env.h for the conventions).
#include "megatrain/comm/env.h"

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <numeric>

#include "megatrain/core/error.h"

namespace mt {
namespace {

// An empty variable counts as unset: job scripts often do `export X=` to clear one.
const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int to_int(const std::string& s, bool& ok) {
  int v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  ok = !s.empty() && ec == std::errc() && end == s.data() + s.size();
  return v;
}

int env_int(const char* name) {
  std::string s = env(name);
  bool ok;
  int v = to_int(s, ok);
  MT_CHECK(ok, "environment variable {}='{}' is not an integer", name, s);
  return v;
}

// The names a launcher uses for the four numbers, so messages speak the user's variables.
struct Names {
  const char *rank, *world, *local_rank, *local_world;
};

void validate(const RankInfo& r, const Names& n) {
  MT_CHECK(r.world_size >= 1, "{}={} must be at least 1", n.world, r.world_size);
  MT_CHECK(r.rank >= 0 && r.rank < r.world_size, "{}={} is outside 0..{}-1 ({}={})", n.rank, r.rank, n.world, n.world,
           r.world_size);
  MT_CHECK(r.local_world_size >= 1 && r.local_world_size <= r.world_size, "{}={} must be in 1..{} ({}={})",
           n.local_world, r.local_world_size, r.world_size, n.world, r.world_size);
  MT_CHECK(r.local_rank >= 0 && r.local_rank < r.local_world_size, "{}={} is outside 0..{}-1 ({}={})", n.local_rank,
           r.local_rank, n.local_world, n.local_world, r.local_world_size);
  MT_CHECK(r.local_rank <= r.rank, "{}={} exceeds {}={}", n.local_rank, r.local_rank, n.rank, r.rank);
}

void read_master(RankInfo& r) {
  if (const char* a = env("MASTER_ADDR")) r.master_addr = a;
  if (env("MASTER_PORT")) {
    r.master_port = env_int("MASTER_PORT");
    MT_CHECK(r.master_port >= 1 && r.master_port <= 65535, "MASTER_PORT={} is outside 1..65535", r.master_port);
  }
}

void from_torchrun(RankInfo& r) {
  MT_CHECK(env("RANK") && env("WORLD_SIZE"), "{} is set but {} is not (a launcher sets both)",
           env("RANK") ? "RANK" : "WORLD_SIZE", env("RANK") ? "WORLD_SIZE" : "RANK");
  r.rank = env_int("RANK");
  r.world_size = env_int("WORLD_SIZE");
  // Without the local variables, assume one node (a hand-made environment).
  r.local_rank = env("LOCAL_RANK") ? env_int("LOCAL_RANK") : r.rank;
  r.local_world_size = env("LOCAL_WORLD_SIZE") ? env_int("LOCAL_WORLD_SIZE") : r.world_size;
  read_master(r);
  validate(r, {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"});
}

void from_slurm(RankInfo& r) {
  const char* ntasks_var = env("SLURM_NTASKS") ? "SLURM_NTASKS" : "SLURM_NPROCS";
  MT_CHECK(env(ntasks_var), "SLURM_PROCID is set but SLURM_NTASKS is not");
  MT_CHECK(env("SLURM_LOCALID"), "SLURM_PROCID is set but SLURM_LOCALID is not");
  r.rank = env_int("SLURM_PROCID");
  r.world_size = env_int(ntasks_var);
  r.local_rank = env_int("SLURM_LOCALID");

  // Tasks on this node: the step's per-node list (exact, even when nodes differ), else the uniform count.
  const char* local_var = "SLURM_TASKS_PER_NODE";
  if (const char* tpn = env("SLURM_TASKS_PER_NODE")) {
    std::vector<int> per_node = parse_slurm_tasks_per_node(tpn);
    long total = std::accumulate(per_node.begin(), per_node.end(), 0L);
    MT_CHECK(total == r.world_size, "SLURM_TASKS_PER_NODE='{}' adds up to {} tasks but {}={}", tpn, total, ntasks_var,
             r.world_size);
    int node = 0;
    if (env("SLURM_NODEID")) {
      node = env_int("SLURM_NODEID");
      MT_CHECK(node >= 0 && node < int(per_node.size()), "SLURM_NODEID={} is outside 0..{} (SLURM_TASKS_PER_NODE='{}')",
               node, per_node.size() - 1, tpn);
    } else {
      for (int n : per_node)
        MT_CHECK(n == per_node[0], "SLURM_TASKS_PER_NODE='{}' differs between nodes and SLURM_NODEID is not set", tpn);
    }
    r.local_world_size = per_node[size_t(node)];
  } else if (env("SLURM_NTASKS_PER_NODE")) {
    r.local_world_size = env_int("SLURM_NTASKS_PER_NODE");
    local_var = "SLURM_NTASKS_PER_NODE";
  } else {
    MT_CHECK(!env("SLURM_NNODES") || env_int("SLURM_NNODES") == 1,
             "SLURM_NNODES={} but neither SLURM_TASKS_PER_NODE nor SLURM_NTASKS_PER_NODE says how many tasks run "
             "on each node",
             env("SLURM_NNODES"));
    r.local_world_size = r.world_size;
    local_var = "tasks on this node";
  }

  // Rank 0 runs on the first node of the step, so that is where its store listens. SLURM_LAUNCH_NODE_IPADDR is
  // the host srun ran on (possibly a login node), hence only the last resort. MASTER_* override both.
  r.master_addr = "127.0.0.1";
  const char* list_var = env("SLURM_STEP_NODELIST")  ? "SLURM_STEP_NODELIST"
                         : env("SLURM_JOB_NODELIST") ? "SLURM_JOB_NODELIST"
                                                     : "SLURM_NODELIST";
  if (const char* list = env(list_var))
    r.master_addr = slurm_first_host(list, list_var);
  else if (const char* ip = env("SLURM_LAUNCH_NODE_IPADDR"))
    r.master_addr = ip;
  read_master(r);
  validate(r, {"SLURM_PROCID", ntasks_var, "SLURM_LOCALID", local_var});
}

}  // namespace

std::vector<int> parse_slurm_tasks_per_node(const std::string& s, const std::string& var) {
  auto bad = [&](const std::string& why) { fail("{}='{}' is malformed: {} (expected e.g. '4(x2),3')", var, s, why); };
  std::vector<int> out;
  size_t i = 0;
  auto number = [&]() {
    size_t j = i;
    while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
    bool ok;
    int v = to_int(s.substr(i, j - i), ok);
    if (!ok || v < 1) bad(fmt::format("expected a positive count at position {}", i));
    i = j;
    return v;
  };
  for (;;) {
    int n = number(), times = 1;
    if (i < s.size() && s[i] == '(') {
      if (s.compare(i, 2, "(x") != 0) bad("expected '(x' after a count");
      i += 2;
      times = number();
      if (i >= s.size() || s[i] != ')') bad("missing ')'");
      ++i;
    }
    if (out.size() + size_t(times) > (1u << 20)) bad("too many nodes");
    out.insert(out.end(), size_t(times), n);
    if (i == s.size()) break;
    if (s[i] != ',') bad(fmt::format("unexpected '{}' at position {}", s[i], i));
    ++i;
  }
  return out;
}

std::string slurm_first_host(const std::string& list, const std::string& var) {
  auto bad = [&](const std::string& why) {
    fail("{}='{}' is malformed: {} (expected e.g. 'node[01-03],gpu7')", var, list, why);
  };
  // Brackets must pair up across the whole list, not only in its first entry.
  int depth = 0;
  size_t first_end = std::string::npos;
  for (size_t i = 0; i < list.size(); ++i) {
    char c = list[i];
    if (c == '[' && ++depth > 1) bad("nested '['");
    if (c == ']' && --depth < 0) bad("']' without '['");
    if (c == ',' && depth == 0 && first_end == std::string::npos) first_end = i;
  }
  if (depth != 0) bad("unclosed '['");
  std::string item = list.substr(0, first_end);
  if (item.empty()) bad("empty first host");

  // Each bracket group (there may be several: "rack[1-2]-n[01-04]") becomes the first value of its first range,
  // keeping the zero padding as written.
  std::string host;
  for (size_t i = 0; i < item.size(); ++i) {
    if (item[i] != '[') {
      host += item[i];
      continue;
    }
    size_t close = item.find(']', i);
    std::string ranges = item.substr(i + 1, close - i - 1);
    std::string first = ranges.substr(0, ranges.find_first_of(",-"));
    if (first.empty() || first.find_first_not_of("0123456789") != std::string::npos)
      bad(fmt::format("'[{}]' does not start with a number", ranges));
    host += first;
    i = close;
  }
  return host;
}

RankInfo rank_info_from_env() {
  RankInfo r;
  const char* store = env("MEGATRAIN_STORE");
  if (env("RANK") || env("WORLD_SIZE")) {
    from_torchrun(r);
    r.source = store ? "megatrain" : "torchrun";
  } else if (env("SLURM_PROCID")) {
    from_slurm(r);
    r.source = "slurm";
  } else {
    read_master(r);
    r.source = "single";
  }
  if (const char* prefix = env("MEGATRAIN_STORE_PREFIX")) r.store_prefix = prefix;
  if (store)
    r.store_url = store;
  else if (r.world_size > 1)
    r.store_url = fmt::format("tcp://{}:{}",
                              r.master_addr.find(':') != std::string::npos ? "[" + r.master_addr + "]" : r.master_addr,
                              r.master_port);
  return r;
}

}  // namespace mt
