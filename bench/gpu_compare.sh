#!/usr/bin/env bash
# GPU training throughput, megatrain vs PyTorch (bench/torch_gpt.py) on the same model shapes, one after the other
# on this machine's first GPU. Writes bench/results/gpu_compare-<gpu name>.json and prints it.
#   bench/gpu_compare.sh                      # the three sizes with batch sizes that fit in 80 GB
#   B_124M=32 STEPS=50 bench/gpu_compare.sh   # override batch sizes / timed steps (a batch that is not the
#                                             # default is named in the result file: ...-124m-b32.json)
#   MEGATRAIN_BIN=build/bench/bench_gpu_train # the megatrain side (skipped, with a note, when it is not built)
#   MODELS=gpt2-124m VARIANTS=0 bench/gpu_compare.sh   # one size, no block variants (to fit a time-limited call);
#                                             # the result file is then named after the sizes run
#   MODELS=none bench/gpu_compare.sh          # only the megatrain block variants (PTB / SWA vs sequential)
#   MT_FLAGS=--recompute-act bench/gpu_compare.sh   # extra bench_gpu_train flags for every megatrain run (here: the
#                                             # GeLU output recomputed in backward); the file name ends in them
#   ATTENTION=flash bench/gpu_compare.sh      # megatrain with our flash kernels instead of the default (auto: cuDNN's
#                                             # fused attention where megatrain was built with cuDNN); the result
#                                             # file then ends in -flash (or -cudnn)
#   MT_ALT_FLAGS="--recompute-act --recompute-norm" bench/gpu_compare.sh   # a second megatrain run per size with
#                                             # these flags, against the same PyTorch run ("megatrain_alt")
#   RESULTS_DIR=/tmp/r bench/gpu_compare.sh   # where the result file goes (default bench/results)
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
MEGATRAIN_BIN=${MEGATRAIN_BIN:-build/bench/bench_gpu_train}
WARMUP=${WARMUP:-10}
STEPS=${STEPS:-20}
# model:batch:seq
ALL_RUNS=("gpt2-124m:${B_124M:-16}:1024" "gpt2-350m:${B_350M:-8}:1024" "gpt-1.3b:${B_1P3B:-4}:2048")
MODELS=${MODELS:-}
VARIANTS=${VARIANTS:-1}
ATTENTION=${ATTENTION:-auto}
RUNS=()
for run in "${ALL_RUNS[@]}"; do
  [[ -z "$MODELS" || " ${MODELS//,/ } " == *" ${run%%:*} "* ]] && RUNS+=("$run")
done
[[ ${#RUNS[@]} -gt 0 || "$VARIANTS" != 0 ]] || { echo "gpu_compare: MODELS='$MODELS' names none of: ${ALL_RUNS[*]%%:*}" >&2; exit 2; }

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1 || true)
gpu=${gpu:-unknown-gpu}
slug=$(echo "$gpu" | tr '[:upper:]' '[:lower:]' | tr -cs 'a-z0-9' '-' | sed 's/^-//; s/-$//')
suffix=""
[[ -n "$MODELS" || "$VARIANTS" == 0 ]] && suffix="-$(echo "${MODELS:-variants}" | tr ',' '-')"
[[ "$VARIANTS" == 0 && -z "$MODELS" ]] && suffix="-sizes"
[[ "$ATTENTION" != auto ]] && suffix="$suffix-$ATTENTION"
MT_FLAGS=${MT_FLAGS:-}
MT_ALT_FLAGS=${MT_ALT_FLAGS:-}
RESULTS_DIR=${RESULTS_DIR:-bench/results}
[[ -n "$MT_FLAGS" ]] && suffix="$suffix-$(echo "$MT_FLAGS" | tr -cs 'a-z0-9' '-' | sed 's/^-*//; s/-*$//')"
# A batch other than the default goes into the name too, so such a run never replaces the default's file.
[[ "${B_124M:-16}" != 16 ]] && suffix="$suffix-124m-b$B_124M"
[[ "${B_350M:-8}" != 8 ]] && suffix="$suffix-350m-b$B_350M"
[[ "${B_1P3B:-4}" != 4 ]] && suffix="$suffix-1.3b-b$B_1P3B"
[[ -n "$MT_ALT_FLAGS" ]] && suffix="$suffix-alt"
out=$RESULTS_DIR/gpu_compare-${slug}${suffix}.json
mkdir -p "$RESULTS_DIR"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The last line of a run's stdout that is a JSON object ("" when the run failed; its log says why).
json_line() { grep -E '^\{' "$1" | tail -n1 || true; }

for run in ${RUNS[@]+"${RUNS[@]}"}; do
  IFS=: read -r model batch seq <<<"$run"
  echo "== $model B=$batch T=$seq" >&2
  "$PYTHON" bench/torch_gpt.py --model "$model" --batch "$batch" --seq "$seq" --warmup "$WARMUP" --steps "$STEPS" \
    >"$tmp/torch-$model.out" 2>"$tmp/torch-$model.log" || { echo "torch run failed:" >&2; tail -n 20 "$tmp/torch-$model.log" >&2; }
  json_line "$tmp/torch-$model.out" >"$tmp/torch-$model.json"
  cat "$tmp/torch-$model.json" >&2

  # ---- MEGATRAIN HOOK ------------------------------------------------------------------------------------------
  # bench_gpu_train (written by the lead) takes the same shapes and prints one JSON line with the same keys as
  # torch_gpt.py (model, B, T, tokens_per_s, step_ms, mfu, gpu_memory_gb). Adjust the flags here if they change.
  : >"$tmp/mt-$model.json"
  if [[ -x "$MEGATRAIN_BIN" ]]; then
    "$MEGATRAIN_BIN" --model "$model" --batch "$batch" --seq "$seq" --warmup "$WARMUP" --steps "$STEPS" \
      --attention "$ATTENTION" $MT_FLAGS >"$tmp/mt-$model.out" 2>"$tmp/mt-$model.log" || { echo "megatrain run failed:" >&2; tail -n 20 "$tmp/mt-$model.log" >&2; }
    json_line "$tmp/mt-$model.out" >"$tmp/mt-$model.json"
    cat "$tmp/mt-$model.json" >&2
    if [[ -n "$MT_ALT_FLAGS" ]]; then
      # shellcheck disable=SC2086
      "$MEGATRAIN_BIN" --model "$model" --batch "$batch" --seq "$seq" --warmup "$WARMUP" --steps "$STEPS" \
        --attention "$ATTENTION" $MT_FLAGS $MT_ALT_FLAGS >"$tmp/mt-alt-$model.out" 2>"$tmp/mt-alt-$model.log" ||
        { echo "megatrain run ($MT_ALT_FLAGS) failed:" >&2; tail -n 20 "$tmp/mt-alt-$model.log" >&2; }
      json_line "$tmp/mt-alt-$model.out" >"$tmp/mt-alt-$model.json"
      cat "$tmp/mt-alt-$model.json" >&2
    fi
  else
    echo "(megatrain side skipped: $MEGATRAIN_BIN not built)" >&2
  fi
  # ---------------------------------------------------------------------------------------------------------------
done

# MegaScale's block variants on megatrain alone (issue 4: PTB and SWA must be as fast as the sequential block with
# full attention, or faster): the 350M shape with the parallel block, a window of T/4, and both.
VARIANT_MODEL=${VARIANT_MODEL:-gpt2-350m}
VARIANT_B=${B_350M:-8}
variants=("seq_full:--block sequential" "ptb_full:--block parallel" "seq_swa:--block sequential --window 256"
          "ptb_swa:--block parallel --window 256")
[[ "$VARIANTS" == 0 ]] && variants=()
for v in ${variants[@]+"${variants[@]}"}; do
  name=${v%%:*}
  flags=${v#*:}
  : >"$tmp/var-$name.json"
  if [[ -x "$MEGATRAIN_BIN" ]]; then
    echo "== variant $name ($VARIANT_MODEL B=$VARIANT_B: $flags)" >&2
    # shellcheck disable=SC2086
    "$MEGATRAIN_BIN" --model "$VARIANT_MODEL" --batch "$VARIANT_B" --warmup "$WARMUP" --steps "$STEPS" \
      --attention "$ATTENTION" $MT_FLAGS $flags \
      >"$tmp/var-$name.out" 2>"$tmp/var-$name.log" || tail -n 20 "$tmp/var-$name.log" >&2
    json_line "$tmp/var-$name.out" >"$tmp/var-$name.json"
  fi
done

# One JSON document: per size the results, the ratio megatrain/torch of tokens/s and of memory (megatrain's
# allocated_gb against PyTorch's max_memory_allocated; null when one is missing), and the same for the run with
# MT_ALT_FLAGS when there is one.
"$PYTHON" - "$tmp" "$gpu" "$out" "$ATTENTION" "$MT_ALT_FLAGS" ${RUNS[@]+"${RUNS[@]}"} <<'PY'
import json, sys, datetime, pathlib
tmp, gpu, out, attention, alt_flags = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
runs = sys.argv[6:]
def load(p):
    s = p.read_text().strip() if p.exists() else ""
    return json.loads(s) if s else None
def ratio(m, t, mkey, tkey):
    ok = t and m and t.get(tkey) and m.get(mkey)  # a skipped or failed run has none
    return round(m[mkey] / t[tkey], 3) if ok else None
rows = []
for run in runs:
    model, batch, seq = run.split(":")
    t, m = load(tmp / f"torch-{model}.json"), load(tmp / f"mt-{model}.json")
    row = {"model": model, "B": int(batch), "T": int(seq), "torch": t, "megatrain": m,
           "ratio_tokens_per_s": ratio(m, t, "tokens_per_s", "tokens_per_s"),
           "ratio_memory": ratio(m, t, "allocated_gb", "gpu_memory_gb")}
    if alt_flags:
        a = load(tmp / f"mt-alt-{model}.json")
        row.update({"megatrain_alt_flags": alt_flags, "megatrain_alt": a,
                    "ratio_tokens_per_s_alt": ratio(a, t, "tokens_per_s", "tokens_per_s"),
                    "ratio_memory_alt": ratio(a, t, "allocated_gb", "gpu_memory_gb")})
    rows.append(row)
variants = {}
for name in ["seq_full", "ptb_full", "seq_swa", "ptb_swa"]:
    variants[name] = load(tmp / f"var-{name}.json")
base = variants.get("seq_full") or {}
for name, v in variants.items():
    if v and base.get("step_ms") and v.get("step_ms"):
        v["step_time_vs_seq_full"] = round(v["step_ms"] / base["step_ms"], 3)
doc = {"benchmark": "gpu_compare", "gpu": gpu, "megatrain_attention": attention, "date": datetime.datetime.now().isoformat(timespec="seconds"),
       "note": "tokens/s = B*T / median step time; MFU with ModelConfig::flops_per_token and 989e12 FLOP/s",
       "runs": rows, "megatrain_block_variants": variants}
pathlib.Path(out).write_text(json.dumps(doc, indent=2) + "\n")
print(json.dumps(doc, indent=2))
PY
echo "wrote $out" >&2
