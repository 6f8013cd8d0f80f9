// Applying kernels/cpu/blas_core_choice.h to the processes megatrain starts: the launcher's ranks (agent.cpp adds
// blas_core_env() to each rank's environment) and `megatrain train` run directly (cli/ re-executes itself once
// with it). OpenBLAS reads OPENBLAS_CORETYPE when it loads, so a core can only be chosen for a process not yet
// started: each candidate's self-test runs as `<this binary> __blas-selftest` with OPENBLAS_CORETYPE=<candidate>,
// and the choice goes to the children (or the re-executed image) through their environment.
//
// Invariants: a user's OPENBLAS_CORETYPE is never replaced; a process whose environment holds a kBlasCoreNoteEnv
// naming the OPENBLAS_CORETYPE it runs under (a parent decided) decides nothing again, so a re-exec cannot loop and
// ranks do not rerun the self-tests. The self-tests run only when OpenBLAS fell back to a pre-AVX core: a
// recognised CPU costs one openblas_get_corename() call.
#pragma once
#include <string>
#include <vector>

#include "megatrain/kernels/cpu/blas_core_choice.h"

namespace mt::launch {

// The hidden subcommand a candidate's self-test runs as (cli/main.cpp): exit 0 when this process's kernels are
// OPENBLAS_CORETYPE's and pass blas_self_test, else 1 with the reason on stdout.
inline constexpr const char* kBlasSelfTestCommand = "__blas-selftest";
// Test-only: the core name to take as OpenBLAS's report instead of openblas_get_corename(), so a test can make a
// recognised CPU look like a fallback one ("Prescott").
inline constexpr const char* kBlasTestCorenameEnv = "MEGATRAIN_TEST_BLAS_CORENAME";

// True when a parent already decided for this process (kBlasCoreNoteEnv names the OPENBLAS_CORETYPE in effect).
bool blas_core_decided();

// Decides for this CPU, running the candidates' self-tests (children of this process) as the decision asks.
// A warning (a user's unknown OPENBLAS_CORETYPE) goes to stderr.
BlasCoreDecision choose_blas_core();

// "OPENBLAS_CORETYPE=<core>" (for a Use) and "MEGATRAIN_BLAS_CORE=<note>": the entries the processes started next
// get, so they run the chosen core and say why.
std::vector<std::string> blas_core_env(const BlasCoreDecision& d);

// The hidden subcommand's body: 0 when the kernels loaded are OPENBLAS_CORETYPE's and pass the self-test.
int run_blas_self_test();

}  // namespace mt::launch
