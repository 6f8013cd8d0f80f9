// gemm_reruns_safely (kernels/cuda/gemm.h): which cuBLASLt calls GEMM tuning may run several times. Pure arithmetic
// on the pointers and layouts of an LtCall, so it needs the CUDA headers but no device (label `unit`). The oracle is
// the definition: a call reruns safely when no byte it writes is a byte it reads; each case places one matrix so
// that it does or does not share bytes with another, by one element.
#include <gtest/gtest.h>

#include <cstdint>

#include "megatrain/kernels/cuda/gemm.h"

namespace mt {
namespace {

// Fake device addresses: only their arithmetic matters.
void* at(uintptr_t a) { return reinterpret_cast<void*>(a); }

// A forward-shaped call: D[m=64, n=32] (bf16, ld 64) = op(A)[64, k=16] @ B[16, 32], A stored [16, 64] with op T.
// A spans 0x10000 + [0, 16*64*2), B 0x20000 + [0, 16*32*2), D 0x30000 + [0, 64*32*2).
LtCall forward() {
  LtCall c;
  c.trans_a = CUBLAS_OP_T;
  c.m = 64, c.n = 32, c.k = 16;
  c.A = at(0x10000), c.lda = 16;
  c.B = at(0x20000), c.ldb = 16;
  c.D = at(0x30000), c.ldd = 64;
  return c;
}

TEST(GemmRerunsSafely, AnOverwritingGemmOfSeparateMatricesDoes) { EXPECT_TRUE(gemm_reruns_safely(forward())); }

TEST(GemmRerunsSafely, AccumulatingIntoDDoesNot) {
  LtCall c = forward();
  c.beta = 1;  // C unset: D is read and written
  EXPECT_FALSE(gemm_reruns_safely(c));
  c.C = c.D;  // the same, said explicitly
  EXPECT_FALSE(gemm_reruns_safely(c));
  c.C = at(0x40000);  // the residual read from elsewhere: each run writes the same D
  EXPECT_TRUE(gemm_reruns_safely(c));
}

TEST(GemmRerunsSafely, ACThatSharesOneElementWithDDoesNot) {
  LtCall c = forward();
  c.beta = 1;
  const uintptr_t d_bytes = 64 * 32 * 2;
  c.C = at(0x30000 + d_bytes - 2);  // C's first element is D's last
  EXPECT_FALSE(gemm_reruns_safely(c));
  c.C = at(0x30000 + d_bytes);  // right after D
  EXPECT_TRUE(gemm_reruns_safely(c));
}

TEST(GemmRerunsSafely, DOverAnInputDoesNot) {
  LtCall c = forward();
  const uintptr_t a_bytes = 16 * 64 * 2;
  c.D = at(0x10000 + a_bytes - 2);  // D starts on A's last element
  EXPECT_FALSE(gemm_reruns_safely(c));
  c.D = at(0x10000 + a_bytes);
  EXPECT_TRUE(gemm_reruns_safely(c));
  c.D = at(0x20000 - 64 * 32 * 2 + 2);  // D ends one element into B
  EXPECT_FALSE(gemm_reruns_safely(c));
}

TEST(GemmRerunsSafely, TheLeadingDimensionSetsTheSpan) {
  // D with ld 128 spans (32 - 1) * 128 + 64 elements, not 64 * 32: a C placed after 64 * 32 elements overlaps.
  LtCall c = forward();
  c.ldd = 128;
  c.beta = 1;
  c.C = at(0x30000 + 64 * 32 * 2);
  EXPECT_FALSE(gemm_reruns_safely(c));
  c.C = at(0x30000 + ((32 - 1) * 128 + 64) * 2);
  EXPECT_TRUE(gemm_reruns_safely(c));
}

TEST(GemmRerunsSafely, TheAuxIsAnOutputOfGeluAuxAndAnInputOfDgelu) {
  LtCall c = forward();
  c.aux = at(0x30000), c.aux_ld = 64;  // aux on D
  c.epilogue = CUBLASLT_EPILOGUE_GELU_AUX;
  EXPECT_TRUE(gemm_reruns_safely(c)) << "two outputs on each other: rewritten alike on every run";
  c.aux = at(0x20000);  // aux on B: the epilogue writes what the GEMM reads
  EXPECT_FALSE(gemm_reruns_safely(c));
  c.epilogue = CUBLASLT_EPILOGUE_DGELU;  // now aux is read: reading B's bytes twice is harmless
  EXPECT_TRUE(gemm_reruns_safely(c));
  c.aux = at(0x30000);  // DGELU reading what D overwrites (dpre in place over pre)
  EXPECT_FALSE(gemm_reruns_safely(c));
}

TEST(GemmRerunsSafely, BiasIsReadBiasOutIsWritten) {
  LtCall c = forward();
  c.epilogue = CUBLASLT_EPILOGUE_BIAS;
  c.bias = at(0x30000);  // the bias vector inside D
  EXPECT_FALSE(gemm_reruns_safely(c));
  c.bias = at(0x50000);
  EXPECT_TRUE(gemm_reruns_safely(c));
  LtCall g = forward();  // BGRADB writes n = 32 sums of D's type
  g.epilogue = CUBLASLT_EPILOGUE_BGRADB;
  g.bias_out = at(0x20000 - 32 * 2 + 2);  // its last element on B's first
  EXPECT_FALSE(gemm_reruns_safely(g));
  g.bias_out = at(0x20000 - 32 * 2);
  EXPECT_TRUE(gemm_reruns_safely(g));
}

}  // namespace
}  // namespace mt
