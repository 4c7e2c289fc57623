#!/usr/bin/env bash
# Regenerates tests/golden/data/qat_lora/: the pinned packages of requirements-qat.txt in a virtualenv at
# $SCALELAB_QAT_VENV (default: <repo>/.venv-qat, ignored by git).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${SCALELAB_QAT_VENV:-$repo/.venv-qat}"
if [ ! -x "$venv/bin/python" ]; then
  echo "make_qat_lora_golden: creating $venv"
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$here/requirements-qat.txt"
"$venv/bin/python" "$here/make_qat_lora_golden.py" --out "$here/data/qat_lora" "$@"
echo "make_qat_lora_golden: wrote $here/data/qat_lora ($(du -sh "$here/data/qat_lora" | cut -f1)); commit it"
