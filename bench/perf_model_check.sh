#!/usr/bin/env bash
# The performance model against our own CPU runs, with the split between what it learns from and what it is judged
# on declared in files:
#   1. bench/calibrate_cpu (one rank per core, all timed together: OpenBLAS sgemm at the tiny model's GEMM shapes, a
#      triad, the CPU attention kernel, a small kernel's fixed cost, Gloo all-reduce over loopback) writes the
#      machine's cluster file, CLUSTER (every constant a measurement of this machine, with its source);
#   2. the tiny model (configs/tiny.toml) trains on CPU under dp2, tp2, pp2 and dp2 x pp2 with `megatrain launch`;
#      each run's median step time (metrics.jsonl, the first WARMUP steps dropped) becomes a point of the
#      measured-runs file RUNS (configs/measured/), with the config, overrides and flags `megatrain simulate` predicts
#      it from and its source;
#   3. `megatrain simulate --calibrate SET --cluster CLUSTER` fits the set's constants on its one calibration layout
#      (SET, configs/calibration/; written with CAL_LAYOUT and FIT when it does not exist yet) and writes them into
#      CLUSTER with their source and residuals;
#   4. every layout is predicted on the calibrated CLUSTER: JSON with measured, predicted, their ratio and whether the
#      layout was the calibration one (the others are held out: the fit never saw them).
# A benchmark, not a test: the numbers depend on the machine and on what else runs on it (run it on a quiet machine,
# under nice -n -20). Rerunning it rewrites CLUSTER and RUNS; commit them with the results file.
#   bench/perf_model_check.sh                                     # 6 steps per layout; this machine = epyc-2core
#   MACHINE=xeon-4core STEPS=10 WARMUP=3 bench/perf_model_check.sh
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
MACHINE=${MACHINE:-epyc-2core}
CLUSTER=${CLUSTER:-configs/clusters/cpu-$MACHINE.toml}
RUNS=${RUNS:-configs/measured/cpu-$MACHINE.json}
SET=${SET:-configs/calibration/cpu-$MACHINE.json}
CAL_LAYOUT=${CAL_LAYOUT:-dp2}
FIT=${FIT:-gemm_efficiency_scale}
TARGET=${TARGET:-0.10}
CORES=$(nproc)
[[ -x "$BIN" && -x "$CAL" ]] || { echo "perf_model_check: build megatrain and calibrate_cpu first" >&2; exit 2; }
[[ -f "$DATA/meta.json" ]] || { echo "perf_model_check: no prepared data in $DATA (make train prepares it, or set DATA=)" >&2; exit 2; }
mkdir -p "$OUT" "$(dirname "$CLUSTER")" "$(dirname "$RUNS")" "$(dirname "$SET")"

# 1. The machine's cluster file. With more ranks than cores a rank waiting in the pipeline gives its core away, which
# ranks all timed together would not show: calibrate with one rank per core (at least 2 for the all-reduce); the
# model shares the cores itself.
cal_n=$(( CORES < 2 ? 2 : CORES ))
"$BIN" launch --nproc "$cal_n" --exec -- "$CAL" --out "$OUT/local" > "$OUT/calibrate.log" 2>&1 ||
  { cat "$OUT/calibrate.log" >&2; exit 1; }
{
  echo "# This machine ($MACHINE), for the performance model's CPU check (bench/perf_model_check.sh): every constant"
  echo "# measured here by bench/calibrate_cpu ($cal_n ranks on $CORES cores), except [calibration], which"
  echo "#   megatrain simulate --calibrate $SET --cluster $CLUSTER"
  echo "# fits on the set's calibration layout."
  tail -n +2 "$OUT/local-$cal_n.toml" | sed "s/^name = .*/name = \"cpu-$MACHINE\"/"
} > "$CLUSTER"

# 2. The runs. Each layout: name, ranks, overrides (section.key=value); the flags are megatrain's defaults.
FLAGS=(tp-overlap pp-overlap dp-overlap misc)
LAYOUTS=("dp2:2:parallel.dp=2" "tp2:2:parallel.tp=2" "pp2:2:parallel.pp=2" "dp2pp2:4:parallel.dp=2 parallel.pp=2")
COMMON=(--config configs/tiny.toml --data.dir="$DATA" --train.steps="$STEPS" --train.threads=1 --train.eval_every=0
        --train.log_every=1 --ckpt.every=0 --ckpt.save_final=false --ckpt.resume=none --sample.tokens=0)
specs=()
for layout in "${LAYOUTS[@]}"; do
  IFS=: read -r name nproc overrides <<< "$layout"
  par=()
  for o in $overrides; do par+=("--$o"); done
  rm -rf "$OUT/$name"
  "$BIN" launch --nproc "$nproc" -- train "${COMMON[@]}" "${par[@]}" --train.out_dir="$OUT/$name" \
    > "$OUT/$name.log" 2>&1 || { tail -20 "$OUT/$name.log" >&2; exit 1; }
  specs+=("$name:$nproc:$overrides:$OUT/$name/metrics.jsonl")
done

# The measured-runs file, and the calibration set when there is none yet.
"$PYTHON" - "$RUNS" "$SET" "$CLUSTER" "$MACHINE" "$WARMUP" "$CAL_LAYOUT" "$FIT" "$TARGET" "${FLAGS[*]}" \
  "${specs[@]}" <<'PY'
import datetime, json, os, platform, statistics, sys
runs_path, set_path, cluster, machine, warmup, cal_layout, fit, target, flags = sys.argv[1:10]
warmup, target = int(warmup), float(target)
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.machine())
when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
runs = []
for spec in sys.argv[10:]:
    name, nproc, overrides, metrics = spec.split(":")
    steps = [json.loads(l) for l in open(metrics) if '"kind":"train"' in l.replace(" ", "")]
    times = [s["step_seconds"] for s in steps[warmup:]] or [s["step_seconds"] for s in steps]
    runs.append({"id": f"cpu/{name}", "config": "configs/tiny.toml", "overrides": overrides.split(),
                 "cluster": cluster, "gpus": int(nproc), "batch": 0, "recompute": "none", "flags": flags.split(),
                 "measured_step_seconds": round(statistics.median(times), 6), "target": target,
                 "source": f"bench/perf_model_check.sh on {cpu} ({os.cpu_count()} cores, {machine}), {when}: median "
                           f"of {len(times)} steps after {warmup} warm-up; load average after the runs {load}"})
json.dump({"description": f"megatrain's own CPU runs on {machine}: the tiny model under four layouts "
                          "(bench/perf_model_check.sh), each predicted on the machine's cluster file.",
           "runs": runs}, open(runs_path, "w"), indent=2)
if not os.path.exists(set_path):
    json.dump({"description": f"Our CPU runs on {machine}: {fit} fitted on the {cal_layout} layout only; the "
                              "other layouts are held out.",
               "runs": [runs_path], "fit": fit.split(","), "calibrate": [f"cpu/{cal_layout}"]},
              open(set_path, "w"), indent=2)
PY

# 3. The fit, on the set's calibration layout.
"$BIN" simulate --calibrate "$SET" --cluster "$CLUSTER" --json > "$OUT/fit.json"

# 4. Every layout on the calibrated cluster.
preds=()
for layout in "${LAYOUTS[@]}"; do
  IFS=: read -r name nproc overrides <<< "$layout"
  par=()
  for o in $overrides; do par+=("--$o"); done
  for f in "${FLAGS[@]}"; do par+=("--$f"); done
  "$BIN" simulate --config configs/tiny.toml --cluster "$CLUSTER" "${par[@]}" --recompute none --json \
    > "$OUT/$name.predicted.json"
  preds+=("$name:$OUT/$name.predicted.json")
done

"$PYTHON" - "$RUNS" "$SET" "$CLUSTER" "$OUT/fit.json" "$OUT/calibrate.log" "${preds[@]}" <<'PY'
import json, os, sys
runs_path, set_path, cluster, fit_path, cal_log = sys.argv[1:6]
measured = {r["id"]: r for r in json.load(open(runs_path))["runs"]}
cal_set = json.load(open(set_path))
cal_text = open(cal_log).read()
micro = json.loads("\n".join(l[len("[rank 0] "):] for l in cal_text.splitlines() if l.startswith("[rank 0]")))
rows = []
for spec in sys.argv[6:]:
    name, pred = spec.split(":")
    m, p = measured[f"cpu/{name}"], json.load(open(pred))
    ratio = p["step_seconds"] / m["measured_step_seconds"]
    rows.append({"layout": name, "set": "calibration" if m["id"] in cal_set["calibrate"] else "held_out",
                 "measured_step_seconds": m["measured_step_seconds"], "predicted_step_seconds": p["step_seconds"],
                 "ratio_predicted_over_measured": ratio, "target": m["target"],
                 "met": abs(ratio - 1) <= m["target"], "predicted_breakdown": p["breakdown"]})
held = [abs(r["ratio_predicted_over_measured"] - 1) for r in rows if r["set"] == "held_out"]
print(json.dumps({"machine": {"cores": os.cpu_count(), "load_average": os.getloadavg()},
                  "cluster": cluster, "measured_runs": runs_path, "calibration_set": set_path,
                  "calibration_layouts": [r["layout"] for r in rows if r["set"] == "calibration"],
                  "fit": json.load(open(fit_path)), "microbenchmarks": micro, "runs": rows,
                  "held_out_worst_abs_error": max(held) if held else None}, indent=2))
PY
