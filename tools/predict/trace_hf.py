#!/usr/bin/env python3
"""Traces every CPU allocation and free of a real Hugging Face Trainer run on a tiny Llama or Qwen2 (the
hf-trainer predictor's reference without a GPU). Run it in the venv tools/predict/make_venv.sh
makes (torch 2.11.0, transformers 5.17.0, accelerate 1.13.0, pinned there):

    /work/venvs/predict/bin/python tools/predict/trace_hf.py --out tests/golden/predict/cpu

For each configuration it builds scalelab's llama-tiny shapes (bench/gpu/hf_benchmark.py TINY:
hidden 64, intermediate 128, 2 layers, 4 heads / 2 KV heads of 16, vocab 256) from a config dict,
runs 2 Trainer steps on the CPU (adamw_torch, seq-len 32, micro-batch 2, the same Trainer
arguments as bench/gpu/hf_memory.py) under torch.profiler with profile_memory=True, and writes
NAME.cpu.events: `# PHASE` lines (forward, backward, optimizer_step, step_end, from hooks on
the model, accelerate's backward and the optimizer) and one line per allocation `a BYTES` (in
order, numbered from 0) or free `f N`, for the CPU allocator's requests (exact sizes, no caching).

Qwen2 configurations use scalelab's qwen2-tiny shapes (QWEN2_TINY below); DDP configurations
("-ddp2") start two ranks of the same Trainer (RANK / WORLD_SIZE / MASTER_ADDR as torchrun sets
them; gloo on the CPU) and trace rank 0, with a `# ddp_init` marker when DDP wraps the model.

tests/predict/cpu_trace_test.cpp compares the saved-for-backward tensors (the allocations of
step 2's forward still live when its backward starts), the gradients at the optimizer step and
the AdamW states with scalelab's generated schedule for the same job: autograd saves the same
tensors on the CPU as on CUDA; tests/predict/ddp_trace_test.cpp compares what DDP allocates. What only CUDA does (cuBLAS
workspaces, kernel temporaries such as reduction buffers, flash attention) is not compared here;
the H200 traces (bench/gpu/hf_memory.py --trace) cover it.
"""
import argparse
import json
import os
import sys
import tempfile
import time

CONFIGS = {
    "llama-tiny-fp32-eager": dict(model_precision="fp32", mixed_precision="no", attn="eager"),
    "llama-tiny-bf16mixed-eager": dict(model_precision="fp32", mixed_precision="bf16", attn="eager"),
    "llama-tiny-bf16-eager": dict(model_precision="bf16", mixed_precision="bf16", attn="eager"),
}
# Qwen2: scalelab's qwen2-tiny preset (src/model/qwen2/family.cpp: hidden 64, intermediate 128,
# 2 layers, 4 heads / 2 KV heads, vocab 256, tied embeddings, rope_theta 1e6, rms_norm_eps 1e-6),
# written here as a Qwen2Config dict (no hub download); "-untied" sets tie_word_embeddings false
# (Qwen2Config's default), "-ckpt" gradient_checkpointing=True.
QWEN2_TINY = dict(model_type="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=256, max_position_embeddings=512,
                  rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
                  hidden_act="silu", attention_dropout=0.0)
for _prec, _mixed, _tag in (("fp32", "no", "fp32"), ("fp32", "bf16", "bf16mixed"), ("bf16", "bf16", "bf16")):
    for _attn in ("eager", "sdpa"):
        if _attn == "sdpa" and _prec == "fp32" and _mixed == "no":
            continue  # the CPU has an fp32 flash kernel; CUDA runs the math path: the "-math" configurations below
        for _ckpt in (False, True):
            CONFIGS[f"qwen2-tiny-{_tag}-{_attn}" + ("-ckpt" if _ckpt else "")] = dict(
                family="qwen2", model_precision=_prec, mixed_precision=_mixed, attn=_attn, ckpt=_ckpt)
# fp32 sdpa as CUDA runs it: no flash or cuDNN kernel takes fp32 and the memory-efficient one no
# grouped heads (enable_gqa), so CUDA falls back to PyTorch's math path, a composite of ATen ops
# that allocates the same on the CPU. The CPU's own fp32 flash kernel is turned off for these
# ("-math": torch.nn.attention.sdpa_kernel(SDPBackend.MATH) around the training).
CONFIGS["llama-tiny-fp32-sdpa-math"] = dict(model_precision="fp32", mixed_precision="no", attn="sdpa", math_sdpa=True)
CONFIGS["qwen2-tiny-fp32-sdpa-math"] = dict(family="qwen2", model_precision="fp32", mixed_precision="no", attn="sdpa",
                                            math_sdpa=True)
# OPT: scalelab's opt-tiny (bench/gpu/hf_benchmark.py TINY["opt"], residual dropout 0).
CONFIGS["opt-tiny-fp32-eager"] = dict(family="opt", model_precision="fp32", mixed_precision="no", attn="eager")
CONFIGS["opt-tiny-bf16mixed-eager"] = dict(family="opt", model_precision="fp32", mixed_precision="bf16", attn="eager")
CONFIGS["opt-tiny-fp32-eager-ckpt"] = dict(family="opt", model_precision="fp32", mixed_precision="no", attn="eager",
                                           ckpt=True)
CONFIGS["opt-tiny-bf16mixed-eager-ckpt"] = dict(family="opt", model_precision="fp32", mixed_precision="bf16",
                                                attn="eager", ckpt=True)
# (full bf16 OPT is not traced: the CPU's layer_norm keeps mean / rstd in bf16, CUDA's in fp32)
# DDP (torchrun, gloo on the CPU): two ranks each run the same Trainer; rank 0 is traced. The
# Trainer's DDP arguments (accelerate's DistributedDataParallelKwargs): bucket_cap_mb 25,
# gradient_as_bucket_view False, find_unused_parameters = not gradient_checkpointing.
# "llama-ddp": llama-tiny widened (hidden 128, intermediate 512, head_dim 32, vocab 4096: 3.9 MiB of
# fp32 parameters, the embedding alone 2 MiB) so that DDP's 1 MiB first bucket and a 1 MiB
# ddp_bucket_cap_mb make several buckets.
DDP_SHAPE = {"hidden_size": 128, "intermediate_size": 512, "head_dim": 32, "vocab_size": 4096}
CONFIGS["llama-ddp-fp32-eager-ddp2"] = dict(model_precision="fp32", mixed_precision="no", attn="eager", ranks=2)
CONFIGS["llama-ddp-bf16-eager-ddp2"] = dict(model_precision="bf16", mixed_precision="bf16", attn="eager", ranks=2)
CONFIGS["llama-ddp-bf16mixed-eager-ckpt-ddp2"] = dict(model_precision="fp32", mixed_precision="bf16", attn="eager",
                                                      ckpt=True, ranks=2)
# torchrun with one process (--nproc_per_node 1, as the reference practice's single-GPU jobs run):
# accelerate sees LOCAL_RANK and wraps the model in DDP over a world of one ("-torchrun1").
CONFIGS["llama-ddp-fp32-eager-torchrun1"] = dict(model_precision="fp32", mixed_precision="no", attn="eager", ranks=1,
                                                 torchrun=True)
CONFIGS["llama-ddp-bf16mixed-eager-torchrun1"] = dict(model_precision="fp32", mixed_precision="bf16", attn="eager",
                                                      ranks=1, torchrun=True)
CONFIGS["llama-ddp-bf16-eager-torchrun1"] = dict(model_precision="bf16", mixed_precision="bf16", attn="eager", ranks=1,
                                                 torchrun=True)
# the other families under one torchrun process (their tiny shapes: one gradient bucket)
CONFIGS["qwen2-tiny-fp32-eager-torchrun1"] = dict(family="qwen2", model_precision="fp32", mixed_precision="no",
                                                  attn="eager", ranks=1, torchrun=True)
CONFIGS["qwen2-tiny-bf16-sdpa-torchrun1"] = dict(family="qwen2", model_precision="bf16", mixed_precision="bf16",
                                                 attn="sdpa", ranks=1, torchrun=True)
CONFIGS["opt-tiny-fp32-eager-torchrun1"] = dict(family="opt", model_precision="fp32", mixed_precision="no",
                                                attn="eager", ranks=1, torchrun=True)
CONFIGS["opt-tiny-bf16mixed-eager-torchrun1"] = dict(family="opt", model_precision="fp32", mixed_precision="bf16",
                                                     attn="eager", ranks=1, torchrun=True)
CONFIGS["llama-ddp-fp32-eager-cap1-ddp2"] = dict(model_precision="fp32", mixed_precision="no", attn="eager", ranks=2,
                                                 bucket_cap_mb=1)
# the fused AdamW (TrainingArguments optim="adamw_torch_fused": torch._fused_adamw_, which has a CPU
# kernel since torch 2.4)
CONFIGS["llama-tiny-fp32-eager-fusedadam"] = dict(model_precision="fp32", mixed_precision="no", attn="eager",
                                                  optim="adamw_torch_fused")
# gradient accumulation on one process: the second micro-step's gradients added into the first's
CONFIGS["llama-tiny-fp32-eager-ga2"] = dict(model_precision="fp32", mixed_precision="no", attn="eager", grad_accum=2)
# gradient accumulation under DDP: the Trainer runs every micro-step but the last in no_sync
CONFIGS["llama-ddp-fp32-eager-ga2-ddp2"] = dict(model_precision="fp32", mixed_precision="no", attn="eager", ranks=2,
                                                grad_accum=2)
CONFIGS["llama-ddp-bf16mixed-eager-ckpt-ga2-ddp2"] = dict(model_precision="fp32", mixed_precision="bf16",
                                                          attn="eager", ckpt=True, ranks=2, grad_accum=2)
CONFIGS["qwen2-tiny-untied-fp32-eager"] = dict(family="qwen2", model_precision="fp32", mixed_precision="no",
                                               attn="eager", tied=False)
SEQ, MB, STEPS = 32, 2, 2


def _older(version):
    """Whether this transformers is an older release than the pinned 5.17: its traces are written as
    NAME.tf<major.minor>.cpu.events (e.g. llama-tiny-fp32-eager.tf4.45.cpu.events), beside the pinned
    release's NAME.cpu.events. The older releases the predictor models are 4.43 to 4.48
    (--transformers-version; their loss copies the shifted logits, docs/predict.md "The published
    point"); trace one with the pinned torch and that transformers put first on PYTHONPATH (4.46.3,
    4.47.1 and 4.48.3 with tokenizers 0.20.3 / 0.21.0 and accelerate 1.2.1, 4.43.4 and 4.44.2 with tokenizers
    0.19.1, huggingface_hub 0.24.7 and accelerate 0.34.2, the same way):

        pip install --no-deps --target /work/venvs/tf445 transformers==4.45.2 tokenizers==0.20.3 \
            huggingface_hub==0.26.2 accelerate==1.0.1 requests
        PYTHONPATH=/work/venvs/tf445 /work/venvs/predict/bin/python tools/predict/trace_hf.py \
            --out tests/golden/predict/cpu --only llama-tiny-fp32-eager
    """
    return int(version.split(".")[0]) < 5


def _tag(version):
    """The file name's release tags: ".tf4.45" for a transformers other than the pinned 5.17 (an
    older one, or a 5.x release checked against 5.17's schedule: ".tf5.24"), and ".torch2.4" for a torch
    other than the pinned 2.11. A 5.x release goes on PYTHONPATH as the older ones do (5.0 to 5.12
    with tokenizers 0.22.2, which their import checks):

        pip install --no-deps --target /work/venvs/tf5240 transformers==5.24.0
        PYTHONPATH=/work/venvs/tf5240 /work/venvs/predict/bin/python tools/predict/trace_hf.py \
            --out tests/golden/predict/cpu --only llama-tiny-fp32-eager

    Under 4.49 to 4.57 (docs/predict.md "Versions modelled") trace one configuration
    per process: a Trainer run there leaves state behind that changes the next run's trace.

    The torch tag: --torch-version 2.4 to 2.10, docs/predict.md: 2.4 to 2.8 record a
    backward node for every full slice `[:]`, which 2.9 to 2.11 skip). Trace one with that torch
    installed by tools/predict/make_torch_overlay.sh and put first on PYTHONPATH (an older
    transformers after it; 2.4 with /work/venvs/torch24, a venv of torch 2.4.0 and transformers
    4.45.2, works the same way):

        tools/predict/make_torch_overlay.sh 2.8.0          # -> /work/venvs/torch28
        PYTHONPATH=/work/venvs/torch28:/work/venvs/tf445 /work/venvs/predict/bin/python \\
            tools/predict/trace_hf.py --out tests/golden/predict/cpu --only llama-tiny-fp32-eager
    """
    import torch
    t = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    tf = ".".join(version.split(".")[:2])
    return (".tf" + tf if tf != "5.17" else "") + ("" if t == "2.11" else ".torch" + t)


def _ddp(cfg):
    """Whether the configuration runs under torchrun (one worker process per rank, DDP)."""
    return cfg.get("ranks", 1) > 1 or cfg.get("torchrun", False)


def run(name, cfg, out_dir):
    import torch
    from torch.profiler import profile, ProfilerActivity
    from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "gpu"))
    from hf_benchmark import MODELS, TINY

    torch.manual_seed(0)
    torch.set_num_threads(1)
    if cfg.get("family") == "opt":
        d = json.loads(json.dumps(MODELS["opt-1.3b"]))
        d.update(TINY["opt"])
    elif cfg.get("family") == "qwen2":
        d = dict(QWEN2_TINY, tie_word_embeddings=cfg.get("tied", True))
    else:
        d = json.loads(json.dumps(MODELS["llama-3.2-1b"]))
        d.update(TINY["llama"])
        if name.startswith("llama-ddp"):
            d.update(DDP_SHAPE)
    dtype = torch.bfloat16 if cfg["model_precision"] == "bf16" else torch.float32
    import transformers
    # transformers < 4.56 names the load dtype `torch_dtype` (the older releases traced: _older above)
    dtype_kw = "torch_dtype" if _older(transformers.__version__) else "dtype"
    model = AutoModelForCausalLM.from_config(CONFIG_MAPPING[d["model_type"]].from_dict(d), attn_implementation=cfg["attn"],
                                             **{dtype_kw: dtype})

    class Ids(torch.utils.data.Dataset):
        def __len__(self):
            return STEPS * MB * cfg.get("grad_accum", 1)

        def __getitem__(self, i):
            ids = torch.randint(0, 256, (SEQ,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids.clone()}

    marks = []

    rank = int(os.environ.get("RANK", "0"))

    def mark(n):
        marks.append((time.time_ns(), n))

    class Cb(TrainerCallback):
        def on_step_end(self, *a, **k):
            mark("step_end")

    args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=MB, max_steps=STEPS,
                             learning_rate=5e-5, optim=cfg.get("optim", "adamw_torch"),
                             bf16=cfg["mixed_precision"] == "bf16",
                             logging_strategy="no", save_strategy="no", report_to="none", disable_tqdm=True,
                             use_cpu=True, dataloader_num_workers=0, seed=0,
                             gradient_checkpointing=cfg.get("ckpt", False),
                             ddp_bucket_cap_mb=cfg.get("bucket_cap_mb"),
                             gradient_accumulation_steps=cfg.get("grad_accum", 1))
    trainer = Trainer(model=model, args=args, train_dataset=Ids(), callbacks=[Cb()])
    model.register_forward_pre_hook(lambda *a: mark("forward"))
    inner = trainer.accelerator.backward

    def backward(*a, **k):
        mark("backward")
        return inner(*a, **k)
    trainer.accelerator.backward = backward
    if _ddp(cfg):
        # `# ddp_init` when the Trainer (accelerate's prepare_model) wraps the model. What comes
        # just before it on the CPU, model.to(device) copying every parameter, is a no-op on CUDA
        # (the Trainer moved the model to its GPU already).
        ddp_init = torch.nn.parallel.DistributedDataParallel.__init__

        def init(self, *a, **k):
            mark("ddp_init")
            return ddp_init(self, *a, **k)
        torch.nn.parallel.DistributedDataParallel.__init__ = init
    from torch.optim.optimizer import register_optimizer_step_pre_hook
    register_optimizer_step_pre_hook(lambda *a: mark("optimizer_step"))
    import contextlib
    math_only = contextlib.nullcontext()
    if cfg.get("math_sdpa"):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        math_only = sdpa_kernel(SDPBackend.MATH)
    with math_only, profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        trainer.train()
    evs = []

    def walk(n):
        ef = n.extra_fields
        if type(ef).__name__ == "_ExtraFields_Allocation" and ef.alloc_size != 0:
            evs.append((n.start_time_ns, ef.alloc_size, ef.ptr))
        for c in n.children:
            walk(c)
    for r in prof.profiler.kineto_results.experimental_event_tree():
        walk(r)
    merged = sorted([(t, 0, s, p) for t, s, p in evs] + [(t, 1, n, None) for t, n in marks], key=lambda x: (x[0], x[1]))
    live, n, lines = {}, 0, []
    for t, kind, x, ptr in merged:
        if kind == 1:
            lines.append(f"# {x}")
        elif x > 0:
            live[ptr] = n
            lines.append(f"a {x}")
            n += 1
        elif ptr in live:
            lines.append(f"f {live.pop(ptr)}")
    if rank != 0:
        return None, n
    path = os.path.join(out_dir, name + _tag(transformers.__version__) + ".cpu.events")
    with open(path + ".tmp", "w") as f:
        f.write(f"# trace of {name}: torch {torch.__version__}, transformers {transformers.__version__}, seq {SEQ}, micro-batch {MB}, {STEPS} steps on the CPU"
                + (f", rank 0 of {cfg['ranks']} (DDP, gloo)" if _ddp(cfg) else "") + "\n")
        f.write("\n".join(lines) + "\n")
    os.replace(path + ".tmp", path)
    return path, n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--ddp-worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.ddp_worker:  # one rank of a DDP configuration (started below, as torchrun would)
        run(a.only, CONFIGS[a.only], a.out)
        return 0
    for name, cfg in CONFIGS.items():
        if a.only and name not in a.only.split(","):
            continue
        if _ddp(cfg):
            import socket
            import subprocess
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            procs = []
            for r in range(cfg["ranks"]):
                env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(cfg["ranks"]),
                           LOCAL_WORLD_SIZE=str(cfg["ranks"]), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
                procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--out", a.out, "--only",
                                               name, "--ddp-worker"], env=env))
            if any(p.wait() != 0 for p in procs):
                print(f"{name}: a DDP rank failed", file=sys.stderr)
                return 1
            import transformers
            path = os.path.join(a.out, name + _tag(transformers.__version__) + ".cpu.events")
            n = sum(1 for line in open(path) if line.startswith("a "))
        else:
            path, n = run(name, cfg, a.out)
        print(f"{path}: {n} allocations", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
