#!/usr/bin/env bash
# ctest: scripts/gpu_check's stage machinery, rehearsed where there is no GPU (DRY_ARCH): the probe stage (which
# needs no build) runs, an unknown stage fails the run, and the summary and the archive of the logs come back in
# $OUT, as a device call would return them. The build and test stages need the GPU machine.
set -uo pipefail
root=$1
out=$(mktemp -d)
build=$(mktemp -d)
trap 'rm -rf "$out" "$build"' EXIT
if OUT=$out BUILD=$build DRY_ARCH=90a STAGES="probe nosuchstage" "$root/scripts/gpu_check" >/dev/null 2>&1; then
  echo "FAIL: an unknown stage did not fail the run"; exit 1
fi
fail() { echo "FAIL: $1"; cat "$out/summary.txt" 2>/dev/null; exit 1; }
grep -q "probe: exit 0" "$out/summary.txt" || fail "no 'probe: exit 0' line in the summary"
grep -q "unknown stage 'nosuchstage'" "$out/summary.txt" || fail "the unknown stage is not named in the summary"
tar -tzf "$out/gpu_check.tgz" | grep -q "probe.log" || fail "probe.log is not in gpu_check.tgz"
tar -xzOf "$out/gpu_check.tgz" ./probe.log | grep -q "cmake --version" || fail "probe.log does not hold the probe's commands"
echo "gpu_check rehearsal: ok"
