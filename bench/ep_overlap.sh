#!/usr/bin/env bash
# Expert parallelism's all-to-alls hidden or exposed: a dp2 x ep2 MoE job on the CPU (`megatrain launch --nproc 2`)
# with parallel.ep_overlap = true (the dispatch in flight while the shared experts compute, the gradient exchanges
# while the shared experts' and the router's backward run) and false (every exchange waited for at once), REPS runs
# of each, interleaved (repetition 1 of both, then repetition 2, ...) so a change of the machine's load hits both.
#
# Per run, from rank 0's metrics.jsonl over the steps after the first WARMUP: the medians of comm_busy_s.ep (the
# all-to-alls' execution), comm_exposed_s.ep (the time the layers waited for them) and step_seconds; per setting the
# medians over the runs. JSON on stdout (and to RESULT when set).
#
# A benchmark, not a test: the numbers depend on the machine and on what else runs on it. Both ranks share the
# machine's cores, so on a small machine the shared experts' compute and the exchange compete for them.
#   bench/ep_overlap.sh                                 # 6 runs, about a minute on 2 cores
#   DATA=/path/to/data/brown REPS=5 STEPS=20 bench/ep_overlap.sh
#   EXTRA="--train.grad_accum=2 --parallel.ep_interleave=true" bench/ep_overlap.sh   # flags added to every run
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-build/megatrain}
PYTHON=${PYTHON:-python3}
DATA=${DATA:-data/brown}
OUT=${OUT:-runs/ep_overlap}
REPS=${REPS:-3}
STEPS=${STEPS:-12}
WARMUP=${WARMUP:-3}
ROWS=${ROWS:-4}
SEQ=${SEQ:-64}
RESULT=${RESULT:-}
read -r -a EXTRA_FLAGS <<<"${EXTRA:-}"
[[ -x "$BIN" ]] || { echo "ep_overlap: build megatrain first ($BIN)" >&2; exit 2; }
[[ -f "$DATA/meta.json" ]] || { echo "ep_overlap: no prepared data in $DATA (set DATA=)" >&2; exit 2; }
VOCAB=$("$PYTHON" -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$DATA/meta.json")
mkdir -p "$OUT"

MODEL=(--config configs/moe-tiny.toml --data.dir="$DATA" --model.vocab_size="$VOCAB" --data.seq_len="$SEQ"
       --data.batch_size="$ROWS" --model.moe_shared_experts=2 --train.steps="$STEPS" --train.threads=1
       --train.eval_every=0 --train.log_every=1 --ckpt.every=0 --ckpt.save_final=false --ckpt.resume=none
       --sample.tokens=0 --train.peak_tflops=1 --parallel.dp=2 --parallel.ep=2 --parallel.timeout_s=60)

for rep in $(seq 1 "$REPS"); do
  for overlap in true false; do
    dir="$OUT/overlap_${overlap}_$rep"
    rm -rf "$dir"
    "$BIN" launch --nproc 2 -- train "${MODEL[@]}" --parallel.ep_overlap="$overlap" --train.out_dir="$dir" ${EXTRA_FLAGS[@]+"${EXTRA_FLAGS[@]}"} \
      >"$dir.log" 2>&1 || { echo "ep_overlap: run $dir failed (see $dir.log)" >&2; exit 1; }
  done
done

"$PYTHON" - "$OUT" "$REPS" "$WARMUP" "$RESULT" <<'PY'
import json, statistics, sys
out, reps, warmup, result = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
report = {}
for overlap in ("true", "false"):
    runs = []
    for rep in range(1, reps + 1):
        steps = [json.loads(l) for l in open(f"{out}/overlap_{overlap}_{rep}/metrics.jsonl")]
        steps = [s for s in steps if s.get("kind") == "train" and s["step"] > warmup]
        runs.append({
            "ep_busy_s": statistics.median(s["comm_busy_s"]["ep"] for s in steps),
            "ep_exposed_s": statistics.median(s["comm_exposed_s"]["ep"] for s in steps),
            "step_s": statistics.median(s["step_seconds"] for s in steps),
        })
    report[f"ep_overlap={overlap}"] = {
        "runs": runs,
        **{k: statistics.median(r[k] for r in runs) for k in ("ep_busy_s", "ep_exposed_s", "step_s")},
    }
text = json.dumps(report, indent=2)
print(text)
if result:
    open(result, "w").write(text + "\n")
PY
