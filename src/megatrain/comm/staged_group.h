// A device-plane process group that stages device tensors through host memory over a host group (Gloo): what lets
// several ranks share one GPU, where NCCL refuses two ranks on one device ("Duplicate GPU detected"), as PyTorch's
// gloo backend does with CUDA tensors. It has ProcessGroup's interface, so the trainer cannot tell it from the NCCL
// group, and a multi-GPU layout can be run and debugged on a one-GPU workstation.
//
// Ordering: the NCCL group's contract (comm/cuda/nccl_group.h), kept:
//  * An op sees all compute issued before it and nothing issued after: at issue the group marks the compute stream
//    (StagingDevice::mark), and the op's copy to the host waits for that mark.
//  * Collectives execute in issue order on the group's staging thread: wait for the mark, copy the inputs to host
//    buffers, run the host group's collective, copy the result to the device. Point-to-point ops are not queued
//    behind collectives nor behind each other (a receive posted early must not hold up a later send: pipeline
//    stages post receives in both directions early): each runs on a thread of its own. A receive copies into its
//    tensor only after compute passed its mark, so compute issued before it may still read the old contents.
//  * Work::wait() returns once the result is on the device (the copy completed), so compute issued after wait()
//    sees it. Unlike the NCCL group's, it blocks the host until then: staged transfers are host work anyway.
//  * A tensor handed to an op must not be written by compute until wait() (nor read, for an op's output), as with
//    NCCL.
// Dtypes: the host group moves F32 and I32. The device copies F32 and BF16 tensors to host F32 (exact) and back
// (BF16 rounded once, to nearest even), I32 as I32: a BF16 reduction is summed in F32 and rounded once where NCCL
// rounds at every step, which is within bf16's tolerance and no worse.
//
// The device side is an interface, so the group's ordering and copies are tested with the CPU standing in for the
// device (tests/comm_staged_group_test.cpp); the CUDA one is comm/cuda/staged_cuda.h.
#pragma once
#include <cstddef>
#include <memory>

#include "megatrain/comm/process_group.h"

namespace mt {

// What the staged group needs of the device. Every call may come from any of the group's threads.
class StagingDevice {
 public:
  using Mark = std::shared_ptr<void>;
  virtual ~StagingDevice() = default;
  // A mark on the compute stream after everything issued to it so far (called on the issuing thread).
  virtual Mark mark() = 0;
  // Blocks the calling thread until compute has passed `m`.
  virtual void wait(const Mark& m) = 0;
  // Copies a device tensor to host memory and back, blocking the calling thread until the copy completed. F32 and
  // BF16 tensors are numel floats on the host, I32 tensors numel int32s.
  virtual void to_host(void* host, const Tensor& src) = 0;
  virtual void to_device(const Tensor& dst, const void* host) = 0;
  // Host memory for the copies (the CUDA device gives pinned memory, which copies at full speed); at least `bytes`.
  virtual std::shared_ptr<void> host_buffer(size_t bytes);
};

// Wraps `host` (a group over host memory: make_gloo_group) so that its ops take device tensors. `device` must
// outlive the group. The group's threads are joined when it is destroyed, after its queued ops ran.
std::unique_ptr<ProcessGroup> make_staged_group(std::unique_ptr<ProcessGroup> host,
                                                std::shared_ptr<StagingDevice> device);

}  // namespace mt
