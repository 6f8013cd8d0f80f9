// Flash attention (kernels/cuda/flash_attention.*) against two independent oracles on the same bf16-rounded inputs:
//   (a) the fp32 CPU backend (CpuOps::attention_forward/backward), over causal, windowed, GQA and ragged-T shapes;
//   (b) a naive double-precision T x T formula written here, on small shapes (also for the deterministic dq pass).
// The kernels are called directly on cudaMalloc'd memory, so this does not depend on CudaOps. GPU tests skip
// without a device; the oracle and tile-range tests run everywhere.
//
// Tolerances. Inputs are bf16 (8 mantissa bits, unit roundoff u = 2^-9 ~ 0.002); the kernel rounds P and dS to
// bf16 before their tensor-core products and rounds every output to bf16, so each output element carries a few u
// of relative error against an fp32 or double reference. Near-zero entries of dq/dk (sums with cancellation:
// sum_j dS_ij = 0) make an element-wise relative bound meaningless, so errors are measured against the tensor's
// scale: max |got - want| <= 2e-2 * max |want| (about 10 u) and rms(got - want) <= 1e-2 * rms(want) (about 5 u).
// The scale has a floor of kScaleFloor: with window 1 (or T = 1) every row sees only itself, P = 1, and
// dS = P (dP - D) = dO.v - dO.v is zero in exact arithmetic, so dq and dk are pure rounding noise (~1e-6) in every
// implementation; inputs are N(0, 1) and real gradients O(0.1..1), so the floor hides no real error.
// lse is fp32 throughout (scores are exact products of bf16 values summed in fp32): |got - want| <= 2e-3.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "megatrain/core/bf16.h"
#include "megatrain/kernels/cuda/flash_attention.h"
#include "megatrain/kernels/cuda/flash_attention_kernels.h"
#include "megatrain/kernels/ops.h"
#include "support/attention_testutil.h"
#include "support/test_util.h"

namespace mt {

// gtest prints parameters with this (ADL: it must live in AttnShape's namespace).
void PrintTo(const AttnShape& s, std::ostream* os) {
  *os << "B=" << s.B << " T=" << s.T << " H=" << s.n_head << " Hkv=" << s.n_kv_head << " hd=" << s.head_dim
      << " window=" << s.window;
}

namespace {

using namespace attn_test;

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// cudaMalloc'd memory, freed on scope exit.
struct DeviceMem {
  void* p = nullptr;
  explicit DeviceMem(size_t bytes) { cuda_ok(cudaMalloc(&p, bytes), "cudaMalloc"); }
  ~DeviceMem() { cudaFree(p); }
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// deterministic: the backward's dq from its atomic-free pass (train.deterministic).
Results run_gpu(const AttnShape& s, const Inputs& in, bool deterministic = false) {
  const size_t n_qkv = in.qkv.size(), n_out = in.dout.size(), n_lse = static_cast<size_t>(s.B) * s.n_head * s.T;
  DeviceMem qkv(n_qkv * 2), out(n_out * 2), dout(n_out * 2), lse(n_lse * 4), dqkv(n_qkv * 2),
      ws(flash_attention_workspace_bytes(s));
  const std::vector<uint16_t> hq = to_bf16(in.qkv), hd = to_bf16(in.dout);
  cuda_ok(cudaMemcpy(qkv.p, hq.data(), n_qkv * 2, cudaMemcpyHostToDevice), "cudaMemcpy qkv");
  cuda_ok(cudaMemcpy(dout.p, hd.data(), n_out * 2, cudaMemcpyHostToDevice), "cudaMemcpy dout");
  // NaN (0xFFFF) everywhere the kernels write or use as scratch: what they fail to overwrite shows up.
  cuda_ok(cudaMemset(out.p, 0xFF, n_out * 2), "cudaMemset out");
  cuda_ok(cudaMemset(lse.p, 0xFF, n_lse * 4), "cudaMemset lse");
  cuda_ok(cudaMemset(dqkv.p, 0xFF, n_qkv * 2), "cudaMemset dqkv");
  cuda_ok(cudaMemset(ws.p, 0xFF, flash_attention_workspace_bytes(s)), "cudaMemset workspace");

  flash_attention_forward(nullptr, s, qkv.as<__nv_bfloat16>(), out.as<__nv_bfloat16>(), lse.as<float>());
  flash_attention_backward(nullptr, s, qkv.as<__nv_bfloat16>(), out.as<__nv_bfloat16>(), dout.as<__nv_bfloat16>(),
                           lse.as<float>(), dqkv.as<__nv_bfloat16>(), ws.as<float>(), deterministic);
  cuda_ok(cudaDeviceSynchronize(), "flash attention kernels");

  std::vector<uint16_t> ho(n_out), hdq(n_qkv);
  Results r;
  r.lse.resize(n_lse);
  cuda_ok(cudaMemcpy(ho.data(), out.p, n_out * 2, cudaMemcpyDeviceToHost), "cudaMemcpy out");
  cuda_ok(cudaMemcpy(r.lse.data(), lse.p, n_lse * 4, cudaMemcpyDeviceToHost), "cudaMemcpy lse");
  cuda_ok(cudaMemcpy(hdq.data(), dqkv.p, n_qkv * 2, cudaMemcpyDeviceToHost), "cudaMemcpy dqkv");
  r.out = from_bf16(ho);
  r.dqkv = from_bf16(hdq);
  return r;
}

// ---- oracle (b): the textbook formula in double ------------------------------------------------------------------

bool sees(const AttnShape& s, int t, int j) { return j <= t && (s.window == 0 || j > t - s.window); }

// S_tj = q_t.k_j / sqrt(hd) over visible j, lse_t = log sum exp S, P = exp(S - lse), O_t = sum_j P_tj v_j;
// dP_tj = dO_t.v_j, D_t = sum_j P_tj dP_tj, dS = P (dP - D), dq_t = sum_j dS_tj k_j / sqrt(hd),
// dk_j += dS_tj q_t / sqrt(hd), dv_j += P_tj dO_t (k and v summed over the query heads of their group).
Results naive(const AttnShape& s, const Inputs& in) {
  const int T = s.T, hd = s.head_dim, group = s.n_head / s.n_kv_head;
  const int64_t W = s.qkv_width(), OC = out_width(s);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> out(in.dout.size()), dqkv(in.qkv.size()), lse(static_cast<size_t>(s.B) * s.n_head * T);
  std::vector<double> P(static_cast<size_t>(T) * T), dS(static_cast<size_t>(T) * T);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.n_head; ++h) {
      const int kvh = h / group;
      auto q = [&](int t, int d) { return double{in.qkv[(int64_t{b} * T + t) * W + h * hd + d]}; };
      auto k = [&](int t, int d) { return double{in.qkv[(int64_t{b} * T + t) * W + (s.n_head + kvh) * hd + d]}; };
      auto v = [&](int t, int d) {
        return double{in.qkv[(int64_t{b} * T + t) * W + (s.n_head + s.n_kv_head + kvh) * hd + d]};
      };
      auto g = [&](int t, int d) { return double{in.dout[(int64_t{b} * T + t) * OC + h * hd + d]}; };
      for (int t = 0; t < T; ++t) {
        double mx = -INFINITY;
        for (int j = 0; j < T; ++j) {
          double dot = 0;
          for (int d = 0; d < hd; ++d) dot += q(t, d) * k(j, d);
          P[t * T + j] = sees(s, t, j) ? dot * scale : -INFINITY;
          mx = std::max(mx, P[t * T + j]);
        }
        double sum = 0;
        for (int j = 0; j < T; ++j) sum += sees(s, t, j) ? std::exp(P[t * T + j] - mx) : 0.0;
        const double l = mx + std::log(sum);
        lse[(int64_t{b} * s.n_head + h) * T + t] = l;
        for (int j = 0; j < T; ++j) P[t * T + j] = sees(s, t, j) ? std::exp(P[t * T + j] - l) : 0.0;
        for (int d = 0; d < hd; ++d) {
          double o = 0;
          for (int j = 0; j < T; ++j) o += P[t * T + j] * v(j, d);
          out[(int64_t{b} * T + t) * OC + h * hd + d] = o;
        }
        double D = 0;
        for (int j = 0; j < T; ++j) {
          double dp = 0;
          for (int d = 0; d < hd; ++d) dp += g(t, d) * v(j, d);
          dS[t * T + j] = dp;  // dP for now
          D += P[t * T + j] * dp;
        }
        for (int j = 0; j < T; ++j) dS[t * T + j] = P[t * T + j] * (dS[t * T + j] - D);
      }
      for (int t = 0; t < T; ++t)
        for (int d = 0; d < hd; ++d) {
          double dq = 0, dk = 0, dv = 0;
          for (int j = 0; j < T; ++j) dq += dS[t * T + j] * k(j, d);
          for (int i = 0; i < T; ++i) {
            dk += dS[i * T + t] * q(i, d);
            dv += P[i * T + t] * g(i, d);
          }
          const int64_t row = (int64_t{b} * T + t) * W;
          dqkv[row + h * hd + d] = dq * scale;
          dqkv[row + (s.n_head + kvh) * hd + d] += dk * scale;
          dqkv[row + (s.n_head + s.n_kv_head + kvh) * hd + d] += dv;
        }
    }
  Results r;
  r.out.assign(out.begin(), out.end());
  r.lse.assign(lse.begin(), lse.end());
  r.dqkv.assign(dqkv.begin(), dqkv.end());
  return r;
}

// ---- tests that need no GPU ----------------------------------------------------------------------------------------

// Every visible (query, key) pair lies in a tile pair the kernels visit, and every visited tile pair holds at least
// one visible pair (so a window really skips work).
TEST(FlashAttentionTiles, VisitExactlyTheTilesHoldingVisiblePairs) {
  const int tile = flash::kTile;
  for (int T : {1, 2, 63, 64, 65, 130, 257})
    for (int W : {0, 1, 2, 17, 63, 64, 65, 200}) {
      AttnShape s = shape(1, T, 1, 1, 64, W);
      const int nt = (T + tile - 1) / tile;
      // has[qb][kb]: some query of tile qb sees some key of tile kb
      std::vector<std::vector<bool>> has(nt, std::vector<bool>(nt, false));
      for (int t = 0; t < T; ++t)
        for (int j = 0; j < T; ++j)
          if (sees(s, t, j)) has[t / tile][j / tile] = true;
      for (int a = 0; a < nt; ++a) {
        int kf, kl, qf, ql;
        flash::key_tiles_of_query_tile(T, W, a, kf, kl);
        flash::query_tiles_of_key_tile(T, W, a, qf, ql);
        for (int c = 0; c < nt; ++c) {
          EXPECT_EQ(has[a][c], c >= kf && c <= kl)
              << "forward: query tile " << a << " key tile " << c << " T " << T << " W " << W;
          EXPECT_EQ(has[c][a], c >= qf && c <= ql)
              << "backward: key tile " << a << " query tile " << c << " T " << T << " W " << W;
        }
      }
    }
}

// Oracle (b) against oracle (a), so a GPU failure points at the kernel, not at the test's formula.
TEST(FlashAttentionOracle, NaiveDoubleMatchesCpuBackend) {
  for (const AttnShape& s : {shape(2, 37, 4, 2, 64, 0), shape(1, 41, 4, 1, 16, 9)}) {
    const Inputs in = make_inputs(s, 7);
    const Results want = naive(s, in);
    const Results cpu = cpu_forward(s, in);
    expect_close(shape_name(s) + " out", cpu.out, want.out, 1e-4, 1e-5);
    expect_lse_close(shape_name(s) + " lse", cpu.lse, want.lse, 1e-4);
    const std::vector<float> dqkv = cpu_backward(s, in, cpu.out, cpu.lse);
    for (char part : {'q', 'k', 'v'})
      expect_close(shape_name(s) + " d" + part, qkv_part(s, dqkv, part), qkv_part(s, want.dqkv, part), 1e-4, 1e-5);
  }
}

TEST(FlashAttention, RejectsUnsupportedShapesWithAMessage) {
  EXPECT_NE(test::error_of([] {
              flash_attention_forward(nullptr, shape(1, 8, 2, 2, 32, 0), nullptr, nullptr, nullptr);
            }).find("head_dim 32"),
            std::string::npos);
  EXPECT_NE(test::error_of([] {
              flash_attention_backward(nullptr, shape(1, 8, 3, 2, 64, 0), nullptr, nullptr, nullptr, nullptr, nullptr,
                                       nullptr);
            }).find("multiple of n_kv_head"),
            std::string::npos);
  // Shapes are checked before pointers, and a good shape with a null pointer names the pointer.
  EXPECT_NE(test::error_of([] {
              flash_attention_forward(nullptr, shape(1, 8, 2, 2, 64, 0), nullptr, nullptr, nullptr);
            }).find("qkv is null"),
            std::string::npos);
}

// ---- GPU tests -----------------------------------------------------------------------------------------------------

class FlashAttentionVsCpu : public ::testing::TestWithParam<AttnShape> {};

TEST_P(FlashAttentionVsCpu, ForwardAndBackwardMatch) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const AttnShape s = GetParam();
  const Inputs in = make_inputs(s, 1234);
  const Results gpu = run_gpu(s, in);
  const Results cpu = cpu_forward(s, in);
  expect_close("out", gpu.out, cpu.out, kMaxTol, kRmsTol);
  expect_lse_close("lse", gpu.lse, cpu.lse, kLseTol);
  expect_dqkv_close("vs cpu", s, gpu.dqkv, cpu_backward(s, in, gpu.out, gpu.lse));
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashAttentionVsCpu,
                         ::testing::Values(shape(2, 130, 4, 4, 64, 0),    // causal, T not a multiple of the tile
                                           shape(1, 63, 4, 2, 128, 0),    // hd 128, GQA 2:1, one partial tile
                                           shape(2, 1, 4, 2, 64, 0),      // a single token
                                           shape(1, 1, 2, 1, 128, 0),     // a single token, hd 128, MQA
                                           shape(2, 130, 4, 2, 64, 1),    // window 1: each token sees only itself
                                           shape(2, 130, 4, 2, 64, 17),   // window inside a tile
                                           shape(1, 130, 4, 1, 128, 17),  // window, MQA, hd 128
                                           shape(1, 130, 4, 2, 64, 200),  // window >= T: plain causal
                                           shape(1, 257, 4, 1, 64, 64),   // window = the tile, tile boundaries
                                           shape(1, 200, 2, 2, 128, 65),  // window one past the tile
                                           shape(1, 300, 2, 1, 64, 0)),   // several causal tiles, MQA
                         [](const ::testing::TestParamInfo<AttnShape>& i) { return shape_name(i.param); });

class FlashAttentionVsNaive : public ::testing::TestWithParam<AttnShape> {};

TEST_P(FlashAttentionVsNaive, ForwardAndBackwardMatch) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const AttnShape s = GetParam();
  const Inputs in = make_inputs(s, 99);
  const Results gpu = run_gpu(s, in);
  const Results want = naive(s, in);
  expect_close("out", gpu.out, want.out, kMaxTol, kRmsTol);
  expect_lse_close("lse", gpu.lse, want.lse, kLseTol);
  expect_dqkv_close("vs naive", s, gpu.dqkv, want.dqkv);
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashAttentionVsNaive,
                         ::testing::Values(shape(1, 70, 4, 2, 64, 0), shape(1, 70, 4, 2, 64, 17),
                                           shape(2, 33, 2, 1, 128, 0), shape(1, 66, 2, 2, 128, 5)),
                         [](const ::testing::TestParamInfo<AttnShape>& i) { return shape_name(i.param); });

// Deterministic mode (train.deterministic): dq from a pass of its own, without atomics. It matches the naive
// oracle within the same bounds as the default path, two runs give bit-identical dqkv, and dk, dv (the same kernel
// in both modes) are bit-identical to the default path's. Several key tiles per query tile (T = 300) make the order
// of dq's adds matter.
class FlashAttentionDeterministic : public ::testing::TestWithParam<AttnShape> {};

TEST_P(FlashAttentionDeterministic, DqMatchesTheOracleAndRunsAreBitIdentical) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const AttnShape s = GetParam();
  const Inputs in = make_inputs(s, 77);
  const Results a = run_gpu(s, in, true), b = run_gpu(s, in, true), fast = run_gpu(s, in, false);
  const Results want = naive(s, in);
  expect_close("out", a.out, want.out, kMaxTol, kRmsTol);
  expect_dqkv_close("deterministic vs naive", s, a.dqkv, want.dqkv);
  EXPECT_EQ(a.dqkv, b.dqkv) << "two deterministic backward passes differ";
  for (char part : {'k', 'v'}) EXPECT_EQ(qkv_part(s, a.dqkv, part), qkv_part(s, fast.dqkv, part)) << part;
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashAttentionDeterministic,
                         ::testing::Values(shape(1, 70, 4, 2, 64, 0), shape(1, 66, 2, 2, 128, 5),
                                           shape(2, 300, 4, 2, 64, 0), shape(1, 300, 2, 1, 128, 0),
                                           shape(1, 257, 4, 1, 64, 64)),
                         [](const ::testing::TestParamInfo<AttnShape>& i) { return shape_name(i.param); });

// A window covering the whole sequence visits the same tiles with the same mask: bit-identical forward results.
TEST(FlashAttention, WindowCoveringTheSequenceIsCausal) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const AttnShape causal = shape(1, 150, 2, 1, 64, 0), wide = shape(1, 150, 2, 1, 64, 150);
  const Inputs in = make_inputs(causal, 5);
  const Results a = run_gpu(causal, in), b = run_gpu(wide, in);
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.lse, b.lse);
}

}  // namespace
}  // namespace mt
