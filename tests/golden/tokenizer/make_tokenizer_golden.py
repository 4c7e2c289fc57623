#!/usr/bin/env python3
"""Regenerates tests/golden/data/tokenizer/ (run make_tokenizer_golden.sh, or this script in a
virtualenv with requirements.txt installed).

What it writes, per tokenizer directory (gpt2_style/, llama3_style/, ignore_merges/):
  tokenizer.json (+ tokenizer_config.json): the tokenizer under test, trained here with HF
      `tokenizers` on the Debian license texts (/usr/share/common-licenses) and committed;
  golden.json: {"cases": [{"hex": input bytes, "ids": encode with special tokens,
      "ids_plain": encode without, "decoded_hex": HF decode(ids) as UTF-8}],
      "corpus": [{"file", "fnv1a64", "lines": [ids of every non-empty line]}],
      "packing": {"file", "fnv1a64", "block": seq_len + 1, "blocks": [[ids]...]}}
Inputs with invalid UTF-8 reach HF the way Python text does: bytes.decode("utf-8", "replace").
"""
import argparse
import json
import os
import random
import sys

from tokenizers import Tokenizer, Regex, decoders, models, pre_tokenizers, processors, trainers

LICENSES = "/usr/share/common-licenses"
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def license_files():
    out = []
    for name in sorted(os.listdir(LICENSES)):
        path = os.path.join(LICENSES, name)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        out.append(name)
    return out


def fnv1a64(data):
    """The files' fingerprint (64-bit FNV-1a; the C++ test computes the same without a crypto library)."""
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def read_bytes(name):
    with open(os.path.join(LICENSES, name), "rb") as f:
        return f.read()


def corpus_texts():
    return [read_bytes(n).decode("utf-8", "replace") for n in license_files()]


def train_gpt2_style(vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus_texts(), trainer)
    return tok


def train_llama3_style(vocab_size):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus_texts(), trainer)
    # Llama 3 keeps its special tokens after the model vocabulary.
    tok.add_special_tokens(specials)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)]),
    ])
    # A non-special added token with lstrip/rstrip, to exercise both.
    from tokenizers import AddedToken
    tok.add_tokens([AddedToken("[MARK]", lstrip=True, rstrip=True, normalized=False)])
    return tok


def train_smollm_style(vocab_size):
    """SmolLM/SmolLM2's pre-tokenizer: every digit alone, then GPT-2's ByteLevel."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus_texts(), trainer)
    return tok


def ignore_merges_tokenizer(ignore):
    """A hand-made vocabulary where BPE and ignore_merges disagree: merges make "a"+"bc" of
    "abc", but "abc" itself is in the vocabulary."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(alphabet))}
    for w in ["bc", "ab", "abc", "Ġa", "Ġabc"]:
        vocab[w] = len(vocab)
    merges = [("b", "c"), ("a", "b"), ("ab", "c"), ("Ġ", "a")]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def edge_cases(extra_specials):
    cases = []
    add = cases.append
    # Contractions in any case, after words and alone.
    for c in ["s", "t", "re", "ve", "m", "ll", "d"]:
        # Lower, upper, capitalized, and (for two letters) lower-then-upper; in a fixed order.
        for v in dict.fromkeys([c, c.upper(), c.capitalize(), c[0] + c[1:].upper()]):
            add(f"it'{v} here")
            add(f"'{v}")
            add(f"x '{v}'{v}")
    add("I'M YOU'RE WE'VE SHE'LL HE'D IT'S DON'T")
    add("ſ 'ſ K 'K Kelvin İstanbul ıi")  # long s and Kelvin sign under case folding
    # Digit runs.
    for n in range(1, 13):
        add("".join(str((i * 7 + 3) % 10) for i in range(n)))
        add("a" + "9" * n + "b")
    add("3.14159 1,000,000 0x1F 1e-9 -42 +7 2024-06-01 12:30:45")
    add("١٢٣٤٥ ۱۲۳ १२३ １２３ ²³ ½ Ⅻ ⅷ")
    # Whitespace.
    for n in range(1, 9):
        add("a" + " " * n + "b")
        add("a" + "\t" * n + "b")
        add(" " * n)
        add("\n" * n)
        add("x" + " " * n)
    add("line one\r\nline two\r\n\r\nline four\r")
    add("\r\n")
    add(" \n \n  \n")
    add("\t \t  \n\t")
    add("a\u00a0b\u2003c\u3000d\u180ee\u200bf\u0085g\u2028h\u2029i\u202fj\u205fk\u1680l\x0bm\x0cn\x1co\x1dp\x1eq\x1fr")
    add("  leading and trailing  ")
    # Unicode categories.
    add("Ελληνικά Русский 中文字符 日本語のテキスト 한국어 العربية עברית हिन्दी ไทย")
    add("e\u0301 a\u0308 n\u0303 \u0301\u0301 café naïve Å Ω")
    add("∑∫√∞ ≤≥≠ €$¥£ ©®™ §¶ †‡ •… —– “quotes” ‘single’ «guillemets»")
    add("!!!??? ... ;;; ::: ((( ))) [[[ ]]] {{{ }}} <<< >>> /// \\\\\\ ||| &&& ***")
    add("\x00\x01\x02 \x7f \x1b[31mred\x1b[0m")
    add("ﬁ ﬂ Ǆ ǅ ǆ ß ẞ ŉ")
    add("\ue000\uf8ff private use")
    add("tab\tsep\tvalues\there")
    # Emoji.
    add("👍 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇩🇪 ❤️ ☺︎ 🏳️‍🌈 🤖🤖🤖")
    add("emoji👍inside💡words")
    # Special tokens inside text.
    for s in extra_specials:
        add(f"before{s}after")
        add(f"{s}")
        add(f"{s}{s}")
        add(f" {s} ")
        add(f"x {s}\n{s[:-1]}")
    # Long pieces (the merge loop's long-word strategy) and mixed text.
    add("a" * 300)
    add("ab" * 150)
    add("The" + "re" * 100 + "fore")
    add(" " * 500 + "x")
    add("7" * 100)
    add("-" * 80)
    add("This License applies to any program or other work which contains a notice placed by the copyright holder.")
    # Seeded random strings from a mixed pool.
    pool = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \t\n\r'.,;:!?-_()[]{}\"/\\@#$%^&*+=<>|~`") + \
        list("éüßñçøåÆŒΣλж中文日本한🙂👍🏽\u0301\u00a0\u3000\u2028١²") + ["'s", "'LL", "'Re", " the", "  "]
    rng = random.Random(13)
    for _ in range(250):
        add("".join(rng.choice(pool) for _ in range(rng.randint(1, 40))))
    out = [c.encode("utf-8") for c in cases]
    # Invalid UTF-8.
    out += [b"\xff", b"abc\x80def", b"\xc3", b"\xe2\x82", b"\xe2\x82 x", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
            b"\xc0\xaf", b"\xf0\x9f\x98", b"ok \xf0\x9f\x98 ok", b"\xfe\xfe\xff\xff", b"\xe0\x80\x80", b"a\xc3(b",
            b"\xf0\x90\x80", b"\xf1\x80\x80\xe1\x80\xc2", b"caf\xe9 na\xefve"]
    return out


def encode_cases(tok, cases):
    rows = []
    for raw in cases:
        text = raw.decode("utf-8", "replace")
        ids = tok.encode(text, add_special_tokens=True).ids
        plain = tok.encode(text, add_special_tokens=False).ids
        decoded = tok.decode(ids, skip_special_tokens=False)
        rows.append({"hex": raw.hex(), "ids": ids, "ids_plain": plain, "decoded_hex": decoded.encode("utf-8").hex()})
    return rows


def encode_corpus(tok):
    out = []
    for name in license_files():
        raw = read_bytes(name)
        lines = [l for l in raw.split(b"\n") if l]
        encs = tok.encode_batch([l.decode("utf-8", "replace") for l in lines], add_special_tokens=True)
        out.append({"file": name, "fnv1a64": fnv1a64(raw), "lines": [e.ids for e in encs]})
    return out


def documents(raw):
    """Blank-line-separated blocks, as scalelab's text: data spec reads a file (docs/data.md)."""
    docs, cur = [], []
    for line in raw.split(b"\n"):
        if line.strip(b" \t\r\f\v") == b"":
            if cur:
                docs.append(b"\n".join(cur))
            cur = []
        else:
            cur.append(line)
    if cur:
        docs.append(b"\n".join(cur))
    return docs


def group_texts(examples, block_size):
    """transformers' examples/pytorch/language-modeling/run_clm.py group_texts: concatenate,
    drop the remainder, cut into blocks."""
    concatenated = sum(examples, [])
    total = (len(concatenated) // block_size) * block_size
    return [concatenated[i:i + block_size] for i in range(0, total, block_size)]


def packing(tok, eos, name, block):
    raw = read_bytes(name)
    # run_clm's tokenize_function is tokenizer(text) (special tokens added); scalelab appends EOS.
    examples = [tok.encode(d.decode("utf-8", "replace"), add_special_tokens=True).ids + [eos] for d in documents(raw)]
    return {"file": name, "fnv1a64": fnv1a64(raw), "block": block,
            "documents": len(examples), "blocks": group_texts(examples, block)}


def write(outdir, name, tok, config, specials, eos, cases=None):
    d = os.path.join(outdir, name)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "tokenizer.json")
    tok.save(path, pretty=False)
    if name == "gpt2_style":
        # Older files (GPT-2's own) write merges as "a b" strings; keep this one in that form
        # and check HF reads it back identically.
        with open(path) as f:
            j = json.load(f)
        j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
        with open(path, "w") as f:
            json.dump(j, f, ensure_ascii=False, indent=1)
        reread = Tokenizer.from_file(path)
        assert reread.get_vocab() == tok.get_vocab()
        tok = reread
    if config is not None:
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(config, f, indent=1)
    golden = {"generator": "tests/golden/tokenizer/make_tokenizer_golden.py",
              "cases": encode_cases(tok, cases if cases is not None else edge_cases(specials))}
    if cases is None:
        golden["corpus"] = encode_corpus(tok)
        golden["packing"] = packing(tok, eos, "GPL-3", 33)
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(golden, f, separators=(",", ":"))
    n_lines = sum(len(c["lines"]) for c in golden.get("corpus", []))
    print(f"{name}: vocab {tok.get_vocab_size()}, {len(golden['cases'])} cases, {n_lines} corpus lines")


WHISPER = "openai-whisper==20250625"  # whisper/assets/gpt2.tiktoken: GPT-2's ranks
LLAMA_MODELS = "llama-models==0.3.0"  # llama_models/llama3/tokenizer.model: Llama 3's ranks


def fetch_real(workdir):
    """pip-downloads the two packages (no dependencies) and returns the two rank files."""
    import glob
    import subprocess
    import tarfile
    import zipfile
    os.makedirs(workdir, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", workdir, WHISPER, LLAMA_MODELS],
                   check=True)
    for t in glob.glob(os.path.join(workdir, "openai_whisper-*.tar.gz")):
        with tarfile.open(t) as f:
            f.extractall(workdir, filter="data")
    for w in glob.glob(os.path.join(workdir, "llama_models-*.whl")):
        with zipfile.ZipFile(w) as f:
            f.extractall(os.path.join(workdir, "llama_models_whl"))
    gpt2 = glob.glob(os.path.join(workdir, "openai_whisper-*", "whisper", "assets", "gpt2.tiktoken"))[0]
    llama3 = glob.glob(os.path.join(workdir, "llama_models_whl", "llama_models", "llama3", "tokenizer.model"))[0]
    return gpt2, llama3


def real_gpt2(ranks_file):
    """GPT-2 in its original tokenizer.json form (BPE + the ByteLevel pre-tokenizer with GPT-2's
    regex, merges as transformers' TikTokenConverter derives them from the ranks)."""
    from transformers.convert_slow_tokenizer import TikTokenConverter
    vocab, merges = TikTokenConverter(vocab_file=ranks_file).extract_vocab_merges_from_model(ranks_file)
    vocab["<|endoftext|>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens(["<|endoftext|>"])
    return tok


def real_llama3(ranks_file):
    """Llama 3 as transformers converts it (TikTokenConverter: Split with Llama 3's regex,
    ignore_merges), 256 special tokens and the BOS template of Meta's tokenizer.json."""
    from transformers.convert_slow_tokenizer import TikTokenConverter
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
                "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
                "<|eot_id|>", "<|python_tag|>", "<|image|>"]
    specials += [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(specials))]
    tok = TikTokenConverter(vocab_file=ranks_file, pattern=LLAMA3_PATTERN, additional_special_tokens=specials).converted()
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)]),
    ])
    return tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "tokenizer"))
    ap.add_argument("--real", action="store_true",
                    help=f"also convert the real GPT-2 ({WHISPER}) and Llama 3 ({LLAMA_MODELS}) vocabularies (pip download)")
    ap.add_argument("--real-only", action="store_true", help="only the real vocabularies")
    ap.add_argument("--workdir", default="/tmp/scalelab-tokenizer-golden")
    args = ap.parse_args()
    if not os.path.isdir(LICENSES):
        sys.exit(f"{LICENSES} is missing (Debian's base-files ships it)")
    if args.real or args.real_only:
        gpt2_file, llama3_file = fetch_real(args.workdir)
        g = real_gpt2(gpt2_file)
        write(args.out, "real_gpt2", g, {"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"},
              ["<|endoftext|>"], g.token_to_id("<|endoftext|>"))
        l = real_llama3(llama3_file)
        write(args.out, "real_llama3", l, {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"},
              ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"], l.token_to_id("<|end_of_text|>"))
        if args.real_only:
            return
    g = train_gpt2_style(1200)
    write(args.out, "gpt2_style", g, {"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"},
          ["<|endoftext|>"], g.token_to_id("<|endoftext|>"))
    l = train_llama3_style(1500)
    write(args.out, "llama3_style", l, {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"},
          ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "[MARK]"], l.token_to_id("<|end_of_text|>"))
    s = train_smollm_style(1000)
    write(args.out, "smollm_style", s, {"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"},
          ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], s.token_to_id("<|endoftext|>"))
    for ignore, name in [(True, "ignore_merges"), (False, "no_ignore_merges")]:
        t = ignore_merges_tokenizer(ignore)
        small = [w.encode() for w in ["abc", " abc", "abcabc", "abc abc", "ab", "bc", "aabbcc", "cab", "a", "abcd", "zabc"]]
        write(args.out, name, t, None, [], 0, small)


if __name__ == "__main__":
    main()
