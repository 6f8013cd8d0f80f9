#!/usr/bin/env bash
# `megatrain --version` and `megatrain version` against git and the binary's own libraries: both spellings print the
# same text; the commit is the checkout's HEAD (git rev-parse, the oracle; "-dirty" when tracked files differ), the
# version the one CMakeLists.txt declares, and every line a bug report needs is there; an argument is refused.
bin=$1 src=$2
source "$(dirname "$0")/check_lib.sh"
"$bin" --version >"$tmp/a" || fail "megatrain --version exited $?"
"$bin" version >"$tmp/b" || fail "megatrain version exited $?"
cmp -s "$tmp/a" "$tmp/b" || fail "--version and version differ: $(diff "$tmp/a" "$tmp/b")"
want=$(sed -n 's/^project(megatrain VERSION \([0-9.]*\) .*/\1/p' "$src/CMakeLists.txt")
[ "$(head -1 "$tmp/a")" = "megatrain $want" ] || fail "first line '$(head -1 "$tmp/a")', not 'megatrain $want'"
for field in commit build BLAS CUDA NCCL; do
  grep -q "^$field: \+[^ ]" "$tmp/a" || fail "no $field line in: $(cat "$tmp/a")"
done
grep -q "^BLAS: .*OpenBLAS" "$tmp/a" || fail "the BLAS line names no OpenBLAS: $(grep BLAS "$tmp/a")"
if head=$(git -C "$src" rev-parse --short=12 HEAD 2>/dev/null); then
  # Built from this checkout: the commit printed is HEAD at build time, which is HEAD now unless a commit came after
  # the build (then the binary is stale, and so is this check's premise).
  grep -q "^commit: \+$head\(-dirty\)\?$" "$tmp/a" || fail "commit line '$(grep commit "$tmp/a")', HEAD is $head"
fi
if "$bin" version --bogus >"$tmp/c" 2>&1; then fail "megatrain version --bogus succeeded"; fi
grep -q "unexpected argument '--bogus'" "$tmp/c" || fail "no clear error for an argument: $(cat "$tmp/c")"
echo "version check: ok"
