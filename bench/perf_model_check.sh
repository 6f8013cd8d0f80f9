#!/usr/bin/env bash
# The performance model against our own runs: calibrates a cluster file for this machine right before each run, with
# as many ranks as the run or as the machine has cores, whichever is fewer (bench/calibrate_cpu: sgemm, memory
# bandwidth, attention, Gloo all-reduce over loopback, measured by all ranks at once), runs the tiny model (configs/tiny.toml) on
# CPU under dp2, tp2, pp2 and dp2 x pp2 with `megatrain launch`, takes each run's median step time from
# metrics.jsonl (the first WARMUP steps dropped), and prints it beside `megatrain simulate`'s prediction for the same
# layout on the calibrated cluster, with their ratio. A benchmark, not a test: the numbers depend on the machine and
# on what else runs on it. Prints JSON.
#   bench/perf_model_check.sh                 # 6 steps per layout
#   STEPS=10 WARMUP=3 bench/perf_model_check.sh
#   DATA=/path/to/data/brown bench/perf_model_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-build/megatrain}
CAL=${CAL:-build/bench/calibrate_cpu}
PYTHON=${PYTHON:-python3}
STEPS=${STEPS:-6}
WARMUP=${WARMUP:-2}
OUT=${OUT:-runs/perf_check}
DATA=${DATA:-data/brown}
CORES=$(nproc)
[[ -x "$BIN" && -x "$CAL" ]] || { echo "perf_model_check: build megatrain and calibrate_cpu first" >&2; exit 2; }
[[ -f "$DATA/meta.json" ]] || { echo "perf_model_check: no prepared data in $DATA (make train prepares it, or set DATA=)" >&2; exit 2; }
mkdir -p "$OUT"

COMMON=(--config configs/tiny.toml --data.dir="$DATA" --train.steps="$STEPS" --train.threads=1 --train.eval_every=0
        --train.log_every=1 --ckpt.every=0 --ckpt.save_final=false --ckpt.resume=none --sample.tokens=0)
results=()
for layout in "dp2:2:--parallel.dp=2" "tp2:2:--parallel.tp=2" "pp2:2:--parallel.pp=2" \
              "dp2pp2:4:--parallel.dp=2 --parallel.pp=2"; do
  IFS=: read -r name nproc flags <<< "$layout"
  # shellcheck disable=SC2206
  par=($flags)
  rm -rf "$OUT/$name"
  # Calibrate right before each run: on a shared machine the load changes, and the model should see the machine the
  # run will see. With more ranks than cores, calibrate with one rank per core: the model shares the cores itself
  # (a rank waiting in the pipeline gives its core away, which ranks all timed together would not show).
  cal_n=$(( nproc < CORES ? nproc : CORES )); (( cal_n >= 2 )) || cal_n=2
  "$BIN" launch --nproc "$cal_n" --exec -- "$CAL" --out "$OUT/$name-local" > "$OUT/$name.calibrate.log" 2>&1 ||
    { cat "$OUT/$name.calibrate.log" >&2; exit 1; }
  "$BIN" launch --nproc "$nproc" -- train "${COMMON[@]}" "${par[@]}" --train.out_dir="$OUT/$name" \
    > "$OUT/$name.log" 2>&1 || { tail -20 "$OUT/$name.log" >&2; exit 1; }
  "$BIN" simulate --config configs/tiny.toml --cluster "$OUT/$name-local-$cal_n.toml" "${par[@]}" --recompute none \
    --tp-overlap --pp-overlap --dp-overlap --misc --json > "$OUT/$name.predicted.json"
  results+=("$name:$OUT/$name/metrics.jsonl:$OUT/$name.predicted.json:$OUT/$name.calibrate.log")
done

"$PYTHON" - "$WARMUP" "${results[@]}" <<'PY'
import json, os, re, statistics, sys
warmup = int(sys.argv[1])
rows = []
for spec in sys.argv[2:]:
    name, metrics, pred, cal_log = spec.split(":")
    cal_text = open(cal_log).read()
    cal = json.loads("\n".join(l[len("[rank 0] "):] for l in cal_text.splitlines() if l.startswith("[rank 0]")))
    steps = [json.loads(l) for l in open(metrics) if '"kind":"train"' in l.replace(" ", "")]
    times = [s["step_seconds"] for s in steps[warmup:]] or [s["step_seconds"] for s in steps]
    p = json.load(open(pred))
    measured = statistics.median(times)
    rows.append({"layout": name, "steps_timed": len(times), "measured_step_seconds": measured,
                 "predicted_step_seconds": p["step_seconds"], "ratio_predicted_over_measured": p["step_seconds"] / measured,
                 "predicted_breakdown": p["breakdown"], "calibration": cal})
worst = max(abs(r["ratio_predicted_over_measured"] - 1) for r in rows)
print(json.dumps({"machine": {"cores": os.cpu_count(), "load_average": os.getloadavg()}, "runs": rows,
                  "worst_abs_error": worst}, indent=2))
PY
