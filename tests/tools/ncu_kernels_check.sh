#!/usr/bin/env bash
# bench/ncu_kernels.py against a hand-written Nsight Compute CSV log with a known answer: ncu's own lines are
# skipped, durations in ns and us are converted, launches of one kernel and shape are summed and divided by --steps,
# names lose return type, namespaces and parameters, and a log without duration rows is an error.
src=$1
source "$(dirname "$0")/check_lib.sh"
cat >"$tmp/k.csv" <<'CSV'
==PROF== Connected to process 1
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1","b","h","void cuda::<unnamed>::norm_backward_kernel<0>(cuda::NormBackwardArgs, float *, long)","1","13","(256, 1, 1)","(512, 1, 1)","0","9.0","m","gpu__time_duration.sum","ns","1,000,000"
"1","1","b","h","nvjet_gemm_NTT","1","13","(384, 1, 1)","(2, 66, 1)","0","9.0","m","gpu__time_duration.sum","us","500"
"2","1","b","h","void cuda::<unnamed>::norm_backward_kernel<0>(cuda::NormBackwardArgs, float *, long)","1","13","(256, 1, 1)","(512, 1, 1)","0","9.0","m","gpu__time_duration.sum","ns","2,000,000"
CSV
python3 "$src/bench/ncu_kernels.py" "$tmp/k.csv" --steps 2 --label t >"$tmp/out.json"
python3 - "$tmp/out.json" <<'PY' || fail "wrong summary: $(cat "$tmp/out.json")"
import json, sys
d = json.load(open(sys.argv[1]))
assert abs(d["kernel_ms_per_step"] - 1.75) < 1e-9, d["kernel_ms_per_step"]  # (1 + 2 + 0.5) ms over 2 steps
k = d["kernels"]
assert [x["kernel"] for x in k] == ["norm_backward_kernel<0>", "nvjet_gemm_NTT"], k
assert k[0]["launches_per_step"] == 1 and abs(k[0]["ms_per_step"] - 1.5) < 1e-9, k[0]
assert abs(k[1]["ms_per_step"] - 0.25) < 1e-9 and abs(k[0]["share"] - 1.5 / 1.75) < 1e-9, k
PY
head -n 2 "$tmp/k.csv" >"$tmp/empty.csv"
if python3 "$src/bench/ncu_kernels.py" "$tmp/empty.csv" >/dev/null 2>"$tmp/err"; then fail "a log without durations was accepted"; fi
grep -q "no gpu__time_duration.sum rows" "$tmp/err" || fail "the error does not say what is missing: $(cat "$tmp/err")"
echo "ncu_kernels.py: ok"
