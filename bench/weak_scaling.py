#!/usr/bin/env python3
"""Weak scaling on this machine: 1 rank x T threads vs 2 ranks x T threads, data-parallel (DDP).

    python3 bench/weak_scaling.py --build build [--rounds 3] [--threads 1] [train flags...]

Each round runs `scalelab scale --ranks 1,2 --repeats <round>` (which resumes the earlier
repeats from its database and measures one more of each rank count, so the two counts alternate
in time), then a contention control: two independent single-rank runs at once, each bound to its
own cores. The control separates what the machine costs two processes (shared memory bandwidth,
caches, other tenants) from what data parallelism costs (the all-reduce and its synchronization):

  parallel efficiency     = 2-rank tokens/s per device / 1-rank tokens/s   (what `scale` reports)
  DDP vs independent pair = 2-rank tokens/s per device / mean of the pair's tokens/s

It prints per round and the medians, the communication per step, the part hidden behind backward,
and the load average around each measurement (the machine may be shared: read them with it).
Defaults: llama-small, seq-len 256, micro-batch 4, 6 steps of which 2 warm-up.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def run(cmd, env=None):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if p.returncode != 0:
        sys.exit("command failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stdout[-4000:]))
    return p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="threads per rank")
    ap.add_argument("--db", default="", help="results database (default: a temporary one)")
    args, train = ap.parse_known_args()
    exe = os.path.abspath(os.path.join(args.build, "scalelab"))
    if not train:
        train = ["--model", "llama-small", "--seq-len", "256", "--micro-batch-size", "4", "--max-steps", "6",
                 "--bench-warmup-steps", "2"]
    train = train + ["--threads", str(args.threads)]
    tmp = tempfile.mkdtemp(prefix="scalelab-weak-")
    db = args.db or os.path.join(tmp, "scale.db")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    ncpu = os.cpu_count() or 1
    print("machine: %d cores; 2 ranks x %d threads; train flags: %s" % (ncpu, args.threads, " ".join(train)))

    rounds = []
    for r in range(1, args.rounds + 1):
        before = loadavg()
        run([exe, "scale", "--ranks", "1,2", "--repeats", str(r), "--db", db, "--name", "weak"] + train, env)
        mid = loadavg()
        # The control: two independent single-rank runs at once, on disjoint cores.
        procs, paths = [], []
        for i in range(2):
            cores = ",".join(str(c % ncpu) for c in range(i * args.threads, (i + 1) * args.threads))
            path = os.path.join(tmp, "pair-%d-%d.json" % (r, i))
            paths.append(path)
            procs.append(subprocess.Popen(["taskset", "-c", cores, exe, "train", "--quiet", "--json", path] + train,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env))
        for p in procs:
            if p.wait() != 0:
                sys.exit("the control run failed")
        after = loadavg()
        pair = [json.load(open(p))["tokens_per_s_per_device"] for p in paths]
        rounds.append({"pair": statistics.mean(pair), "load": (before, mid, after)})

    rows = json.loads(run([exe, "results", "--db", db, "--sweep", "weak", "--view", "trials", "--format", "json"]))
    logdir = os.path.join(os.path.dirname(db), "logs", "weak")
    by = {1: [], 2: []}
    for t in sorted(rows, key=lambda t: t["trial_id"]):
        rec = json.load(open(os.path.join(logdir, os.path.basename(t["log_path"])[:-4] + ".json")))
        by[rec["world_size"]].append(rec)
    print("\n| round | load 1-min (before/mid/after) | 1 rank tok/s | 2 ranks tok/s/device | efficiency % | "
          "independent pair tok/s each | DDP vs pair % | comm s/step | exposed s/step | hidden % |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    effs, vs_pair, hidden = [], [], []
    for i, rd in enumerate(rounds):
        one, two = by[1][i], by[2][i]
        e = 100 * two["tokens_per_s_per_device"] / one["tokens_per_s_per_device"]
        v = 100 * two["tokens_per_s_per_device"] / rd["pair"]
        d = two["data_parallel"]
        effs.append(e)
        vs_pair.append(v)
        hidden.append(100 * d["comm_hidden_fraction"])
        print("| %d | %.2f / %.2f / %.2f | %.1f | %.1f | %.1f | %.1f | %.1f | %.3f | %.3f | %.0f |" % (
            i + 1, *rd["load"], one["tokens_per_s_per_device"], two["tokens_per_s_per_device"], e, rd["pair"], v,
            d["comm_time_s"], d["comm_exposed_s"], 100 * d["comm_hidden_fraction"]))
    print("\nmedian parallel efficiency %.1f%%, DDP vs independent pair %.1f%%, all-reduce hidden %.0f%%" % (
        statistics.median(effs), statistics.median(vs_pair), statistics.median(hidden)))
    print("scale table: %s results --db %s --sweep weak" % (exe, db))


if __name__ == "__main__":
    main()
