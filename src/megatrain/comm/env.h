// Where this process sits in the job, read from the launcher conventions of the ecosystem:
//   torchrun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//   Slurm:    SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE / SLURM_TASKS_PER_NODE,
//             SLURM_LAUNCH_NODE_IPADDR or the first host of SLURM_JOB_NODELIST
//   megatrain launch sets the torchrun variables plus MEGATRAIN_STORE (a store URL, see store.h).
// With none of them set, the process is rank 0 of a world of 1.
#pragma once
#include <string>
#include <vector>

namespace mt {

struct RankInfo {
  int rank = 0, world_size = 1;
  int local_rank = 0, local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string store_url;  // MEGATRAIN_STORE if set; else tcp://MASTER_ADDR:MASTER_PORT when world_size > 1
  std::string source;     // "megatrain", "torchrun", "slurm" or "single"
  // MEGATRAIN_STORE_PREFIX: the namespace of this job's keys in the store (a supervisor gives each attempt a fresh
  // one, so a restarted job never meets the keys of the attempt before it); "" = none.
  std::string store_prefix;
};

// Throws mt::Error naming the variable when one is malformed or inconsistent (RANK >= WORLD_SIZE, ...).
RankInfo rank_info_from_env();

// Slurm's compressed lists, exposed for tests. Both throw mt::Error naming `var` (the variable it came from).
// "4(x2),3" -> {4, 4, 3}   (SLURM_TASKS_PER_NODE: tasks on each node of the step, in node order)
std::vector<int> parse_slurm_tasks_per_node(const std::string& s, const std::string& var = "SLURM_TASKS_PER_NODE");
// "node[01-03,07],gpu7" -> "node01"   (SLURM_JOB_NODELIST: the host rank 0 runs on)
std::string slurm_first_host(const std::string& nodelist, const std::string& var = "SLURM_JOB_NODELIST");

}  // namespace mt
