#!/usr/bin/env python3
"""Measured peak GPU memory of the Hugging Face Trainer over a matrix of configurations: the ground
truth for `scalelab plan --stack hf-trainer` (src/predict/, docs/predict.md).

For each configuration, in a fresh Python process (an earlier run's cached segments or OOM must
not shape the next), it builds the model from a config dict (bench/gpu/hf_benchmark.py's MODELS:
the published config.json of each model; random init, nothing downloaded) on the CPU in the dtype
of --model-precision (as from_pretrained(torch_dtype=...) would), lets the Trainer move it to the
GPU, runs 3 Trainer steps (adamw_torch, lr 5e-5, no logging/saving, random token ids with
labels = inputs) and records after each step torch.cuda.max_memory_reserved /
max_memory_allocated (cumulative from process start: the model's move is included), the
allocator's segment counts, num_alloc_retries and num_ooms, and at start torch.cuda.mem_get_info()
and the CUDA context (the process's nvidia-smi "used" minus torch's reserved, after the context is
created by a 1-element tensor). An OOM is status "oom", not a failure.

--emulate-gib G: caps the allocator at G GiB less the measured context
(torch.cuda.set_per_process_memory_fraction), which is how a G GiB GPU behaves for the caching
allocator (cudaMalloc fails past its free memory; PyTorch's free-and-retry then runs the same way).
The published point (llama-3.2-1b, seq 1024, fp32, eager, one 64 GB H100: micro-batch 6 fits at
max_memory_reserved 61.89 "GB" — GiB: its script divides by 1024^3 —, 7 runs out of memory) is rerun
that way on a larger GPU (docs/predict.md "The published point").

    python3 bench/gpu/hf_memory.py --out runs/hf-memory --budget-s 300        # the matrix on a GPU
    /opt/torch/.venv/bin/python3 bench/gpu/hf_memory.py --out $OUT/hfm --budget-s 300   # the lent H200's torch
    python3 bench/gpu/hf_memory.py --out /tmp/m --tiny --device cpu           # smoke test on a CPU
    python3 bench/gpu/hf_memory.py --out DIR --only llama-fp32-eager-mb6      # one configuration
    python3 bench/gpu/hf_memory.py --out DIR --trace all     # + the allocator's event history

HF_MEMORY_HIDE=peft,...: those packages are made unimportable in the workers (an older transformers
carried by bench/gpu/run.sh versions is trimmed, and the machine's newer peft imports families it
leaves out; these rows never use peft).

--trace NAMES|all: torch.cuda.memory._record_memory_history without stacks, saved as
DIR/NAME.trace.json.gz (every alloc / free / segment event with its size and address) with phase
markers (forward, backward, optimizer_step, step_end) in the same clock: the GPU allocation
sequence the predictor's schedule is checked against.

Prints the versions and device, then one JSON line per configuration (also written to
DIR/hf_memory.jsonl, DIR/hf_memory.json at the end) and a table. Configurations run in the order
below (most important first) until --budget-s is spent; the ones left are reported as skipped.
Exit 0 unless the harness itself failed.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from hf_benchmark import MODELS, TINY, DATA_VOCAB, OOM_RE, LIGER_PATCH  # noqa: E402  (the same model dicts)

GIB = 2**30


def matrix(tiny):
    """The configurations, most important first. Each: name and the flags of `scalelab plan --stack
    hf-trainer` that describe it."""
    rows = []

    def add(name, model, mb, prec="fp32", mixed="no", attn="eager", ckpt=False, emulate=None, seq=1024, fused=False,
            torchrun=False):
        rows.append(dict(name=name, model=model, seq_len=seq, micro_batch_size=mb, model_precision=prec,
                         mixed_precision=mixed, attn=attn, activation_checkpointing=ckpt, emulate_gib=emulate,
                         fused=fused, torchrun=torchrun))

    L, O = "llama-3.2-1b", "opt-1.3b"
    if tiny:
        seq = 64
        add("llama-fp32-eager-mb2", L, 2, seq=seq)
        add("llama-bf16mixed-eager-mb2", L, 2, mixed="bf16", seq=seq)
        add("llama-bf16-sdpa-mb2", L, 2, prec="bf16", mixed="bf16", attn="sdpa", seq=seq)
        add("opt-fp32-eager-mb2", O, 2, seq=seq)
        add("llama-fp32-eager-mb2-torchrun1", L, 2, seq=seq, torchrun=True)
        return rows
    add("llama-fp32-eager-mb6", L, 6)
    add("llama-fp32-eager-mb6-64GiB", L, 6, emulate=64)
    add("llama-fp32-eager-mb7-64GiB", L, 7, emulate=64)
    # the predicted limit's other side: plan --stack hf-trainer says 7 is the largest that fits 64 GiB
    add("llama-fp32-eager-mb8-64GiB", L, 8, emulate=64)
    # the published point as the reference ran it: `torchrun --nproc_per_node 1`, so accelerate wraps
    # the model in DDP over one process (plan --launcher torchrun: DDP's gradient buckets, _DDPSink's
    # clones of the outputs). The worker gets torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,
    # MASTER_ADDR/PORT) from the harness; NCCL's own memory shows as nvidia_smi_used_at_end.
    add("llama-fp32-eager-mb6-torchrun1", L, 6, torchrun=True)
    add("llama-fp32-eager-mb6-64GiB-torchrun1", L, 6, emulate=64, torchrun=True)
    add("llama-fp32-eager-mb7-64GiB-torchrun1", L, 7, emulate=64, torchrun=True)
    add("llama-fp32-eager-mb1", L, 1)
    add("llama-fp32-eager-mb2", L, 2)
    add("llama-fp32-eager-mb4", L, 4)
    add("llama-bf16mixed-eager-mb6", L, 6, mixed="bf16")
    add("llama-bf16-eager-mb6", L, 6, prec="bf16", mixed="bf16")
    add("llama-fp32-sdpa-mb6", L, 6, attn="sdpa")
    add("llama-bf16-sdpa-mb6", L, 6, prec="bf16", mixed="bf16", attn="sdpa")
    add("opt-fp32-eager-mb4", O, 4)
    add("opt-bf16mixed-eager-mb4", O, 4, mixed="bf16")
    add("opt-bf16-sdpa-mb8", O, 8, prec="bf16", mixed="bf16", attn="sdpa")
    add("llama-fp32-eager-mb6-ckpt", L, 6, ckpt=True)
    add("llama-bf16-sdpa-mb6-ckpt", L, 6, prec="bf16", mixed="bf16", attn="sdpa", ckpt=True)
    # Liger-Kernel 0.8.5 (fused=True: apply_liger_kernel_to_llama / _qwen2 with its defaults; needs the
    # liger-kernel wheel). Modelled from Liger's source and not yet measured (docs/predict.md): Qwen2,
    # Liger under gradient checkpointing, Liger under bf16 autocast over fp32 weights (the last two),
    # each beside a neighbour measured on the same machine.
    Q = "qwen2.5-0.5b"
    add("qwen2-bf16-sdpa-mb8-liger", Q, 8, prec="bf16", attn="sdpa", fused=True)
    add("qwen2-bf16-sdpa-mb8", Q, 8, prec="bf16", attn="sdpa")
    add("llama-bf16-sdpa-mb16-liger", L, 16, prec="bf16", attn="sdpa", fused=True)
    add("llama-bf16-sdpa-mb16-liger-ckpt", L, 16, prec="bf16", attn="sdpa", ckpt=True, fused=True)
    add("qwen2-bf16-sdpa-mb8-liger-ckpt", Q, 8, prec="bf16", attn="sdpa", ckpt=True, fused=True)
    add("llama-fp32-eager-mb2-liger-ckpt", L, 2, ckpt=True, fused=True)
    add("llama-bf16mixed-sdpa-mb4-liger", L, 4, mixed="bf16", attn="sdpa", fused=True)
    add("llama-bf16mixed-eager-mb4-liger", L, 4, mixed="bf16", fused=True)
    # fp16 autocast over fp32 weights (the Trainer's fp16=True: a GradScaler, its scale and
    # found-inf tensors, the unscale before clipping): modelled, not yet measured.
    add("llama-fp16mixed-eager-mb6", L, 6, mixed="fp16")
    add("opt-fp16mixed-eager-mb4", O, 4, mixed="fp16")
    return rows


def versions():
    v = {"python": sys.version.split()[0]}
    for name in ("torch", "transformers", "accelerate"):
        try:
            v[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001 - not installed
            v[name] = None
    return v


def nvidia_smi_used_bytes(pid):
    """This process's GPU memory as nvidia-smi reports it (None when not available)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
    except Exception:  # noqa: BLE001
        return None
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            return int(parts[1]) * 2**20
    return None


# --- one configuration, in this process ----------------------------------------------------------
def start_trace(torch, on_cuda):
    """The caching allocator's own event history (alloc / free / segment_alloc / segment_free, no
    stacks: small and cheap), and phase markers in the same clock (Unix microseconds)."""
    if not on_cuda:
        return None
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=2_000_000)
    return []


def mark(markers, name):
    if markers is not None:
        markers.append([time.time_ns() // 1000, name])


def save_trace(torch, markers, path):
    import gzip
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    ev = []
    for dev in snap.get("device_traces", []):
        for e in dev:
            ev.append([e.get("time_us"), e["action"], e.get("size"), e.get("addr"), e.get("stream")])
    with gzip.open(path, "wt") as f:
        json.dump({"fields": ["time_us", "action", "size", "addr", "stream"], "events": ev, "markers": markers}, f)
    return len(ev)


def hide_packages():
    """HF_MEMORY_HIDE=peft,...: make those packages unimportable in this process (sys.modules[name] =
    None, which importlib.util.find_spec answers with None, so transformers' is_X_available() says no).
    A carried older transformers release is trimmed to the families measured (pack_transformers.py),
    and the machine's newer peft imports other families' modelling classes when the Trainer loads it;
    the rows here never use peft."""
    for name in filter(None, os.environ.get("HF_MEMORY_HIDE", "").split(",")):
        sys.modules[name.strip()] = None


def worker(cfg, device, tiny, steps, trace_path=None):
    hide_packages()
    import torch
    rec = dict(cfg)
    rec.update(status="error", device=device, tiny=tiny, steps=steps, error=None, versions=versions())
    on_cuda = device == "cuda"
    oom_types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                                  getattr(torch.cuda, "OutOfMemoryError", None)) if t is not None)
    if on_cuda:
        torch.empty(1, device="cuda")  # creates the context
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        rec["gpu"] = torch.cuda.get_device_name()
        rec["mem_get_info"] = {"free": free, "total": total}
        used = nvidia_smi_used_bytes(os.getpid())
        rec["nvidia_smi_used_at_start"] = used
        rec["reserved_at_start"] = torch.cuda.memory_reserved()
        rec["cuda_context_bytes"] = (used - torch.cuda.memory_reserved()) if used is not None else None
        rec["non_torch_bytes_at_start"] = total - free - torch.cuda.memory_reserved()
        if cfg.get("emulate_gib"):
            ctx = rec["cuda_context_bytes"] or rec["non_torch_bytes_at_start"]
            limit = cfg["emulate_gib"] * GIB - ctx
            torch.cuda.set_per_process_memory_fraction(limit / total)
            rec["emulated_allocator_limit"] = limit
    markers = start_trace(torch, on_cuda) if trace_path else None
    try:
        from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
        d = json.loads(json.dumps(MODELS[cfg["model"]]))
        if tiny:
            d.update(TINY[d["model_type"]])
        if d["model_type"] == "opt":
            d["dropout"] = 0.0  # scalelab's OPT runs are dropout-free; dropout masks would add memory
        if cfg.get("fused"):  # Liger: patches the model classes, so before the model is built
            import liger_kernel.transformers as liger
            getattr(liger, LIGER_PATCH[d["model_type"]])()
            rec["liger_kernel"] = getattr(__import__("liger_kernel"), "__version__", None)
        hf_cfg = CONFIG_MAPPING[d["model_type"]].from_dict(dict(d))
        dtype = torch.bfloat16 if cfg["model_precision"] == "bf16" else torch.float32
        torch.manual_seed(0)
        try:
            model = AutoModelForCausalLM.from_config(hf_cfg, attn_implementation=cfg["attn"], dtype=dtype)
        except TypeError:
            model = AutoModelForCausalLM.from_config(hf_cfg, attn_implementation=cfg["attn"], torch_dtype=dtype)
        rec["params"] = sum(p.numel() for p in model.parameters())
        rec["param_dtype"] = str(next(model.parameters()).dtype)

        class RandomIds(torch.utils.data.Dataset):
            def __len__(self):
                return steps * cfg["micro_batch_size"]

            def __getitem__(self, i):
                g = torch.Generator().manual_seed(1_000_003 + i)
                ids = torch.randint(0, min(DATA_VOCAB, d["vocab_size"]), (cfg["seq_len"],), generator=g)
                return {"input_ids": ids, "labels": ids.clone()}

        per_step = []

        class Probe(TrainerCallback):
            def on_step_end(self, args, state, control, **kw):
                mark(markers, "step_end")
                if on_cuda:
                    torch.cuda.synchronize()
                    s = torch.cuda.memory_stats()
                    per_step.append({
                        "step": state.global_step,
                        "max_reserved": torch.cuda.max_memory_reserved(),
                        "max_allocated": torch.cuda.max_memory_allocated(),
                        "reserved": torch.cuda.memory_reserved(),
                        "allocated": torch.cuda.memory_allocated(),
                        "segments": s.get("segment.all.current"),
                        "large_segments": s.get("segment.large_pool.current"),
                        "num_alloc_retries": s.get("num_alloc_retries"),
                    })
                else:
                    per_step.append({"step": state.global_step})
                scaler = getattr(getattr(self, "trainer_ref", None), "accelerator", None)
                scaler = getattr(scaler, "scaler", None)
                if scaler is not None:  # fp16: a step with inf/NaN gradients skips AdamW (no states yet)
                    per_step[-1]["grad_scale"] = float(scaler.get_scale())
                opt = getattr(getattr(self, "trainer_ref", None), "optimizer", None)
                if opt is not None:  # parameters with AdamW states so far (0 after a skipped first step)
                    per_step[-1]["params_with_states"] = len(getattr(opt, "state", {}))

        fields = getattr(TrainingArguments, "__dataclass_fields__", {})
        ta = dict(output_dir=tempfile.mkdtemp(prefix="hf_memory_"), per_device_train_batch_size=cfg["micro_batch_size"],
                  max_steps=steps, learning_rate=5e-5, optim="adamw_torch", bf16=(cfg["mixed_precision"] == "bf16"),
                  fp16=(cfg["mixed_precision"] == "fp16"),
                  gradient_checkpointing=cfg["activation_checkpointing"], logging_strategy="no", save_strategy="no",
                  report_to="none", disable_tqdm=True, seed=0, dataloader_num_workers=0)
        if not on_cuda:
            ta["use_cpu"] = True
        ta = {k: v for k, v in ta.items() if not fields or k in fields}
        probe = Probe()
        trainer = Trainer(model=model, args=TrainingArguments(**ta), train_dataset=RandomIds(), callbacks=[probe])
        probe.trainer_ref = trainer
        if markers is not None:  # phase boundaries: forward, backward, optimizer step, step end
            model.register_forward_pre_hook(lambda *a_: mark(markers, "forward"))
            model.register_forward_hook(lambda *a_: mark(markers, "forward_end"))
            inner_backward = trainer.accelerator.backward

            def backward(*a_, **k_):
                mark(markers, "backward")
                r = inner_backward(*a_, **k_)
                mark(markers, "backward_end")
                return r
            trainer.accelerator.backward = backward
            from torch.optim.optimizer import register_optimizer_step_pre_hook, register_optimizer_step_post_hook
            register_optimizer_step_pre_hook(lambda *a_: mark(markers, "optimizer_step"))
            register_optimizer_step_post_hook(lambda *a_: mark(markers, "optimizer_step_end"))
            mark(markers, "train")
        if on_cuda:
            rec["after_model_move"] = {"allocated": torch.cuda.memory_allocated(),
                                       "reserved": torch.cuda.memory_reserved()}
        t0 = time.time()
        out = trainer.train()
        rec["train_s"] = round(time.time() - t0, 3)
        rec["train_loss"] = float(out.training_loss)
        rec["per_step"] = per_step
        rec["model_wrapped"] = type(getattr(trainer, "model_wrapped", model)).__name__  # DistributedDataParallel?
        rec["status"] = "ok"
    except oom_types as e:
        rec["status"], rec["error"] = "oom", f"{type(e).__name__}: {str(e).splitlines()[0][:400]}"
    except RuntimeError as e:
        msg = str(e)
        rec["status"] = "oom" if OOM_RE.search(msg) else "error"
        rec["error"] = f"{type(e).__name__}: {msg.splitlines()[0][:400] if msg else ''}"
    except Exception as e:  # noqa: BLE001 - reported in the record
        rec["error"] = f"{type(e).__name__}: {str(e)[:400]}"
    if markers is not None:
        try:
            rec["trace_events"] = save_trace(torch, markers, trace_path)
            rec["trace_file"] = os.path.basename(trace_path)
        except Exception as e:  # noqa: BLE001
            rec["trace_error"] = f"{type(e).__name__}: {e}"
    if on_cuda:
        try:
            s = torch.cuda.memory_stats()
            rec["max_reserved_bytes"] = torch.cuda.max_memory_reserved()
            rec["max_allocated_bytes"] = torch.cuda.max_memory_allocated()
            rec["num_alloc_retries"] = s.get("num_alloc_retries")
            rec["num_ooms"] = s.get("num_ooms")
            rec["max_reserved_gib"] = rec["max_reserved_bytes"] / GIB
            rec["reserved_at_end"] = torch.cuda.memory_reserved()
            # with the context: what NCCL (torchrun rows) and kernels hold outside the allocator
            rec["nvidia_smi_used_at_end"] = nvidia_smi_used_bytes(os.getpid())
        except Exception:  # noqa: BLE001 - a poisoned context
            pass
        rec["torchrun_env"] = os.environ.get("LOCAL_RANK") is not None
    return rec


# --- the harness ---------------------------------------------------------------------------------
def fmt_gib(b):
    return "" if b is None else f"{b / GIB:.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="directory for hf_memory.jsonl / hf_memory.json / logs")
    ap.add_argument("--budget-s", type=float, default=300.0, help="stop starting configurations after this (default 300)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny models (2 layers, hidden 64), seq 64: a CPU smoke test")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated configuration names, run in the order given")
    ap.add_argument("--list", action="store_true", help="print the configurations and exit")
    ap.add_argument("--python", default=sys.executable, help="the interpreter for the workers")
    ap.add_argument("--logs", action="store_true", help="keep every worker's output as DIR/NAME.log (default: failures only)")
    ap.add_argument("--trace", default="",
                    help="comma-separated configuration names whose allocator event history to save as "
                         "DIR/NAME.trace.json.gz (or 'all')")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--trace-path", help=argparse.SUPPRESS)
    a = ap.parse_args()

    if a.worker:
        cfg = json.loads(a.worker)
        rec = worker(cfg, a.device, a.tiny, a.steps, a.trace_path)
        print("HF_MEMORY_RECORD " + json.dumps(rec), flush=True)
        return 0

    rows = matrix(a.tiny)
    if a.only:
        want = set(a.only.split(","))
        unknown = want - {r["name"] for r in rows}
        if unknown:
            print(f"hf_memory: unknown configuration(s) {sorted(unknown)}; --list shows them", file=sys.stderr)
            return 2
        by_name = {r["name"]: r for r in rows}
        rows = [by_name[n] for n in dict.fromkeys(a.only.split(","))]  # in the order given
    if a.list:
        for r in rows:
            print(json.dumps(r))
        return 0
    os.makedirs(a.out, exist_ok=True)
    t_start = time.time()
    head = {"versions": None, "device": a.device}
    probe = subprocess.run([a.python, "-c", (
        "import json,sys,torch,transformers\n"
        "v={'python':sys.version.split()[0],'torch':torch.__version__,'transformers':transformers.__version__}\n"
        "try:\n import accelerate; v['accelerate']=accelerate.__version__\nexcept Exception: pass\n"
        "d={'versions':v,'cuda_available':torch.cuda.is_available()}\n"
        "if torch.cuda.is_available():\n"
        " torch.empty(1,device='cuda'); f,t=torch.cuda.mem_get_info()\n"
        " d.update(gpu=torch.cuda.get_device_name(),mem_get_info={'free':f,'total':t},cuda=torch.version.cuda)\n"
        "print(json.dumps(d))")], capture_output=True, text=True, timeout=120)
    try:
        head.update(json.loads(probe.stdout.strip().splitlines()[-1]))
    except Exception:  # noqa: BLE001
        head["probe_error"] = (probe.stderr or probe.stdout)[-1000:]
    print("HF_MEMORY_HEADER " + json.dumps(head), flush=True)
    if a.device == "cuda" and not head.get("cuda_available"):
        print("hf_memory: torch.cuda.is_available() is False (use --device cpu --tiny for a smoke test)", file=sys.stderr)
        return 1

    records = []
    jsonl = os.path.join(a.out, "hf_memory.jsonl")
    with open(jsonl, "w") as f:
        pass
    for i, cfg in enumerate(rows):
        left = a.budget_s - (time.time() - t_start)
        if left < 20:
            rec = dict(cfg, status="skipped", error=f"budget: {left:.0f} s left of {a.budget_s:.0f}")
        else:
            print(f"[{i + 1}/{len(rows)}] {cfg['name']} ({left:.0f} s of budget left)", file=sys.stderr, flush=True)
            cmd = [a.python, os.path.abspath(__file__), "--out", a.out, "--device", a.device, "--steps", str(a.steps),
                   "--worker", json.dumps(cfg)] + (["--tiny"] if a.tiny else [])
            if a.trace == "all" or cfg["name"] in a.trace.split(","):
                cmd += ["--trace-path", os.path.join(a.out, cfg["name"] + ".trace.json.gz")]
            env = None
            if cfg.get("torchrun"):  # what `torchrun --nproc_per_node 1` gives its one worker
                import socket
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    port = s.getsockname()[1]
                env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                           GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            t0 = time.time()
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=max(20.0, left), env=env)
                out, err, rc = p.stdout, p.stderr, p.returncode
            except subprocess.TimeoutExpired as e:
                out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
                err, rc = "timeout", -9
            rec = None
            for line in out.splitlines():
                if line.startswith("HF_MEMORY_RECORD "):
                    rec = json.loads(line[len("HF_MEMORY_RECORD "):])
            if rec is None:
                rec = dict(cfg, status="oom" if OOM_RE.search(err or "") else "error",
                           error=f"worker exit {rc}: {(err or '').strip()[-400:]}")
            if a.logs or rec.get("status") == "error":  # few files: a lent machine returns only some
                with open(os.path.join(a.out, cfg["name"] + ".log"), "w") as lf:
                    lf.write(out + "\n--- stderr ---\n" + err)
            rec["wall_s"] = round(time.time() - t0, 2)
        records.append(rec)
        print(json.dumps(rec), flush=True)
        with open(jsonl, "a") as f:
            f.write(json.dumps(rec) + "\n")
    tmp = os.path.join(a.out, "hf_memory.json.tmp")
    with open(tmp, "w") as f:
        json.dump({"header": head, "records": records, "elapsed_s": round(time.time() - t_start, 1)}, f, indent=1)
    os.replace(tmp, os.path.join(a.out, "hf_memory.json"))

    print(f"\nHF Trainer peak memory, {head.get('gpu', a.device)}, torch {head.get('versions', {}).get('torch')}, "
          f"transformers {head.get('versions', {}).get('transformers')}, {a.steps} steps; GiB = 2^30 bytes")
    print("| config | status | max reserved GiB | max allocated GiB | max reserved bytes | context MiB | wall s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in records:
        ctx = r.get("cuda_context_bytes")
        print(f"| {r['name']} | {r['status']} | {fmt_gib(r.get('max_reserved_bytes'))} | "
              f"{fmt_gib(r.get('max_allocated_bytes'))} | {r.get('max_reserved_bytes', '')} | "
              f"{'' if ctx is None else round(ctx / 2**20)} | {r.get('wall_s', '')} |")
    print(f"elapsed {time.time() - t_start:.0f} s of a {a.budget_s:.0f} s budget; records in {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
