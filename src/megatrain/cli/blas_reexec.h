// `megatrain train` run directly (no launcher to choose for it): the OpenBLAS core choice of launch/blas_core.h
// applied to this very process by re-executing it once with OPENBLAS_CORETYPE set, as OpenBLAS reads the variable
// only when it loads. The kBlasCoreNoteEnv set with it makes the new image decide nothing again (no loop); a run
// that keeps its core gets the note too, so the first line can say why.
#pragma once

namespace mt::cli {

// argv: the subcommand's (argv[0] = "train"). Returns when the core stays; else does not return (execv).
void apply_blas_core(int argc, char** argv);

}  // namespace mt::cli
