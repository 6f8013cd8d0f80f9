# libFuzzer targets (tests/fuzz/): the parsers of untrusted files built with clang, AddressSanitizer and UBSan in a
# tree of their own (build/fuzz), configured and built as part of the main build so `make test` needs no extra step.
# Each target gets two tests, labelled `fuzz`: a regression run over its committed corpus (every seed and every past
# crash input once) and a short fuzzing run (MT_FUZZ_SECONDS, 5 s by default: the CI budget) on a copy of that corpus.
option(MEGATRAIN_FUZZ "Build the libFuzzer targets (tests/fuzz: clang, ASan, UBSan) and run them in ctest" ON)
set(MT_FUZZ_SECONDS 5 CACHE STRING "Seconds of fuzzing per target in ctest (the environment's MT_FUZZ_SECONDS wins)")
set(MT_FUZZ_OPT -O0 CACHE STRING "Optimisation of the fuzz targets: -O0 builds fastest (make test), -O1 fuzzes faster")
if(NOT MEGATRAIN_FUZZ)
  return()
endif()

# A clang that can link a libFuzzer target with both sanitizers (Debian: clang and libclang-rt-<N>-dev, which
# scripts/setup installs). Probed once per compiler; without one the fuzz tests are left out, with a warning.
find_program(MT_FUZZ_CXX NAMES clang++ clang++-19 clang++-18 clang++-17 clang++-16 clang++-15 clang++-14)
if(MT_FUZZ_CXX AND NOT MT_FUZZ_PROBED STREQUAL MT_FUZZ_CXX)
  set(_probe ${CMAKE_BINARY_DIR}/fuzz-probe)
  file(WRITE ${_probe}/probe.cpp "#include <cstddef>\n#include <cstdint>\n"
       "extern \"C\" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n")
  execute_process(COMMAND ${MT_FUZZ_CXX} -fsanitize=fuzzer,address,undefined ${_probe}/probe.cpp -o ${_probe}/probe
                  RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_VARIABLE _err)
  if(_rc EQUAL 0)
    set(MT_FUZZ_OK ON CACHE INTERNAL "")
  else()
    set(MT_FUZZ_OK OFF CACHE INTERNAL "")
    message(WARNING "Fuzz targets: ${MT_FUZZ_CXX} cannot link -fsanitize=fuzzer,address,undefined (run scripts/setup "
                    "for libclang-rt-dev):\n${_err}")
  endif()
  set(MT_FUZZ_PROBED ${MT_FUZZ_CXX} CACHE INTERNAL "")
endif()
if(NOT MT_FUZZ_CXX OR NOT MT_FUZZ_OK)
  message(WARNING "Fuzz targets: off (no clang++ with libFuzzer; run scripts/setup). The fuzz tests are left out.")
  return()
endif()
message(STATUS "Fuzz targets: ${MT_FUZZ_CXX} with ASan + UBSan, ${MT_FUZZ_SECONDS} s each in ctest")

include(ExternalProject)
ExternalProject_Add(mt_fuzz_targets
  SOURCE_DIR ${CMAKE_SOURCE_DIR}/tests/fuzz
  BINARY_DIR ${CMAKE_BINARY_DIR}/fuzz
  STAMP_DIR ${CMAKE_BINARY_DIR}/fuzz/stamp  # inside it: deleting build/fuzz rebuilds it from scratch
  TMP_DIR ${CMAKE_BINARY_DIR}/fuzz/tmp
  CMAKE_ARGS -DCMAKE_CXX_COMPILER=${MT_FUZZ_CXX} -DMT_DEPS_ROOT=${MT_DEPS_ROOT} -DMEGATRAIN_UNITY=${MEGATRAIN_UNITY}
             -DMT_FUZZ_OPT=${MT_FUZZ_OPT}
             -DCMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER}
  BUILD_ALWAYS ON      # the sub-build decides what is out of date (sources live outside its tree)
  INSTALL_COMMAND "")
add_dependencies(mt_tests mt_fuzz_targets)

include(${CMAKE_SOURCE_DIR}/tests/fuzz/targets.cmake)
set(_run ${CMAKE_SOURCE_DIR}/tests/fuzz/run_fuzz.sh)
foreach(t ${MT_FUZZ_TARGETS})
  set(_bin ${CMAKE_BINARY_DIR}/fuzz/fuzz_${t})
  set(_corpus ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/${t})
  set(_work ${CMAKE_BINARY_DIR}/fuzz/runs/${t})
  add_test(NAME fuzz_${t}_regress COMMAND bash ${_run} regress ${_bin} ${_corpus} ${_work}-regress)
  add_test(NAME fuzz_${t} COMMAND bash ${_run} fuzz ${_bin} ${_corpus} ${_work} ${MT_FUZZ_SECONDS})
  set_tests_properties(fuzz_${t}_regress fuzz_${t} PROPERTIES LABELS fuzz)
endforeach()
