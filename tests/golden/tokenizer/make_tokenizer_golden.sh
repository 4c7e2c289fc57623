#!/usr/bin/env bash
# Regenerates tests/golden/data/tokenizer/ with the pinned packages of requirements.txt in a
# virtualenv ($SCALELAB_TOKENIZER_VENV, default /work/venvs/tokenizer or <repo>/.venv-tokenizer).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
venv="${SCALELAB_TOKENIZER_VENV:-$repo/.venv-tokenizer}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$here/requirements.txt"
"$venv/bin/python" "$here/make_tokenizer_golden.py" "$@"
