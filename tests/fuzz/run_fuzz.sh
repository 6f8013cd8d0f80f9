#!/usr/bin/env bash
# Runs one libFuzzer target the way ctest does (tests/fuzz.cmake), or for longer by hand (tests/README.md, "Fuzzing"):
#   run_fuzz.sh regress BINARY CORPUS_DIR WORK_DIR            each committed input once (regression inputs included)
#   run_fuzz.sh fuzz    BINARY CORPUS_DIR WORK_DIR [SECONDS]  fuzz for $MT_FUZZ_SECONDS if set, else SECONDS, else 30
# Fuzzing works on a copy of the corpus in WORK_DIR/corpus (the committed corpus never grows); a finding is saved as
# WORK_DIR/crash-*, leak-*, timeout-* or oom-*, and the run fails.
set -euo pipefail
mode=$1 bin=$2 corpus=$3 work=$4
seconds=${MT_FUZZ_SECONDS:-${5:-30}}
# Per input: 10 s is ~1000x a typical input's time under the sanitizers; 2 GiB bounds memory (and single allocations).
limits=(-timeout=10 -rss_limit_mb=2048)
dict=(-dict="$(dirname "$0")/numbers.dict")
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}

[ -x "$bin" ] || { echo "run_fuzz: $bin is missing (build the fuzz targets: cmake --build build)"; exit 1; }
rm -rf "$work"
mkdir -p "$work/corpus"
export TMPDIR=$work  # the targets' scratch files (left behind when a finding aborts a run) stay in the work folder
case $mode in
  regress)
    inputs=("$corpus"/*)
    [ -e "${inputs[0]}" ] || { echo "run_fuzz: no inputs in $corpus"; exit 1; }
    "$bin" "${limits[@]}" -artifact_prefix="$work/" "${inputs[@]}" && exit 0 ;;
  fuzz)
    cp "$corpus"/* "$work/corpus/"
    "$bin" "${limits[@]}" "${dict[@]}" -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$work/" \
      "$work/corpus" && exit 0 ;;
  *) echo "run_fuzz: unknown mode '$mode' (regress | fuzz)"; exit 2 ;;
esac
echo
echo "run_fuzz: FINDING in $(basename "$bin"); the input is in $work/ (crash-*, leak-*, timeout-*, oom-*)."
echo "  Reproduce:  $bin $work/<file>"
echo "  Once fixed, keep it as a regression input:  cp $work/<file> $corpus/regress-<what-it-tests>"
exit 1
