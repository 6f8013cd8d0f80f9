#!/usr/bin/env bash
# A mixture-of-experts model against the dense model with the same active parameters per token, on the CPU: CONFIG
# (configs/moe-tiny.toml) as it is, and the same model with every MLP dense (model.moe_experts = 0) of the width
# bench/moe_dense_equivalent.py computes (same d_model, layers and heads; d_ff such that the dense MLPs' weights
# touched per token equal the MoE model's: router, top_k routed experts and shared experts on its MoE layers, its
# dense MLP on the others). Both train on the same data (DATA, as `make train` prepares it) for the same STEPS, REPS
# repetitions each, in one run with the repetitions interleaved (repetition 1 of every variant, then repetition 2,
# ...) so that a change of the machine's load hits every variant alike.
#
# EXTRA_VARIANTS adds runs to the same interleaving: a ';'-separated list of NAME:FLAGS, each FLAGS appended to the
# MoE model's command line (e.g. EXTRA_VARIANTS='cf125:--model.moe_capacity_factor=1.25'); the JSON gives each
# one's ratio to the MoE model and to the dense one.
#
# Per run: the median step time of the steps after the first WARMUP (metrics.jsonl's step_seconds) and tokens/s =
# batch_size x seq_len x grad_accum / that median; per variant the REPS runs and their median; the ratio of the MoE
# model's median tokens/s to the dense model's. The parameter counts the helper computes are checked against those
# megatrain reports (metrics.jsonl's run line); a mismatch stops the script. JSON on stdout (and to RESULT when set).
#
# A benchmark, not a test: the numbers depend on the machine and on what else runs on it.
#   bench/moe_vs_dense.sh                                          # 2 x 3 runs of 12 steps
#   DATA=data/brown REPS=5 STEPS=20 THREADS=2 RESULT=bench/results/moe_vs_dense-epyc-2core.json bench/moe_vs_dense.sh
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-build/megatrain}
PYTHON=${PYTHON:-python3}
CONFIG=${CONFIG:-configs/moe-tiny.toml}
DATA=${DATA:-data/brown}
OUT=${OUT:-runs/moe_vs_dense}
REPS=${REPS:-3}
STEPS=${STEPS:-12}
WARMUP=${WARMUP:-2}
THREADS=${THREADS:-}  # train.threads; the config's default when empty
EXTRA_VARIANTS=${EXTRA_VARIANTS:-}
RESULT=${RESULT:-}
[[ -x "$BIN" ]] || { echo "moe_vs_dense: build megatrain first ($BIN)" >&2; exit 2; }
[[ -f "$DATA/meta.json" ]] || { echo "moe_vs_dense: no prepared data in $DATA (set DATA=)" >&2; exit 2; }
(( WARMUP < STEPS )) || { echo "moe_vs_dense: WARMUP ($WARMUP) must be under STEPS ($STEPS)" >&2; exit 2; }
mkdir -p "$OUT"

EQUIV=$("$PYTHON" bench/moe_dense_equivalent.py "$CONFIG")
DENSE_FF=$("$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["dense_d_ff"])' <<< "$EQUIV")
echo "moe_vs_dense: the dense model's d_ff is $DENSE_FF" >&2

COMMON=(--config "$CONFIG" --data.dir="$DATA" --train.steps="$STEPS" --train.eval_every=0 --train.log_every=1
        --ckpt.every=0 --ckpt.save_final=false --ckpt.resume=none --sample.tokens=0)
[[ -n "$THREADS" ]] && COMMON+=(--train.threads="$THREADS")
declare -A FLAGS=([moe]="" [dense]="--model.moe_experts=0 --model.d_ff=$DENSE_FF")
VARIANTS=(moe dense)
IFS=';' read -r -a extras <<< "$EXTRA_VARIANTS"
for spec in "${extras[@]}"; do
  [[ -z "${spec// /}" ]] && continue
  name=${spec%%:*}
  [[ "$spec" == *:* && "$name" =~ ^[A-Za-z0-9_.-]+$ && -z "${FLAGS[$name]+x}" ]] ||
    { echo "moe_vs_dense: EXTRA_VARIANTS entry '$spec': expected NAME:FLAGS with a new name of [A-Za-z0-9_.-]" >&2; exit 2; }
  FLAGS[$name]=${spec#*:}
  VARIANTS+=("$name")
done

start=$(date +%s)
runs=()
for rep in $(seq 1 "$REPS"); do
  for v in "${VARIANTS[@]}"; do
    dir="$OUT/$v-$rep"
    rm -rf "$dir"
    read -r -a flags <<< "${FLAGS[$v]}"
    "$BIN" train "${COMMON[@]}" "${flags[@]}" --train.out_dir="$dir" > "$dir.log" 2>&1 ||
      { tail -20 "$dir.log" >&2; exit 1; }
    runs+=("$v:$rep:$dir/metrics.jsonl")
    echo "moe_vs_dense: $v-$rep done ($(( $(date +%s) - start )) s)" >&2
  done
done
seconds=$(( $(date +%s) - start ))

flag_lines=$(for v in "${VARIANTS[@]}"; do printf '%s\t%s\n' "$v" "${FLAGS[$v]}"; done)
"$PYTHON" - "$WARMUP" "$seconds" "$RESULT" "$(printf '%s ' "$BIN" train "${COMMON[@]}")" "$EQUIV" "$flag_lines" \
  "${runs[@]}" <<'PY'
import datetime, json, os, platform, statistics, sys
warmup, seconds = int(sys.argv[1]), int(sys.argv[2])
result, command, equiv = sys.argv[3], sys.argv[4].strip(), json.loads(sys.argv[5])
flags = dict(l.split("\t", 1) for l in sys.argv[6].splitlines() if l)
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
           platform.machine())
med = statistics.median
out = {"benchmark": "moe_vs_dense",
       "when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
       "machine": {"cpu": cpu, "cores": os.cpu_count(), "load_average_after": os.getloadavg()[0]},
       "command": command, "warmup_steps_dropped": warmup, "seconds": seconds,
       "models": {"moe": dict(equiv["moe"]), "dense": dict(equiv["dense"], d_ff=equiv["dense_d_ff"])},
       "moe_layers": equiv["moe_layers"], "active_mlp_weights_per_token": equiv["active_mlp_weights_per_token"],
       "variants": {}}
for spec in sys.argv[7:]:
    name, rep, path = spec.split(":", 2)
    lines = [json.loads(l) for l in open(path)]
    run_line = next(l for l in lines if l.get("kind") == "run")
    model = out["models"].get(name)
    if model is not None:  # the helper's count must be megatrain's
        if run_line["params"] != model["params"]:
            sys.exit(f"moe_vs_dense: {name}: megatrain reports {run_line['params']} parameters, "
                     f"bench/moe_dense_equivalent.py counted {model['params']}")
        model["params_reported"] = run_line["params"]
    train = [l for l in lines if l.get("kind") == "train"]
    steps = train[warmup:]
    step_s = med([l["step_seconds"] for l in steps])
    tokens_per_step = train[0]["tokens_per_second"] * train[0]["step_seconds"]
    v = out["variants"].setdefault(name, {"flags": flags.get(name, ""), "runs": []})
    v["runs"].append({"rep": int(rep), "steps": len(steps), "median_step_s": step_s,
                      "tokens_per_s": round(tokens_per_step) / step_s, "final_loss": train[-1]["loss"]})
for v in out["variants"].values():
    v["median_tokens_per_s"] = med([r["tokens_per_s"] for r in v["runs"]])
    v["median_step_s"] = med([r["median_step_s"] for r in v["runs"]])
tps = {n: v["median_tokens_per_s"] for n, v in out["variants"].items()}
out["ratios"] = {"moe_over_dense_tokens_per_s": tps["moe"] / tps["dense"]}
for n in tps:
    if n not in ("moe", "dense"):
        out["ratios"][f"{n}_over_moe_tokens_per_s"] = tps[n] / tps["moe"]
        out["ratios"][f"{n}_over_dense_tokens_per_s"] = tps[n] / tps["dense"]
text = json.dumps(out, indent=2)
print(text)
if result:
    with open(result, "w") as f:
        f.write(text + "\n")
PY
