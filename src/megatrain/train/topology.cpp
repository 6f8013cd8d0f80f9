#include "megatrain/train/topology.h"

#include <fmt/format.h>
#include <omp.h>

#include "megatrain/comm/local_address.h"
#include "megatrain/core/error.h"
#include "megatrain/train/config_agreement.h"
#include "megatrain/train/device_plane.h"
#include "megatrain/train/gpu_groups.h"

namespace mt {

std::unique_ptr<ProcessGroup> Topology::make_device_group(GroupRole role, const std::string& name,
                                                          const std::vector<int>& ranks) {
  return device_groups ? device_groups(*store, role, "device/" + name, ranks, rank_info.rank, group_options)
                       : make_gloo_group(*store, name, ranks, rank_info.rank, group_options);
}

Topology build_topology(const RunConfig& cfg, const TrainSeams& seams) {
  Topology t;
  if (cfg.train.threads > 0) omp_set_num_threads(cfg.train.threads);
  t.rank_info = with_kind(ErrorKind::Config, [] { return rank_info_from_env(); });
  const RankInfo& ri = t.rank_info;
  t.shape = MeshShape{cfg.parallel.dp, cfg.parallel.pp, cfg.parallel.tp, cfg.parallel.ep};
  with_kind(ErrorKind::Config, [&] { check_mesh(t.shape, ri.world_size); });
  t.main_rank = ri.rank == 0;
  const bool gpu = cfg.train.device == Device::CUDA;
  DevicePlaneDecision plane;  // (one rank: no device plane, the current GPU)
  if (gpu && !seams.make_ops && ri.world_size > 1)
    plane = decide_device_plane(cfg.parallel.device_plane, ri.local_rank, ri.local_world_size, cuda_device_count());
  t.ops = seams.make_ops ? seams.make_ops()
          : gpu          ? make_cuda_ops(ri.world_size > 1 ? plane.gpu : -1,
                                CudaOptions{kind_name(cfg.train.attention), cfg.train.gemm_tuning,
                                            cfg.train.deterministic})
                : make_cpu_ops();
  if (ri.world_size == 1) return t;

  t.group_options.timeout = Millis(1000LL * cfg.parallel.timeout_s);
  // Multi-node: the interface that reaches the other nodes (local_address.h); one line per node says which.
  const LocalAddress local = with_kind(ErrorKind::Config, [&] { return choose_local_address(ri); });
  t.group_options.iface = local.address;
  if (ri.local_rank == 0 && ri.local_world_size < ri.world_size)
    fmt::print("comm: rank {} and its node use {} ({}): {}\n", ri.rank, local.address, local.iface, local.reason);
  t.store = open_store(ri.store_url, t.group_options.timeout);
  if (!ri.store_prefix.empty()) t.store = prefixed_store(std::move(t.store), ri.store_prefix);
  agree_on_config(*t.store, ri.rank, ri.world_size, cfg.effective, t.group_options.timeout);
  t.host_mesh = std::make_unique<DeviceMesh>(*t.store, t.shape, ri.rank, t.group_options, seams.host_groups);
  t.host_groups = seams.host_groups;
  t.coord = t.host_mesh->coord();
  if (gpu && !seams.device_groups) {
    // A group's members must take one backend: any rank's staged is the job's (its GPU stays what it decided).
    float staged = plane.staged ? 1.0f : 0.0f;
    allreduce_all(*t.host_mesh, Tensor(&staged, {1}));
    if (staged > 0 && !plane.staged)
      plane.why = "staged through host memory over Gloo: another node's ranks share a GPU";
    plane.staged = staged > 0;
    if (t.main_rank) fmt::print("device plane: {}\n", plane.why);
  }
  t.device_groups = seams.device_groups ? seams.device_groups
                    : !gpu              ? GroupFactory{}
                    : plane.staged      ? gpu_staged_mesh_groups(*t.ops)
                                        : gpu_mesh_groups(*t.ops);
  if (t.device_groups)
    t.own_device_mesh = std::make_unique<DeviceMesh>(*t.store, t.shape, ri.rank, t.group_options, t.device_groups,
                                                     "device/");
  t.device_mesh = t.own_device_mesh ? t.own_device_mesh.get() : t.host_mesh.get();
  if (t.main_rank)
    fmt::print("mesh dp={} pp={} tp={} over {} ranks ready in {:.2f} s{}\n", t.shape.dp, t.shape.pp, t.shape.tp,
               ri.world_size, t.host_mesh->init_seconds(),
               t.own_device_mesh
                   ? fmt::format(" (host mesh), {:.2f} s (device mesh)", t.own_device_mesh->init_seconds())
                   : "");
  return t;
}

}  // namespace mt
