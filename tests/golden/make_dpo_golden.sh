#!/usr/bin/env bash
# Regenerates tests/golden/data/dpo/: the pinned packages of requirements-dpo.txt in a virtualenv
# at $SCALELAB_DPO_VENV (default: <repo>/.venv-dpo, ignored by git).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${SCALELAB_DPO_VENV:-$repo/.venv-dpo}"
if [ ! -x "$venv/bin/python" ]; then
  echo "make_dpo_golden: creating $venv"
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$here/requirements-dpo.txt"
"$venv/bin/python" "$here/make_dpo_golden.py" --out "$here/data/dpo" "$@"
echo "make_dpo_golden: wrote $here/data/dpo ($(du -sh "$here/data/dpo" | cut -f1)); commit it"
