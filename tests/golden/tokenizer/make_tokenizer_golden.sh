#!/usr/bin/env bash
# Regenerates tests/golden/data/tokenizer/ and tests/golden/data/gguf/ (`make tokenizer-golden`)
# with the pinned packages of requirements.txt and ../gguf/requirements.txt in a virtualenv
# ($SCALELAB_TOKENIZER_VENV, default <repo>/.venv-tokenizer). Arguments go to
# make_tokenizer_golden.py (--real: the real GPT-2 and Llama 3 vocabularies);
# SCALELAB_SMOLLM2_GGUF=path also writes the SmolLM2 expectations.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
venv="${SCALELAB_TOKENIZER_VENV:-$repo/.venv-tokenizer}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$here/requirements.txt" -r "$here/../gguf/requirements.txt"
"$venv/bin/python" "$here/make_tokenizer_golden.py" "$@"
# The GGUF goldens use the llama3_style tokenizer written above.
"$venv/bin/python" "$here/../gguf/make_gguf_golden.py" ${SCALELAB_SMOLLM2_GGUF:+--smollm2 "$SCALELAB_SMOLLM2_GGUF"}
