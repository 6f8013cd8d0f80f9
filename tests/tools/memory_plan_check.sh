#!/usr/bin/env bash
# bench_gpu_train --plan-memory (the CUDA backend's allocation plan, computed on the host) against arithmetic done
# here: for GPT-2 124M at B 16 x T 1024, model.recompute_act must save exactly one [B*T, 4C] bf16 buffer per layer,
# and model.recompute_norm exactly two [B*T, C] bf16 buffers per (sequential) layer less the one shared scratch; the
# weights and the optimizer's state must not move. (On an H100 the plan without the switches equalled the measured
# allocated_gb to the byte for all three gpu_compare sizes; docs/performance.md.)
set -euo pipefail
bin=$1
plan() { "$bin" --model gpt2-124m --batch 16 --plan-memory "$@"; }
python3 - "$(plan)" "$(plan --recompute-act)" "$(plan --recompute-act --recompute-norm)" <<'PY'
import json, sys
keep, act, both = (json.loads(a) for a in sys.argv[1:4])
L, N, C, bf16 = 12, 16 * 1024, 768, 2
for p in (act, both):
    for k in ("params_grads_compute_copy_gb", "optimizer_gb"):
        assert p[k] == keep[k], (k, p[k], keep[k])
saved_act = L * N * 4 * C * bf16
saved_norm = L * 2 * N * C * bf16 - N * C * bf16
assert keep["planned_bytes"] - act["planned_bytes"] == saved_act, (keep, act, saved_act)
assert act["planned_bytes"] - both["planned_bytes"] == saved_norm, (act, both, saved_norm)
assert keep["planned_gb"] > 8 and keep["recompute_norm"] is False and both["recompute_norm"] is True, keep
print("memory plan: ok", keep["planned_gb"], act["planned_gb"], both["planned_gb"])
PY
