#!/usr/bin/env python3
"""A fake training job for the lab's tests, shaped like the reference `torchrun benchmark.py`:
it prints the reference benchmark's summary lines, dies with PyTorch's out-of-memory message
above a batch size, and on request hangs, crashes, prints no metrics, or leaves a grandchild
behind. Plain python3, no packages.

  --batch_size N            micro-batch per device
  --seq_len N               (default 1024)
  --model_precision fp32|bf16  --mixed_precision no|bf16
  --attn_implementation eager|sdpa|flash_attention_2   --use_liger
  --memory_gb G             device memory: OOM when the modelled need exceeds it (default 80)
  --oom_above N             OOM when batch_size > N (overrides the model)
  --hang                    sleep forever after the first step
  --ignore_sigterm          (with --hang) ignore SIGTERM, so only SIGKILL stops it
  --spawn_child FILE        start a grandchild that sleeps forever; write its pid to FILE
  --no_metrics              finish normally but print no throughput or memory line
  --crash                   raise an exception (exit 1, not an OOM)
  --sleep S                 sleep S seconds before finishing
"""
import argparse
import os
import signal
import subprocess
import sys
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch_size", type=int, required=True)
    p.add_argument("--seq_len", type=int, default=1024)
    p.add_argument("--model_precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--mixed_precision", choices=["no", "bf16"], default="no")
    p.add_argument("--attn_implementation", choices=["eager", "sdpa", "flash_attention_2"], default="eager")
    p.add_argument("--use_liger", action="store_true")
    p.add_argument("--memory_gb", type=float, default=80.0)
    p.add_argument("--oom_above", type=int)
    p.add_argument("--hang", action="store_true")
    p.add_argument("--ignore_sigterm", action="store_true")
    p.add_argument("--spawn_child")
    p.add_argument("--no_metrics", action="store_true")
    p.add_argument("--crash", action="store_true")
    p.add_argument("--sleep", type=float, default=0.0)
    a = p.parse_args()

    print("Loading model... world size 1, micro-batch %d, seq %d" % (a.batch_size, a.seq_len), flush=True)
    if a.spawn_child:
        child = subprocess.Popen([sys.executable, "-S", "-c", "import time\nwhile True: time.sleep(1)"])
        with open(a.spawn_child, "w") as f:
            f.write(str(child.pid))
    bf16 = a.model_precision == "bf16" or a.mixed_precision == "bf16"
    weights = 16.0 if a.model_precision == "fp32" else 8.0
    per_sample = 2.0 if bf16 else 4.0
    if a.attn_implementation == "eager":
        per_sample *= 2
    if a.use_liger:
        per_sample /= 3
    need = weights + per_sample * a.batch_size
    too_big = a.batch_size > a.oom_above if a.oom_above is not None else need > a.memory_gb
    if too_big:
        sys.stderr.write("Traceback (most recent call last):\n  File \"benchmark.py\", line 212, in <module>\n"
                         "    loss.backward()\n")
        sys.stderr.write("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
                         "total capacity of 79.25 GiB of which 1.02 GiB is free.\n")
        return 1
    if a.crash:
        raise RuntimeError("NCCL error: unhandled system error")
    if a.hang:
        if a.ignore_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("step 1/20", flush=True)
        while True:
            time.sleep(1)
    time.sleep(a.sleep)
    if a.no_metrics:
        print("done.")
        return 0
    tps = 1000.0 * (1.8 if bf16 else 1.0) * (1.3 if a.attn_implementation != "eager" else 1.0) * \
        (1.2 if a.use_liger else 1.0) * a.batch_size / (a.batch_size + 2.0)
    print("Training throughput: %.2f Tokens/s/GPU" % tps)
    print("Max reserved GPU Memory: %.2f" % need)
    return 0


if __name__ == "__main__":
    sys.exit(main())
