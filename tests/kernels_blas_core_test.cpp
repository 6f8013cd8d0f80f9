// The OpenBLAS core choice (kernels/cpu/blas_core_choice.h) as a function of its facts, against the protocol its
// header states: the user's OPENBLAS_CORETYPE is kept, a recognised core changes nothing, a fallback core on a CPU
// that can run better kernels gets the best candidate whose self-test passed, a failed self-test skips a candidate.
// And the self-test itself (kernels/cpu/blas_probe.h) passes on the kernels this process loaded (it also runs
// under the other core types, tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "megatrain/kernels/cpu/blas_core_choice.h"
#include "megatrain/kernels/cpu/blas_probe.h"

using namespace mt;

namespace {

CpuFeatures avx512_cpu(bool amd = false) {
  CpuFeatures c;
  c.amd = amd;
  c.avx = c.avx2 = c.fma = true;
  c.avx512f = c.avx512cd = c.avx512bw = c.avx512dq = c.avx512vl = true;
  return c;
}

BlasCoreInputs fallback_on(const CpuFeatures& cpu) {
  BlasCoreInputs in;
  in.reported = "Prescott";
  in.cpu = cpu;
  return in;
}

}  // namespace

TEST(BlasCoreCandidates, BestFirstAndOnlyWhatTheCpuCanExecute) {
  EXPECT_EQ(blas_core_candidates(avx512_cpu()),
            (std::vector<std::string>{"SkylakeX", "Haswell", "Zen", "Sandybridge"}));
  EXPECT_EQ(blas_core_candidates(avx512_cpu(/*amd=*/true)),
            (std::vector<std::string>{"SkylakeX", "Zen", "Haswell", "Sandybridge"}));
  CpuFeatures no_bw = avx512_cpu();
  no_bw.avx512bw = false;  // AVX-512 F without BW (Knights Landing): not SkylakeX's
  EXPECT_EQ(blas_core_candidates(no_bw), (std::vector<std::string>{"Haswell", "Zen", "Sandybridge"}));
  CpuFeatures avx;
  avx.avx = true;
  EXPECT_EQ(blas_core_candidates(avx), std::vector<std::string>{"Sandybridge"});
  EXPECT_TRUE(blas_core_candidates(CpuFeatures{}).empty());
}

TEST(BlasCoreNames, FallbackAndKnownCoresCaseInsensitively) {
  EXPECT_TRUE(is_blas_fallback_core("Prescott"));
  EXPECT_TRUE(is_blas_fallback_core("NEHALEM"));
  EXPECT_FALSE(is_blas_fallback_core("Haswell"));
  EXPECT_FALSE(is_blas_fallback_core("SkylakeX"));
  EXPECT_TRUE(is_known_blas_core("skylakex"));
  EXPECT_TRUE(is_known_blas_core("Zen"));
  EXPECT_FALSE(is_known_blas_core("Skylake"));
  EXPECT_FALSE(is_known_blas_core(""));
}

TEST(BlasCoreDecision, TheUsersChoiceIsKeptEvenAFallbackCore) {
  BlasCoreInputs in = fallback_on(avx512_cpu());
  in.user_set = true;
  in.user_coretype = "Prescott";
  const BlasCoreDecision d = decide_blas_core(in);
  EXPECT_EQ(d.action, BlasCoreAction::Keep);
  EXPECT_EQ(d.reason, "OPENBLAS_CORETYPE=Prescott set by the user");
  EXPECT_EQ(d.warning, "");
}

TEST(BlasCoreDecision, AnUnknownUserCoreNameIsKeptWithAWarningNamingIt) {
  BlasCoreInputs in = fallback_on(avx512_cpu());
  in.user_set = true;
  in.user_coretype = "Skylake";
  const BlasCoreDecision d = decide_blas_core(in);
  EXPECT_EQ(d.action, BlasCoreAction::Keep);
  EXPECT_NE(d.warning.find("OPENBLAS_CORETYPE=Skylake is not a core name"), std::string::npos) << d.warning;
  EXPECT_NE(d.reason.find("not a core name OpenBLAS knows"), std::string::npos) << d.reason;
}

TEST(BlasCoreDecision, ARecognisedCoreChangesNothingAndRunsNoSelfTest) {
  for (const char* core : {"Haswell", "Zen", "SkylakeX", "Sandybridge"}) {
    BlasCoreInputs in = fallback_on(avx512_cpu());
    in.reported = core;
    const BlasCoreDecision d = decide_blas_core(in);
    EXPECT_EQ(d.action, BlasCoreAction::Keep) << core;
    EXPECT_EQ(d.reason, "OpenBLAS's choice for this CPU") << core;
  }
}

TEST(BlasCoreDecision, AFallbackOnACapableCpuAsksForTheBestCandidatesSelfTestFirst) {
  const BlasCoreDecision d = decide_blas_core(fallback_on(avx512_cpu()));
  EXPECT_EQ(d.action, BlasCoreAction::Test);
  EXPECT_EQ(d.core, "SkylakeX");
}

TEST(BlasCoreDecision, AFallbackOnACapableCpuUsesTheBestPassingCandidate) {
  BlasCoreInputs in = fallback_on(avx512_cpu());
  in.tests["SkylakeX"] = BlasSelfTest::Passed;
  const BlasCoreDecision d = decide_blas_core(in);
  EXPECT_EQ(d.action, BlasCoreAction::Use);
  EXPECT_EQ(d.core, "SkylakeX");
  EXPECT_EQ(d.reason, "OpenBLAS fell back to Prescott on a CPU with AVX-512; SkylakeX passed the self-test");
}

TEST(BlasCoreDecision, AFailedSelfTestSkipsTheCandidate) {
  BlasCoreInputs in = fallback_on(avx512_cpu(/*amd=*/true));
  in.tests["SkylakeX"] = BlasSelfTest::Failed;
  BlasCoreDecision d = decide_blas_core(in);
  EXPECT_EQ(d.action, BlasCoreAction::Test);
  EXPECT_EQ(d.core, "Zen");  // the next on an AMD CPU
  in.tests["Zen"] = BlasSelfTest::Passed;
  in.tests["Haswell"] = BlasSelfTest::Passed;  // passed too, but Zen comes first here
  d = decide_blas_core(in);
  EXPECT_EQ(d.action, BlasCoreAction::Use);
  EXPECT_EQ(d.core, "Zen");
  EXPECT_NE(d.reason.find("(SkylakeX failed it)"), std::string::npos) << d.reason;
}

TEST(BlasCoreDecision, EveryCandidateFailingKeepsTheFallbackSayingWhy) {
  BlasCoreInputs in = fallback_on(avx512_cpu());
  for (const std::string& c : blas_core_candidates(in.cpu)) in.tests[c] = BlasSelfTest::Failed;
  const BlasCoreDecision d = decide_blas_core(in);
  EXPECT_EQ(d.action, BlasCoreAction::Keep);
  EXPECT_NE(d.reason.find("every better core failed the self-test (SkylakeX, Haswell, Zen, Sandybridge)"),
            std::string::npos)
      << d.reason;
}

TEST(BlasCoreDecision, AFallbackOnACpuWithoutAvxIsKept) {
  const BlasCoreDecision d = decide_blas_core(fallback_on(CpuFeatures{}));
  EXPECT_EQ(d.action, BlasCoreAction::Keep);
}

TEST(BlasCoreNote, GivesItsReasonOnlyUnderTheCoreItNames) {
  EXPECT_EQ(blas_core_note_reason(blas_core_note("SkylakeX", "why"), "SkylakeX"), "why");
  EXPECT_EQ(blas_core_note_reason(blas_core_note("SkylakeX", "why"), "Haswell"), "");  // the user changed it since
  EXPECT_EQ(blas_core_note_reason(blas_core_note("", "kept"), ""), "kept");
  EXPECT_EQ(blas_core_note_reason(blas_core_note("", "kept"), "Zen"), "");
  EXPECT_EQ(blas_core_note_reason("no bar", ""), "");
}

TEST(BlasSelfTest, TheKernelsLoadedAgreeWithTheNaiveGemm) {
  std::string why;
  EXPECT_TRUE(blas_self_test(&why)) << blas_core_name() << ": " << why;
}

namespace {

// A naive row-major sgemm in float, written here: the independent kernel the check must accept.
void naive_sgemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
                 float beta, float* c, int ldc) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      float s = 0;
      for (int l = 0; l < k; ++l) s += (ta ? a[l * lda + i] : a[i * lda + l]) * (tb ? b[j * ldb + l] : b[l * ldb + j]);
      c[i * ldc + j] = alpha * s + beta * c[i * ldc + j];
    }
}

}  // namespace

TEST(BlasSelfTest, TheCheckAcceptsANaiveGemmAndRejectsOneWrongElementOrAnIgnoredBeta) {
  std::string why;
  EXPECT_TRUE(sgemm_self_test(naive_sgemm, &why)) << why;
  // Right everywhere but C[2][3] of the large cases, off by 1e-3 of the result's scale.
  const SgemmFn one_wrong = [](bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
                               const float* b, int ldb, float beta, float* c, int ldc) {
    naive_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    if (m > 2 && n > 3 && k > 100) c[2 * ldc + 3] += 1e-3f * float(k);
  };
  EXPECT_FALSE(sgemm_self_test(one_wrong, &why));
  EXPECT_NE(why.find("C[2][3]"), std::string::npos) << why;
  const SgemmFn ignores_beta = [](bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
                                  const float* b, int ldb, float, float* c,
                                  int ldc) { naive_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, 0.0f, c, ldc); };
  EXPECT_FALSE(sgemm_self_test(ignores_beta, &why));
}
