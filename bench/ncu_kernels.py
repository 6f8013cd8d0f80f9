#!/usr/bin/env python3
"""Where a training step's GPU time goes, kernel by kernel, from an Nsight Compute CSV log.

The log comes from profiling bench_gpu_train with only the kernel-duration metric (cheap: ~40 ms per kernel launch,
so a 1.3B step of ~750 launches takes about a minute), e.g. as scripts/gpu_check's `profile` stage does:

    ncu --clock-control none --metrics gpu__time_duration.sum --csv --log-file k.csv \
        bench_gpu_train --model gpt-1.3b --batch 4 --seq 2048 --warmup 0 --steps 1
    bench/ncu_kernels.py k.csv --steps 2 --label "gpt-1.3b B4 T2048" > kernels.json

Each kernel runs serialised under ncu, so durations are the kernel's own, without overlap; `--clock-control none`
leaves the GPU at its normal (boost) clocks, as in training. bench_gpu_train with --warmup 0 --steps 1 runs two
steps (the timed one and the op-timed one): pass --steps 2 to get per-step figures. Kernels are grouped by name and
launch shape; the JSON lists them by time per step, with the share of the total.
"""
import argparse
import collections
import csv
import io
import json
import re
import sys


def short_name(name: str) -> str:
    """A kernel's name without its return type, namespaces and parameters.

    'void cuda::<unnamed>::norm_backward_kernel<0>(cuda::NormBackwardArgs, float *, long)' -> 'norm_backward_kernel<0>'
    """
    depth, start, cut = 0, 0, len(name)
    for i, ch in enumerate(name):
        if ch in "<(":
            if ch == "(" and depth == 0:
                cut = i  # the parameter list
                break
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == ":" and depth == 0 and name[i + 1 : i + 2] == ":":
            start = i + 2  # after the last namespace qualifier outside template arguments
    return re.sub(r"^void ", "", name[start:cut].strip())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="ncu --csv --log-file output")
    ap.add_argument("--steps", type=float, default=1.0, help="training steps the log covers (per-step figures)")
    ap.add_argument("--label", default="", help="what was profiled (model, batch, sequence), copied to the JSON")
    ap.add_argument("--top", type=int, default=40, help="kernels listed (the rest are summed as 'other')")
    a = ap.parse_args()
    if a.steps <= 0:
        print("ncu_kernels: --steps must be > 0", file=sys.stderr)
        return 2
    try:
        text = open(a.csv, encoding="utf-8", errors="replace").read()
    except OSError as e:
        print(f"ncu_kernels: cannot read {a.csv}: {e}", file=sys.stderr)
        return 2
    # ncu mixes its own "==PROF==" lines with the CSV rows; the CSV rows are the quoted ones.
    rows = csv.DictReader(io.StringIO("\n".join(l for l in text.splitlines() if l.startswith('"'))))
    to_ms = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0, "s": 1e3,
             "second": 1e3}
    groups = collections.defaultdict(lambda: {"launches": 0, "ms": 0.0})
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r["Metric Unit"].strip()
        if unit not in to_ms:
            print(f"ncu_kernels: unknown time unit '{unit}' in {a.csv}", file=sys.stderr)
            return 2
        key = (short_name(r["Kernel Name"]), r["Grid Size"], r["Block Size"])
        groups[key]["launches"] += 1
        groups[key]["ms"] += float(r["Metric Value"].replace(",", "")) * to_ms[unit]
    if not groups:
        print(f"ncu_kernels: no gpu__time_duration.sum rows in {a.csv} (was ncu run with --csv and that metric?)",
              file=sys.stderr)
        return 1
    total = sum(g["ms"] for g in groups.values())
    ranked = sorted(groups.items(), key=lambda kv: -kv[1]["ms"])
    kernels = [{"kernel": k[0], "grid": k[1], "block": k[2], "launches_per_step": g["launches"] / a.steps,
                "ms_per_step": g["ms"] / a.steps, "share": g["ms"] / total} for k, g in ranked[: a.top]]
    rest = sum(g["ms"] for _, g in ranked[a.top:])
    out = {"tool": "ncu gpu__time_duration.sum (kernels serialised)", "label": a.label, "steps": a.steps,
           "kernel_ms_per_step": total / a.steps, "kernels": kernels, "other_ms_per_step": rest / a.steps}
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
