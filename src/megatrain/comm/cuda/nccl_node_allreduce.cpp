#include <cuda_runtime_api.h>
#include <nccl.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "megatrain/comm/node_gpu_allreduce.h"

namespace mt {
namespace {

// The first failure, said once: later steps are skipped once one failed.
struct Steps {
  std::string why;
  bool cuda(cudaError_t e, const char* what) {
    if (why.empty() && e != cudaSuccess) why = fmt::format("{}: {}", what, cudaGetErrorString(e));
    return why.empty();
  }
  bool nccl(ncclResult_t r, const char* what) {
    if (why.empty() && r != ncclSuccess) why = fmt::format("{}: {}", what, ncclGetErrorString(r));
    return why.empty();
  }
};

}  // namespace

NodeAllreduce node_gpu_allreduce(size_t bytes) {
  NodeAllreduce out;
  if (cudaGetDeviceCount(&out.gpus) != cudaSuccess) {
    cudaGetLastError();
    out.gpus = 0;
  }
  if (out.gpus < 2) {
    out.why = fmt::format("{} GPU(s) visible: nothing to all-reduce between", out.gpus);
    return out;
  }
  const int n = out.gpus;
  const size_t count = bytes / sizeof(float);
  Steps s;
  std::vector<ncclComm_t> comms(size_t(n), nullptr);
  std::vector<cudaStream_t> streams(size_t(n), nullptr);
  std::vector<float*> in(size_t(n), nullptr), res(size_t(n), nullptr);
  std::vector<int> devs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) devs[size_t(i)] = i;
  s.nccl(ncclCommInitAll(comms.data(), n, devs.data()), "ncclCommInitAll");
  for (int i = 0; i < n && s.why.empty(); ++i) {
    const std::vector<float> fill(count, float(i + 1));
    s.cuda(cudaSetDevice(i), "cudaSetDevice") && s.cuda(cudaStreamCreate(&streams[size_t(i)]), "cudaStreamCreate") &&
        s.cuda(cudaMalloc(&in[size_t(i)], count * sizeof(float)), "cudaMalloc") &&
        s.cuda(cudaMalloc(&res[size_t(i)], count * sizeof(float)), "cudaMalloc") &&
        s.cuda(cudaMemcpy(in[size_t(i)], fill.data(), count * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  auto all_reduce = [&] {
    if (!s.nccl(ncclGroupStart(), "ncclGroupStart")) return false;
    for (int i = 0; i < n; ++i)
      s.nccl(ncclAllReduce(in[size_t(i)], res[size_t(i)], count, ncclFloat, ncclSum, comms[size_t(i)],
                           streams[size_t(i)]),
             "ncclAllReduce");
    s.nccl(ncclGroupEnd(), "ncclGroupEnd");
    for (int i = 0; i < n; ++i)
      s.cuda(cudaSetDevice(i), "cudaSetDevice") && s.cuda(cudaStreamSynchronize(streams[size_t(i)]), "all-reduce");
    return s.why.empty();
  };
  std::vector<double> t;
  if (s.why.empty() && all_reduce() && all_reduce()) {  // two warm-ups
    out.exact = true;
    std::vector<float> got(count);
    const float want = float(n * (n + 1) / 2);
    for (int i = 0; i < n && out.exact; ++i) {
      s.cuda(cudaSetDevice(i), "cudaSetDevice") &&
          s.cuda(cudaMemcpy(got.data(), res[size_t(i)], count * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
      out.exact = s.why.empty() && std::all_of(got.begin(), got.end(), [&](float v) { return v == want; });
    }
    for (int k = 0; k < 5 && s.why.empty(); ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      if (all_reduce()) t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  for (int i = 0; i < n; ++i) {
    cudaSetDevice(i);
    if (in[size_t(i)]) cudaFree(in[size_t(i)]);
    if (res[size_t(i)]) cudaFree(res[size_t(i)]);
    if (streams[size_t(i)]) cudaStreamDestroy(streams[size_t(i)]);
    if (comms[size_t(i)]) ncclCommDestroy(comms[size_t(i)]);
  }
  if (!s.why.empty() || t.size() < 5) {
    out.why = s.why.empty() ? "the timed all-reduces did not finish" : s.why;
    return out;
  }
  std::sort(t.begin(), t.end());
  out.ran = true;
  out.busbw_gbps = 2.0 * (n - 1) / n * double(count * sizeof(float)) / t[2] / 1e9;
  return out;
}

}  // namespace mt
