#include "megatrain/train/peer_links.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "megatrain/core/error.h"

namespace mt {

int snapshot_buddy(int r, int world, int local) {
  const int step = (local > 0 && local < world) ? local : 1;
  return (r + step) % world;
}

std::unique_ptr<PeerLinks> make_peer_links(const RunConfig& cfg, Topology& topo) {
  const int world = topo.rank_info.world_size;
  if (world < 2 || cfg.ckpt.snapshot_every <= 0 || !cfg.ckpt.sharded || !topo.store) return nullptr;
  auto links = std::make_unique<PeerLinks>();
  const int r = topo.rank_info.rank, L = topo.rank_info.local_world_size;
  links->rank = r;
  links->buddy = snapshot_buddy(r, world, L);
  for (int p = 0; p < world; ++p)
    if (snapshot_buddy(p, world, L) == r) links->from = p;
  // The two edges in the global order (sender, receiver): see the header.
  std::pair<int, int> edges[2] = {{r, links->buddy}, {links->from, r}};
  std::sort(std::begin(edges), std::end(edges));
  for (auto [s, d] : edges) {
    std::vector<int> ranks = {std::min(s, d), std::max(s, d)};
    const std::string name = fmt::format("snap[{}>{}]", s, d);
    auto g = topo.host_groups ? topo.host_groups(*topo.store, GroupRole::Snapshot, name, ranks, r, topo.group_options)
                              : make_gloo_group(*topo.store, name, ranks, r, topo.group_options);
    (s == r ? links->out : links->in) = std::move(g);
  }
  return links;
}

namespace {

// Bytes as I32 elements for the groups (which move F32 and I32 tensors): the buffer is padded to a multiple of 4.
Tensor i32_bytes(void* p, size_t bytes) { return Tensor(p, {static_cast<int64_t>((bytes + 3) / 4)}, DType::I32); }

}  // namespace

void PeerLinks::exchange(ShardSnapshot& mine, ShardSnapshot& held) {
  // Three messages each way: the sizes, the header (JSON), the bytes. The receiver learns the sizes first so it
  // can lay out (once; the same sizes every time after) before the bulk arrives.
  const std::string header = mine.header().dump();
  int32_t sizes_out[2] = {static_cast<int32_t>(header.size()), 0};
  MT_CHECK(mine.bytes() % 4 == 0, "shard snapshot of {} bytes is not whole 4-byte words", mine.bytes());
  std::vector<char> hbuf(header.begin(), header.end());
  hbuf.resize((hbuf.size() + 3) / 4 * 4, ' ');
  const int to = out->rank() == 0 ? 1 : 0, src = in->rank() == 0 ? 1 : 0;
  // Large snapshots go in chunks (Gloo's pair messages are bounded; 256 MiB keeps them well inside).
  constexpr size_t kChunk = size_t{256} << 20;
  const size_t nchunks = (mine.bytes() + kChunk - 1) / kChunk;
  sizes_out[1] = static_cast<int32_t>(nchunks);
  std::vector<WorkPtr> sends;
  sends.push_back(out->send(Tensor(sizes_out, {2}, DType::I32), to, 0));
  sends.push_back(out->send(i32_bytes(hbuf.data(), hbuf.size()), to, 1));
  for (size_t c = 0; c < nchunks; ++c) {
    const size_t off = c * kChunk, n = std::min(kChunk, mine.bytes() - off);
    sends.push_back(out->send(i32_bytes(static_cast<char*>(mine.data()) + off, n), to, 2 + static_cast<int>(c)));
  }
  int32_t sizes_in[2] = {0, 0};
  in->recv(Tensor(sizes_in, {2}, DType::I32), src, 0)->wait();
  MT_CHECK(sizes_in[0] > 0 && sizes_in[1] >= 0, "a peer's shard snapshot announces {} header bytes", sizes_in[0]);
  std::vector<char> hin((static_cast<size_t>(sizes_in[0]) + 3) / 4 * 4);
  in->recv(i32_bytes(hin.data(), hin.size()), src, 1)->wait();
  held.receive_layout(nlohmann::json::parse(std::string(hin.data(), static_cast<size_t>(sizes_in[0]))));
  const size_t want = (held.bytes() + kChunk - 1) / kChunk;
  MT_CHECK(want == static_cast<size_t>(sizes_in[1]), "a peer's shard snapshot of {} bytes arrives in {} chunks, not {}",
           held.bytes(), sizes_in[1], want);
  std::vector<WorkPtr> recvs;
  for (size_t c = 0; c < want; ++c) {
    const size_t off = c * kChunk, n = std::min(kChunk, held.bytes() - off);
    recvs.push_back(in->recv(i32_bytes(static_cast<char*>(held.data()) + off, n), src, 2 + static_cast<int>(c)));
  }
  for (auto& w : recvs) w->wait();
  for (auto& w : sends) w->wait();
}

}  // namespace mt
