# cmake -DSRC=<checkout> -DOUT=<file.cpp> -P build_commit.cmake: writes OUT, a source defining mt::build_commit(),
# the checkout's git commit ("-dirty" when tracked files differ from it). Run at every build (the mt_build_commit
# target), it rewrites OUT only when the text changes, so an unchanged commit recompiles nothing.
execute_process(COMMAND git -C ${SRC} rev-parse --short=12 HEAD OUTPUT_VARIABLE commit RESULT_VARIABLE rc
                OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT rc EQUAL 0)
  set(commit "unknown (not built from a git checkout)")
else()
  execute_process(COMMAND git -C ${SRC} status --porcelain --untracked-files=no OUTPUT_VARIABLE changes
                  ERROR_QUIET)
  if(changes)
    string(APPEND commit "-dirty")
  endif()
endif()
file(WRITE ${OUT}.tmp "// Written by cmake/build_commit.cmake at build time.\n#include <string>\n\nnamespace mt {\n\n"
     "std::string build_commit() { return \"${commit}\"; }\n\n}  // namespace mt\n")
execute_process(COMMAND ${CMAKE_COMMAND} -E copy_if_different ${OUT}.tmp ${OUT})
file(REMOVE ${OUT}.tmp)
