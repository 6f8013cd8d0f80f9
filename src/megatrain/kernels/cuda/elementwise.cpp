// Memory and elementwise ops on F32 or BF16 tensors (every tensor of one call has the same dtype).
#include <cstring>

#include "megatrain/core/bits_hash.h"
#include "megatrain/kernels/cuda/cuda_args.h"
#include "megatrain/kernels/cuda/cuda_ops.h"
#include "megatrain/kernels/cuda/launch.h"

namespace mt {

using namespace cuda_args;
using cuda::check;

namespace {

void same_dtype(const Tensor& a, const Tensor& b, const char* op, const char* na, const char* nb) {
  MT_CHECK(a.dtype == b.dtype, "{}: {} and {} differ in dtype ({} vs {})", op, na, nb, dtype_name(a.dtype),
           dtype_name(b.dtype));
}

}  // namespace

void CudaOps::zero(Tensor t) {
  auto scope = timed("zero");
  MT_CHECK(t.device == Device::CUDA, "zero: tensor must be a CUDA tensor");
  if (t.numel() == 0) return;
  MT_CHECK(t.defined(), "zero: tensor {} is undefined", t.shape_str());
  check(cudaMemsetAsync(t.ptr, 0, t.nbytes(), stream_), "zero: cudaMemsetAsync");
}

void CudaOps::copy(Tensor dst, Tensor src) {
  auto scope = timed("copy");
  MT_CHECK(dst.device == Device::CUDA && src.device == Device::CUDA, "copy: tensors must be CUDA tensors");
  same_dtype(dst, src, "copy", "dst", "src");
  check_numel(dst, src.numel(), "copy", "dst");
  if (src.numel() == 0) return;
  MT_CHECK(dst.defined() && src.defined(), "copy: undefined tensor");
  if (dst.ptr != src.ptr)
    check(cudaMemcpyAsync(dst.ptr, src.ptr, src.nbytes(), cudaMemcpyDeviceToDevice, stream_), "copy: cudaMemcpyAsync");
}

void CudaOps::add(Tensor out, Tensor a, Tensor b) {
  const char* op = "add";
  auto scope = timed(op);
  const bool bf = float_like(out, op, "out");
  float_like(a, op, "a");
  float_like(b, op, "b");
  same_dtype(out, a, op, "out", "a");
  same_dtype(out, b, op, "out", "b");
  const int64_t n = out.numel();
  check_numel(a, n, op, "a");
  check_numel(b, n, op, "b");
  cuda::add(stream_, bf, out.ptr, a.ptr, b.ptr, n);
}

void CudaOps::axpy(Tensor dst, Tensor src, float alpha) {
  const char* op = "axpy";
  auto scope = timed(op);
  const bool bf = float_like(dst, op, "dst");
  float_like(src, op, "src");
  same_dtype(dst, src, op, "dst", "src");
  check_numel(src, dst.numel(), op, "src");
  cuda::axpy(stream_, bf, dst.ptr, src.ptr, alpha, dst.numel());
}

void CudaOps::scale(Tensor t, float s) {
  auto scope = timed("scale");
  const bool bf = float_like(t, "scale", "t");
  cuda::scale(stream_, bf, t.ptr, s, t.numel());
}

double CudaOps::sum_squares(Tensor t) {
  int blocks = 0;
  {
    auto scope = timed("sum_squares");
    const bool bf = float_like(t, "sum_squares", "t");
    blocks = cuda::sum_squares_partials(stream_, bf, t.ptr, t.numel(), partials_dev_);
  }
  return sum_partials(blocks);
}

uint64_t CudaOps::bits_hash(Tensor t) {
  MT_CHECK(t.dtype == DType::F32 || t.dtype == DType::I32, "bits_hash: F32 or I32, not {}", dtype_name(t.dtype));
  auto scope = timed("bits_hash");
  auto* partials = reinterpret_cast<unsigned long long*>(partials_dev_);  // 8-byte slots, as the doubles'
  const int blocks = cuda::bits_hash_partials(stream_, static_cast<const uint32_t*>(t.ptr), t.numel(), partials);
  uint64_t sum = 0;
  if (blocks > 0) {
    cuda::check(cudaMemcpyAsync(partials_host_, partials, blocks * sizeof(unsigned long long), cudaMemcpyDeviceToHost,
                                stream_),
                "bits_hash: cudaMemcpyAsync");
    sync_and_check();
    for (int i = 0; i < blocks; ++i) {
      uint64_t v;
      std::memcpy(&v, &partials_host_[i], sizeof v);
      sum += v;
    }
  }
  return bits_hash_finish(sum, static_cast<uint64_t>(t.numel()));
}

}  // namespace mt
