#!/usr/bin/env bash
# Gradient coding against bursty stragglers on the CPU: a dp4 job (`megatrain launch --nproc 4`) under each
# parallel.straggler_coding scheme (none, gc with s=1, sr-sgc and m-sgc), each with injected bursty stragglers and
# with none, REPS repetitions each, all in one run with the repetitions interleaved (repetition 1 of every
# configuration, then repetition 2, ...) so a change of the machine's load hits every configuration alike.
#
# The slowburst fault acts in the rounds each step runs: the uncoded step's train.grad_accum micro-batch rounds
# (none: the slow replica sleeps after its slow rounds and its peers wait for it in the gradient reduction) and each
# coded scheme's own rounds (m-sgc runs fewer, larger rounds). The ratios under stragglers are against none under the
# same fault.
#
# The bursty model: (B, W, lambda) = (1, 2, 1), at most one straggling replica in any two consecutive rounds, bursts
# of one round. It is the one point all three coded schemes run on dp4 with one train.grad_accum: gc s=1 (s+1 = 2
# divides dp = 4), sr-sgc's s = ceil(B lambda / (W-1+B)) = 1, and m-sgc's job size (W-1)(lambda+1)+B = 3; grad_accum
# = 6 is a multiple of 3 (two m-sgc jobs a step) and at least B+1 (sr-sgc). The paper's load (compute per round
# against the uncoded step's): gc 2, sr-sgc 2, m-sgc (lambda+1)(W-1+B)/(B+(W-1)(lambda+1)) = 4/3.
#
# Stragglers: the slowburst fault on ranks 1 and 2 (replicas 1 and 2), both columns of one bursty generator (same
# b, w, lambda, p, seed: jointly inside the model), each slow micro-batch FACTOR times its usual compute time.
#
# Per configuration: the median step time of the steps after the first WARMUP (metrics.jsonl), tokens/s =
# batch_size x seq_len x dp x grad_accum / that median, the measured redundancy (micro-batches computed / the
# uncoded step's), stragglers left behind and rounds waited per step; per scheme and condition the REPS runs and
# their medians, and the ratios m-sgc / gc and scheme / none under stragglers. JSON on stdout (and to RESULT when set).
#
# A benchmark, not a test: the numbers depend on the machine and on what else runs on it. The tiny model (2 layers,
# d_model 64, 2 rows of 32 tokens a micro-batch, one thread a rank): 4 ranks share the machine's cores.
#   bench/straggler_coding.sh                                   # 24 runs, ~5 minutes on 2 cores
#   DATA=/path/to/data/brown REPS=3 STEPS=12 RESULT=bench/results/straggler_coding-epyc-2core.json bench/straggler_coding.sh
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-build/megatrain}
PYTHON=${PYTHON:-python3}
DATA=${DATA:-data/brown}
OUT=${OUT:-runs/straggler_coding}
REPS=${REPS:-3}
STEPS=${STEPS:-12}
WARMUP=${WARMUP:-3}
ACCUM=${ACCUM:-6}
ROWS=${ROWS:-2}
SEQ=${SEQ:-32}
FACTOR=${FACTOR:-4}
P=${P:-0.5}
SEED=${SEED:-7}
RESULT=${RESULT:-}
BURST=1 WINDOW=2 LAMBDA=1 DP=4
[[ -x "$BIN" ]] || { echo "straggler_coding: build megatrain first ($BIN)" >&2; exit 2; }
[[ -f "$DATA/meta.json" ]] || { echo "straggler_coding: no prepared data in $DATA (set DATA=)" >&2; exit 2; }
mkdir -p "$OUT"

MODEL=(--config configs/tiny.toml --data.dir="$DATA" --model.n_layer=2 --model.d_model=64 --model.n_head=4
       --data.seq_len="$SEQ" --data.batch_size="$ROWS" --train.steps="$STEPS" --train.threads=1
       --train.eval_every=0 --train.log_every=1 --ckpt.every=0 --ckpt.save_final=false --ckpt.resume=none
       --sample.tokens=0 --train.peak_tflops=1 --parallel.bucket_mb=1 --parallel.timeout_s=60
       --parallel.dp="$DP" --train.grad_accum="$ACCUM")
BURSTY=(--parallel.straggler_burst="$BURST" --parallel.straggler_window="$WINDOW" --parallel.straggler_lambda="$LAMBDA")
declare -A CODING=(
  [none]=""
  [gc]="--parallel.straggler_coding=gc --parallel.straggler_s=1"
  [sr-sgc]="--parallel.straggler_coding=sr-sgc ${BURSTY[*]}"
  [m-sgc]="--parallel.straggler_coding=m-sgc ${BURSTY[*]}"
)
CONFIGS=(none:stragglers none:clean gc:stragglers gc:clean sr-sgc:stragglers sr-sgc:clean m-sgc:stragglers
         m-sgc:clean)
gen="factor=$FACTOR:b=$BURST:w=$WINDOW:lambda=$LAMBDA:p=$P:seed=$SEED"
STRAGGLERS="slowburst:rank=1:$gen;slowburst:rank=2:$gen"

start=$(date +%s)
runs=()
for rep in $(seq 1 "$REPS"); do
  for config in "${CONFIGS[@]}"; do
    IFS=: read -r scheme cond <<< "$config"
    name="$scheme-$cond-$rep"
    dir="$OUT/$name"
    rm -rf "$dir"
    faults=""
    [[ $cond == stragglers ]] && faults=$STRAGGLERS
    read -r -a coding <<< "${CODING[$scheme]}"
    MEGATRAIN_FAULTS="$faults" "$BIN" launch --nproc "$DP" -- train "${MODEL[@]}" "${coding[@]}" \
      --train.out_dir="$dir" > "$dir.log" 2>&1 || { tail -20 "$dir.log" >&2; exit 1; }
    runs+=("$scheme:$cond:$rep:$dir/metrics.jsonl")
    echo "straggler_coding: $name done ($(( $(date +%s) - start )) s)" >&2
  done
done
seconds=$(( $(date +%s) - start ))

"$PYTHON" - "$WARMUP" "$ROWS" "$SEQ" "$DP" "$ACCUM" "$seconds" "$STRAGGLERS" "$RESULT" \
  "$(printf '%s ' "$BIN" launch --nproc "$DP" -- train "${MODEL[@]}")" "${runs[@]}" <<'PY'
import datetime, json, os, platform, statistics, sys
warmup, rows, seq, dp, accum, seconds = (int(a) for a in sys.argv[1:7])
faults, result, command = sys.argv[7:10]
B, W, lam = 1, 2, 1
paper_load = {  # compute per round against the uncoded step's (docs/robust-training.md's table x n)
    "none": 1.0, "gc": 2.0, "sr-sgc": 2.0,
    "m-sgc": (lam + 1) * (W - 1 + B) / (B + (W - 1) * (lam + 1)),
}
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
           platform.machine())
med = statistics.median
out = {"benchmark": "straggler_coding",
       "when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
       "machine": {"cpu": cpu, "cores": os.cpu_count(), "load_average_after": os.getloadavg()[0]},
       "command": command.strip(), "faults_under_stragglers": faults,
       "bursty_model": {"B": B, "W": W, "lambda": lam}, "dp": dp, "grad_accum": accum,
       "tokens_per_step": rows * seq * dp * accum, "warmup_steps_dropped": warmup, "seconds": seconds,
       "schemes": {}}
for spec in sys.argv[10:]:
    scheme, cond, rep, path = spec.split(":", 3)
    lines = [json.loads(l) for l in open(path)]
    steps = [l for l in lines if l.get("kind") == "train"][warmup:]
    st = [l.get("straggler") for l in steps]
    step_s = med([l["step_seconds"] for l in steps])
    run = {"rep": int(rep), "steps": len(steps), "median_step_s": step_s,
           "tokens_per_s": rows * seq * dp * accum / step_s}
    if all(st):
        run.update({
            "redundancy": med([s["redundancy"] for s in st]),
            "rounds": med([s["rounds"] for s in st]),
            "stragglers_left_behind_per_step": sum(len(s["stragglers"]) for s in st) / len(st),
            "rounds_waited_per_step": sum(s["rounds_waited"] for s in st) / len(st),
            "microbatches_recomputed_per_step": sum(s["microbatches_recomputed"] for s in st) / len(st),
            "seconds_saved_per_step": sum(s["seconds_saved"] for s in st) / len(st)})
    else:  # the uncoded step reports no straggler object
        run.update({"redundancy": 1.0, "rounds": accum})
    out["schemes"].setdefault(scheme, {"paper_load": paper_load[scheme]}).setdefault(cond, {"runs": []})["runs"].append(run)
for scheme, conds in out["schemes"].items():
    for cond, c in conds.items():
        if cond == "paper_load":
            continue
        keys = [k for k in c["runs"][0] if k not in ("rep", "steps")]
        c["median"] = {k: med([r[k] for r in c["runs"]]) for k in keys}
tps = {s: {c: v["median"]["tokens_per_s"] for c, v in conds.items() if c != "paper_load"}
       for s, conds in out["schemes"].items()}
coded = [s for s in tps if s != "none"]
out["ratios"] = {  # of median tokens/s
    "m-sgc_over_gc": {c: tps["m-sgc"][c] / tps["gc"][c] for c in ("stragglers", "clean")},
    "scheme_over_none_under_stragglers": {s: tps[s]["stragglers"] / tps["none"]["stragglers"] for s in coded},
    "scheme_over_none_clean": {s: tps[s]["clean"] / tps["none"]["clean"] for s in coded},
    "stragglers_over_clean": {s: tps[s]["stragglers"] / tps[s]["clean"] for s in tps},
}
text = json.dumps(out, indent=2)
print(text)
if result:
    with open(result, "w") as f:
        f.write(text + "\n")
PY
