// An all-reduce across every GPU this process sees, for `megatrain diagnose` on a node with two or more (MegaScale
// §4.3: the intra-node links are checked as the inter-node ones are). One process drives them all through NCCL,
// one communicator per GPU (ncclCommInitAll), so no launcher is needed and nothing is shared with a training job.
//
// Each GPU sums a buffer of `bytes` floats equal to its index + 1 out of place: every element of every result must
// be n(n+1)/2 exactly (small integers are exact in fp32 whatever NCCL's reduction order), so a wrong bit on a link
// or in a reduction shows. The bus bandwidth is NCCL-tests' convention, 2(n-1)/n x bytes / time, the median of five
// timed all-reduces after two warm-ups, so it compares across GPU counts.
#pragma once
#include <cstddef>
#include <string>

namespace mt {

struct NodeAllreduce {
  int gpus = 0;      // the GPUs this process sees
  bool ran = false;  // false: fewer than two GPUs, no NCCL, or a failure (why)
  double busbw_gbps = 0;
  bool exact = false;
  std::string why;  // when !ran
};

NodeAllreduce node_gpu_allreduce(size_t bytes = size_t(256) << 20);

}  // namespace mt
