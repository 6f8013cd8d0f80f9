#include "megatrain/comm/clock_offset.h"

#include <cstring>
#include <limits>

#include "megatrain/obs/timeline.h"

namespace mt {

namespace {

constexpr int kPingTag = 0x7c1000, kPongTag = 0x7c1001;

// Doubles travel as int32 pairs (the groups move f32 or i32; f32 would round a unix time to minutes).
struct Wire {
  int32_t w[4] = {0, 0, 0, 0};
  Tensor tensor() { return Tensor(w, {4}, DType::I32); }
  void put(int i, double v) { std::memcpy(&w[2 * i], &v, sizeof v); }
  double get(int i) const {
    double v;
    std::memcpy(&v, &w[2 * i], sizeof v);
    return v;
  }
};

// The leader's total offset sent to every member of g (only the leader's value matters).
ClockOffset from_leader(ProcessGroup& g, const ClockOffset& mine) {
  if (g.size() == 1) return mine;
  Wire w;
  w.put(0, mine.offset_s);
  w.put(1, mine.error_s);
  g.broadcast(w.tensor(), 0)->wait();
  return {w.get(0), w.get(1)};
}

}  // namespace

ClockOffset clock_offset_to_group_leader(ProcessGroup& g, int rounds) {
  if (g.size() == 1) return {};
  if (g.rank() == 0) {
    for (int member = 1; member < g.size(); ++member)
      for (int k = 0; k < rounds; ++k) {
        Wire ping;
        g.recv(ping.tensor(), member, kPingTag)->wait();
        Wire pong;
        pong.put(0, obs::trace_clock());
        g.send(pong.tensor(), member, kPongTag)->wait();
      }
    return {};
  }
  ClockOffset best{0, std::numeric_limits<double>::infinity()};
  for (int k = 0; k < rounds; ++k) {
    Wire ping, pong;
    const double t1 = obs::trace_clock();
    g.send(ping.tensor(), 0, kPingTag)->wait();
    g.recv(pong.tensor(), 0, kPongTag)->wait();
    const double t2 = obs::trace_clock();
    const double half_rtt = (t2 - t1) / 2;
    if (half_rtt < best.error_s) best = {pong.get(0) - (t1 + t2) / 2, half_rtt};
  }
  return best;
}

ClockOffset clock_offset_to_rank0(DeviceMesh& mesh, int rounds) {
  const ClockOffset tp = clock_offset_to_group_leader(mesh.tp(), rounds);
  const ClockOffset dp = clock_offset_to_group_leader(mesh.dp(), rounds);
  const ClockOffset pp = clock_offset_to_group_leader(mesh.pp(), rounds);
  const MeshCoord& c = mesh.coord();
  auto add = [](ClockOffset a, ClockOffset b) { return ClockOffset{a.offset_s + b.offset_s, a.error_s + b.error_s}; };
  // (0,0,t) reaches (0,0,0) through its tp leader.
  ClockOffset total = c.pp == 0 && c.dp == 0 ? tp : ClockOffset{};
  // (0,d,t) through its dp leader (0,0,t); the dp groups of other pp indices broadcast a value nobody uses.
  const ClockOffset dp_leader = from_leader(mesh.dp(), total);
  if (c.pp == 0 && c.dp != 0) total = add(dp, dp_leader);
  // (p,d,t) through its pp leader (0,d,t).
  const ClockOffset pp_leader = from_leader(mesh.pp(), total);
  if (c.pp != 0) total = add(pp, pp_leader);
  return total;
}

}  // namespace mt
