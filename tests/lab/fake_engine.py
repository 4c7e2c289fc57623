#!/usr/bin/env python3
"""A stand-in for `scalelab train` and `scalelab plan` in the lab's tests (no packages needed).

It follows the engine's contract as the lab reads it (docs/lab.md, "How a trial's outcome is decided"; the design guide
DESIGN.md is not in this repository): the train flags, the run record written to --json,
the summary lines, and the exit codes (0 ok, 2 invalid input, 3 out of device memory). Memory use
follows a small model of the real thing, so that the optimization ladder moves the way the
physics says: bf16 halves weights and activations, flash attention drops the S x S scores, fused
kernels drop the logits.

Environment knobs for tests:
  FAKE_ENGINE_CALLS=FILE      append one line per invocation ("train mbs=4 ...")
  FAKE_ENGINE_NO_PLAN=1       `plan` is an unknown subcommand (exit 2), like an engine without it
  FAKE_ENGINE_PLAN_OFFSET=K   the plan's max_micro_batch_size is off by K
  FAKE_ENGINE_REFUSE=FLAG     refuse a switch with exit 2 (attn|fused-kernels|model-precision|mixed-precision)
  FAKE_ENGINE_SLEEP=S         sleep S seconds in train (so a runner can be killed mid-trial)
  FAKE_ENGINE_HANG_ABOVE=N    hang forever when the micro-batch is above N
"""
import json
import os
import sys
import time

MODELS = {"llama-tiny": 2e6, "llama-small": 40e6, "opt-tiny": 2e6, "opt-small": 40e6}
FLAGS_WITH_VALUE = {
    "--model", "--seq-len", "--micro-batch-size", "--max-steps", "--model-precision", "--mixed-precision",
    "--attn", "--device-memory", "--threads", "--json", "--seed", "--lr", "--warmup-steps", "--data",
    "--grad-accum-steps", "--device",
}
SWITCHES = {"--fused-kernels", "--activation-checkpointing"}
CHOICES = {"--model-precision": ("fp32", "bf16"), "--mixed-precision": ("no", "bf16", "fp16"),
           "--attn": ("eager", "flash")}


def fail(msg, code=2):
    sys.stderr.write("scalelab train: error: " + msg + "\n")
    sys.exit(code)


def parse_size(text):
    units = {"TiB": 2**40, "GiB": 2**30, "MiB": 2**20, "KiB": 2**10, "GB": 1e9, "MB": 1e6, "G": 2**30, "M": 2**20}
    for u, f in units.items():
        if text.endswith(u):
            return int(float(text[: -len(u)]) * f)
    return int(text)


def parse(argv):
    opts = {"--model": "llama-small", "--seq-len": "256", "--micro-batch-size": "1", "--max-steps": "5",
            "--model-precision": "fp32", "--mixed-precision": "no", "--attn": "eager", "--device-memory": "1TiB"}
    i = 0
    while i < len(argv):
        a = argv[i]
        if "=" in a and a.startswith("--"):
            a, v = a.split("=", 1)
            argv = argv[:i] + [a, v] + argv[i + 1:]
        if a in SWITCHES:
            opts[a] = True
            i += 1
        elif a in FLAGS_WITH_VALUE:
            if i + 1 >= len(argv):
                fail(a + " needs a value")
            opts[a] = argv[i + 1]
            i += 2
        else:
            fail("The following argument was not expected: " + a + " — see scalelab train --help")
    for flag, allowed in CHOICES.items():
        if opts[flag] not in allowed:
            fail("%s %s is not one of %s" % (flag, opts[flag], "|".join(allowed)))
    if opts["--model"] not in MODELS:
        fail("unknown model preset '%s'" % opts["--model"])
    refuse = os.environ.get("FAKE_ENGINE_REFUSE", "")
    if refuse:
        value = opts.get("--" + refuse)
        default = {"attn": "eager", "model-precision": "fp32", "mixed-precision": "no"}.get(refuse)
        if value not in (None, default):
            fail("--%s %s is not supported by this engine build — remove it" % (refuse, value))
    return opts


def memory(opts, mbs):
    """Bytes needed: (fixed, per sample)."""
    n = MODELS[opts["--model"]]
    s = int(opts["--seq-len"])
    bf16_model = opts["--model-precision"] == "bf16"
    mixed = opts["--mixed-precision"] != "no"
    if bf16_model:
        fixed = n * (2 + 2 + 4)  # weights, grads, adam (bf16)
    else:
        fixed = n * (4 + 4 + 8) + (n * 2 if mixed else 0)  # fp32 master + low-precision copy
    c = 2 if (bf16_model or mixed) else 4
    layers = 8
    per = layers * s * 2048 * c
    if opts["--attn"] == "eager":
        per += layers * 8 * s * s * c
    if not opts.get("--fused-kernels"):
        per += s * 32768 * 4 * 2
    if opts.get("--activation-checkpointing"):
        per //= 4
    return int(fixed), int(per)


def throughput(opts, mbs):
    t = 1000.0
    if opts["--model-precision"] == "bf16":
        t *= 1.8
    elif opts["--mixed-precision"] != "no":
        t *= 1.5
    if opts["--attn"] == "flash":
        t *= 1.3
    if opts.get("--fused-kernels"):
        t *= 1.2
    return t * mbs / (mbs + 2.0)


def main():
    argv = sys.argv[1:]
    if not argv or argv[0] not in ("train", "plan"):
        fail("expected a subcommand: train or plan")
    cmd = argv[0]
    calls = os.environ.get("FAKE_ENGINE_CALLS")
    if calls:
        with open(calls, "a") as f:
            f.write(" ".join(argv) + "\n")
    if cmd == "plan" and os.environ.get("FAKE_ENGINE_NO_PLAN"):
        fail("The following argument was not expected: plan")
    opts = parse(argv[1:])
    mbs = int(opts["--micro-batch-size"])
    if mbs < 1:
        fail("--micro-batch-size must be positive")
    cap = parse_size(opts["--device-memory"])
    fixed, per = memory(opts, mbs)
    out = opts.get("--json")

    if cmd == "plan":
        best = max(0, (cap - fixed) // per) if cap > fixed else 0
        best = max(0, best + int(os.environ.get("FAKE_ENGINE_PLAN_OFFSET", "0")))
        rec = {"max_micro_batch_size": int(best), "total_bytes": fixed + per * mbs, "capacity_bytes": cap}
        print("plan: largest micro-batch that fits: %d" % best)
        if out:
            with open(out, "w") as f:
                json.dump(rec, f)
        return 0

    hang = os.environ.get("FAKE_ENGINE_HANG_ABOVE")
    if hang and mbs > int(hang):
        sys.stderr.write("step 1 ...\n")
        sys.stderr.flush()
        while True:
            time.sleep(1)
    time.sleep(float(os.environ.get("FAKE_ENGINE_SLEEP", "0")))
    need = fixed + per * mbs
    config = {k[2:].replace("-", "_"): v for k, v in opts.items()}
    if need > cap:
        msg = ("[allocator] out of cpu memory for activations: tried to allocate %.2f GiB with %.2f GiB allocated "
               "of a %.2f GiB capacity" % (per * mbs / 2**30, fixed / 2**30, cap / 2**30))
        sys.stderr.write("scalelab train: error: " + msg + "\n")
        if out:
            with open(out, "w") as f:
                json.dump({"status": "oom", "config": config, "error": msg}, f)
        return 3
    steps = int(opts["--max-steps"])
    tps = throughput(opts, mbs)
    seq = int(opts["--seq-len"])
    losses = [10.4 - 0.1 * i for i in range(steps)]
    for i, loss in enumerate(losses):
        sys.stderr.write("step %d/%d loss %.4f %.1f tokens/s\n" % (i + 1, steps, loss, tps))
    print("Training throughput: %.2f tokens/s/device" % tps)
    print("Max reserved memory: %.2f GiB" % (need / 2**30))
    rec = {
        "status": "ok", "config": config, "params": MODELS[opts["--model"]], "flops_per_token": 6 * MODELS[opts["--model"]],
        "tokens_per_s": tps, "tokens_per_s_per_device": tps, "step_time_s": mbs * seq / tps,
        "max_allocated_bytes": need, "max_reserved_bytes": need, "losses": losses, "final_loss": losses[-1],
        "mfu": None, "error": None,
    }
    if out:
        with open(out, "w") as f:
            json.dump(rec, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
