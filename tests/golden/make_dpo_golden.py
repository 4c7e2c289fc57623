#!/usr/bin/env python3
"""Golden data for DPO (scalelab dpo): the DPO loss of trl's "sigmoid" kind, written out in PyTorch.

Run it with make_dpo_golden.sh: a virtualenv with the PyPI packages pinned in
requirements-dpo.txt (PyTorch for the CPU, transformers, peft). The output under
tests/golden/data/dpo/ is committed so that CI needs none of them.

trl itself is not used (it pulls datasets and more, and its DPOTrainer pads per batch and shuffles);
the loss, the rewards and the batch layout are trl's DPOTrainer's, written out here:
  - tokenization: prompt as tokenizer(prompt) (the template's BOS), each completion as
    tokenizer(completion, add_special_tokens=False) + [eos], completions cut at their end so that
    prompt + completion is at most seq_len + 1 tokens (scalelab's rule; see src/train/dpo.h);
  - a micro-batch of B pairs is one batch of 2B rows [chosen; rejected], inputs = tokens[:-1] and
    labels = tokens[1:] right-padded to seq_len, labels of prompt tokens and padding -100;
  - log p(completion) = sum over unmasked labels of log_softmax(logits)[label] (trl's
    get_batch_logps), for the policy and for the reference;
  - z = beta * ((pi_c - pi_r) - (ref_c - ref_r)); loss = mean(-(1 - eps) logsigmoid(z) - eps logsigmoid(-z));
    rewards beta * (pi - ref) (chosen, rejected), margin = chosen - rejected, accuracy = mean(chosen > rejected).
The reference is a frozen copy of the initial model (full fine-tuning) or, under LoRA, the same peft
model inside `with model.disable_adapter():` (as trl does when ref_model is None with peft).

Training is the Hugging Face Trainer's step written out (as make_lora_golden.py): torch.optim.AdamW
(weight decay on every non-bias, non-norm trainable parameter), get_linear_schedule_with_warmup,
clip_grad_norm_, loss / grad_accum_steps per micro-batch; metrics of a step are the means over its
micro-batches.

For each case a directory with config.json, model.safetensors, tokenizer.json + tokenizer_config.json,
pairs.jsonl, (LoRA) adapter_init/, and expected.json: the settings, the token ids of every pair, and
per step loss, rewards_chosen, rewards_rejected, reward_margin, reward_accuracy, grad_norm.

Cases with "eval" also write pairs_val.jsonl (held-out pairs) and expected.json "evals": after every
`every` optimizer steps and after the last, trl's evaluation metrics on the held-out pairs with the
model in eval mode and no gradient (eval_loss, eval_rewards/chosen, /rejected, /margins,
/accuracies): the means over all held-out pairs (trl averages per batch; equal when batches are full,
and scalelab averages over pairs, which is what this writes).

OPT cases ("family": "opt"): OPTForCausalLM (learned positions with offset 2, biases, LayerNorm, tied
head) with dropout 0 (random masks cannot be compared; scalelab's are its own generator's).
"""
import argparse
import copy
import json
import os
import shutil

import peft
import torch
import transformers
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, OPTConfig, OPTForCausalLM, PreTrainedTokenizerFast

SEED = 5151
HERE = os.path.dirname(os.path.abspath(__file__))
TOKENIZER = os.path.join(HERE, "data", "tokenizer", "llama3_style")

PAIRS = [
    ("The capital of France is", " Paris, a city on the Seine.", " Berlin, obviously."),
    ("Two plus two equals", " four.", " five, give or take."),
    ("Water boils at sea level at", " one hundred degrees Celsius.", " forty degrees."),
    ("A good reply is", " short and kind.", " long, rude and off topic."),
    ("Q: What colour is the sky on a clear day?\nA:", " Blue.", " Green with purple stripes."),
    ("The opposite of hot is", " cold.", " hot."),
    ("Write one word for happy:", " glad", " the word that means the opposite of sad in most dictionaries and "
                                           "several other reference works written over many years by many people"),
    ("Say thanks:", " Thank you very much!", " No."),
]

# Held-out pairs for the cases with evaluation (5: with micro-batch 2 the last batch is partial).
VAL_PAIRS = [
    ("The capital of Italy is", " Rome.", " a kind of pasta."),
    ("Three minus one equals", " two.", " seven hundred."),
    ("Ice is", " frozen water.", " a warm drink served at breakfast."),
    ("A polite greeting is", " Hello!", " Go away."),
    ("The sun rises in the", " east.", " basement."),
]

CASES = [
    {"name": "full_accum2", "description": "full fine-tuning, reference = a frozen copy, micro-batch 2, accumulation 2",
     "lora": None, "beta": 0.1, "label_smoothing": 0.0, "tied": False,
     "training": {"micro_batch_size": 2, "grad_accum_steps": 2, "seq_len": 32, "max_steps": 5, "warmup_steps": 1,
                  "lr": 2e-3, "lr_scheduler": "linear", "weight_decay": 0.1, "adam_beta1": 0.9,
                  "adam_beta2": 0.999, "adam_epsilon": 1e-8, "max_grad_norm": 1.0}},
    {"name": "lora_qv_smoothing", "description": "LoRA r 4 alpha 8 on q_proj,v_proj (tied Llama), reference = the "
     "adapters off, beta 0.5, label smoothing 0.1",
     "lora": {"r": 4, "alpha": 8.0, "targets": ["q_proj", "v_proj"]}, "beta": 0.5, "label_smoothing": 0.1,
     "tied": True,
     "training": {"micro_batch_size": 4, "grad_accum_steps": 1, "seq_len": 32, "max_steps": 5, "warmup_steps": 0,
                  "lr": 2e-2, "lr_scheduler": "linear", "weight_decay": 0.0, "adam_beta1": 0.9,
                  "adam_beta2": 0.999, "adam_epsilon": 1e-8, "max_grad_norm": 1.0}},
    {"name": "full_eval", "description": "Llama full fine-tuning (frozen reference copy), evaluation on 5 held-out "
     "pairs every 2 steps", "lora": None, "beta": 0.1, "label_smoothing": 0.0, "tied": False,
     "eval": {"every": 2},
     "training": {"micro_batch_size": 2, "grad_accum_steps": 1, "seq_len": 32, "max_steps": 5, "warmup_steps": 1,
                  "lr": 2e-3, "lr_scheduler": "linear", "weight_decay": 0.1, "adam_beta1": 0.9,
                  "adam_beta2": 0.999, "adam_epsilon": 1e-8, "max_grad_norm": 1.0}},
    {"name": "opt_full_eval", "description": "OPT (biases, learned positions, tied head) full fine-tuning with a frozen reference copy, accumulation 2, evaluation every 2 steps",
     "family": "opt", "lora": None, "beta": 0.1, "label_smoothing": 0.0, "tied": True,
     "eval": {"every": 2},
     "training": {"micro_batch_size": 2, "grad_accum_steps": 2, "seq_len": 32, "max_steps": 4, "warmup_steps": 1,
                  "lr": 3e-3, "lr_scheduler": "linear", "weight_decay": 0.1, "adam_beta1": 0.9,
                  "adam_beta2": 0.999, "adam_epsilon": 1e-8, "max_grad_norm": 1.0}},
    {"name": "opt_lora_eval", "description": "OPT LoRA r 4 alpha 8 on q_proj,v_proj,out_proj,fc1,fc2, reference = "
     "the adapters off, beta 0.5, label smoothing 0.1, evaluation every 2 steps",
     "family": "opt", "lora": {"r": 4, "alpha": 8.0, "targets": ["q_proj", "v_proj", "out_proj", "fc1", "fc2"]},
     "beta": 0.5, "label_smoothing": 0.1, "tied": True,
     "eval": {"every": 2},
     "training": {"micro_batch_size": 4, "grad_accum_steps": 1, "seq_len": 32, "max_steps": 4, "warmup_steps": 0,
                  "lr": 2e-2, "lr_scheduler": "linear", "weight_decay": 0.0, "adam_beta1": 0.9,
                  "adam_beta2": 0.999, "adam_epsilon": 1e-8, "max_grad_norm": 1.0}},
]


def tokenize(tok, seq_len, pairs=PAIRS):
    out = []
    for prompt, chosen, rejected in pairs:
        p = tok(prompt)["input_ids"]
        c = tok(chosen, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        r = tok(rejected, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        room = seq_len + 1 - len(p)
        assert room >= 1
        out.append((p, c[:room], r[:room]))
    return out


def make_batch(pairs, seq_len):
    """[chosen; rejected] rows: inputs and labels (-100: prompt and padding), right-padded with 0."""
    B = len(pairs)
    inputs = torch.zeros(2 * B, seq_len, dtype=torch.int64)
    labels = torch.full((2 * B, seq_len), -100, dtype=torch.int64)
    for k in range(2):
        for i, (p, c, r) in enumerate(pairs):
            seq = p + (c if k == 0 else r)
            n = len(seq)
            row = k * B + i
            inputs[row, :n - 1] = torch.tensor(seq[:-1])
            for t in range(n - 1):
                if t + 1 >= len(p):
                    labels[row, t] = seq[t + 1]
    return inputs, labels


def sequence_logps(model, inputs, labels):
    logits = model(input_ids=inputs).logits.float()
    mask = labels != -100
    safe = labels.clamp(min=0)
    lp = torch.log_softmax(logits, dim=-1).gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    return (lp * mask).sum(-1)


def dpo_loss(pi, ref, beta, eps):
    B = pi.shape[0] // 2
    pc, pr, rc, rr = pi[:B], pi[B:], ref[:B], ref[B:]
    z = beta * ((pc - pr) - (rc - rr))
    losses = -(1 - eps) * torch.nn.functional.logsigmoid(z) - eps * torch.nn.functional.logsigmoid(-z)
    chosen = beta * (pc - rc).detach()
    rejected = beta * (pr - rr).detach()
    return losses.mean(), chosen, rejected


def make_model(case, tok, vocab):
    if case.get("family", "llama") == "opt":
        config = OPTConfig(
            vocab_size=vocab, hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=64, word_embed_proj_dim=32, do_layer_norm_before=True,
            activation_function="relu", enable_bias=True, layer_norm_elementwise_affine=True, dropout=0.0,
            attention_dropout=0.0, layerdrop=0.0, init_std=0.02, pad_token_id=1, bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id, tie_word_embeddings=case["tied"], attn_implementation="eager",
            torch_dtype="float32")
        return OPTForCausalLM(config).float()
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=case["tied"], initializer_range=0.02, attention_dropout=0.0, hidden_act="silu",
        attn_implementation="eager", torch_dtype="float32", bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id)
    return LlamaForCausalLM(config).float()


def evaluate(model, ref_model, val, seq, beta, eps):
    """trl's evaluation metrics over every held-out pair, the model in eval mode, no gradient."""
    model.eval()
    inputs, labels = make_batch(val, seq)
    with torch.no_grad():
        if ref_model is not None:
            ref = sequence_logps(ref_model, inputs, labels)
        else:
            with model.disable_adapter():
                ref = sequence_logps(model, inputs, labels)
        pi = sequence_logps(model, inputs, labels)
        loss, chosen, rejected = dpo_loss(pi, ref, beta, eps)
    model.train()
    return {"loss": loss.item(), "rewards_chosen": chosen.mean().item(), "rewards_rejected": rejected.mean().item(),
            "reward_margin": (chosen - rejected).mean().item(),
            "reward_accuracy": (chosen > rejected).float().mean().item(), "pairs": len(val)}


def make_case(case, out_root):
    torch.manual_seed(SEED)
    t = case["training"]
    mb, seq, steps, accum = t["micro_batch_size"], t["seq_len"], t["max_steps"], t["grad_accum_steps"]
    out = os.path.join(out_root, case["name"])
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOKENIZER, f), os.path.join(out, f))
    tok = PreTrainedTokenizerFast.from_pretrained(out)
    vocab = (len(tok) + 63) // 64 * 64
    base = make_model(case, tok, vocab)
    base.save_pretrained(out, safe_serialization=True)
    with open(os.path.join(out, "pairs.jsonl"), "w") as f:
        for p, c, r in PAIRS:
            f.write(json.dumps({"prompt": p, "chosen": c, "rejected": r}) + "\n")
    pairs = tokenize(tok, seq)
    val = None
    if case.get("eval"):
        with open(os.path.join(out, "pairs_val.jsonl"), "w") as f:
            for p, c, r in VAL_PAIRS:
                f.write(json.dumps({"prompt": p, "chosen": c, "rejected": r}) + "\n")
        val = tokenize(tok, seq, VAL_PAIRS)

    if case["lora"]:
        l = case["lora"]
        lcfg = LoraConfig(r=l["r"], lora_alpha=l["alpha"], lora_dropout=0.0, target_modules=l["targets"],
                          bias="none", task_type="CAUSAL_LM")
        model = get_peft_model(base, lcfg)
        model.save_pretrained(os.path.join(out, "adapter_init"), safe_serialization=True)
        ref_model = None
    else:
        model = base
        ref_model = copy.deepcopy(base).eval()
        for p in ref_model.parameters():
            p.requires_grad_(False)
    model.train()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in named if "norm" not in n and "bias" not in n]
    no_decay = [p for n, p in named if "norm" in n or "bias" in n]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": t["weight_decay"]},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=t["lr"], betas=(t["adam_beta1"], t["adam_beta2"]), eps=t["adam_epsilon"])
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, t["warmup_steps"], steps)
    trainable = [p for _, p in named]
    rec = {k: [] for k in ("losses", "rewards_chosen", "rewards_rejected", "reward_margins", "reward_accuracies",
                           "grad_norms")}
    evals = []
    g = 0
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        sums = {"loss": 0.0, "c": 0.0, "r": 0.0, "m": 0.0, "a": 0.0}
        for _ in range(accum):
            chunk = [pairs[(g + i) % len(pairs)] for i in range(mb)]
            g += mb
            inputs, labels = make_batch(chunk, seq)
            with torch.no_grad():
                if ref_model is not None:
                    ref = sequence_logps(ref_model, inputs, labels)
                else:
                    with model.disable_adapter():
                        ref = sequence_logps(model, inputs, labels)
            pi = sequence_logps(model, inputs, labels)
            loss, chosen, rejected = dpo_loss(pi, ref, case["beta"], case["label_smoothing"])
            (loss / accum).backward()
            sums["loss"] += loss.item()
            sums["c"] += chosen.mean().item()
            sums["r"] += rejected.mean().item()
            sums["m"] += (chosen - rejected).mean().item()
            sums["a"] += (chosen > rejected).float().mean().item()
        rec["grad_norms"].append(float(torch.nn.utils.clip_grad_norm_(trainable, t["max_grad_norm"])))
        optimizer.step()
        scheduler.step()
        rec["losses"].append(sums["loss"] / accum)
        rec["rewards_chosen"].append(sums["c"] / accum)
        rec["rewards_rejected"].append(sums["r"] / accum)
        rec["reward_margins"].append(sums["m"] / accum)
        rec["reward_accuracies"].append(sums["a"] / accum)
        if val is not None and ((step + 1) % case["eval"]["every"] == 0 or step + 1 == steps):
            evals.append({"step": step + 1, **evaluate(model, ref_model, val, seq, case["beta"],
                                                       case["label_smoothing"])})
    assert rec["losses"][-1] < rec["losses"][0] - 0.01, f"{case['name']}: the loss barely moves ({rec['losses']})"
    expected = {
        "description": case["description"],
        "beta": case["beta"],
        "label_smoothing": case["label_smoothing"],
        "lora": case["lora"],
        "training": t,
        "family": case.get("family", "llama"),
        "pairs_tokens": [{"prompt": p, "chosen": c, "rejected": r} for p, c, r in pairs],
        **rec,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__},
    }
    if val is not None:
        expected["eval_every"] = case["eval"]["every"]
        expected["val_pairs_tokens"] = [{"prompt": p, "chosen": c, "rejected": r} for p, c, r in val]
        expected["evals"] = evals
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
    print(f"{case['name']}: losses {['%.5f' % x for x in rec['losses']]} accuracies {rec['reward_accuracies']} "
          f"margins {['%.4f' % x for x in rec['reward_margins']]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", nargs="*", help="names to generate (default: all)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    for c in CASES:
        if not a.cases or c["name"] in a.cases:
            make_case(c, a.out)


if __name__ == "__main__":
    main()
