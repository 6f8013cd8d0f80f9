#include "megatrain/cli/commands.h"
#include "megatrain/core/error.h"

namespace mt::cli {

int cmd_train(int, char**) { fail("not implemented yet"); }

}  // namespace mt::cli
