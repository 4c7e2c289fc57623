#!/usr/bin/env python3
"""Side-by-side: scalelab vs the same Llama in plain PyTorch (Debian python3-torch), one run.

Runs both on llama-small (seq-len 256, micro-batch 4, fp32, synthetic data, 2 threads by
default), alternating them `--rounds` times, and prints tokens/s, peak RSS and the effective
GFLOP/s (6·N·tokens/s, N = parameters in matmuls) against this machine's measured sgemm peak.

    python3 bench/train_vs_torch.py [--build build] [--steps 8] [--rounds 2] [--threads 2]
"""
import argparse, json, os, re, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TORCH_PY = "/usr/bin/python3"


def run_child(cmd, env=None):
    """Runs cmd, returns (stdout, peak RSS bytes of the child)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    out, err = p.communicate()
    if p.returncode != 0:
        sys.exit(f"command failed ({p.returncode}): {' '.join(cmd)}\n{err[-2000:]}")
    return out, err


def measured(cmd, env=None):
    # ru_maxrss of RUSAGE_CHILDREN is the max over all waited children; take a fresh fork per
    # command so each figure is its own: run through a tiny wrapper that reports its child's rusage.
    wrapper = ("import resource,subprocess,sys,json;"
               "r=subprocess.run(sys.argv[1:],capture_output=True,text=True);"
               "sys.stdout.write(r.stdout);sys.stderr.write(r.stderr);"
               "print('@@RSS '+str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss*1024));"
               "sys.exit(r.returncode)")
    out, err = run_child([sys.executable, "-c", wrapper] + cmd, env)
    rss = int(re.search(r"@@RSS (\d+)", out).group(1))
    return out, err, rss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="llama-small")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--micro-batch-size", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()

    exe = os.path.join(a.build, "scalelab")
    peak_out = subprocess.run([os.path.join(a.build, "bench", "bench_sgemm_peak"), str(a.threads)],
                              capture_output=True, text=True, check=True).stdout
    peak = float(re.search(r"sgemm peak .*: ([\d.]+) GFLOP/s", peak_out).group(1))

    have_torch = subprocess.run([TORCH_PY, "-c", "import torch"], capture_output=True).returncode == 0
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    results = {"scalelab": [], "pytorch": []}
    n_matmul = None
    for rnd in range(a.rounds):
        with tempfile.TemporaryDirectory() as td:
            rec = os.path.join(td, "run.json")
            _, _, rss = measured([exe, "train", "--model", a.model, "--seq-len", str(a.seq_len),
                                  "--micro-batch-size", str(a.micro_batch_size), "--max-steps", str(a.steps),
                                  "--bench-warmup-steps", str(a.warmup), "--threads", str(a.threads),
                                  "--quiet", "--json", rec], env)
            j = json.load(open(rec))
            results["scalelab"].append((j["tokens_per_s"], rss))
            attn = 12.0 * j["config"]["model_config"]["num_hidden_layers"] * j["config"]["model_config"]["num_attention_heads"] \
                * j["config"]["model_config"]["head_dim"] * a.seq_len
            n_matmul = (j["flops_per_token"] - attn) / 6.0
        if have_torch:
            out, _, rss = measured([TORCH_PY, os.path.join(HERE, "torch_llama.py"), "--model", a.model,
                                    "--seq-len", str(a.seq_len), "--micro-batch-size", str(a.micro_batch_size),
                                    "--max-steps", str(a.steps), "--warmup-steps", str(a.warmup),
                                    "--threads", str(a.threads)], env)
            tj = json.loads([l for l in out.splitlines() if l.startswith("{")][-1])
            results["pytorch"].append((tj["tokens_per_s"], rss))

    def best(rows):
        return max(r[0] for r in rows), max(r[1] for r in rows)

    print(f"llama train, {a.model}, seq-len {a.seq_len}, micro-batch {a.micro_batch_size}, fp32, "
          f"{a.threads} threads, {a.steps} steps ({a.warmup} warm-up), best of {a.rounds} rounds")
    print(f"sgemm peak of this machine: {peak:.1f} GFLOP/s; N (matmul parameters) = {n_matmul:,.0f}")
    print(f"{'engine':<10} {'tokens/s':>10} {'peak RSS':>10} {'eff GFLOP/s':>12} {'% of peak':>10}")
    s_tps, s_rss = best(results["scalelab"])
    rows = [("scalelab", s_tps, s_rss)]
    if results["pytorch"]:
        t_tps, t_rss = best(results["pytorch"])
        rows.append(("pytorch", t_tps, t_rss))
    for name, tps, rss in rows:
        eff = 6 * n_matmul * tps / 1e9
        print(f"{name:<10} {tps:>10.1f} {rss / 2**30:>9.2f}G {eff:>12.1f} {100 * eff / peak:>9.1f}%")
    if results["pytorch"]:
        print(f"scalelab / pytorch: {s_tps / t_tps:.2f}x tokens/s (target >= 2.0x), "
              f"{s_rss / t_rss:.2f}x peak RSS (target <= 0.5x)")
    else:
        print("pytorch: not measured (Debian's python3-torch is not installed for /usr/bin/python3)")


if __name__ == "__main__":
    main()
