#!/usr/bin/env bash
# Regenerates tests/golden/data/lora/: the pinned packages of requirements-lora.txt in a virtualenv
# at $SCALELAB_LORA_VENV (default: <repo>/.venv-lora, ignored by git).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${SCALELAB_LORA_VENV:-$repo/.venv-lora}"
if [ ! -x "$venv/bin/python" ]; then
  echo "make_lora_golden: creating $venv"
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$here/requirements-lora.txt"
"$venv/bin/python" "$here/make_lora_golden.py" --out "$here/data/lora" "$@"
echo "make_lora_golden: wrote $here/data/lora ($(du -sh "$here/data/lora" | cut -f1)); commit it"
