// The CUDA backend against the CPU backend (the fp32 reference) on the same bf16-rounded inputs: every op but
// attention (tested with the flash attention kernels), forward and backward, with shapes that exercise the
// vectorised paths and their tails (widths that are not multiples of 8, N = 1, unaligned views), padded vocabularies,
// ignored targets, and the accumulate-vs-overwrite contract of ops.h. Skipped without a GPU.
//
// Tolerances. bf16 keeps 8 significant bits: one rounding is at most half an ulp, 2^-9 of the binade's top and
// just under 2^-8 ~ 3.9e-3 relative to a value just above a power of two. An op whose bf16 output is computed in
// fp32 from the same inputs and rounded once is checked at rtol kOneRounding = 5e-3 (one rounding, with room for
// fp32 differences in the device's exp/sqrt and summation order; a CPU emulation of the kernels reached 0.97 of
// 4e-3), ops that round twice (a bf16 accumulator plus a rounded
// update) or through a GEMM at 8e-3 to 1e-2; an absolute floor, scaled to the output's largest magnitude, covers
// elements that cancel to near zero (where relative error is meaningless). fp32 outputs from bf16 inputs (dw, db,
// losses, norm statistics) differ from the CPU only by summation order: 1e-4 to 1e-3 relative. Optimizer steps are
// fp32 throughout: 1e-5 relative.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "support/device_tensors.h"
#include "support/kernels_testutil.h"
#include "megatrain/core/bf16.h"
#include "megatrain/core/buffer.h"
#include "megatrain/kernels/cuda/cuda_ops.h"
#include "megatrain/core/bits_hash.h"
#include "megatrain/kernels/ops.h"
#include "support/test_util.h"

namespace mt {
constexpr double kOneRounding = 5e-3;  // see the top of the file

namespace {

using test::close;
using test::randn;
using test::tf;
using test::ti;
using test::to_d;
using test::VecD;
using test::VecF;

double max_abs(const VecF& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::abs(x)));
  return m;
}


class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
    gpu_ = make_cuda_ops(-1, CudaOptions{"flash"});  // attention here is our flash kernels (cuDNN's has its own test)
    cpu_ = make_cpu_ops();
    mem_ = std::make_unique<test::DeviceTensors>(*gpu_);
  }

  // Device tensors (support/device_tensors.h): a tensor of dtype dt holding v (for BF16, v is first rounded in place
  // so the CPU oracle sees the same numbers); `offset_bytes` places it off the allocation's 256-byte alignment.
  Tensor dev(VecF& v, std::initializer_list<int64_t> shape, DType dt = DType::BF16, size_t offset_bytes = 0) {
    return mem_->upload(v, shape, dt, offset_bytes);
  }
  Tensor dev_f32(VecF& v, std::initializer_list<int64_t> shape) { return dev(v, shape, DType::F32); }
  Tensor dev_i32(std::vector<int32_t>& v, std::initializer_list<int64_t> shape) { return mem_->upload_i32(v, shape); }
  Tensor zeros(std::initializer_list<int64_t> shape, DType dt = DType::BF16) { return mem_->zeros(shape, dt); }
  VecF host(const Tensor& t) { return mem_->host(t); }
  // Checks got against want with rtol and an absolute floor of atol_frac * max|want|.
  static ::testing::AssertionResult near(const VecF& got, const VecF& want, double rtol, double atol_frac) {
    return close(got, to_d(want), rtol, atol_frac * max_abs(want) + 1e-30);
  }

  std::unique_ptr<Ops> gpu_, cpu_;
  std::unique_ptr<test::DeviceTensors> mem_;
};

// ---- memory ---------------------------------------------------------------------------------------------------

TEST_F(CudaOpsTest, BasicsAndAllocIsZeroed) {
  EXPECT_EQ(gpu_->device(), Device::CUDA);
  EXPECT_EQ(gpu_->compute_dtype(), DType::BF16);
  Buffer b = gpu_->alloc(4096 + 3);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 256, 0u);
  VecF got(1024);
  gpu_->to_host(got.data(), b.view({1024}, DType::F32));
  for (float x : got) ASSERT_EQ(x, 0.0f);
}

// More than the device holds: a Device error (exit 23) that says how far the plan got and what makes it smaller,
// not a bare cudaMalloc message; the backend stays usable afterwards.
TEST_F(CudaOpsTest, AllocBeyondTheDeviceIsAnErrorThatSaysWhatToChange) {
  try {
    gpu_->alloc(size_t{1} << 50);  // 1 PiB
    FAIL() << "allocated a petabyte";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind, ErrorKind::Device);
    const std::string w = e.what();
    EXPECT_NE(w.find("out of device memory"), std::string::npos) << w;
    EXPECT_NE(w.find("data.batch_size"), std::string::npos) << w;
    EXPECT_NE(w.find("model.recompute_norm"), std::string::npos) << w;
  }
  Buffer b = gpu_->alloc(1024);
  EXPECT_TRUE(b.data());
}

TEST_F(CudaOpsTest, ConvertRoundTripIsBitExact) {
  // Normal values, halfway cases (round to even), denormals, signed zeros, infinities and NaNs.
  VecF v = randn(1000 + 5, 1, 3.0f);
  const uint32_t specials[] = {0x3f808000u, 0x3f818000u, 0x00000001u, 0x80000000u, 0x7f800000u,
                               0xff800000u, 0x7fc00001u, 0x7f800001u, 0x7f7fffffu, 0x0080ffffu};
  for (uint32_t u : specials) {
    float f;
    std::memcpy(&f, &u, 4);
    v.push_back(f);
  }
  const int64_t n = static_cast<int64_t>(v.size());
  Tensor src = zeros({n}, DType::F32);
  gpu_->to_device(src, v.data());
  Tensor b16 = zeros({n}, DType::BF16);
  Tensor back = zeros({n}, DType::F32);
  gpu_->convert(b16, src);
  gpu_->convert(back, b16);
  std::vector<uint16_t> bits(v.size());
  gpu_->to_host(bits.data(), b16);
  std::vector<uint32_t> back_bits(v.size());
  gpu_->to_host(back_bits.data(), back);
  for (size_t i = 0; i < v.size(); ++i) {
    ASSERT_EQ(bits[i], float_to_bf16(v[i])) << "element " << i;
    const float f = bf16_to_float(bits[i]);
    uint32_t fb;
    std::memcpy(&fb, &f, 4);
    ASSERT_EQ(back_bits[i], fb) << "element " << i;
  }
}

TEST_F(CudaOpsTest, ZeroAndCopy) {
  VecF v = randn(1003, 2);
  Tensor a = dev(v, {1003});
  Tensor b = zeros({1003});
  gpu_->copy(b, a);
  EXPECT_EQ(host(b), v);
  gpu_->zero(a);
  for (float x : host(a)) ASSERT_EQ(x, 0.0f);
}

// ---- elementwise ----------------------------------------------------------------------------------------------

TEST_F(CudaOpsTest, AddAxpyScaleF32AndBf16WithTails) {
  for (DType dt : {DType::F32, DType::BF16}) {
    for (size_t offset : {size_t{0}, dtype_size(dt)}) {  // aligned (vector path) and shifted by one element
      SCOPED_TRACE(std::string(dtype_name(dt)) + (offset ? " unaligned" : " aligned"));
      const int64_t n = 1003;
      VecF x = randn(n, 3), y = randn(n, 4);
      Tensor gx = dev(x, {n}, dt, offset), gy = dev(y, {n}, dt, offset);
      Tensor go = dev(x, {n}, dt, offset);  // out starts as a copy of x
      // bf16 results round once; fp32 results differ by nothing (same operations) or an fma contraction.
      const double rtol = dt == DType::BF16 ? kOneRounding : 1e-6;
      VecF want(n);
      for (int64_t i = 0; i < n; ++i) want[i] = x[i] + y[i];
      gpu_->add(go, gx, gy);
      EXPECT_TRUE(near(host(go), want, rtol, 1e-6));
      gpu_->add(gx, gx, gy);  // out aliases a
      EXPECT_TRUE(near(host(gx), want, rtol, 1e-6));
      VecF d = host(gx);
      for (int64_t i = 0; i < n; ++i) want[i] = d[i] + 0.5f * y[i];
      gpu_->axpy(gx, gy, 0.5f);
      EXPECT_TRUE(near(host(gx), want, rtol, 1e-6));
      d = host(gx);
      for (int64_t i = 0; i < n; ++i) want[i] = d[i] * -3.0f;
      gpu_->scale(gx, -3.0f);
      EXPECT_TRUE(near(host(gx), want, rtol, 1e-6));
    }
  }
}

TEST_F(CudaOpsTest, SumSquaresMatchesDoubleSum) {
  for (DType dt : {DType::F32, DType::BF16}) {
    for (int64_t n : {int64_t{1}, int64_t{1003}, int64_t{3000017}}) {
      VecF x = randn(n, 5);
      Tensor g = dev(x, {n}, dt);  // rounds x for BF16
      const double want = cpu_->sum_squares(tf(x, {n}));
      EXPECT_NEAR(gpu_->sum_squares(g), want, 1e-9 * want) << dtype_name(dt) << " n=" << n;
    }
  }
}

// The silent-data-corruption check's hash where the tensor lives (core/bits_hash.h): the device's block sums give
// the host loop's bits exactly, at sizes below one block, across many blocks and past the partials' cap; one
// flipped bit changes it.
TEST_F(CudaOpsTest, BitsHashOnTheDeviceIsTheHostsBitForBit) {
  for (int64_t n : {int64_t{1}, int64_t{1003}, int64_t{3000017}, int64_t{40000001}}) {
    VecF x = randn(n, 11);
    Tensor g = dev(x, {n}, DType::F32);
    const uint64_t want = bits_hash(x.data(), size_t(n));
    EXPECT_EQ(gpu_->bits_hash(g), want) << "n=" << n;
    EXPECT_EQ(cpu_->bits_hash(tf(x, {n})), want) << "n=" << n;
    x[size_t(n / 2)] = -x[size_t(n / 2)];  // the sign bit of one element
    EXPECT_NE(gpu_->bits_hash(dev(x, {n}, DType::F32)), want) << "n=" << n;
  }
}

// ---- activations ----------------------------------------------------------------------------------------------

TEST_F(CudaOpsTest, GeluForwardBackward) {
  for (size_t offset : {size_t{0}, size_t{2}}) {
    const int64_t n = 1003;
    VecF x = randn(n, 6, 2.0f), dy = randn(n, 7);
    Tensor gx = dev(x, {n}, DType::BF16, offset), gdy = dev(dy, {n}, DType::BF16, offset);
    Tensor go = zeros({n});
    VecF want(n), wantd(n);
    cpu_->gelu_forward(tf(want, {n}), tf(x, {n}));
    gpu_->gelu_forward(go, gx);
    EXPECT_TRUE(near(host(go), want, kOneRounding, 1e-4));
    cpu_->gelu_backward(tf(wantd, {n}), tf(x, {n}), tf(dy, {n}));
    gpu_->gelu_backward(gdy, gx, gdy);  // dinp aliases dout, as ops.h allows
    EXPECT_TRUE(near(host(gdy), wantd, kOneRounding, 1e-4));
  }
}

TEST_F(CudaOpsTest, SwigluForwardBackward) {
  for (int64_t F : {int64_t{24}, int64_t{13}}) {  // vector path and scalar tails
    for (int64_t N : {int64_t{1}, int64_t{5}}) {
      SCOPED_TRACE("N=" + std::to_string(N) + " F=" + std::to_string(F));
      VecF x = randn(N * 2 * F, 8, 2.0f), dy = randn(N * F, 9);
      Tensor gx = dev(x, {N, 2 * F}), gdy = dev(dy, {N, F});
      Tensor go = zeros({N, F}), gdx = zeros({N, 2 * F});
      VecF want(N * F), wantd(N * 2 * F);
      cpu_->swiglu_forward(tf(want, {N, F}), tf(x, {N, 2 * F}));
      cpu_->swiglu_backward(tf(wantd, {N, 2 * F}), tf(x, {N, 2 * F}), tf(dy, {N, F}));
      gpu_->swiglu_forward(go, gx);
      gpu_->swiglu_backward(gdx, gx, gdy);
      EXPECT_TRUE(near(host(go), want, kOneRounding, 1e-4));
      EXPECT_TRUE(near(host(gdx), wantd, kOneRounding, 1e-4));
    }
  }
}

// ---- linear ---------------------------------------------------------------------------------------------------

struct GemmShape {
  int64_t N, C, OC;
};
// The bias gradient's column sums over OC: 60, 96, 24 and 2056 take the vector path (2056: three column tiles, 300
// rows: ten row blocks), 13 the scalar one.
const GemmShape kGemmShapes[] = {{37, 100, 60}, {64, 128, 96}, {1, 64, 24}, {5, 40, 13}, {300, 64, 2056}};

TEST_F(CudaOpsTest, MatmulForwardWithAndWithoutBias) {
  for (const auto& [N, C, OC] : kGemmShapes) {
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C) + " OC=" + std::to_string(OC) +
                   (with_bias ? " bias" : ""));
      VecF x = randn(N * C, 10), w = randn(OC * C, 11, 0.1f), b = randn(OC, 12);
      Tensor gx = dev(x, {N, C}), gw = dev(w, {OC, C}), gb = dev(b, {OC});
      Tensor go = zeros({N, OC});
      VecF want(N * OC);
      cpu_->matmul_forward(tf(want, {N, OC}), tf(x, {N, C}), tf(w, {OC, C}), with_bias ? tf(b, {OC}) : Tensor{});
      gpu_->matmul_forward(go, gx, gw, with_bias ? gb : Tensor{});
      EXPECT_TRUE(near(host(go), want, 8e-3, 2e-3));
    }
  }
}

// The residual read as the GEMM's C matrix (fused) against the CPU's GEMM then add, into a separate output and in
// place, with and without a bias; OC = 13 (a leading dimension cuBLASLt may refuse) exercises whichever path runs.
TEST_F(CudaOpsTest, MatmulForwardAddJoinsTheResidual) {
  for (const auto& [N, C, OC] : kGemmShapes) {
    for (int variant = 0; variant < 4; ++variant) {
      const bool with_bias = variant & 1, in_place = variant & 2;
      SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C) + " OC=" + std::to_string(OC) +
                   (with_bias ? " bias" : "") + (in_place ? " in place" : ""));
      VecF x = randn(N * C, 30), w = randn(OC * C, 31, 0.1f), b = randn(OC, 32), r = randn(N * OC, 33);
      Tensor gx = dev(x, {N, C}), gw = dev(w, {OC, C}), gb = dev(b, {OC}), gr = dev(r, {N, OC});
      Tensor go = in_place ? gr : zeros({N, OC}), gt = zeros({N, OC});
      VecF want(N * OC), tmp(N * OC);
      cpu_->matmul_forward_add(tf(want, {N, OC}), tf(x, {N, C}), tf(w, {OC, C}), with_bias ? tf(b, {OC}) : Tensor{},
                               tf(r, {N, OC}), tf(tmp, {N, OC}));
      gpu_->matmul_forward_add(go, gx, gw, with_bias ? gb : Tensor{}, gr, gt);
      EXPECT_TRUE(near(host(go), want, 1e-2, 2e-3));
      if (!in_place) {
        EXPECT_TRUE(near(host(gr), r, 4e-3, 0.0));  // only read (bf16 storage of r)
      }
    }
  }
}

// Both ways to the bias gradient: the dw GEMM's BGRADB epilogue (the default, where cuBLASLt accepts it for the
// shape) and the column-sum kernels (switched off), each against the CPU.
TEST_F(CudaOpsTest, MatmulBackwardOverwritesOrAccumulatesDinpAndAccumulatesDwDbias) {
  auto* cuda_ops = dynamic_cast<CudaOps*>(gpu_.get());
  ASSERT_NE(cuda_ops, nullptr);
  for (bool fuse : {true, false}) {
    cuda_ops->set_fuse_bias_grads(fuse);
    const int64_t fused_before = cuda_ops->fused_bias_grads();
    for (const auto& [N, C, OC] : kGemmShapes) {
      for (bool acc : {false, true}) {
        SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C) + " OC=" + std::to_string(OC) +
                     (acc ? " accumulate" : "") + (fuse ? " BGRADB where accepted" : " column-sum kernels"));
        VecF x = randn(N * C, 13), w = randn(OC * C, 14, 0.1f), dy = randn(N * OC, 15);
        VecF dx0 = randn(N * C, 16), dw0 = randn(OC * C, 17), db0 = randn(OC, 18);  // existing contents
        Tensor gx = dev(x, {N, C}), gw = dev(w, {OC, C}), gdy = dev(dy, {N, OC});
        Tensor gdx = dev(dx0, {N, C}), gdw = dev_f32(dw0, {OC, C}), gdb = dev_f32(db0, {OC});
        VecF dx = dx0, dw = dw0, db = db0;
        cpu_->matmul_backward(tf(dx, {N, C}), tf(dw, {OC, C}), tf(db, {OC}), tf(dy, {N, OC}), tf(x, {N, C}),
                              tf(w, {OC, C}), acc);
        gpu_->matmul_backward(gdx, gdw, gdb, gdy, gx, gw, acc);
        EXPECT_TRUE(near(host(gdx), dx, 8e-3, 2e-3));
        EXPECT_TRUE(near(host(gdw), dw, 1e-3, 1e-4));
        EXPECT_TRUE(near(host(gdb), db, 1e-4, 1e-5));
      }
    }
    const int64_t fused = cuda_ops->fused_bias_grads() - fused_before;
    if (fuse) {
      RecordProperty("bgradb_calls", static_cast<int>(fused));  // how many of the 10 cuBLASLt accepted, in the XML
    } else {
      EXPECT_EQ(fused, 0) << "set_fuse_bias_grads(false) still ran the epilogue";
    }
  }
  cuda_ops->set_fuse_bias_grads(true);
}

// accumulate_dw = false (a step's first write of a gradient): the existing dw / dbias (large garbage here) are
// overwritten, through the GEMM's beta = 0 and the BGRADB epilogue's write (or the column sums' overwriting second
// pass), as on the CPU.
TEST_F(CudaOpsTest, MatmulBackwardOverwritesDwDbiasWhenAsked) {
  for (const auto& [N, C, OC] : kGemmShapes) {
    SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C) + " OC=" + std::to_string(OC));
    VecF x = randn(N * C, 13), w = randn(OC * C, 14, 0.1f), dy = randn(N * OC, 15), pre = randn(N * C, 16);
    VecF dw0 = randn(OC * C, 17, 1e4f), db0 = randn(OC, 18, 1e4f);
    Tensor gx = dev(x, {N, C}), gw = dev(w, {OC, C}), gdy = dev(dy, {N, OC}), gpre = dev(pre, {N, C});
    for (bool gelu : {false, true}) {
      Tensor gdx = zeros({N, C}), gdw = dev_f32(dw0, {OC, C}), gdb = dev_f32(db0, {OC});
      VecF dx(N * C), dw = dw0, db = db0, prec = pre;
      if (gelu) {
        cpu_->matmul_backward_gelu(tf(dx, {N, C}), tf(dw, {OC, C}), tf(db, {OC}), tf(dy, {N, OC}), tf(x, {N, C}),
                                   tf(w, {OC, C}), tf(prec, {N, C}), false);
        gpu_->matmul_backward_gelu(gdx, gdw, gdb, gdy, gx, gw, gpre, false);
      } else {
        cpu_->matmul_backward(tf(dx, {N, C}), tf(dw, {OC, C}), tf(db, {OC}), tf(dy, {N, OC}), tf(x, {N, C}),
                              tf(w, {OC, C}), false, false);
        gpu_->matmul_backward(gdx, gdw, gdb, gdy, gx, gw, false, false);
      }
      EXPECT_TRUE(near(host(gdw), dw, 1e-3, 1e-4)) << (gelu ? "gelu" : "plain");
      EXPECT_TRUE(near(host(gdb), db, 1e-4, 1e-5)) << (gelu ? "gelu" : "plain");
    }
  }
}

TEST_F(CudaOpsTest, MatmulBackwardWithoutInputOrWeightGrad) {
  const int64_t N = 9, C = 32, OC = 16;
  VecF w = randn(OC * C, 19, 0.1f), dy = randn(N * OC, 20);
  Tensor gw = dev(w, {OC, C}), gdy = dev(dy, {N, OC}), gdx = zeros({N, C});
  VecF dx(N * C);
  cpu_->matmul_backward(tf(dx, {N, C}), Tensor{}, Tensor{}, tf(dy, {N, OC}), Tensor{}, tf(w, {OC, C}), false);
  gpu_->matmul_backward(gdx, Tensor{}, Tensor{}, gdy, Tensor{}, gw, false);
  EXPECT_TRUE(near(host(gdx), dx, 8e-3, 2e-3));
}

TEST_F(CudaOpsTest, MatmulGeluForwardFusedAndFallback) {
  // OC = 64: the GELU_AUX_BIAS epilogue; OC = 60: not a multiple of 8, the unfused path.
  for (int64_t OC : {int64_t{64}, int64_t{60}}) {
    const int64_t N = 33, C = 48;
    SCOPED_TRACE("OC=" + std::to_string(OC));
    VecF x = randn(N * C, 21), w = randn(OC * C, 22, 0.2f), b = randn(OC, 23);
    Tensor gx = dev(x, {N, C}), gw = dev(w, {OC, C}), gb = dev(b, {OC});
    Tensor go = zeros({N, OC}), gp = zeros({N, OC});
    VecF out(N * OC), pre(N * OC);
    cpu_->matmul_gelu_forward(tf(out, {N, OC}), tf(pre, {N, OC}), tf(x, {N, C}), tf(w, {OC, C}), tf(b, {OC}));
    gpu_->matmul_gelu_forward(go, gp, gx, gw, gb);
    EXPECT_TRUE(near(host(gp), pre, 8e-3, 2e-3));
    EXPECT_TRUE(near(host(go), out, 1e-2, 2e-3));
  }
}

TEST_F(CudaOpsTest, MatmulBackwardGeluFusedAndFallback) {
  // C = 64: the DGELU epilogue; C = 44: the unfused path.
  for (int64_t C : {int64_t{64}, int64_t{44}}) {
    const int64_t N = 29, OC = 40;
    SCOPED_TRACE("C=" + std::to_string(C));
    VecF pre = randn(N * C, 24, 2.0f), w = randn(OC * C, 25, 0.2f), dy = randn(N * OC, 26);
    test::rounded_bf16(pre);
    VecF act(N * C);
    cpu_->gelu_forward(tf(act, {N, C}), tf(pre, {N, C}));
    VecF dw0 = randn(OC * C, 27), db0 = randn(OC, 28);
    Tensor gpre = dev(pre, {N, C}), gact = dev(act, {N, C}), gw = dev(w, {OC, C}), gdy = dev(dy, {N, OC});
    Tensor gdpre = zeros({N, C}), gdw = dev_f32(dw0, {OC, C}), gdb = dev_f32(db0, {OC});
    VecF dpre(N * C), dw = dw0, db = db0;
    cpu_->matmul_backward_gelu(tf(dpre, {N, C}), tf(dw, {OC, C}), tf(db, {OC}), tf(dy, {N, OC}), tf(act, {N, C}),
                               tf(w, {OC, C}), tf(pre, {N, C}));
    gpu_->matmul_backward_gelu(gdpre, gdw, gdb, gdy, gact, gw, gpre);
    EXPECT_TRUE(near(host(gdpre), dpre, 1e-2, 4e-3));
    EXPECT_TRUE(near(host(gdw), dw, 1e-3, 1e-4));
    EXPECT_TRUE(near(host(gdb), db, 1e-4, 1e-5));
  }
}

TEST_F(CudaOpsTest, MatmulRejectsWrongDtypes) {
  Tensor x32 = zeros({4, 8}, DType::F32), w = zeros({8, 8}), out = zeros({4, 8});
  const std::string msg = test::error_of([&] { gpu_->matmul_forward(out, x32, w, Tensor{}); });
  EXPECT_NE(msg.find("matmul_forward: inp must be BF16"), std::string::npos) << msg;
  Tensor dw16 = zeros({8, 8}), dy = zeros({4, 8}), x = zeros({4, 8});
  const std::string msg2 = test::error_of([&] { gpu_->matmul_backward(Tensor{}, dw16, Tensor{}, dy, x, w, false); });
  EXPECT_NE(msg2.find("matmul_backward: dw must be F32"), std::string::npos) << msg2;
}

// GEMM tuning (CudaOptions::gemm_tuning): every linear op still matches the CPU, whichever algorithm the timing
// chose, and an accumulation (dw += ..., the residual added in place) is not timed, so it is added exactly once.
// The tolerances are the untuned tests' above: another cuBLASLt algorithm differs only in summation order (split-K,
// tile shape), inside the one bf16 rounding of the output.
TEST_F(CudaOpsTest, GemmTuningKeepsEveryLinearOpRightAndTimesOnlyWhatRerunsSafely) {
  auto tuned_ops = make_cuda_ops(-1, CudaOptions{"flash", 8});
  auto* tuned = dynamic_cast<CudaOps*>(tuned_ops.get());
  ASSERT_NE(tuned, nullptr);
  gpu_ = std::move(tuned_ops);  // dev()/zeros()/host() now work on the tuned backend
  // 256 x 384 -> 512: large enough for the heuristic to offer several algorithms; 37 x 100 -> 60 is odd-shaped.
  for (const auto& [N, C, OC] : {GemmShape{256, 384, 512}, GemmShape{37, 100, 60}}) {
    SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C) + " OC=" + std::to_string(OC));
    VecF x = randn(N * C, 40), w = randn(OC * C, 41, 0.1f), b = randn(OC, 42), r = randn(N * OC, 43);
    VecF dy = randn(N * OC, 44), dw0 = randn(OC * C, 45), db0 = randn(OC, 46);
    Tensor gx = dev(x, {N, C}), gw = dev(w, {OC, C}), gb = dev(b, {OC}), gdy = dev(dy, {N, OC});

    VecF want(N * OC), tmp(N * OC);
    Tensor go = zeros({N, OC});
    cpu_->matmul_forward(tf(want, {N, OC}), tf(x, {N, C}), tf(w, {OC, C}), tf(b, {OC}));
    gpu_->matmul_forward(go, gx, gw, gb);
    EXPECT_TRUE(near(host(go), want, 8e-3, 2e-3)) << "forward";

    cpu_->matmul_forward_add(tf(want, {N, OC}), tf(x, {N, C}), tf(w, {OC, C}), tf(b, {OC}), tf(r, {N, OC}),
                             tf(tmp, {N, OC}));
    for (bool in_place : {false, true}) {
      VecF rr = r;
      Tensor gr = dev(rr, {N, OC}), gt = zeros({N, OC});
      Tensor out = in_place ? gr : zeros({N, OC});
      gpu_->matmul_forward_add(out, gx, gw, gb, gr, gt);
      EXPECT_TRUE(near(host(out), want, 1e-2, 2e-3)) << (in_place ? "residual added in place" : "residual apart");
    }

    for (bool acc : {false, true}) {
      VecF dx(N * C), dw = dw0, db = db0;
      Tensor gdx = zeros({N, C}), gdw = dev_f32(dw0, {OC, C}), gdb = dev_f32(db0, {OC});
      cpu_->matmul_backward(tf(dx, {N, C}), tf(dw, {OC, C}), tf(db, {OC}), tf(dy, {N, OC}), tf(x, {N, C}),
                            tf(w, {OC, C}), false, acc);
      gpu_->matmul_backward(gdx, gdw, gdb, gdy, gx, gw, false, acc);
      const char* what = acc ? "backward, dw accumulated" : "backward, dw overwritten";
      EXPECT_TRUE(near(host(gdx), dx, 8e-3, 2e-3)) << what;
      EXPECT_TRUE(near(host(gdw), dw, 1e-3, 1e-4)) << what;
      EXPECT_TRUE(near(host(gdb), db, 1e-4, 1e-5)) << what;
    }

    VecF pre(N * OC), act(N * OC);
    Tensor gact = zeros({N, OC}), gpre = zeros({N, OC});
    cpu_->matmul_gelu_forward(tf(act, {N, OC}), tf(pre, {N, OC}), tf(x, {N, C}), tf(w, {OC, C}), tf(b, {OC}));
    gpu_->matmul_gelu_forward(gact, gpre, gx, gw, gb);
    EXPECT_TRUE(near(host(gpre), pre, 8e-3, 2e-3)) << "gelu forward, pre";
    EXPECT_TRUE(near(host(gact), act, 1e-2, 2e-3)) << "gelu forward, out";
  }
  // The DGELU epilogue (C a multiple of 8), its aux read while dpre is written.
  {
    const int64_t N = 64, C = 256, OC = 128;
    VecF pre = randn(N * C, 47, 2.0f), w = randn(OC * C, 48, 0.2f), dy = randn(N * OC, 49);
    test::rounded_bf16(pre);
    VecF act(N * C), dpre(N * C), dw(OC * C), db(OC);
    cpu_->gelu_forward(tf(act, {N, C}), tf(pre, {N, C}));
    Tensor gpre = dev(pre, {N, C}), gact = dev(act, {N, C}), gw = dev(w, {OC, C}), gdy = dev(dy, {N, OC});
    Tensor gdpre = zeros({N, C}), gdw = zeros({OC, C}, DType::F32), gdb = zeros({OC}, DType::F32);
    cpu_->matmul_backward_gelu(tf(dpre, {N, C}), tf(dw, {OC, C}), tf(db, {OC}), tf(dy, {N, OC}), tf(act, {N, C}),
                               tf(w, {OC, C}), tf(pre, {N, C}), false);
    gpu_->matmul_backward_gelu(gdpre, gdw, gdb, gdy, gact, gw, gpre, false);
    EXPECT_TRUE(near(host(gdpre), dpre, 1e-2, 4e-3)) << "gelu backward";
    EXPECT_TRUE(near(host(gdw), dw, 1e-3, 1e-4)) << "gelu backward";
  }

  // What the tuning says: every problem either timed (its choice one of the candidates, no slower than the
  // heuristic's by the medians it compared) or not, with the reason; the accumulations among the untimed.
  const std::vector<GemmTuned> report = tuned->gemm_tuning_report();
  ASSERT_FALSE(report.empty());
  int timed = 0, accumulations = 0;
  for (const GemmTuned& g : report) {
    SCOPED_TRACE(g.op + ": " + g.problem);
    EXPECT_GE(g.calls, 1);
    EXPECT_GE(g.candidates, 1);
    if (g.tuned) {
      ++timed;
      EXPECT_TRUE(g.why_not.empty());
      EXPECT_GE(g.chosen, 0);
      EXPECT_LT(g.chosen, g.candidates);
      EXPECT_LE(g.best_ms, g.heuristic_ms);
      EXPECT_GT(g.best_ms, 0.0);
    } else {
      EXPECT_FALSE(g.why_not.empty());
    }
    const bool accumulates = g.problem.find("beta 1") != std::string::npos &&
                             (g.op == "matmul_backward" || g.problem.find("D fp32") != std::string::npos);
    if (accumulates) {
      ++accumulations;
      EXPECT_FALSE(g.tuned) << "an accumulation into dw was timed (each timed run adds again)";
    }
  }
  EXPECT_GT(accumulations, 0) << "the accumulating dw GEMMs are missing from the report";
  RecordProperty("gemm_problems_timed", timed);
  // The 256 x 384 -> 512 forward GEMM reruns safely; cuBLASLt offers an H100 or A100 several algorithms for it.
  const bool forward_timed = std::any_of(report.begin(), report.end(), [](const GemmTuned& g) {
    return g.op == "matmul_forward" && g.problem.rfind("512 x 256 x 384,", 0) == 0 && g.tuned;
  });
  EXPECT_TRUE(forward_timed) << "the plain forward GEMM was not timed";
}

TEST(CudaOptions, GemmTuningOutOfRangeIsAnErrorNamingTheRange) {
  const std::string msg = test::error_of([] { make_cuda_ops(-1, CudaOptions{"flash", 1}); });
  EXPECT_NE(msg.find("gemm_tuning must be 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("2 to 64 (got 1)"), std::string::npos) << msg;
}

// ---- embedding ------------------------------------------------------------------------------------------------

TEST_F(CudaOpsTest, EmbeddingForwardBackward) {
  for (int64_t C : {int64_t{64}, int64_t{20}}) {
    for (bool with_wpe : {true, false}) {
      SCOPED_TRACE("C=" + std::to_string(C) + (with_wpe ? " wpe" : ""));
      const int64_t B = 3, T = 5, V = 11, maxT = 8;
      std::vector<int32_t> tok = {1, 2, 3, 1, 1, 0, 10, -1, 2, 2, 7, 7, 7, 3, -1};  // repeats and not-mine (-1)
      VecF wte = randn(V * C, 29), wpe = randn(maxT * C, 30), dy = randn(B * T * C, 31);
      Tensor gtok = dev_i32(tok, {B, T}), gwte = dev(wte, {V, C}), gwpe = dev(wpe, {maxT, C}), gdy = dev(dy, {B, T, C});
      Tensor go = zeros({B, T, C});
      VecF out(B * T * C);
      cpu_->embedding_forward(tf(out, {B, T, C}), ti(tok, {B, T}), tf(wte, {V, C}),
                              with_wpe ? tf(wpe, {maxT, C}) : Tensor{});
      gpu_->embedding_forward(go, gtok, gwte, with_wpe ? gwpe : Tensor{});
      EXPECT_TRUE(near(host(go), out, kOneRounding, 1e-6));

      VecF dwte0 = randn(V * C, 32), dwpe0 = randn(maxT * C, 33);
      Tensor gdwte = dev_f32(dwte0, {V, C}), gdwpe = dev_f32(dwpe0, {maxT, C});
      VecF dwte = dwte0, dwpe = dwpe0;
      cpu_->embedding_backward(tf(dwte, {V, C}), with_wpe ? tf(dwpe, {maxT, C}) : Tensor{}, tf(dy, {B, T, C}),
                               ti(tok, {B, T}));
      gpu_->embedding_backward(gdwte, with_wpe ? gdwpe : Tensor{}, gdy, gtok);
      EXPECT_TRUE(near(host(gdwte), dwte, 1e-5, 1e-6));
      EXPECT_TRUE(near(host(gdwpe), dwpe, 1e-5, 1e-6));  // untouched without wpe
    }
  }
}

// Deterministic mode (train.deterministic): the sorted, atomic-free backward. Many rows share a few tokens (half of
// them token 7, the rest from 6 tokens, some -1 = not mine), so atomics would add each token's rows in a varying
// order. Oracle: a naive sum in double over the same bf16 dout; fp32 sums of up to ~600 terms in a fixed order
// are within 1e-5 of the largest gradient. Two calls from the same starting dwte give bit-identical results.
TEST_F(CudaOpsTest, DeterministicEmbeddingBackwardMatchesADoubleSumAndRepeatsBitForBit) {
  static_cast<CudaOps&>(*gpu_).set_deterministic(true);
  const int64_t B = 4, T = 300, C = 72, V = 50;
  std::vector<int32_t> tok(B * T);
  for (int64_t i = 0; i < B * T; ++i) tok[i] = i % 2 == 0 ? 7 : i % 13 == 0 ? -1 : static_cast<int32_t>(i % 6) * 8;
  VecF dy = randn(B * T * C, 47), dwte0 = randn(V * C, 48), dwpe0 = randn(T * C, 49);
  Tensor gtok = dev_i32(tok, {B, T}), gdy = dev(dy, {B, T, C});  // dy rounded to bf16 in place
  std::vector<double> want_te(dwte0.begin(), dwte0.end()), want_pe(dwpe0.begin(), dwpe0.end());
  for (int64_t i = 0; i < B * T; ++i)
    for (int64_t c = 0; c < C; ++c) {
      if (tok[i] >= 0) want_te[tok[i] * C + c] += dy[i * C + c];
      want_pe[(i % T) * C + c] += dy[i * C + c];
    }
  VecF first;
  for (int run = 0; run < 2; ++run) {
    Tensor gdwte = dev_f32(dwte0, {V, C}), gdwpe = dev_f32(dwpe0, {T, C});
    gpu_->embedding_backward(gdwte, gdwpe, gdy, gtok);
    const VecF got = host(gdwte);
    double max_want = 0;
    for (double w : want_te) max_want = std::max(max_want, std::abs(w));
    EXPECT_TRUE(close(got, want_te, 1e-5, 1e-5 * max_want));
    EXPECT_TRUE(close(host(gdwpe), want_pe, 1e-5, 1e-5 * max_want));
    if (run == 0)
      first = got;
    else
      EXPECT_EQ(got, first) << "two deterministic embedding backward calls differ";
  }
  // A token beyond the table is still reported at the next synchronisation.
  std::vector<int32_t> bad = {0, 60};
  Tensor gbad = dev_i32(bad, {2}), gdbad = zeros({2, C}), gdw = zeros({V, C}, DType::F32);
  gpu_->embedding_backward(gdw, Tensor{}, gdbad, gbad);
  const std::string msg = test::error_of([&] { gpu_->synchronize(); });
  EXPECT_NE(msg.find("embedding"), std::string::npos) << msg;
}

TEST(CudaOptions, DeterministicWithGemmTuningIsAnErrorSayingWhy) {
  const std::string msg = test::error_of([] { make_cuda_ops(-1, CudaOptions{"flash", 8, true}); });
  EXPECT_NE(msg.find("deterministic mode and gemm_tuning = 8 cannot be combined"), std::string::npos) << msg;
}

TEST_F(CudaOpsTest, EmbeddingTokenOutOfRangeIsReportedAtSync) {
  std::vector<int32_t> tok = {0, 5};
  VecF wte = randn(4 * 8, 34);
  Tensor gtok = dev_i32(tok, {2}), gwte = dev(wte, {4, 8}), go = zeros({2, 8});
  gpu_->embedding_forward(go, gtok, gwte, Tensor{});
  const std::string msg = test::error_of([&] { gpu_->synchronize(); });
  EXPECT_NE(msg.find("embedding"), std::string::npos) << msg;
  EXPECT_EQ(test::error_of([&] { gpu_->synchronize(); }), "<no error>");  // reported once
}

// ---- normalisation --------------------------------------------------------------------------------------------

struct NormShape {
  int64_t N, C;
};
// 64, 768, 2048, 4104: the vector path of the backward with 1 pack of 8 per thread (2 and 256 threads, 300 rows
// over several blocks) and with 4 (4104 = 513 packs, a partly filled last one); 100 and 7: the scalar path.
const NormShape kNormShapes[] = {{1, 64}, {37, 100}, {16, 768}, {3, 7}, {300, 2048}, {40, 4104}};

TEST_F(CudaOpsTest, LayerNormForwardBackward) {
  for (const auto& [N, C] : kNormShapes) {
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C) + (with_bias ? " bias" : ""));
      VecF x = randn(N * C, 35, 2.0f), w = randn(C, 36), b = randn(C, 37);
      for (int64_t i = 0; i < N * C; ++i) x[i] += 3.0f;  // a mean far from zero: the two-pass variance matters
      Tensor gx = dev(x, {N, C}), gw = dev(w, {C}), gb = dev(b, {C});
      Tensor go = zeros({N, C}), gm = zeros({N}, DType::F32), gr = zeros({N}, DType::F32);
      VecF out(N * C), mean(N), rstd(N);
      cpu_->layernorm_forward(tf(out, {N, C}), tf(mean, {N}), tf(rstd, {N}), tf(x, {N, C}), tf(w, {C}),
                              with_bias ? tf(b, {C}) : Tensor{}, 1e-5f);
      gpu_->layernorm_forward(go, gm, gr, gx, gw, with_bias ? gb : Tensor{}, 1e-5f);
      EXPECT_TRUE(near(host(go), out, kOneRounding, 2e-3));
      EXPECT_TRUE(near(host(gm), mean, 1e-5, 1e-6));
      EXPECT_TRUE(near(host(gr), rstd, 1e-4, 1e-6));

      // Backward from the CPU's statistics (the oracle's own), accumulating into non-zero dinp, dw, db.
      VecF dy = randn(N * C, 38), dx0 = randn(N * C, 39), dw0 = randn(C, 40), db0 = randn(C, 41);
      Tensor gdy = dev(dy, {N, C}), gdx = dev(dx0, {N, C}), gdw = dev_f32(dw0, {C}), gdb = dev_f32(db0, {C});
      Tensor gmean = dev_f32(mean, {N}), grstd = dev_f32(rstd, {N});
      VecF dx = dx0, dw = dw0, db = db0;
      cpu_->layernorm_backward(tf(dx, {N, C}), tf(dw, {C}), with_bias ? tf(db, {C}) : Tensor{}, tf(dy, {N, C}),
                               tf(x, {N, C}), tf(w, {C}), tf(mean, {N}), tf(rstd, {N}));
      gpu_->layernorm_backward(gdx, gdw, with_bias ? gdb : Tensor{}, gdy, gx, gw, gmean, grstd);
      EXPECT_TRUE(near(host(gdx), dx, 8e-3, 4e-3));
      EXPECT_TRUE(near(host(gdw), dw, 1e-3, 1e-4));
      EXPECT_TRUE(near(host(gdb), db, 1e-3, 1e-4));  // untouched without bias
    }
  }
}

// The norms' dw (and db) overwritten with accumulate_dw = false: vector and scalar paths (kNormShapes), as on the CPU.
TEST_F(CudaOpsTest, NormBackwardOverwritesDwDbWhenAsked) {
  for (const auto& [N, C] : kNormShapes) {
    SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C));
    VecF x = randn(N * C, 70), w = randn(C, 71), dy = randn(N * C, 72), mean(N), rstd(N), out(N * C);
    test::rounded_bf16(x);
    cpu_->layernorm_forward(tf(out, {N, C}), tf(mean, {N}), tf(rstd, {N}), tf(x, {N, C}), tf(w, {C}), Tensor{}, 1e-5f);
    Tensor gx = dev(x, {N, C}), gw = dev(w, {C}), gdy = dev(dy, {N, C});
    Tensor gm = dev_f32(mean, {N}), gr = dev_f32(rstd, {N});
    VecF dw0 = randn(C, 73, 1e4f), db0 = randn(C, 74, 1e4f);
    for (bool rms : {false, true}) {
      Tensor gdx = zeros({N, C}), gdw = dev_f32(dw0, {C}), gdb = dev_f32(db0, {C});
      VecF dx(N * C), dw = dw0, db = db0;
      if (rms) {
        cpu_->rmsnorm_backward(tf(dx, {N, C}), tf(dw, {C}), tf(dy, {N, C}), tf(x, {N, C}), tf(w, {C}), tf(rstd, {N}),
                               false);
        gpu_->rmsnorm_backward(gdx, gdw, gdy, gx, gw, gr, false);
      } else {
        cpu_->layernorm_backward(tf(dx, {N, C}), tf(dw, {C}), tf(db, {C}), tf(dy, {N, C}), tf(x, {N, C}), tf(w, {C}),
                                 tf(mean, {N}), tf(rstd, {N}), false);
        gpu_->layernorm_backward(gdx, gdw, gdb, gdy, gx, gw, gm, gr, false);
      }
      EXPECT_TRUE(near(host(gdw), dw, 1e-3, 1e-4)) << (rms ? "rms" : "layernorm");
      EXPECT_TRUE(near(host(gdb), db, 1e-3, 1e-4)) << (rms ? "rms" : "layernorm");  // untouched for RMS
    }
  }
}

TEST_F(CudaOpsTest, LayerNormInferenceWithoutStatistics) {
  const int64_t N = 4, C = 32;
  VecF x = randn(N * C, 42), w = randn(C, 43);
  Tensor gx = dev(x, {N, C}), gw = dev(w, {C}), go = zeros({N, C});
  VecF out(N * C);
  cpu_->layernorm_forward(tf(out, {N, C}), Tensor{}, Tensor{}, tf(x, {N, C}), tf(w, {C}), Tensor{}, 1e-5f);
  gpu_->layernorm_forward(go, Tensor{}, Tensor{}, gx, gw, Tensor{}, 1e-5f);
  EXPECT_TRUE(near(host(go), out, kOneRounding, 2e-3));
}

TEST_F(CudaOpsTest, LayerNormBackwardIsDeterministic) {
  const int64_t N = 4096, C = 256;
  VecF x = randn(N * C, 44), w = randn(C, 45), dy = randn(N * C, 46), mean(N), rstd(N), out(N * C);
  test::rounded_bf16(x);
  cpu_->layernorm_forward(tf(out, {N, C}), tf(mean, {N}), tf(rstd, {N}), tf(x, {N, C}), tf(w, {C}), Tensor{}, 1e-5f);
  Tensor gx = dev(x, {N, C}), gw = dev(w, {C}), gdy = dev(dy, {N, C});
  Tensor gm = dev_f32(mean, {N}), gr = dev_f32(rstd, {N});
  VecF first;
  for (int run = 0; run < 2; ++run) {
    Tensor gdx = zeros({N, C}), gdw = zeros({C}, DType::F32), gdb = zeros({C}, DType::F32);
    gpu_->layernorm_backward(gdx, gdw, gdb, gdy, gx, gw, gm, gr);
    VecF dw = host(gdw);
    if (run == 0) {
      first = dw;
    } else {
      EXPECT_EQ(dw, first);  // bit-identical: partial sums added in a fixed order
    }
  }
}

TEST_F(CudaOpsTest, RmsNormForwardBackward) {
  for (const auto& [N, C] : kNormShapes) {
    SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C));
    VecF x = randn(N * C, 47), w = randn(C, 48);
    Tensor gx = dev(x, {N, C}), gw = dev(w, {C});
    Tensor go = zeros({N, C}), gr = zeros({N}, DType::F32);
    VecF out(N * C), rstd(N);
    cpu_->rmsnorm_forward(tf(out, {N, C}), tf(rstd, {N}), tf(x, {N, C}), tf(w, {C}), 1e-6f);
    gpu_->rmsnorm_forward(go, gr, gx, gw, 1e-6f);
    EXPECT_TRUE(near(host(go), out, kOneRounding, 2e-3));
    EXPECT_TRUE(near(host(gr), rstd, 1e-4, 1e-6));

    VecF dy = randn(N * C, 49), dx0 = randn(N * C, 50), dw0 = randn(C, 51);
    Tensor gdy = dev(dy, {N, C}), gdx = dev(dx0, {N, C}), gdw = dev_f32(dw0, {C}), grstd = dev_f32(rstd, {N});
    VecF dx = dx0, dw = dw0;
    cpu_->rmsnorm_backward(tf(dx, {N, C}), tf(dw, {C}), tf(dy, {N, C}), tf(x, {N, C}), tf(w, {C}), tf(rstd, {N}));
    gpu_->rmsnorm_backward(gdx, gdw, gdy, gx, gw, grstd);
    EXPECT_TRUE(near(host(gdx), dx, 8e-3, 4e-3));
    EXPECT_TRUE(near(host(gdw), dw, 1e-3, 1e-4));
  }
}

TEST_F(CudaOpsTest, AddNormFusedMatchesAddThenNorm) {
  for (const auto& [N, C] : kNormShapes) {
    for (bool rms : {false, true}) {
      SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C) + (rms ? " rms" : " ln"));
      VecF a = randn(N * C, 52), b = randn(N * C, 53), w = randn(C, 54), bias = randn(C, 55);
      Tensor ga = dev(a, {N, C}), gb = dev(b, {N, C}), gw = dev(w, {C}), gbias = dev(bias, {C});
      Tensor go = zeros({N, C}), gm = zeros({N}, DType::F32), gr = zeros({N}, DType::F32);
      // The oracle: res = a + b rounded to bf16 (what the GPU stores and normalises), then the CPU norm.
      VecF res(N * C), out(N * C), mean(N), rstd(N);
      for (int64_t i = 0; i < N * C; ++i) res[i] = round_bf16(a[i] + b[i]);
      if (rms)
        cpu_->rmsnorm_forward(tf(out, {N, C}), tf(rstd, {N}), tf(res, {N, C}), tf(w, {C}), 1e-5f);
      else
        cpu_->layernorm_forward(tf(out, {N, C}), tf(mean, {N}), tf(rstd, {N}), tf(res, {N, C}), tf(w, {C}),
                                tf(bias, {C}), 1e-5f);
      gpu_->add_layernorm_forward(ga, go, rms ? Tensor{} : gm, gr, ga, gb, gw, rms ? Tensor{} : gbias, 1e-5f, rms);
      EXPECT_EQ(host(ga), res);  // res aliases a; exactly the rounded sum
      EXPECT_TRUE(near(host(go), out, kOneRounding, 2e-3));
      EXPECT_TRUE(near(host(gr), rstd, 1e-4, 1e-6));
      if (!rms) {
        EXPECT_TRUE(near(host(gm), mean, 1e-5, 1e-6));
      }
    }
  }
}

// ---- rope -----------------------------------------------------------------------------------------------------

TEST_F(CudaOpsTest, RopeForwardBackward) {
  AttnShape s;
  s.B = 2, s.T = 37, s.n_head = 4, s.n_kv_head = 2, s.head_dim = 16;
  const int64_t n = int64_t{s.B} * s.T * s.qkv_width();
  // Plain, and Llama 3.1's scaling with every regime among head_dim 16's wavelengths (kept, interpolated, divided).
  for (const RopeFreqs& f : {RopeFreqs{10000.0f}, RopeFreqs{10000.0f, 8.0f, 1.0f, 8.0f, 1024}}) {
    SCOPED_TRACE(f.scaling);
    VecF x = randn(n, 56);
    Tensor gx = dev(x, {s.B, s.T, s.qkv_width()});
    VecF want = x;
    cpu_->rope_forward(tf(want, {n}), s, f);
    gpu_->rope_forward(gx, s, f);
    EXPECT_TRUE(near(host(gx), want, kOneRounding, 4e-3));
    VecF d = randn(n, 57);
    Tensor gd = dev(d, {n});
    VecF wantd = d;
    cpu_->rope_backward(tf(wantd, {n}), s, f);
    gpu_->rope_backward(gd, s, f);
    EXPECT_TRUE(near(host(gd), wantd, kOneRounding, 4e-3));
  }
}

// ---- losses ---------------------------------------------------------------------------------------------------

TEST_F(CudaOpsTest, CrossEntropyPaddedVocabAndIgnoredTargets) {
  // Packed and scalar small rows; GPT-2's padded vocabulary (the row kept in shared memory); Llama 3's, wider than
  // a block's shared memory (the streaming kernel).
  for (int64_t Vp : {int64_t{56}, int64_t{53}, int64_t{50304}, int64_t{128256}}) {
    for (bool write_grad : {true, false}) {
      const int64_t N = 7;
      const int V = Vp == 50304 ? 50257 : Vp == 128256 ? 128256 : 50;
      SCOPED_TRACE("Vp=" + std::to_string(Vp) + (write_grad ? " grad" : ""));
      VecF z = randn(N * Vp, 58, 3.0f);
      std::vector<int32_t> tgt = {0, V - 1, -1, 17, 3, -5, 42};
      Tensor gz = dev(z, {N, Vp}), gt = dev_i32(tgt, {N}), gl = zeros({N}, DType::F32);
      VecF zc = z, loss(N);
      const float dloss = 1.0f / N;
      cpu_->cross_entropy(tf(loss, {N}), tf(zc, {N, Vp}), ti(tgt, {N}), V, dloss, write_grad);
      gpu_->cross_entropy(gl, gz, gt, V, dloss, write_grad);
      EXPECT_TRUE(near(host(gl), loss, 1e-4, 1e-5));
      if (write_grad)
        EXPECT_TRUE(close(host(gz), to_d(zc), 1e-2, 1e-8));  // includes the padded columns (0) and ignored rows
      else
        EXPECT_EQ(host(gz), z);  // logits untouched
    }
  }
}

TEST_F(CudaOpsTest, CrossEntropyTargetOutOfRangeIsReportedAtSync) {
  VecF z = randn(2 * 16, 59);
  std::vector<int32_t> tgt = {3, 12};
  Tensor gz = dev(z, {2, 16}), gt = dev_i32(tgt, {2}), gl = zeros({2}, DType::F32);
  gpu_->cross_entropy(gl, gz, gt, 12, 1.0f, true);
  const std::string msg = test::error_of([&] { gpu_->synchronize(); });
  EXPECT_NE(msg.find("cross_entropy"), std::string::npos) << msg;
}

TEST_F(CudaOpsTest, VocabParallelCrossEntropySteps) {
  // One shard [v0, v0 + Vl) of a vocabulary of V = 100, n_real real columns; targets inside, outside and ignored.
  for (int64_t v0 : {int64_t{0}, int64_t{40}}) {
    for (int64_t Vl : {int64_t{64}, int64_t{61}}) {
      SCOPED_TRACE("v0=" + std::to_string(v0) + " Vl=" + std::to_string(Vl));
      const int64_t N = 6;
      const int n_real = 55, V = 100;
      VecF z = randn(N * Vl, 60, 2.0f);
      std::vector<int32_t> tgt = {0, 45, 94, -1, 60, 99};
      Tensor gz = dev(z, {N, Vl}), gt = dev_i32(tgt, {N}), gs = zeros({3, N}, DType::F32), gl = zeros({N}, DType::F32);
      VecF zc = z, st(3 * N), loss(N);
      cpu_->vp_ce_max(tf(st, {3, N}), tf(zc, {N, Vl}), n_real);
      gpu_->vp_ce_max(gs, gz, n_real);
      EXPECT_TRUE(near(host(gs), st, 1e-6, 0));  // max of the same values: exact
      cpu_->vp_ce_sums(tf(st, {3, N}), tf(zc, {N, Vl}), ti(tgt, {N}), v0, n_real, V);
      gpu_->vp_ce_sums(gs, gz, gt, v0, n_real, V);
      EXPECT_TRUE(near(host(gs), st, 1e-5, 1e-7));
      cpu_->vp_ce_finish(tf(loss, {N}), tf(zc, {N, Vl}), tf(st, {3, N}), ti(tgt, {N}), v0, n_real, 0.5f, true);
      gpu_->vp_ce_finish(gl, gz, gs, gt, v0, n_real, 0.5f, true);
      EXPECT_TRUE(near(host(gl), loss, 1e-4, 1e-5));
      EXPECT_TRUE(close(host(gz), to_d(zc), 1e-2, 1e-8));
    }
  }
}

// ---- optimizers -----------------------------------------------------------------------------------------------

TEST_F(CudaOpsTest, AdamWThreeStepsMatchCpu) {
  const int64_t n = 100003;
  VecF p = randn(n, 61), m(n), v(n);
  Tensor gp = dev_f32(p, {n}), gm = dev_f32(m, {n}), gv = dev_f32(v, {n});
  AdamHParams h;
  h.lr = 1e-2f, h.weight_decay = 0.1f, h.grad_scale = 0.5f;
  for (int step = 1; step <= 3; ++step) {
    h.step = step;
    VecF g = randn(n, 62 + step);
    Tensor gg = dev_f32(g, {n});
    cpu_->adamw_update(tf(p, {n}), tf(g, {n}), tf(m, {n}), tf(v, {n}), h);
    gpu_->adamw_update(gp, gg, gm, gv, h);
  }
  EXPECT_TRUE(near(host(gp), p, 1e-5, 1e-7));
  EXPECT_TRUE(near(host(gm), m, 1e-5, 1e-7));
  EXPECT_TRUE(near(host(gv), v, 1e-5, 1e-7));
}

// The multi-tensor AdamW (one launch) against the CPU's per-segment updates: segments with gaps between them (which
// must stay untouched), different weight decays, an empty and a one-element segment, lengths that leave a tail after
// the four-element steps, and a segment whose start is not 16-byte aligned (one element at a time).
TEST_F(CudaOpsTest, AdamWMultiTensorMatchesCpu) {
  const std::vector<AdamSegment> segs = {{0, 13, 0.1f},      {16, 1, 0.0f},     {32, 0, 0.1f},
                                         {32, 100003, 0.1f}, {100048, 7, 0.0f}, {100057, 5, 0.1f}};
  const int64_t n = 100064;
  VecF p = randn(n, 81), m(n), v(n);
  const VecF p0 = p;
  Tensor gp = dev_f32(p, {n}), gm = dev_f32(m, {n}), gv = dev_f32(v, {n});
  AdamHParams h;
  h.lr = 1e-2f, h.weight_decay = 0.5f, h.grad_scale = 0.5f;  // weight_decay: replaced by each segment's
  // The bf16 compute copy written by the same launch (weight_out), gaps pre-filled with a NaN pattern the rounding of
  // these finite weights never produces.
  constexpr uint16_t kSentinel = 0x7fc1;
  std::vector<uint16_t> w_init(n, kSentinel), w(n);
  Buffer wb = gpu_->alloc(n * sizeof(uint16_t));
  Tensor gw = wb.view({n}, DType::BF16);
  gpu_->to_device(gw, w_init.data());
  for (int step = 1; step <= 3; ++step) {
    h.step = step;
    VecF g = randn(n, 82 + step);
    Tensor gg = dev_f32(g, {n});
    cpu_->adamw_update_multi(tf(p, {n}), tf(g, {n}), tf(m, {n}), tf(v, {n}), segs, h);
    gpu_->adamw_update_multi(gp, gg, gm, gv, segs, h, gw);
  }
  const VecF got = host(gp);
  EXPECT_TRUE(near(got, p, 1e-5, 1e-7));
  EXPECT_TRUE(near(host(gm), m, 1e-5, 1e-7));
  EXPECT_TRUE(near(host(gv), v, 1e-5, 1e-7));
  EXPECT_EQ(got[13], p0[13]);  // in the gap after the first segment
  EXPECT_EQ(got[100040], p0[100040]);
  gpu_->to_host(w.data(), gw);
  std::vector<bool> in_segment(n, false);
  for (const AdamSegment& sg : segs)
    for (int64_t i = sg.offset; i < sg.offset + sg.numel; ++i) in_segment[i] = true;
  for (int64_t i = 0; i < n; ++i)  // the device's own fp32 weights, rounded as the host rounds: bit for bit
    ASSERT_EQ(w[i], in_segment[i] ? float_to_bf16(got[i]) : kSentinel) << "element " << i;
  AdamSegment outside{n - 3, 7, 0.0f};
  const std::string e = mt::test::error_of([&] { gpu_->adamw_update_multi(gp, gp, gm, gv, {outside}, h); });
  EXPECT_NE(e.find("outside the flat buffers"), std::string::npos) << e;
}

// The multi-tensor LAMB (two passes, norms kept on the device between them) against the CPU's per-segment sequence,
// within the tolerances of the AdamW test above: segments with gaps, different decays, an empty and a one-element
// segment, one past a launch's 1024-block cap (several partials per thread in the reduction), and one with zero
// params and grads (trust 1). Repeating a step from the same state gives the same bits (no scheduling-dependent
// sums); norms in host memory are refused.
TEST_F(CudaOpsTest, LambMultiTensorMatchesCpu) {
  const std::vector<AdamSegment> segs = {{0, 13, 0.1f},          {16, 1, 0.0f},     {32, 0, 0.1f},
                                         {32, 100003, 0.1f},     {100048, 7, 0.0f}, {100064, 37, 0.1f},
                                         {100112, 2500001, 0.0f}};
  const int64_t n = 2600120, ns = 2 * static_cast<int64_t>(segs.size());
  VecF p = randn(n, 91), m(n), v(n), norms(ns, 0.0f), zero_n(ns, std::nanf(""));
  std::fill(p.begin() + 100064, p.begin() + 100064 + 37, 0.0f);
  const VecF p0 = p;
  Tensor gp = dev_f32(p, {n}), gm = dev_f32(m, {n}), gv = dev_f32(v, {n}), gn = dev_f32(zero_n, {ns});
  AdamHParams h;
  h.lr = 1e-2f, h.weight_decay = 0.5f, h.grad_scale = 0.5f;  // weight_decay: replaced by each segment's
  for (int step = 1; step <= 3; ++step) {
    h.step = step;
    VecF g = randn(n, 92 + step);
    std::fill(g.begin() + 100064, g.begin() + 100064 + 37, 0.0f);
    Tensor gg = dev_f32(g, {n});
    const Tensor cn = tf(norms, {ns});
    cpu_->lamb_moments_multi(tf(p, {n}), tf(g, {n}), tf(m, {n}), tf(v, {n}), segs, h, cn);
    if (step == 2) {  // the same step twice from the same state: the same bits
      VecF p1 = host(gp), m1 = host(gm), v1 = host(gv);
      Tensor gp2 = dev_f32(p1, {n}), gm2 = dev_f32(m1, {n}), gv2 = dev_f32(v1, {n}), gn2 = zeros({ns}, DType::F32);
      gpu_->lamb_moments_multi(gp2, gg, gm2, gv2, segs, h, gn2);
      gpu_->lamb_moments_multi(gp, gg, gm, gv, segs, h, gn);
      EXPECT_EQ(host(gn2), host(gn));
      EXPECT_EQ(host(gm2), host(gm));
    } else {
      gpu_->lamb_moments_multi(gp, gg, gm, gv, segs, h, gn);
    }
    const VecF got = host(gn);
    for (int64_t k = 0; k < ns; ++k)
      EXPECT_NEAR(got[k], norms[k], 1e-5 * norms[k])
          << (k % 2 ? "||u||^2" : "||w||^2") << " of segment " << k / 2 << " at step " << step;
    cpu_->lamb_apply_multi(tf(p, {n}), tf(m, {n}), tf(v, {n}), segs, h, cn);
    gpu_->lamb_apply_multi(gp, gm, gv, segs, h, gn);
  }
  const VecF got = host(gp);
  EXPECT_TRUE(near(got, p, 1e-5, 1e-7));
  EXPECT_TRUE(near(host(gm), m, 1e-5, 1e-7));
  EXPECT_TRUE(near(host(gv), v, 1e-5, 1e-7));
  EXPECT_EQ(got[13], p0[13]);  // in the gaps
  EXPECT_EQ(got[100040], p0[100040]);
  EXPECT_EQ(got[100064], 0.0f);  // the zero segment (trust 1, u = 0) stays zero
  const std::string e = mt::test::error_of([&] { gpu_->lamb_apply_multi(gp, gm, gv, segs, h, tf(norms, {ns})); });
  EXPECT_NE(e.find("lamb_apply_multi: norms must be in device memory"), std::string::npos) << e;
}

TEST_F(CudaOpsTest, LambThreeStepsMatchCpu) {
  const int64_t n = 100003;
  VecF p = randn(n, 70), m(n), v(n);
  Tensor gp = dev_f32(p, {n}), gm = dev_f32(m, {n}), gv = dev_f32(v, {n});
  AdamHParams h;
  h.lr = 1e-2f, h.weight_decay = 0.01f;
  for (int step = 1; step <= 3; ++step) {
    h.step = step;
    VecF g = randn(n, 71 + step);
    Tensor gg = dev_f32(g, {n});
    const double uu_cpu = cpu_->lamb_moments(tf(p, {n}), tf(g, {n}), tf(m, {n}), tf(v, {n}), h);
    const double uu_gpu = gpu_->lamb_moments(gp, gg, gm, gv, h);
    EXPECT_NEAR(uu_gpu, uu_cpu, 1e-5 * uu_cpu);
    const float trust = 0.7f;
    cpu_->lamb_apply(tf(p, {n}), tf(m, {n}), tf(v, {n}), h, trust);
    gpu_->lamb_apply(gp, gm, gv, h, trust);
  }
  EXPECT_TRUE(near(host(gp), p, 1e-5, 1e-7));
}

// ---- timing ---------------------------------------------------------------------------------------------------

TEST_F(CudaOpsTest, OpTimingGivesOneTimingPerOp) {
  const int64_t n = 1 << 20;
  VecF x = randn(n, 80);
  Tensor a = dev(x, {n}), b = zeros({n}), c = zeros({n});
  gpu_->synchronize();
  EXPECT_TRUE(gpu_->take_op_timings().empty());  // off by default
  gpu_->set_op_timing(true);
  gpu_->zero(b);
  gpu_->add(c, a, b);
  gpu_->gelu_forward(b, c);
  gpu_->synchronize();
  const std::vector<OpTiming> t = gpu_->take_op_timings();
  ASSERT_EQ(t.size(), 3u);
  EXPECT_STREQ(t[0].name, "zero");
  EXPECT_STREQ(t[1].name, "add");
  EXPECT_STREQ(t[2].name, "gelu_forward");
  double prev = 0;
  for (const OpTiming& o : t) {
    EXPECT_GE(o.ms, 0.0);
    EXPECT_GE(o.start_ms, prev);
    prev = o.start_ms;
  }
  EXPECT_TRUE(gpu_->take_op_timings().empty());  // taken
  gpu_->set_op_timing(false);
  gpu_->zero(b);
  gpu_->synchronize();
  EXPECT_TRUE(gpu_->take_op_timings().empty());
}

}  // namespace
}  // namespace mt
