// Which OpenBLAS kernel set ("core type") a process should run, decided from facts alone: the core OpenBLAS picked,
// the CPU's instruction sets, the user's OPENBLAS_CORETYPE and the candidates' self-test results. No process, no
// environment, no OpenBLAS call here (launch/blas_core.h gathers the facts and runs the self-tests; cli/ re-executes
// `megatrain train`), so every case is tested as a function.
//
// Why: Debian's OpenBLAS 0.3.21 (DYNAMIC_ARCH) does not know every processor. On one it does not know it falls back
// to its generic Prescott kernels (SSE3) without a word, even on a CPU with AVX-512: sgemm measured 30 GFLOP/s there
// against 209-262 GFLOP/s with OPENBLAS_CORETYPE=SkylakeX. And some OpenBLAS builds compute wrong results with some
// kernels on some processors, so a better core is used only after it passed a numerical self-test (a GEMM against a
// naive one) in a process of its own, where OPENBLAS_CORETYPE can still take effect (OpenBLAS reads it when it loads).
//
// The protocol (decide_blas_core), in order:
//   1. OPENBLAS_CORETYPE set by the user: kept, always (an unknown name is kept too, with a warning saying so).
//   2. A core OpenBLAS recognised (any core with AVX kernels or better): kept; OpenBLAS knows the processor.
//   3. A fallback core (a pre-AVX one: Prescott, Core2, Nehalem, ...) on a CPU whose instruction sets allow better:
//      the candidates, best first, are tried in order: the first without a result is asked for (action Test), a
//      failed one is skipped, the first that passed is used (action Use). None left: kept, saying why.
// The process that applies a Use sets OPENBLAS_CORETYPE and kBlasCoreNoteEnv ("<core>|<reason>") for the processes
// it starts; a process that finds kBlasCoreNoteEnv naming the OPENBLAS_CORETYPE it runs under decides nothing again.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace mt {

// What a process set OPENBLAS_CORETYPE to and why, "<core>|<reason>" (core empty: none set; OpenBLAS's own choice).
inline constexpr const char* kBlasCoreNoteEnv = "MEGATRAIN_BLAS_CORE";

// The instruction sets that decide which OpenBLAS kernels a CPU can execute (as the OS enables them: libgcc's
// __builtin_cpu_supports checks XCR0 for the AVX and AVX-512 state).
struct CpuFeatures {
  bool amd = false;  // the vendor: Zen's kernels are tuned for AMD's caches, Haswell's for Intel's
  bool avx = false, avx2 = false, fma = false;
  bool avx512f = false, avx512cd = false, avx512bw = false, avx512dq = false, avx512vl = false;
};

// The core types worth trying on this CPU instead of a fallback, best first: SkylakeX (AVX-512 F/CD/BW/DQ/VL),
// then Zen and Haswell (AVX2 + FMA; Zen first on AMD), then Sandybridge (AVX). Empty without AVX.
std::vector<std::string> blas_core_candidates(const CpuFeatures& cpu);

// A pre-AVX core OpenBLAS falls back to when it does not know the processor (case-insensitive).
bool is_blas_fallback_core(const std::string& name);

// A name OpenBLAS 0.3.21's x86-64 OPENBLAS_CORETYPE accepts (case-insensitive): its dynamic.c table.
bool is_known_blas_core(const std::string& name);

enum class BlasSelfTest { Passed, Failed };

struct BlasCoreInputs {
  std::string reported;  // openblas_get_corename() of a process without OPENBLAS_CORETYPE set by us
  CpuFeatures cpu;
  bool user_set = false;  // OPENBLAS_CORETYPE was in the environment, set by the user
  std::string user_coretype;
  std::map<std::string, BlasSelfTest> tests;  // the self-tests run so far, by candidate
};

enum class BlasCoreAction {
  Keep,  // change nothing
  Test,  // run the self-test of `core` and decide again with its result
  Use,   // run under OPENBLAS_CORETYPE=core
};

struct BlasCoreDecision {
  BlasCoreAction action = BlasCoreAction::Keep;
  std::string core;     // Test, Use: the candidate
  std::string reason;   // for the run's first line, e.g. "OpenBLAS fell back to Prescott on a CPU with AVX-512; ..."
  std::string warning;  // for stderr: a user's OPENBLAS_CORETYPE that OpenBLAS does not know ("" when none)
};

BlasCoreDecision decide_blas_core(const BlasCoreInputs& in);

// kBlasCoreNoteEnv's value for a decision (Keep: core is the OPENBLAS_CORETYPE in effect, "" when none), and back:
// the reason a note gives when its core is the OPENBLAS_CORETYPE in effect (`coretype`, "" when unset), else "".
std::string blas_core_note(const std::string& core, const std::string& reason);
std::string blas_core_note_reason(const std::string& note, const std::string& coretype);

}  // namespace mt
