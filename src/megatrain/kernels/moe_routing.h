// The device side of a mixture-of-experts routing: the index and gate arrays the MoE ops' kernels read, copied from
// the host routing once per batch into buffers planned up front.
//
// Why the routing stays on the host: it is a top-k over N x E router logits (E is 8 to 256), a few hundred KB that
// the copy down costs microseconds for, and the grouped GEMMs need the expert offsets on the host anyway to size
// their launches. So the layer copies the logits down, routes with moe_route (kernels/cpu/moe.h, the reference), and
// uploads the result here; nothing of the routing is computed twice or in two ways.
#pragma once
#include <cstdint>

#include "megatrain/core/buffer.h"
#include "megatrain/kernels/ops.h"

namespace mt {

class MoeRoutingBuffers {
 public:
  // Room for the routing of up to max_tokens tokens with top-k on ops.device() (nothing on the CPU backend, whose
  // ops read the host routing).
  void allocate(Ops& ops, int64_t max_tokens, int k);
  // r's row, token and gate arrays on ops.device() (Ops::to_device: in stream order, and the host vectors may change
  // once it returns), as the view the MoE ops take. On the CPU backend the view is of r's own vectors, no copy.
  // r must outlive the view's uses. Throws when r has more tokens or a larger k than allocate() planned for.
  MoeDeviceRouting upload(Ops& ops, const MoeRouting& r) const;

 private:
  Buffer row_, token_, gate_;
  int64_t max_assignments_ = 0;
};

}  // namespace mt
