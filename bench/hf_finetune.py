#!/usr/bin/env python3
"""The peer of bench/finetune_vs_hf.py alone: the Hugging Face Trainer (PyTorch, CPU) fine-tuning a
Hugging Face Llama directory on a scalelab token file, full or LoRA (peft), printing one JSON line.

It does what a user of the Trainer does, with the settings scalelab's trainer uses by default:
AdamW (torch), lr 5e-5, linear schedule, no warm-up, weight decay 0, clipping at 1.0, fp32, no
logging, evaluation or saving. The data are the token file's samples in file order (scalelab reads
seq-len + 1 ids per sample; here each sample's first seq-len ids are both `input_ids` and `labels`,
run_clm's convention, so the model sees the same seq-len tokens per sample and the loss has
seq-len - 1 targets instead of seq-len).

Timing: a callback records each optimizer step's begin and end (the data loader is outside that
window, as in bench/gpu/hf_benchmark.py); tokens/s = micro-batch x seq-len x grad-accum / median step
time over the steps after --warmup-steps, the way scalelab's run record counts.

  /work/venvs/lora/bin/python bench/hf_finetune.py --model DIR --data tokens.bin --seq-len 256 \
      --micro-batch-size 4 --max-steps 6 --warmup-steps 2 --threads 2 [--lora-rank 16 --lora-alpha 32]
"""
import argparse
import json
import os
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="a Hugging Face Llama directory (config.json + model.safetensors)")
    ap.add_argument("--data", required=True, help="flat little-endian uint32 token file (scalelab tokenize)")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--micro-batch-size", type=int, default=4)
    ap.add_argument("--grad-accum-steps", type=int, default=1)
    ap.add_argument("--max-steps", type=int, default=6)
    ap.add_argument("--warmup-steps", type=int, default=2, help="steps left out of the timing")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--lora-rank", type=int, default=0)
    ap.add_argument("--lora-alpha", type=float, default=8)
    ap.add_argument("--lora-targets", default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
    ap.add_argument("--attn", default="sdpa", help="transformers' attn_implementation (default: its own, sdpa)")
    ap.add_argument("--max-grad-norm", type=float, default=1.0, help="the Trainer's max_grad_norm (0: no clipping)")
    a = ap.parse_args()
    if a.max_steps <= a.warmup_steps:
        sys.exit(f"[--max-steps] {a.max_steps} leaves no timed step after --warmup-steps {a.warmup_steps}")

    t_start = time.perf_counter()
    import numpy as np
    import torch
    torch.set_num_threads(a.threads)
    import transformers
    from torch.utils.data import Dataset, SequentialSampler
    from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments
    transformers.logging.set_verbosity_error()

    ids = np.fromfile(a.data, dtype="<u4")
    n = len(ids) // (a.seq_len + 1)
    need = a.max_steps * a.micro_batch_size * a.grad_accum_steps
    if n == 0:
        sys.exit(f"[--data] {a.data}: {len(ids)} tokens, fewer than one sample of {a.seq_len + 1}")
    samples = ids[: n * (a.seq_len + 1)].reshape(n, a.seq_len + 1)[:, : a.seq_len].astype(np.int64)

    class Samples(Dataset):  # the token file's samples in order, wrapping around as scalelab's reader does
        def __len__(self):
            return need

        def __getitem__(self, i):
            t = torch.from_numpy(samples[i % n])
            return {"input_ids": t, "labels": t.clone()}

    class InOrder(Trainer):
        def _get_train_sampler(self):
            return SequentialSampler(self.train_dataset)

    model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.float32, attn_implementation=a.attn)
    if a.lora_rank > 0:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=a.lora_rank, lora_alpha=a.lora_alpha, lora_dropout=0.0,
                                                 target_modules=a.lora_targets.split(","), task_type="CAUSAL_LM"))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)

    class Clock(TrainerCallback):
        def __init__(self):
            self.begin, self.times = 0.0, []

        def on_step_begin(self, args, state, control, **kw):
            self.begin = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self.begin)

    clock = Clock()
    losses = []

    class Losses(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                losses.append(logs["loss"])

    args = TrainingArguments(output_dir=os.path.join(os.environ.get("TMPDIR", "/tmp"), "hf_finetune_out"),
                             per_device_train_batch_size=a.micro_batch_size,
                             gradient_accumulation_steps=a.grad_accum_steps, max_steps=a.max_steps,
                             learning_rate=a.lr, lr_scheduler_type="linear", warmup_steps=0, weight_decay=0.0,
                             max_grad_norm=a.max_grad_norm, optim="adamw_torch", logging_steps=1, logging_strategy="steps",
                             save_strategy="no", eval_strategy="no", report_to=[], use_cpu=True,
                             dataloader_num_workers=0, disable_tqdm=True, seed=0)
    trainer = InOrder(model=model, args=args, train_dataset=Samples(), callbacks=[clock, Losses()])
    t_train = time.perf_counter()
    trainer.train()
    t_end = time.perf_counter()
    timed = clock.times[a.warmup_steps:]
    step = statistics.median(timed)
    tokens_per_step = a.micro_batch_size * a.seq_len * a.grad_accum_steps
    print(json.dumps({
        "side": "hf-trainer" + ("+peft" if a.lora_rank else ""),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "peft": __import__("peft").__version__ if a.lora_rank else None,
        "threads": torch.get_num_threads(), "trainable_params": trainable,
        "step_times_s": clock.times, "step_time_s": step, "tokens_per_s": tokens_per_step / step,
        "losses": losses, "load_s": t_train - t_start, "train_s": t_end - t_train,
    }))


if __name__ == "__main__":
    main()
