#!/usr/bin/env bash
# bench/gpu_compare.sh's bookkeeping with a known answer, no GPU needed: a fake PyTorch side (PYTHON intercepts
# bench/torch_gpt.py) and a fake bench_gpu_train whose speed and memory depend on the flags it is given. The result
# must carry both megatrain runs (plain and MT_ALT_FLAGS) against the one PyTorch run, with the right ratios, under
# RESULTS_DIR and a name that says it has the alternative run.
src=$1
source "$(dirname "$0")/check_lib.sh"
cat >"$tmp/py" <<'SH'
#!/usr/bin/env bash
if [[ "${1:-}" == bench/torch_gpt.py ]]; then
  echo "compiling..."
  echo '{"framework": "torch", "tokens_per_s": 100000.0, "gpu_memory_gb": 10.0}'
  exit 0
fi
exec python3 "$@"
SH
cat >"$tmp/mt" <<'SH'
#!/usr/bin/env bash
echo "$*" >>"$(dirname "$0")/mt_args"
if [[ " $* " == *" --recompute-norm "* ]]; then
  echo '{"framework": "megatrain", "tokens_per_s": 120000.0, "allocated_gb": 9.0}'
else
  echo '{"framework": "megatrain", "tokens_per_s": 125000.0, "allocated_gb": 11.0}'
fi
SH
chmod +x "$tmp/py" "$tmp/mt"
cd "$src"
PYTHON="$tmp/py" MEGATRAIN_BIN="$tmp/mt" MODELS=gpt2-124m VARIANTS=0 WARMUP=1 STEPS=2 \
  MT_ALT_FLAGS="--recompute-act --recompute-norm" RESULTS_DIR="$tmp/r" bench/gpu_compare.sh >"$tmp/out" 2>"$tmp/err" ||
  fail "gpu_compare.sh failed: $(cat "$tmp/err")"
f=$(ls "$tmp"/r/gpu_compare-*-gpt2-124m-alt.json 2>/dev/null) || fail "no result file named ...-alt: $(ls "$tmp/r")"
python3 - "$f" <<'PY' || fail "wrong result: $(cat "$f")"
import json, sys
d = json.load(open(sys.argv[1]))
(r,) = d["runs"]
assert r["model"] == "gpt2-124m" and r["B"] == 16 and r["T"] == 1024, r
assert r["ratio_tokens_per_s"] == 1.25 and r["ratio_memory"] == 1.1, r
assert r["megatrain_alt_flags"] == "--recompute-act --recompute-norm", r
assert r["ratio_tokens_per_s_alt"] == 1.2 and r["ratio_memory_alt"] == 0.9, r
PY
[[ $(wc -l <"$tmp/mt_args") == 2 ]] || fail "expected two megatrain runs: $(cat "$tmp/mt_args")"
head -n1 "$tmp/mt_args" | grep -q -- "--model gpt2-124m --batch 16 --seq 1024 --warmup 1 --steps 2 --attention auto" ||
  fail "the plain run's flags: $(head -n1 "$tmp/mt_args")"
echo "gpu_compare.sh: ok"
