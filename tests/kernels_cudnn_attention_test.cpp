// cuDNN fused attention (kernels/cuda/cudnn_attention.*, selected by CudaOptions::attention = "cudnn") through the
// CudaOps interface, against two independent references on the same bf16-rounded inputs:
//   (a) the fp32 CPU backend (CpuOps::attention_forward/backward), the oracle: out, lse and dqkv;
//   (b) our flash kernels (the default CudaOps): out, lse and dqkv, and each backward fed the other's out and lse,
//       which checks that cuDNN's softmax stats and our lse are the same quantity (natural-log log-sum-exp).
// Shapes: causal with head_dim 64 and 128, GQA and MQA, T not a multiple of 64, a single token, sliding windows.
// Shapes marked "may be refused" (ragged T, windows, T = 1) skip with cuDNN's message when this cuDNN build has no
// engine for them; the plain causal ones (T a multiple of 64) must run.
//
// Tolerances as in kernels_flash_attention_test.cpp (bf16 inputs and outputs, fp32 accumulation, P and dS rounded to
// bf16 before their GEMMs): max |got - want| <= 2e-2 * max |want| and rms(got - want) <= 1e-2 * rms(want), with a
// scale floor of 0.05 (window 1 / T = 1 make dq and dk pure rounding noise); lse within 2e-3.
//
// Option checks that need no GPU run everywhere; the rest skip without a device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "megatrain/core/bf16.h"
#include "megatrain/kernels/cuda/cuda_ops.h"
#include "megatrain/kernels/cuda/cudnn_attention.h"
#include "megatrain/kernels/ops.h"
#include "support/attention_testutil.h"
#include "support/test_util.h"

namespace mt {
namespace {

using namespace attn_test;

struct Case {
  AttnShape s;
  bool may_be_refused = false;  // cuDNN may lack an engine for it: skip (naming cuDNN's reason) instead of failing
};

// gtest prints parameters with this (ADL: it must live in Case's namespace).
void PrintTo(const Case& c, std::ostream* os) {
  *os << "B=" << c.s.B << " T=" << c.s.T << " H=" << c.s.n_head << " Hkv=" << c.s.n_kv_head << " hd=" << c.s.head_dim
      << " window=" << c.s.window;
}

// ---- the GPU backends under test -----------------------------------------------------------------------------------

std::unique_ptr<Ops> cuda_ops(const std::string& attention) {
  CudaOptions opt;
  opt.attention = attention;
  return make_cuda_ops(-1, opt);
}

// Forward then backward through `ops` (CudaOps). With `given`, the forward is skipped and the backward reads
// given->out and given->lse instead (then out and lse of the result are those). Every output buffer starts as NaN, so
// what an implementation fails to write shows up.
Results run_ops(Ops& ops, const AttnShape& s, const Inputs& in, const Results* given = nullptr) {
  const int64_t W = s.qkv_width(), OW = out_width(s);
  Buffer bq = ops.alloc(n_qkv(s) * 2), bd = ops.alloc(n_out(s) * 2), bo = ops.alloc(n_out(s) * 2),
         bl = ops.alloc(n_lse(s) * 4), bdq = ops.alloc(n_qkv(s) * 2);
  const Tensor qkv = bq.view({s.B, s.T, W}, DType::BF16), dout = bd.view({s.B, s.T, OW}, DType::BF16),
               out = bo.view({s.B, s.T, OW}, DType::BF16), lse = bl.view({s.B, s.n_head, s.T}, DType::F32),
               dqkv = bdq.view({s.B, s.T, W}, DType::BF16);
  const std::vector<uint16_t> hq = to_bf16(in.qkv), hd = to_bf16(in.dout);
  ops.to_device(qkv, hq.data());
  ops.to_device(dout, hd.data());
  const std::vector<uint16_t> nan16(n_qkv(s), 0xFFFF);
  const std::vector<float> nan32(n_lse(s), std::nanf(""));
  ops.to_device(out, nan16.data());
  ops.to_device(lse, nan32.data());
  ops.to_device(dqkv, nan16.data());

  Results r;
  if (given) {
    const std::vector<uint16_t> ho = to_bf16(given->out);
    ops.to_device(out, ho.data());
    ops.to_device(lse, given->lse.data());
  } else {
    ops.attention_forward(out, lse, qkv, s);
  }
  std::vector<uint16_t> ho(n_out(s)), hdq(n_qkv(s));
  r.lse.resize(n_lse(s));
  ops.to_host(ho.data(), out);
  ops.to_host(r.lse.data(), lse);
  ops.attention_backward(dqkv, dout, qkv, out, lse, s);
  ops.to_host(hdq.data(), dqkv);
  r.out = from_bf16(ho);
  r.dqkv = from_bf16(hdq);
  return r;
}

// Runs f(); returns cuDNN's message when it refuses a shape marked "may be refused" (empty when f() ran). Any other
// error propagates and fails the test.
template <typename F>
std::string refusal_of(const Case& c, F&& f) {
  try {
    f();
    return "";
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (!c.may_be_refused || msg.find("cuDNN") == std::string::npos) throw;
    return msg;
  }
}

// ---- tests that need no GPU ----------------------------------------------------------------------------------------

TEST(CudnnAttentionOptions, UnknownAttentionIsANamedError) {
  const std::string e = test::error_of([] { cuda_ops("bogus"); });
  EXPECT_NE(e.find("attention must be"), std::string::npos) << e;
  EXPECT_NE(e.find("\"bogus\""), std::string::npos) << e;
}

TEST(CudnnAttentionOptions, CudnnOptionWithoutCudnnInTheBuildIsAClearError) {
  if (CudnnAttention::available()) GTEST_SKIP() << "this build links " << CudnnAttention::version();
  const std::string e = test::error_of([] { cuda_ops("cudnn"); });
  EXPECT_NE(e.find("built without cuDNN"), std::string::npos) << e;
}

// ---- GPU tests -----------------------------------------------------------------------------------------------------

#define MT_NEED_GPU_AND_CUDNN()                                                  \
  do {                                                                           \
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";                           \
    if (!CudnnAttention::available()) GTEST_SKIP() << "this build has no cuDNN"; \
  } while (0)

class CudnnAttentionShapes : public ::testing::TestWithParam<Case> {};

// (a) against the CPU oracle: out, lse, and dqkv from the CPU backward fed the GPU's own out and lse.
TEST_P(CudnnAttentionShapes, MatchesTheCpuBackend) {
  MT_NEED_GPU_AND_CUDNN();
  const Case c = GetParam();
  const AttnShape& s = c.s;
  const Inputs in = make_inputs(s, 1234);
  auto ops = cuda_ops("cudnn");
  Results gpu;
  const std::string refused = refusal_of(c, [&] { gpu = run_ops(*ops, s, in); });
  if (!refused.empty()) GTEST_SKIP() << "this cuDNN has no engine for the shape: " << refused;
  const Results cpu = cpu_forward(s, in);
  expect_close("out", gpu.out, cpu.out);
  expect_lse_close("lse", gpu.lse, cpu.lse);
  expect_dqkv_close("vs cpu", s, gpu.dqkv, cpu_backward(s, in, gpu.out, gpu.lse));
}

// (b) against our flash kernels, including each backward fed the other's forward (out and lse).
TEST_P(CudnnAttentionShapes, MatchesOurFlashKernelsAndSharesItsLse) {
  MT_NEED_GPU_AND_CUDNN();
  const Case c = GetParam();
  const AttnShape& s = c.s;
  if (s.head_dim != 64 && s.head_dim != 128) GTEST_SKIP() << "our flash kernels take head_dim 64 or 128 only";
  const Inputs in = make_inputs(s, 77);
  auto cudnn = cuda_ops("cudnn");
  auto flash = cuda_ops("flash");
  Results a;
  const std::string refused = refusal_of(c, [&] { a = run_ops(*cudnn, s, in); });
  if (!refused.empty()) GTEST_SKIP() << "this cuDNN has no engine for the shape: " << refused;
  const Results b = run_ops(*flash, s, in);
  expect_close("out (cudnn vs flash)", a.out, b.out);
  expect_lse_close("lse (cudnn vs flash)", a.lse, b.lse);
  expect_dqkv_close("cudnn vs flash", s, a.dqkv, b.dqkv);
  // cuDNN's backward from flash's forward, and flash's backward from cuDNN's forward.
  expect_dqkv_close("cudnn bwd on flash fwd", s, run_ops(*cudnn, s, in, &b).dqkv, b.dqkv);
  expect_dqkv_close("flash bwd on cudnn fwd", s, run_ops(*flash, s, in, &a).dqkv, a.dqkv);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudnnAttentionShapes,
                         ::testing::Values(Case{shape(2, 128, 4, 4, 64, 0)},          // causal, hd 64
                                           Case{shape(1, 256, 4, 4, 128, 0)},         // causal, hd 128
                                           Case{shape(2, 128, 4, 2, 64, 0)},          // GQA 2:1
                                           Case{shape(1, 192, 4, 1, 128, 0)},         // MQA, hd 128
                                           Case{shape(2, 130, 4, 4, 64, 0), true},    // T not a multiple of 64
                                           Case{shape(1, 63, 4, 2, 128, 0), true},    // T < 64, GQA, hd 128
                                           Case{shape(2, 1, 4, 2, 64, 0), true},      // a single token
                                           Case{shape(2, 128, 4, 2, 64, 17), true},   // window inside a tile
                                           Case{shape(1, 256, 4, 1, 128, 64), true},  // window = 64, MQA, hd 128
                                           Case{shape(2, 130, 4, 2, 64, 1),
                                                true},  // window 1: each token sees only itself
                                           Case{shape(1, 130, 4, 2, 64, 200), true}),  // window >= T: plain causal
                         [](const ::testing::TestParamInfo<Case>& i) { return shape_name(i.param.s); });

// Repeated backward calls give the same gradients: catches scratch (the fp32 dQ accumulator, the softmax sums) that
// is accumulated into instead of overwritten. Atomics may reorder fp32 sums, hence a tolerance, far below the 2x a
// stale accumulator would cause.
TEST(CudnnAttention, BackwardIsRepeatable) {
  MT_NEED_GPU_AND_CUDNN();
  const AttnShape s = shape(2, 128, 4, 2, 64, 0);
  const Inputs in = make_inputs(s, 9);
  auto ops = cuda_ops("cudnn");
  const Results first = run_ops(*ops, s, in);
  const Results again = run_ops(*ops, s, in, &first);
  expect_dqkv_close("second backward", s, again.dqkv, first.dqkv);
}

// Deterministic mode (train.deterministic): cuDNN only through engines not marked nondeterministic, or, where it
// has none for the shape, our flash kernel's deterministic path. Either way two backward passes from the same
// inputs give bit-identical dqkv, which matches the CPU backend (the oracle).
TEST(CudnnAttention, DeterministicBackwardRepeatsBitForBit) {
  MT_NEED_GPU_AND_CUDNN();
  const AttnShape s = shape(2, 256, 4, 2, 64, 0);
  const Inputs in = make_inputs(s, 21);
  CudaOptions opt;
  opt.attention = "cudnn";
  opt.deterministic = true;
  auto ops = make_cuda_ops(-1, opt);
  const bool on_cudnn = static_cast<CudaOps&>(*ops).attention_on_cudnn(s, true);
  std::cout << "deterministic attention backward runs on " << (on_cudnn ? "cuDNN" : "our flash kernel (fallback)")
            << "\n";
  RecordProperty("deterministic_backward", on_cudnn ? "cudnn" : "flash");
  const Results first = run_ops(*ops, s, in);
  const Results again = run_ops(*ops, s, in, &first);
  EXPECT_EQ(again.dqkv, first.dqkv) << "two deterministic backward passes differ";
  expect_dqkv_close("deterministic vs cpu", s, first.dqkv, cpu_backward(s, in, first.out, first.lse));
}

// reserve_attention builds the plans up front; a shape then runs without growing anything.
TEST(CudnnAttention, ReserveSizesTheWorkspace) {
  MT_NEED_GPU_AND_CUDNN();
  const AttnShape s = shape(2, 128, 4, 4, 64, 0);
  auto ops = cuda_ops("cudnn");
  ops->reserve_attention(s);
  const Inputs in = make_inputs(s, 3);
  const Results r = run_ops(*ops, s, in);
  expect_close("out after reserve", r.out, cpu_forward(s, in).out);
}

// A shape outside cuDNN's fused engines is an mt::Error naming the shape and pointing at attention = "flash".
TEST(CudnnAttention, UnsupportedShapeIsANamedError) {
  MT_NEED_GPU_AND_CUDNN();
  auto ops = cuda_ops("cudnn");
  const AttnShape s = shape(1, 64, 2, 2, 36, 0);  // head_dim not a multiple of 8
  const std::string e = test::error_of([&] { ops->reserve_attention(s); });
  EXPECT_NE(e.find("head_dim=36"), std::string::npos) << e;
  EXPECT_NE(e.find("attention = \"flash\""), std::string::npos) << e;
}

}  // namespace
}  // namespace mt
