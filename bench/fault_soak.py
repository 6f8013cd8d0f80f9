#!/usr/bin/env python3
"""Soak: a supervised training job under a random fault about every --mtbf seconds for --minutes (issue 12).

Faults are done from outside, as a failing machine would: `kill -9` or `kill -STOP` of a random rank, chosen at
random. The job (a 2-rank dp job of a tiny model, checkpointing every --every steps) runs under
`megatrain launch --max-restarts 1000 --events ...` until its steps are done.
    effective training time = (sum of step_seconds over the final history, one train line per step) / wall time
(and, beside it, the supervisor's own figure from its `done` event: launch/useful_time.h)
Prints JSON and writes bench/results/fault_soak-<tag>.json.
  bench/fault_soak.py [--minutes 10] [--mtbf 120] [--every 20] [--seed 1]
"""
import argparse, json, os, random, signal, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fault_recovery import ROOT, job_args, last_step, rank_pid  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--mtbf", type=float, default=120)
    ap.add_argument("--every", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--step-seconds", type=float, default=0.3, help="a guess used only to size the job")
    a = ap.parse_args()
    rnd = random.Random(a.seed)
    binary = os.path.join(a.build, "megatrain")
    work = tempfile.mkdtemp(prefix="mt-fault-soak-")
    out, events = os.path.join(work, "run"), os.path.join(work, "events.jsonl")
    steps = int(a.minutes * 60 / a.step_seconds)
    args = [binary, "launch", "--nproc", "2", "--max-restarts", "1000", "--backoff", "0", "--no-progress-limit", "5",
            "--heartbeat-timeout", "10", "--events", events, *job_args(out, steps, a.every)]
    t0 = time.time()
    faults = []
    with open(os.path.join(work, "run.log"), "w") as log:
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        next_fault = t0 + rnd.expovariate(1 / a.mtbf)
        while p.poll() is None:
            time.sleep(0.2)
            if time.time() < next_fault or last_step(out + "/metrics.jsonl") == 0:
                continue
            kind = rnd.choice(["kill9", "stop"])
            pid = None
            try:
                pid = rank_pid(p.pid, rnd.randrange(2))
            except (FileNotFoundError, ProcessLookupError):
                pass
            if pid:
                os.kill(pid, signal.SIGKILL if kind == "kill9" else signal.SIGSTOP)
                faults.append({"t": time.time() - t0, "kind": kind, "step": last_step(out + "/metrics.jsonl")})
                print(json.dumps(faults[-1]), file=sys.stderr)
            next_fault = time.time() + rnd.expovariate(1 / a.mtbf)
        code = p.wait()
    wall = time.time() - t0
    useful, n = 0.0, 0
    for line in open(out + "/metrics.jsonl"):
        j = json.loads(line)
        if j.get("kind") == "train":
            useful += j["step_seconds"]
            n += 1
    ev = [json.loads(l) for l in open(events)]
    # The supervisor's own figure (launch/useful_time.h), from its last event: the same kept steps, over its wall time
    # (from the agent's start, so a little shorter than this script's, which includes starting the launcher).
    last = next((e for e in reversed(ev) if e["event"] in ("done", "gave_up")), {})
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    result = {"benchmark": "fault_soak", "machine": f"{cpu}, {os.cpu_count()} cores", "exit_code": code,
              "steps": steps, "train_lines": n, "wall_s": round(wall, 1), "useful_step_s": round(useful, 1),
              "effective_training_time": round(useful / wall, 4),
              "supervisor": {k: last.get(k) for k in ("useful_s", "wall_s", "effective_training")},
              "faults": faults,
              "restarts": sum(1 for e in ev if e["event"] == "restarting"),
              "detected": [{k: e.get(k) for k in ("attempt", "reason", "rank", "ranks", "blame")}
                           for e in ev if e["event"] == "detected"],
              "mtbf_s": a.mtbf, "ckpt_every": a.every}
    print(json.dumps(result, indent=2))
    tag = os.environ.get("MT_BENCH_TAG", "local")
    with open(os.path.join(ROOT, "bench", "results", f"fault_soak-{tag}.json"), "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
