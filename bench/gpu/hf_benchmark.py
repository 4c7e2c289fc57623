#!/usr/bin/env python3
"""The reference practice's training benchmark, as its users run it: Hugging Face transformers'
`Trainer` on a randomly initialized model, on one GPU.

The model is built from a config dict written below (the published config.json of each model,
cross-checked against scalelab's presets in src/model/config.cpp), so nothing is downloaded.
The data are random token ids uniform in [0, 1000) with labels = inputs (the model shifts them),
as scalelab's synthetic data. TrainingArguments are the Trainer's defaults except
per_device_train_batch_size, max_steps, bf16 (mixed precision), optim="adamw_torch",
learning_rate 5e-5, no logging, no saving, report_to none, no progress bar.

The ladder's switches, the way the reference practice sets them:
  --torch-dtype float32|bfloat16   weights' dtype (bfloat16: model.to(torch.bfloat16), "full bf16")
  --mixed-precision no|bf16        TrainingArguments(bf16=True): autocast over fp32 weights
  --attn eager|sdpa|flash_attention_2   attn_implementation (`flash` means sdpa: PyTorch's SDPA
                                   dispatches to its FlashAttention-2 kernel on an H100)
  --lora-rank R                    peft LoRA (get_peft_model, r R, alpha 2R, dropout 0, all seven
                                   projections of Llama / q,k,v,out_proj,fc1,fc2 of OPT): the base
                                   frozen, as scalelab's --lora-rank R --lora-alpha 2R
  --liger                          Liger-Kernel (apply_liger_kernel_to_llama: RMSNorm, RoPE,
                                   SwiGLU, fused linear + cross-entropy); Liger has no OPT patch,
                                   so --liger with opt-1.3b reports status "unsupported"

Measured: tokens/s/GPU over the steps after --warmup-steps (a TrainerCallback that synchronizes
the device at on_step_begin and on_step_end, so the data loader's time between steps is not
counted; the wall-clock figure from the end of the last warm-up step is recorded beside it), max
reserved and allocated memory of PyTorch's caching allocator over training (the counters are reset
after the model is built), and torch.OutOfMemoryError -> status "oom" (exit 3). It prints the
reference benchmark's two summary lines and then one JSON line with the whole record.

    python3 bench/gpu/hf_benchmark.py --model llama-3.2-1b --seq-len 1024 --micro-batch-size 8 \
        --torch-dtype bfloat16 --attn sdpa --liger --max-steps 10 --warmup-steps 3
    python3 bench/gpu/hf_benchmark.py --model opt-1.3b --find-max-batch --budget-s 300 ...
    python3 bench/gpu/hf_benchmark.py --tiny --device cpu --max-steps 3   # a smoke test on a CPU
                                  # (--tiny: scalelab's llama-tiny / opt-tiny shapes)

--find-max-batch: the largest micro-batch that fits, doubling from --start then bisecting, each
trial a fresh process (an OOM leaves the caching allocator and sometimes the CUDA context in a
state that says nothing about the next size), within --budget-s; the JSON line holds the limit,
every probe and the largest fitting trial's record.

Exit codes: 0 ok, 3 out of memory, 2 unsupported / invalid, 1 anything else.
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

# --- the models (published config.json; scalelab's presets in src/model/config.cpp) ---------------
MODELS = {
    # meta-llama/Llama-3.2-1B; scalelab: llama("llama-3.2-1b", 2048, 8192, 16, 32, 8, 128256, 131072,
    # 500000.0, tied, llama3 scaling {32, 1, 4, 8192}, head_dim 64), rms_norm_eps 1e-5.
    "llama-3.2-1b": {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 128256,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "hidden_act": "silu",
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "tie_word_embeddings": True,
        "initializer_range": 0.02,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "use_cache": True,
    },
    # facebook/opt-1.3b; scalelab: opt("opt-1.3b", 2048, 8192, 24, 32, 50272, 2048, 2048,
    # do_layer_norm_before, dropout 0.1), relu, biases, tied, pad 1.
    "opt-1.3b": {
        "model_type": "opt",
        "architectures": ["OPTForCausalLM"],
        "vocab_size": 50272,
        "hidden_size": 2048,
        "ffn_dim": 8192,
        "num_hidden_layers": 24,
        "num_attention_heads": 32,
        "max_position_embeddings": 2048,
        "word_embed_proj_dim": 2048,
        "do_layer_norm_before": True,
        "activation_function": "relu",
        "enable_bias": True,
        "layer_norm_elementwise_affine": True,
        "dropout": 0.1,
        "attention_dropout": 0.0,
        "activation_dropout": 0.0,
        "layerdrop": 0.0,
        "init_std": 0.02,
        "tie_word_embeddings": True,
        "pad_token_id": 1,
        "bos_token_id": 2,
        "eos_token_id": 2,
        "use_cache": True,
    },
    # Qwen/Qwen2.5-0.5B (its published config.json); scalelab: qwen2_preset("qwen2.5-0.5b", 896, 4864,
    # 24, 14, 2, 151936, 32768, tied), q/k/v biases. Only bench/gpu/hf_memory.py's Liger rows use it.
    "qwen2.5-0.5b": {
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "sliding_window": 32768,
        "max_window_layers": 24,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
        "use_cache": True,
    },
}

# --tiny: scalelab's llama-tiny / opt-tiny presets (2 layers, hidden 64), for a smoke test on a CPU
# and a like-for-like check against `scalelab train --model llama-tiny|opt-tiny`.
TINY = {
    "llama": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256, "max_position_embeddings": 512,
              "rope_theta": 10000.0, "rope_scaling": None, "bos_token_id": 1, "eos_token_id": 2},
    "opt": {"hidden_size": 64, "ffn_dim": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "word_embed_proj_dim": 64, "vocab_size": 256, "max_position_embeddings": 512, "dropout": 0.0},
}
TINY_NAME = {"llama-3.2-1b": "llama-tiny", "opt-1.3b": "opt-tiny"}  # scalelab's names

# Liger-Kernel's patch function per model_type (the defaults: rope, rms_norm, swiglu,
# fused_linear_cross_entropy); OPT has none.
LIGER_PATCH = {"llama": "apply_liger_kernel_to_llama", "qwen2": "apply_liger_kernel_to_qwen2"}

DATA_VOCAB = 1000  # ids uniform in [0, min(1000, vocab)), as scalelab's synthetic data
OOM_RE = re.compile(r"out of (?:[a-z]+ )?memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|"
                    r"CUDNN_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation", re.I)
EXIT = {"ok": 0, "oom": 3, "unsupported": 2, "invalid": 2}


def model_config(model, tiny=False):
    """The config dict of a model name (a copy; --tiny shrinks it)."""
    if model not in MODELS:
        raise SystemExit(f"hf_benchmark: unknown model {model!r} (known: {', '.join(MODELS)})")
    d = json.loads(json.dumps(MODELS[model]))
    if tiny:
        d.update(TINY[d["model_type"]])
    return d


def matmul_params(d):
    """N of the FLOPs formula: every linear weight that takes part in a matmul, LM head included
    (tied or not), no embeddings lookups, norms or biases; as scalelab's flops_per_token."""
    h, L, V = d["hidden_size"], d["num_hidden_layers"], d["vocab_size"]
    if d["model_type"] == "llama":
        q = d.get("head_dim") or h // d["num_attention_heads"]
        nq, nkv, f = d["num_attention_heads"], d["num_key_value_heads"], d["intermediate_size"]
        per_layer = h * nq * q + 2 * h * nkv * q + nq * q * h + 3 * h * f
        return L * per_layer + V * h
    p, f = d["word_embed_proj_dim"], d["ffn_dim"]
    per_layer = 4 * h * h + 2 * h * f
    proj = 2 * h * p if p != h else 0
    return L * per_layer + proj + V * p


def flops_per_token(d, seq_len):
    """6·N + 12·L·H·Q·T (README: FLOPs per token)."""
    H = d["num_attention_heads"]
    Q = d.get("head_dim") or d["hidden_size"] // H
    return 6 * matmul_params(d) + 12 * d["num_hidden_layers"] * H * Q * seq_len


# --- one run -------------------------------------------------------------------------------------
def versions():
    v = {"python": sys.version.split()[0]}
    for name in ("torch", "transformers", "accelerate", "liger_kernel", "triton"):
        try:
            mod = __import__(name)
            v[name] = getattr(mod, "__version__", "?")
        except Exception:  # noqa: BLE001 - any import failure means "not available"
            v[name] = None
    try:
        import importlib.metadata as md
        if v.get("liger_kernel") in (None, "?"):
            try:
                v["liger_kernel"] = md.version("liger-kernel")
            except md.PackageNotFoundError:
                pass
    except ImportError:
        pass
    return v


def run_once(a):
    rec = {"status": "error", "side": "hf", "model": a.model, "tiny": a.tiny, "seq_len": a.seq_len,
           "micro_batch_size": a.micro_batch_size, "torch_dtype": a.torch_dtype,
           "mixed_precision": a.mixed_precision, "attn": a.attn, "liger": a.liger, "tf32": a.tf32,
           "lora_rank": a.lora_rank,
           "max_steps": a.max_steps, "warmup_steps": a.warmup_steps, "device": a.device, "error": None}
    d = model_config(a.model, a.tiny)
    rec["params_matmul"] = matmul_params(d)
    rec["flops_per_token"] = flops_per_token(d, a.seq_len)
    if a.seq_len > d["max_position_embeddings"]:
        rec["status"], rec["error"] = "invalid", f"seq-len {a.seq_len} > max_position_embeddings"
        return rec
    if a.liger and d["model_type"] not in LIGER_PATCH:
        rec["status"] = "unsupported"
        rec["error"] = ("Liger-Kernel has no patch for OPT (no apply_liger_kernel_to_opt); "
                        "the reference practice has no fused kernels for this model")
        return rec

    import torch
    from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments
    rec["versions"] = versions()
    dev = torch.device(a.device)
    on_cuda = dev.type == "cuda"
    if on_cuda and not torch.cuda.is_available():
        rec["error"] = "torch.cuda.is_available() is False"
        return rec
    if on_cuda:
        rec["gpu"] = torch.cuda.get_device_name(dev)
        if a.tf32:  # PyTorch's default keeps fp32 matmuls in fp32
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
    oom_types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                                  getattr(torch.cuda, "OutOfMemoryError", None)) if t is not None)

    def sync():
        if on_cuda:
            torch.cuda.synchronize(dev)

    try:
        if a.liger:
            try:
                import liger_kernel.transformers as liger
            except Exception as e:  # noqa: BLE001
                rec["status"] = "unsupported"
                rec["error"] = f"liger_kernel not importable: {type(e).__name__}: {e}"
                return rec
            getattr(liger, LIGER_PATCH[d["model_type"]])()  # patches the classes; before the model is built
            rec["liger_kernels"] = "rope, rms_norm, swiglu, fused_linear_cross_entropy (the defaults)"

        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
        cfg = CONFIG_MAPPING[d["model_type"]].from_dict(dict(d))
        attn = "sdpa" if a.attn == "flash" else a.attn
        rec["attn_implementation"] = attn
        torch.manual_seed(a.seed)
        ctx = dev if (on_cuda and hasattr(torch.device, "__enter__")) else None
        if ctx is not None:
            with ctx:  # initialize on the GPU (the Trainer would move it there anyway)
                model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn)
        else:
            model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn)
        if a.torch_dtype == "bfloat16":
            model = model.to(torch.bfloat16)  # "full bf16": bf16 weights, gradients, Adam states
        rec["params"] = sum(p.numel() for p in model.parameters())
        if a.lora_rank > 0:
            from peft import LoraConfig, get_peft_model
            targets = (["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
                       if d["model_type"] == "llama" else ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"])
            model = get_peft_model(model, LoraConfig(r=a.lora_rank, lora_alpha=2 * a.lora_rank, lora_dropout=0.0,
                                                     target_modules=targets, task_type="CAUSAL_LM"))
            rec["trainable_params"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
        rec["attn_implementation_used"] = getattr(model.config, "_attn_implementation", attn)

        class RandomIds(torch.utils.data.Dataset):
            def __init__(self, n, seq, seed):
                self.n, self.seq, self.seed = n, seq, seed

            def __len__(self):
                return self.n

            def __getitem__(self, i):
                g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
                ids = torch.randint(0, min(DATA_VOCAB, d["vocab_size"]), (self.seq,), generator=g)
                return {"input_ids": ids, "labels": ids.clone()}

        class StepTimer(TrainerCallback):
            def __init__(self):
                self.step_s, self.ends, self.t0 = [], [], None

            def on_step_begin(self, args, state, control, **kw):
                sync()
                self.t0 = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                sync()
                t = time.perf_counter()
                self.step_s.append(t - self.t0)
                self.ends.append(t)

        tmp = tempfile.mkdtemp(prefix="hf_benchmark_")
        fields = getattr(TrainingArguments, "__dataclass_fields__", {})
        ta = dict(output_dir=tmp, per_device_train_batch_size=a.micro_batch_size, max_steps=a.max_steps,
                  learning_rate=5e-5, optim="adamw_torch", bf16=(a.mixed_precision == "bf16"),
                  logging_strategy="no", save_strategy="no", report_to="none", disable_tqdm=True,
                  seed=a.seed)
        if not on_cuda:
            ta["use_cpu"] = True
        ta = {k: v for k, v in ta.items() if not fields or k in fields}
        args = TrainingArguments(**ta)
        timer = StepTimer()
        trainer = Trainer(model=model, args=args,
                          train_dataset=RandomIds(a.max_steps * a.micro_batch_size, a.seq_len, a.seed),
                          callbacks=[timer])
        if on_cuda:
            sync()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(dev)
        out = trainer.train()
        rec["train_loss"] = float(out.training_loss)
        rec["status"] = "ok"
    except oom_types as e:
        rec["status"], rec["error"] = "oom", f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    except RuntimeError as e:
        msg = str(e)
        rec["status"] = "oom" if OOM_RE.search(msg) else "error"
        rec["error"] = f"{type(e).__name__}: {msg.splitlines()[0][:300] if msg else ''}"
    except Exception as e:  # noqa: BLE001 - reported in the record
        rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    finally:
        if on_cuda:
            try:
                rec["max_reserved_bytes"] = torch.cuda.max_memory_reserved(dev)
                rec["max_allocated_bytes"] = torch.cuda.max_memory_allocated(dev)
            except Exception:  # noqa: BLE001 - a poisoned context after an error
                pass
        else:
            import resource
            rec["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if rec["status"] == "ok":
        steps = timer.step_s
        w = min(a.warmup_steps, max(0, len(steps) - 1))  # at least one measured step
        meas = steps[w:]
        tokens_per_step = a.micro_batch_size * a.seq_len
        rec["steps_run"] = len(steps)
        rec["warmup_steps_used"] = w
        rec["step_times_s"] = [round(s, 6) for s in steps]
        rec["step_time_s"] = statistics.median(meas)
        rec["tokens_per_s_per_device"] = tokens_per_step * len(meas) / sum(meas)
        if w >= 1 and len(timer.ends) > w:
            wall = timer.ends[-1] - timer.ends[w - 1]
            rec["wall_tokens_per_s_per_device"] = tokens_per_step * len(meas) / wall
        rec["achieved_tflops"] = rec["tokens_per_s_per_device"] * rec["flops_per_token"] / 1e12
    if "max_reserved_bytes" in rec:
        rec["max_reserved_gib"] = rec["max_reserved_bytes"] / 2**30
    return rec


# --- trials in fresh processes, and the largest micro-batch --------------------------------------
def run_cmd(cmd, timeout=None, env=None):
    """Runs cmd in its own process group; returns (exit code or None on timeout, output)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True, env=env)
    try:
        out, _ = p.communicate(timeout=timeout)
        return p.returncode, out
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, _ = p.communicate()
        return None, out


def child_record(rc, out, json_path):
    """The record a child wrote, or one made from its exit code and output."""
    rec = None
    if json_path and os.path.exists(json_path):
        try:
            with open(json_path) as f:
                rec = json.load(f)
        except (OSError, ValueError):
            rec = None
    if rec is None:
        tail = "\n".join((out or "").strip().splitlines()[-5:])
        if rc is None:
            rec = {"status": "timeout", "error": "trial timed out: " + tail[-300:]}
        elif rc == 3 or OOM_RE.search(out or ""):
            rec = {"status": "oom", "error": tail[-300:]}
        else:
            rec = {"status": "error", "error": f"exit {rc}: {tail[-500:]}"}
    rec["exit_code"] = rc
    return rec


class BudgetSpent(Exception):
    pass


def find_max_batch(trial, start=1, guess_step=None, max_mb=4096, deadline=None, tol=0.0, min_trial_s=20.0,
                   log=None):
    """The largest micro-batch b with trial(b) ok and trial(b+1) oom.

    trial(b, timeout_s) -> record with "status". From `start` it doubles (or, when `start` is a
    guess, grows by increments that double from guess_step·start, at least 1) until a trial runs
    out of memory, or shrinks the same way when `start` does not fit, then bisects until the gap is at most
    max(1, tol·b). Stops early (exact: false) at an error, a timeout or when less than
    min_trial_s is left before `deadline` (time.time()); then the limit is a lower bound.
    """
    log = log or (lambda s: None)
    probes, best = [], None
    lo, hi = 0, None
    state = {"stopped": None}

    def probe(b):
        timeout = None
        if deadline is not None:
            timeout = deadline - time.time()
            if timeout < min_trial_s:
                raise BudgetSpent(f"budget spent before micro-batch {b}")
        t0 = time.time()
        r = trial(b, timeout)
        probes.append({"micro_batch_size": b, "status": r.get("status"), "seconds": round(time.time() - t0, 1),
                       "tokens_per_s_per_device": r.get("tokens_per_s_per_device"),
                       "max_reserved_gib": r.get("max_reserved_gib"), "error": r.get("error")})
        log(f"  micro-batch {b}: {r.get('status')}"
            + (f", {r['tokens_per_s_per_device']:.0f} tokens/s" if r.get("tokens_per_s_per_device") else "")
            + (f", {r['max_reserved_gib']:.1f} GiB" if r.get("max_reserved_gib") else "")
            + f" ({time.time() - t0:.0f} s)")
        return r

    try:
        b = max(1, min(start, max_mb))
        r = probe(b)
        if r["status"] == "ok":
            lo, best = b, r
        elif r["status"] == "oom":
            hi = b
        else:
            state["stopped"] = f"micro-batch {b}: {r['status']}: {r.get('error')}"
        if state["stopped"] is None and hi is None:  # grow
            inc = max(1, int(b * guess_step)) if guess_step else b
            while hi is None and lo < max_mb:
                c = min(lo + inc, max_mb)
                r = probe(c)
                if r["status"] == "ok":
                    lo, best, inc = c, r, inc * 2
                elif r["status"] == "oom":
                    hi = c
                else:
                    state["stopped"] = f"micro-batch {c}: {r['status']}: {r.get('error')}"
                    break
        elif state["stopped"] is None:  # shrink
            dec = max(1, int(b * guess_step)) if guess_step else max(1, b // 2)
            while lo == 0 and hi > 1:
                c = max(1, hi - dec)
                r = probe(c)
                if r["status"] == "ok":
                    lo, best = c, r
                elif r["status"] == "oom":
                    hi, dec = c, dec * 2
                else:
                    state["stopped"] = f"micro-batch {c}: {r['status']}: {r.get('error')}"
                    break
        while state["stopped"] is None and hi is not None and lo > 0 and hi - lo > max(1, int(tol * lo)):
            mid = (lo + hi) // 2
            r = probe(mid)
            if r["status"] == "ok":
                lo, best = mid, r
            elif r["status"] == "oom":
                hi = mid
            else:
                state["stopped"] = f"micro-batch {mid}: {r['status']}: {r.get('error')}"
    except BudgetSpent as e:
        state["stopped"] = str(e)

    if lo == 0 and hi == 1:
        status = "oom"  # not even micro-batch 1 fits
    elif lo == 0:
        status = "error" if state["stopped"] and "budget" not in state["stopped"] else "budget"
    else:
        status = "ok"
    capped = status == "ok" and hi is None and lo >= max_mb
    exact = (status == "ok" and state["stopped"] is None and hi is not None
             and hi - lo <= max(1, int(tol * lo)))
    if capped and state["stopped"] is None:
        state["stopped"] = f"micro-batch {max_mb} (the cap) fits"
    return {"status": status, "max_micro_batch_size": lo or None, "first_oom": hi, "exact": exact,
            "lower_bound": status == "ok" and not exact, "stopped": state["stopped"], "probes": probes,
            "best": best}


def trial_argv(a, mb, json_path):
    argv = [sys.executable, os.path.abspath(__file__), "--model", a.model, "--seq-len", str(a.seq_len),
            "--micro-batch-size", str(mb), "--torch-dtype", a.torch_dtype, "--mixed-precision", a.mixed_precision,
            "--attn", a.attn, "--max-steps", str(a.max_steps), "--warmup-steps", str(a.warmup_steps),
            "--device", a.device, "--seed", str(a.seed), "--json", json_path]
    for flag, on in (("--liger", a.liger), ("--tiny", a.tiny), ("--tf32", a.tf32)):
        if on:
            argv.append(flag)
    if a.lora_rank > 0:
        argv += ["--lora-rank", str(a.lora_rank)]
    return argv


def hf_trial(a, timeout_cap=None, python=None):
    """A trial function for find_max_batch: one fresh process per micro-batch."""
    def trial(mb, timeout):
        if timeout_cap is not None:
            timeout = timeout_cap if timeout is None else min(timeout, timeout_cap)
        with tempfile.TemporaryDirectory() as td:
            jp = os.path.join(td, "rec.json")
            argv = trial_argv(a, mb, jp)
            if python:
                argv[0] = python
            rc, out = run_cmd(argv, timeout)
            return child_record(rc, out, jp)
    return trial


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama-3.2-1b", choices=sorted(MODELS))
    ap.add_argument("--tiny", action="store_true", help="2 layers, hidden 64 (a smoke test)")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--micro-batch-size", "--batch-size", type=int, default=1)
    ap.add_argument("--torch-dtype", default="float32", choices=["float32", "bfloat16", "fp32", "bf16"])
    ap.add_argument("--mixed-precision", default="no", choices=["no", "bf16"])
    ap.add_argument("--attn", default="eager", choices=["eager", "sdpa", "flash", "flash_attention_2"])
    ap.add_argument("--liger", "--fused-kernels", action="store_true")
    ap.add_argument("--lora-rank", type=int, default=0, help="peft LoRA of this rank (alpha 2r, all projections); 0: full")
    ap.add_argument("--tf32", action="store_true", help="allow TF32 matmuls (PyTorch's default is off)")
    ap.add_argument("--max-steps", type=int, default=10)
    ap.add_argument("--warmup-steps", type=int, default=3, help="steps excluded from throughput")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--json", help="also write the record here")
    ap.add_argument("--find-max-batch", action="store_true")
    ap.add_argument("--start", type=int, default=1, help="first micro-batch of the search")
    ap.add_argument("--start-is-guess", action="store_true",
                    help="--start is an estimate: grow/shrink around it by small steps first")
    ap.add_argument("--max-micro-batch", type=int, default=1024)
    ap.add_argument("--budget-s", type=float, default=480, help="time budget of the search")
    ap.add_argument("--trial-timeout-s", type=float, default=300)
    ap.add_argument("--tolerance", type=float, default=0.0,
                    help="stop bisecting when the gap is at most max(1, tolerance x micro-batch)")
    a = ap.parse_args(argv)
    a.torch_dtype = {"fp32": "float32", "bf16": "bfloat16"}.get(a.torch_dtype, a.torch_dtype)
    return a


def main():
    a = parse_args()
    if a.find_max_batch:
        t0 = time.time()
        print(f"hf_benchmark: largest micro-batch of {a.model} ({a.torch_dtype}, mixed {a.mixed_precision}, "
              f"{a.attn}{', liger' if a.liger else ''}), budget {a.budget_s:.0f} s", flush=True)
        res = find_max_batch(hf_trial(a, a.trial_timeout_s), start=a.start,
                             guess_step=0.125 if a.start_is_guess else None,
                             max_mb=a.max_micro_batch, deadline=t0 + a.budget_s, tol=a.tolerance,
                             log=lambda s: print(s, flush=True))
        res.update(side="hf", model=a.model, seq_len=a.seq_len, seconds=round(time.time() - t0, 1))
        best = res.get("best") or {}
        if best.get("status") == "ok":
            print(f"Largest micro-batch: {res['max_micro_batch_size']}"
                  f"{'' if res['exact'] else ' (lower bound: ' + str(res['stopped']) + ')'}")
            print(f"Training throughput: {best['tokens_per_s_per_device']:.2f} Tokens/s/GPU")
            if best.get("max_reserved_gib") is not None:
                print(f"Max reserved GPU Memory: {best['max_reserved_gib']:.2f}")
        else:
            print(f"No micro-batch fits: {res['status']} ({res.get('stopped')})")
        line = json.dumps(res)
        if a.json:
            with open(a.json, "w") as f:
                f.write(line + "\n")
        print(line)
        sys.exit(0 if res["status"] == "ok" else EXIT.get(res["status"], 1))

    rec = run_once(a)
    if rec["status"] == "ok":
        print(f"Training throughput: {rec['tokens_per_s_per_device']:.2f} Tokens/s/GPU")
        if rec.get("max_reserved_gib") is not None:
            print(f"Max reserved GPU Memory: {rec['max_reserved_gib']:.2f}")
    elif rec["status"] == "oom":
        print(f"OutOfMemoryError: {rec['error']}", file=sys.stderr)
    else:
        print(f"hf_benchmark: {rec['status']}: {rec['error']}", file=sys.stderr)
    line = json.dumps(rec)
    if a.json:
        with open(a.json, "w") as f:
            f.write(line + "\n")
    print(line, flush=True)
    sys.exit(EXIT.get(rec["status"], 1))


if __name__ == "__main__":
    main()
