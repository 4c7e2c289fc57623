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


if __name__ == "__main__":
    main()
