#!/usr/bin/env python3
"""What recording the timeline costs a step (train.trace_steps, docs/observability.md).

Runs the same 4-rank dp2 x pp2 job of a small model under `megatrain launch` with the timeline off and with every
step traced, alternating the two, `--repeats` times each, and compares their per-step times (metrics.jsonl
`step_seconds`, step 1 left out: it allocates and warms up). A traced step records a span per phase, per pipeline
action and per collective or transfer, so the job's small steps (a few ms of compute each, many collectives) are
the case where the cost shows most. Prints JSON (the medians and their ratio, the spans per step) and writes
bench/results/timeline_overhead-<machine>.json.
  bench/timeline_overhead.py [--build build] [--steps 30] [--repeats 3]
"""
import argparse, json, os, platform, statistics, subprocess, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(build, out, steps, traced):
    args = [os.path.join(build, "megatrain"), "launch", "--nproc", "4", "--", "train",
            "--parallel.dp=2", "--parallel.pp=2", "--parallel.microbatches=4", "--model.n_layer=4",
            "--model.d_model=64", "--model.n_head=2", "--model.max_seq_len=64", "--data.seq_len=32",
            "--data.batch_size=2", "--train.eval_every=0", "--sample.tokens=0", "--train.log_every=1000",
            "--train.threads=1", f"--train.steps={steps}", "--ckpt.save_final=false", "--ckpt.snapshot_every=0",
            "--train.peak_tflops=1", f"--data.dir={os.path.join(build, 'test-data', 'brown')}",
            f"--train.out_dir={out}"]
    if traced:
        args.append(f"--train.trace_steps=[1,{steps}]")
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    times = [j["step_seconds"] for j in map(json.loads, open(os.path.join(out, "metrics.jsonl")))
             if j.get("kind") == "train" and j["step"] > 1]
    spans = None
    if traced:
        spans = len([e for e in json.load(open(os.path.join(out, "trace.json")))["traceEvents"] if e["ph"] == "X"])
    return times, spans


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    off, on, spans = [], [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.repeats):
            for traced in (False, True):
                t, s = run(a.build, os.path.join(tmp, f"{i}-{traced}"), a.steps, traced)
                (on if traced else off).extend(t)
                spans = s or spans
    res = {
        "bench": "timeline_overhead",
        "cores": os.cpu_count(),
        "job": "4 ranks (dp2 x pp2), 4 layers of d_model 64, 4 micro-batches of 2 x 32 tokens, 1 thread per rank",
        "steps_per_run": a.steps - 1, "runs_each": a.repeats,
        "median_step_s_off": statistics.median(off), "median_step_s_traced": statistics.median(on),
        "ratio_traced_to_off": statistics.median(on) / statistics.median(off),
        "spans_per_step_all_ranks": spans / a.steps,
    }
    print(json.dumps(res, indent=2))
    model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
    res["cpu"] = model
    cpu = "epyc" if "EPYC" in model else "xeon" if "Xeon" in model else platform.machine()
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", f"timeline_overhead-{cpu}-{os.cpu_count()}core.json"), "w") as f:
        json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
