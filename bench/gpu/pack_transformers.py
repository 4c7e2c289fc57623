#!/usr/bin/env python3
"""Packs an older transformers release small enough to carry to a lent GPU machine (whose image has
its own transformers, tokenizers and huggingface_hub, and no network), for bench/gpu/run.sh versions.

    python3 bench/gpu/pack_transformers.py SITE_DIR OUT.tar.xz [--pack NAME=DIR ...] [--tokenizers-version V]

SITE_DIR holds an installed transformers (e.g. `pip install --no-deps --target DIR transformers==4.45.2`).
The archive keeps transformers with the modelling code of the families the memory benchmark runs
(llama, opt, qwen2, plus auto and bert, whose tokenizer transformers.data imports), every other model's __init__.py, configuration and tokenization only
(the lazy import tables name them, and some packages import another's tokenizer when loaded; nothing
imports their modelling code), and no TF/Flax modelling
files: about a twentieth of the 100 MB installed. A carried wheel of each release would not fit the
64 MiB a call carries beside the tree and scalelab's package.

--pack NAME=DIR: also pack the installed package NAME (import name, e.g. huggingface_hub or accelerate)
from DIR, with its dist-info: 4.x releases refuse huggingface_hub >= 1.0, and the accelerate a
release was used with keeps the Trainer's wrapping as it was.
--tokenizers-version: write a tokenizers-V.dist-info holding only its version, so that transformers'
import-time version check accepts the machine's own tokenizers library. The memory benchmark never
tokenizes (random ids, no tokenizer object), so the tokenizers code that runs is irrelevant to what
it measures; the archive says so in TOKENIZERS_STUB.txt.
"""
import argparse
import os
import shutil
import sys
import tarfile
import tempfile

KEEP_MODELS = {"llama", "opt", "qwen2", "auto", "bert"}  # bert: transformers.data imports its tokenizer


def copy_trimmed(src, dst):
    for root, dirs, files in os.walk(src):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        rel = os.path.relpath(root, src)
        parts = rel.split(os.sep)
        other_model = len(parts) >= 2 and parts[0] == "models" and parts[1] not in KEEP_MODELS
        for f in files:
            if f.startswith(("modeling_tf_", "modeling_flax_")):
                continue
            if other_model and not (f == "__init__.py" or f.startswith(("configuration_", "tokenization_"))):
                continue
            os.makedirs(os.path.join(dst, rel), exist_ok=True)
            shutil.copy2(os.path.join(root, f), os.path.join(dst, rel, f))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("site")
    ap.add_argument("out")
    ap.add_argument("--pack", action="append", default=[], metavar="NAME=DIR",
                    help="also pack the installed package NAME from DIR (repeatable)")
    ap.add_argument("--tokenizers-version")
    a = ap.parse_args()
    dist = [d for d in os.listdir(a.site) if d.startswith("transformers-") and d.endswith(".dist-info")]
    if not os.path.isdir(os.path.join(a.site, "transformers")) or len(dist) != 1:
        sys.exit(f"pack_transformers: no single installed transformers in {a.site}")
    with tempfile.TemporaryDirectory() as tmp:
        copy_trimmed(os.path.join(a.site, "transformers"), os.path.join(tmp, "transformers"))
        shutil.copytree(os.path.join(a.site, dist[0]), os.path.join(tmp, dist[0]))
        for spec in a.pack:
            name, _, src = spec.partition("=")
            dist_name = name.replace("_", "-")
            di = [d for d in os.listdir(src) if d.endswith(".dist-info") and
                  d.split("-")[0].replace("_", "-").lower() == dist_name.lower()]
            if not os.path.isdir(os.path.join(src, name)) or len(di) != 1:
                sys.exit(f"pack_transformers: no single installed {name} in {src}")
            shutil.copytree(os.path.join(src, name), os.path.join(tmp, name), ignore=shutil.ignore_patterns("__pycache__"))
            shutil.copytree(os.path.join(src, di[0]), os.path.join(tmp, di[0]))
        if a.tokenizers_version:
            d = os.path.join(tmp, f"tokenizers-{a.tokenizers_version}.dist-info")
            os.makedirs(d)
            with open(os.path.join(d, "METADATA"), "w") as f:
                f.write(f"Metadata-Version: 2.1\nName: tokenizers\nVersion: {a.tokenizers_version}\n")
            with open(os.path.join(tmp, "TOKENIZERS_STUB.txt"), "w") as f:
                f.write(f"tokenizers-{a.tokenizers_version}.dist-info is a version stub: the machine's own tokenizers "
                        "library is imported; the memory benchmark never tokenizes.\n")
        with tarfile.open(a.out, "w:xz", preset=9) as t:
            for name in sorted(os.listdir(tmp)):
                t.add(os.path.join(tmp, name), arcname=name)
    print(f"{a.out}: {os.path.getsize(a.out) / 2**20:.2f} MiB")


if __name__ == "__main__":
    main()
