#!/usr/bin/env python3
"""Recovery of a supervised job from each kind of fault (issue 12), measured from the supervisor's event log.

For each fault kind it runs a 2-rank data-parallel job of a tiny model under
`megatrain launch --max-restarts 3 --events ...`, does the fault to it, and reads from the events:
  detection_s           fault (the `injected` event, or the moment this script sent the signal) -> `detected`
  to_first_step_s       `detected` -> `resumed` (the first step of the new attempt finished)
  steps_recomputed      steps the failed attempt had finished past the checkpoint it resumed from
  wall_s / undisturbed_wall_s   the whole job against the same job without a fault, in the same run
Prints JSON and writes bench/results/fault_recovery-<machine>.json.
  node / node_shrink    a job of two agents on this host as nodes (1 rank each, dp2; `node` with a spare agent):
                        agent 1 is killed (kill -9), the job driver detects the lost node (its liveness counter
                        stands still for --node-timeout 8 s) and restarts on the spare, or on one node (dp1)
  bench/fault_recovery.py [--build build] [--steps 20] [--kinds crash,kill9,stop,hang,nan,node,node_shrink]
"""
import argparse, json, os, platform, signal, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def job_args(out, steps, every):
    return ["--", "train", "--parallel.dp=2", "--model.n_layer=2", "--model.d_model=64", "--model.n_head=2",
            "--model.max_seq_len=64", "--data.seq_len=32", "--data.batch_size=2", "--optim.lr=3e-3",
            "--train.eval_every=0", "--sample.tokens=0", "--train.log_every=1000", "--train.threads=1",
            f"--train.steps={steps}", f"--ckpt.every={every}", "--ckpt.save_final=false",
            f"--data.dir={os.path.join(ROOT, 'build', 'test-data', 'brown')}", f"--train.out_dir={out}"]


def last_step(metrics):
    s = 0
    try:
        for line in open(metrics):
            try:
                j = json.loads(line)
            except ValueError:
                continue
            if j.get("kind") == "train":
                s = max(s, j["step"])
    except FileNotFoundError:
        pass
    return s


def rank_pid(launcher, rank):
    for task in os.listdir(f"/proc/{launcher}/task"):
        for pid in open(f"/proc/{launcher}/task/{task}/children").read().split():
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            if f"RANK={rank}".encode() in env:
                return int(pid)
    return None


def run(binary, work, name, steps, every, faults="", signal_at=None, sig=None, extra=()):
    out = os.path.join(work, name)
    events = os.path.join(work, name + ".events.jsonl")
    env = dict(os.environ)
    env.pop("MEGATRAIN_FAULTS", None)
    if faults:
        env["MEGATRAIN_FAULTS"] = faults
    args = [binary, "launch", "--nproc", "2", "--max-restarts", "3", "--backoff", "0", "--events", events,
            *extra, *job_args(out, steps, every)]
    t0 = time.time()
    with open(os.path.join(work, name + ".log"), "w") as log:
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        sent = None
        if signal_at:
            while last_step(out + "/metrics.jsonl") < signal_at and p.poll() is None:
                time.sleep(0.02)
            pid = rank_pid(p.pid, 1)
            sent = time.time()
            os.kill(pid, sig)
        code = p.wait(timeout=900)
    wall = time.time() - t0
    ev = [json.loads(l) for l in open(events)] if os.path.exists(events) else []
    return code, wall, ev, sent


def run_nodes(binary, work, name, steps, every, spares, kill_at):
    """Agents 0 and 1 (and a spare) of a 2-node job on this host; agent 1 is killed at step kill_at."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    out = os.path.join(work, name)
    env = dict(os.environ)
    env.pop("MEGATRAIN_FAULTS", None)
    env["MEGATRAIN_STORE_SECRET"] = "0123456789abcdef0123456789abcdef"
    job = job_args(out, steps, every)
    procs, logs = [], []
    t0 = time.time()
    for a in range(2 + spares):
        log = open(os.path.join(work, f"{name}-agent{a}.log"), "w")
        logs.append(log)
        args = [binary, "launch", "--nproc", "1", "--nnodes", "2", "--node-rank", str(a), "--spares", str(spares),
                "--master", f"127.0.0.1:{port}", "--iface", "lo", "--max-restarts", "3", "--backoff", "0",
                "--events", os.path.join(work, f"{name}.events-{a}.jsonl"), *job]
        procs.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env))
    while last_step(out + "/metrics.jsonl") < kill_at and procs[0].poll() is None:
        time.sleep(0.02)
    sent = time.time()
    procs[1].kill()
    code = procs[0].wait(timeout=900)
    wall = time.time() - t0
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    for log in logs:
        log.close()
    ev = [json.loads(l) for l in open(os.path.join(work, f"{name}.events-0.jsonl"))]
    return code, wall, [e for e in ev if e.get("by") == "driver"], sent


def first(ev, name):
    return next((e for e in ev if e["event"] == name), None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--kinds", default="crash,kill9,stop,hang,nan,node,node_shrink")
    a = ap.parse_args()
    binary = os.path.join(a.build, "megatrain")
    data = os.path.join(ROOT, "build", "test-data", "brown")
    if not os.path.exists(os.path.join(data, "meta.json")):
        subprocess.check_call([binary, "prepare-data", "--preset", "brown", "--out", data], stdout=subprocess.DEVNULL)
    work = tempfile.mkdtemp(prefix="mt-fault-bench-")
    mid = a.steps // 2 + 1
    code, base_wall, _, _ = run(binary, work, "undisturbed", a.steps, a.every)
    assert code == 0, "the undisturbed run failed"
    kinds = {
        "crash": dict(faults=f"crash:rank=1:step={mid}"),
        "kill9": dict(signal_at=mid, sig=signal.SIGKILL),
        "stop": dict(signal_at=mid, sig=signal.SIGSTOP, extra=("--heartbeat-timeout", "10")),
        "hang": dict(faults=f"hang:rank=1:step={mid}", extra=("--hang-floor", "30")),
        "nan": dict(faults=f"nan:rank=0:step={mid}"),
        "node": dict(spares=1),
        "node_shrink": dict(spares=0),
    }
    rows = []
    for k in a.kinds.split(","):
        if k.startswith("node"):
            code, wall, ev, sent = run_nodes(binary, work, k, a.steps, a.every, kinds[k]["spares"], mid)
        else:
            code, wall, ev, sent = run(binary, work, k, a.steps, a.every, **kinds[k])
        inj, det, res, rst = first(ev, "injected"), first(ev, "detected"), first(ev, "resumed"), first(ev, "restarting")
        fault_t = sent if sent else (inj["t"] if inj else None)
        row = {"kind": k, "exit_code": code, "wall_s": round(wall, 2), "undisturbed_wall_s": round(base_wall, 2),
               "detected_reason": det and det.get("reason"), "blame": det and det.get("blame"),
               "detection_s": round(det["t"] - fault_t, 3) if det and fault_t else None,
               "to_first_step_s": round(res["t"] - det["t"], 3) if det and res else None,
               "steps_recomputed": (rst["attempt_best_step"] - res.get("from", res["step"] - 1)) if rst and res
               else None,
               "new_layout": rst and rst.get("why"),
               "restarts": sum(1 for e in ev if e["event"] == "restarting")}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    result = {"benchmark": "fault_recovery", "machine": f"{cpu}, {os.cpu_count()} cores", "steps": a.steps,
              "ckpt_every": a.every, "fault_at_step": mid, "rows": rows,
              "note": "hang: declared after --hang-floor 30 s (the median step time here is far below 6 s); "
                      "stop: after --heartbeat-timeout 10 s; node: after --node-timeout 8 s (the driver polls "
                      "every 0.5 s), then diagnose on the surviving node"}
    print(json.dumps(result, indent=2))
    tag = platform.node() if os.environ.get("MT_BENCH_TAG") is None else os.environ["MT_BENCH_TAG"]
    path = os.path.join(ROOT, "bench", "results", f"fault_recovery-{tag}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
