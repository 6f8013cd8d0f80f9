// CudaOps construction, memory (alloc, host <-> device copies, convert), synchronisation, device-side error
// reporting, op timing, and make_cuda_ops() / cuda_available().
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <vector>

#include "megatrain/kernels/cuda/cublaslt_api.h"
#include "megatrain/kernels/gpu_identity.h"
#include "megatrain/kernels/cuda/cuda_args.h"
#include "megatrain/kernels/cuda/cuda_ops.h"
#include "megatrain/kernels/cuda/launch.h"

namespace mt {

using namespace cuda_args;
using cuda::check;

namespace cuda {
void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    fail_as(ErrorKind::Device, "{}: {} ({})", what, cudaGetErrorString(err), cudaGetErrorName(err));
}
}  // namespace cuda

namespace {
// 32 MiB of fp32 reduction scratch: LayerNorm dw/db partials for up to 1024 blocks x 2 x 4096 channels, fewer blocks
// for wider rows.
constexpr size_t kScratchBytes = 32u << 20;
}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error so later calls start clean
    return 0;
  }
  return n;
}

bool cuda_available() { return cuda_device_count() > 0; }

std::string resolve_cuda_attention(const std::string& attention) {
  if (attention == "auto") return CudnnAttention::available() ? "cudnn" : "flash";
  return attention;
}

std::string cuda_versions() {
  int runtime = 0, driver = 0;
  if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) runtime = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;  // 0: no driver on this machine
  auto cuda = [](int v) { return fmt::format("{}.{}", v / 1000, (v % 1000) / 10); };
  std::string lt_version;
  try {
    lt_version = fmt::format("cuBLASLt {} ({})", lt().GetVersion(), lt().path);
  } catch (const Error& e) {
    lt_version = fmt::format("cuBLASLt not loadable: {}", e.what());
  }
  return fmt::format("CUDA runtime {} (driver {}), {}, {}", cuda(runtime), driver > 0 ? cuda(driver) : "none",
                     lt_version, CudnnAttention::version());
}

std::string cuda_pci_bus_id(int device) {
  if (device < 0 || device >= cuda_device_count()) return "";
  char id[32] = {};
  if (cudaDeviceGetPCIBusId(id, sizeof id, device) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return id;
}

std::pair<double, double> cuda_host_link_gbps(int device, size_t bytes) {
  if (device < 0 || device >= cuda_device_count()) return {0, 0};
  check(cudaSetDevice(device), "cuda_host_link_gbps: cudaSetDevice");
  void *host = nullptr, *dev = nullptr;
  check(cudaMallocHost(&host, bytes), "cuda_host_link_gbps: cudaMallocHost");
  std::memset(host, 0x5a, bytes);  // first touch, so the timed copies move resident pages
  check(cudaMalloc(&dev, bytes), "cuda_host_link_gbps: cudaMalloc");
  cudaEvent_t a = nullptr, b = nullptr;
  check(cudaEventCreate(&a), "cuda_host_link_gbps: cudaEventCreate");
  check(cudaEventCreate(&b), "cuda_host_link_gbps: cudaEventCreate");
  auto gbps = [&](cudaMemcpyKind kind) {
    void* to = kind == cudaMemcpyHostToDevice ? dev : host;
    const void* from = kind == cudaMemcpyHostToDevice ? host : dev;
    check(cudaMemcpy(to, from, bytes, kind), "cuda_host_link_gbps: warm-up copy");
    std::vector<double> t;
    for (int i = 0; i < 5; ++i) {
      check(cudaEventRecord(a), "cuda_host_link_gbps: cudaEventRecord");
      check(cudaMemcpyAsync(to, from, bytes, kind), "cuda_host_link_gbps: cudaMemcpyAsync");
      check(cudaEventRecord(b), "cuda_host_link_gbps: cudaEventRecord");
      check(cudaEventSynchronize(b), "cuda_host_link_gbps: cudaEventSynchronize");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, a, b), "cuda_host_link_gbps: cudaEventElapsedTime");
      t.push_back(double(ms) / 1e3);
    }
    std::sort(t.begin(), t.end());
    return double(bytes) / t[2] / 1e9;
  };
  const std::pair<double, double> r = {gbps(cudaMemcpyHostToDevice), gbps(cudaMemcpyDeviceToHost)};
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaFree(dev);
  cudaFreeHost(host);
  return r;
}

std::unique_ptr<Ops> make_cuda_ops(int device, const CudaOptions& options) {
  // The options first: their errors do not depend on the machine.
  MT_CHECK(options.attention == "auto" || options.attention == "flash" || options.attention == "cudnn",
           "make_cuda_ops: attention must be \"auto\" (cuDNN where built with it, else flash), \"flash\" (our "
           "kernels) or \"cudnn\" (cuDNN's fused attention); got \"{}\"",
           options.attention);
  MT_CHECK(options.gemm_tuning == 0 || (options.gemm_tuning >= 2 && options.gemm_tuning <= 64),
           "make_cuda_ops: gemm_tuning must be 0 (cuBLASLt's heuristic choice) or the number of candidate algorithms "
           "to time, 2 to 64 (got {})",
           options.gemm_tuning);
  CudaOptions opt = options;
  opt.attention = resolve_cuda_attention(options.attention);
  MT_CHECK(opt.attention != "cudnn" || CudnnAttention::available(),
           "make_cuda_ops: attention = \"cudnn\" asked for, but this megatrain was built without cuDNN (CMake found "
           "no libcudnn next to the CUDA toolkit); use attention = \"flash\" or rebuild with cuDNN installed");
  // Deterministic mode relies on cuBLASLt's heuristic choice being fixed per shape; tuning picks by timings.
  MT_CHECK(!options.deterministic || options.gemm_tuning == 0,
           "make_cuda_ops: deterministic mode and gemm_tuning = {} cannot be combined: tuning chooses each GEMM's "
           "algorithm by timing it, so the choice (and its rounding) may differ between runs; set gemm_tuning = 0",
           options.gemm_tuning);
  MT_CHECK(cuda_available(), "make_cuda_ops: no CUDA device is visible (cudaGetDeviceCount found none)");
  if (device >= 0) {
    int n = 0;
    check(cudaGetDeviceCount(&n), "make_cuda_ops: cudaGetDeviceCount");
    MT_CHECK(device < n,
             "make_cuda_ops: GPU {} asked for but only {} visible (CUDA_VISIBLE_DEVICES={}); one process "
             "per GPU: at most {} local ranks on this host",
             device, n, std::getenv("CUDA_VISIBLE_DEVICES") ? std::getenv("CUDA_VISIBLE_DEVICES") : "unset", n);
    check(cudaSetDevice(device), "make_cuda_ops: cudaSetDevice");
  }
  auto ops = std::make_unique<CudaOps>();
  if (opt.attention == "cudnn") ops->use_cudnn_attention();  // a failure here destroys ops cleanly
  ops->set_gemm_tuning(opt.gemm_tuning);
  ops->set_deterministic(opt.deterministic);
  return ops;
}

std::string CudaOps::device_name() const {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device_), "CudaOps: cudaGetDeviceProperties");
  return prop.name;
}

void CudaOps::use_cudnn_attention() {
  if (!cudnn_attn_) cudnn_attn_ = std::make_unique<CudnnAttention>(stream_);
  cudnn_attn_->set_deterministic(deterministic_);
}

CudaOps::CudaOps() {
  check(cudaGetDevice(&device_), "CudaOps: cudaGetDevice");
  // Non-blocking: the legacy default stream (used by stray library calls) never serialises with our ops.
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "CudaOps: cudaStreamCreateWithFlags");
  gemm_ = std::make_unique<LtGemm>();
  check(cudaMalloc(&scratch_, kScratchBytes), "CudaOps: cudaMalloc(reduction scratch)");
  scratch_floats_ = kScratchBytes / sizeof(float);
  check(cudaMalloc(&partials_dev_, cuda::kMaxPartials * sizeof(double)), "CudaOps: cudaMalloc(partials)");
  check(cudaMallocHost(&partials_host_, cuda::kMaxPartials * sizeof(double)), "CudaOps: cudaMallocHost(partials)");
  check(cudaMallocHost(&err_host_, sizeof(int)), "CudaOps: cudaMallocHost(error word)");
  *err_host_ = 0;
  check(cudaMalloc(&err_dev_, sizeof(int)), "CudaOps: cudaMalloc(error word)");
  check(cudaMemsetAsync(err_dev_, 0, sizeof(int), stream_), "CudaOps: cudaMemsetAsync(error word)");
  check(cudaStreamSynchronize(stream_), "CudaOps: cudaStreamSynchronize");
}

CudaOps::~CudaOps() {
  // No throwing from a destructor: wait for the stream, then release, ignoring errors.
  if (stream_) cudaStreamSynchronize(stream_);
  cudnn_attn_.reset();  // before the stream it runs on goes
  if (attn_ws_) cudaFree(attn_ws_);
  if (emb_ws_) cudaFree(emb_ws_);
  for (auto& e : seg_tables_) cudaFree(e.dev);
  if (err_dev_) cudaFree(err_dev_);
  if (err_host_) cudaFreeHost(err_host_);
  if (partials_host_) cudaFreeHost(partials_host_);
  if (partials_dev_) cudaFree(partials_dev_);
  if (scratch_) cudaFree(scratch_);
  gemm_.reset();
  if (stream_) cudaStreamDestroy(stream_);
}

Buffer CudaOps::alloc(size_t bytes) {
  if (bytes == 0) return {};
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);  // 256-byte aligned
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    // Everything a run needs is allocated up front, so this happens while the model, the optimizer or the first
    // batch's activations are planned: say how far the plan got and what makes it smaller.
    fail_as(ErrorKind::Device,
            "out of device memory: this run asked for {:.2f} GB more with {:.2f} GB already allocated, and the GPU "
            "has {:.2f} GB free of {:.2f} GB. A run allocates everything up front: lower data.batch_size, set "
            "model.recompute_act / model.recompute_norm (cheap) or model.recompute (layers), or spread the model "
            "with parallel.tp / parallel.pp / parallel.dp (ZeRO shards the optimizer state); "
            "`bench_gpu_train --plan-memory` shows a single-GPU plan without a GPU",
            bytes / 1e9, allocated_ / 1e9, free_b / 1e9, total_b / 1e9);
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    fail_as(ErrorKind::Device, "alloc: cudaMalloc of {} bytes failed: {}", bytes, cudaGetErrorString(err));
  }
  Buffer buf(p, bytes, Device::CUDA, [](void* q) { cudaFree(q); });
  allocated_ += bytes;
  check(cudaMemsetAsync(p, 0, bytes, stream_), "alloc: cudaMemsetAsync");
  return buf;
}

void CudaOps::to_device(Tensor dst, const void* host) {
  auto scope = timed("to_device");
  MT_CHECK(dst.device == Device::CUDA, "to_device: dst must be a CUDA tensor");
  if (dst.numel() == 0) return;
  MT_CHECK(dst.defined() && host, "to_device: undefined tensor or null host pointer");
  check(cudaMemcpyAsync(dst.ptr, host, dst.nbytes(), cudaMemcpyHostToDevice, stream_), "to_device: cudaMemcpyAsync");
}

void CudaOps::to_host(void* host, Tensor src) {
  {
    auto scope = timed("to_host");
    MT_CHECK(src.device == Device::CUDA, "to_host: src must be a CUDA tensor");
    if (src.numel() == 0) return;
    MT_CHECK(src.defined() && host, "to_host: undefined tensor or null host pointer");
    check(cudaMemcpyAsync(host, src.ptr, src.nbytes(), cudaMemcpyDeviceToHost, stream_), "to_host: cudaMemcpyAsync");
  }
  sync_and_check();
}

void CudaOps::convert(Tensor dst, Tensor src) {
  const char* op = "convert";
  auto scope = timed(op);
  MT_CHECK(dst.device == Device::CUDA && src.device == Device::CUDA, "convert: tensors must be CUDA tensors");
  check_numel(dst, src.numel(), op, "dst");
  const int64_t n = src.numel();
  if (n == 0) return;
  MT_CHECK(dst.defined() && src.defined(), "convert: undefined tensor");
  if (dst.dtype == src.dtype) {
    if (dst.ptr != src.ptr)
      check(cudaMemcpyAsync(dst.ptr, src.ptr, src.nbytes(), cudaMemcpyDeviceToDevice, stream_),
            "convert: cudaMemcpyAsync");
  } else if (dst.dtype == DType::BF16 && src.dtype == DType::F32) {
    cuda::convert_f32_to_bf16(stream_, static_cast<cuda::bf16*>(dst.ptr), static_cast<const float*>(src.ptr), n);
  } else if (dst.dtype == DType::F32 && src.dtype == DType::BF16) {
    cuda::convert_bf16_to_f32(stream_, static_cast<float*>(dst.ptr), static_cast<const cuda::bf16*>(src.ptr), n);
  } else {
    fail("convert: {} to {} is not supported", dtype_name(src.dtype), dtype_name(dst.dtype));
  }
}

void CudaOps::synchronize() { sync_and_check(); }

// The error word lives in device memory (kernels atomicOr into it; atomics on mapped host memory are not atomic
// across PCIe) and rides along with every synchronisation as a 4-byte copy.
void CudaOps::sync_and_check() {
  check(cudaMemcpyAsync(err_host_, err_dev_, sizeof(int), cudaMemcpyDeviceToHost, stream_),
        "synchronize: cudaMemcpyAsync(error word)");
  check(cudaStreamSynchronize(stream_), "synchronize: cudaStreamSynchronize");
  const int err = *err_host_;
  if (err == 0) return;
  *err_host_ = 0;  // reported once
  check(cudaMemsetAsync(err_dev_, 0, sizeof(int), stream_), "synchronize: cudaMemsetAsync(error word)");
  std::string what;
  if (err & cuda::kErrCeTarget) what += " cross_entropy: a target is outside the vocabulary [0, V);";
  if (err & cuda::kErrToken) what += " embedding_forward/backward: a token is outside the embedding table;";
  if (err & cuda::kErrVpTarget) what += " vp_ce_sums: a target is outside the vocabulary [0, V);";
  fail("a CUDA op found bad data (reported at the next synchronisation):{}", what);
}

double CudaOps::sum_partials(int count) {
  if (count <= 0) return 0.0;
  check(cudaMemcpyAsync(partials_host_, partials_dev_, count * sizeof(double), cudaMemcpyDeviceToHost, stream_),
        "sum_partials: cudaMemcpyAsync");
  sync_and_check();
  double s = 0;
  for (int i = 0; i < count; ++i) s += partials_host_[i];
  return s;
}

void CudaOps::set_op_timing(bool on) { timer_.set_enabled(on); }

std::vector<OpTiming> CudaOps::take_op_timings() { return timer_.take(); }

}  // namespace mt
