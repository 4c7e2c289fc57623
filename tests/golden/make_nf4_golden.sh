#!/usr/bin/env bash
# Regenerates tests/golden/data/nf4/: the pinned packages of requirements-nf4.txt in a virtualenv
# at $SCALELAB_NF4_VENV (default: <repo>/.venv-nf4, ignored by git).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${SCALELAB_NF4_VENV:-$repo/.venv-nf4}"
if [ ! -x "$venv/bin/python" ]; then
  echo "make_nf4_golden: creating $venv"
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$here/requirements-nf4.txt"
"$venv/bin/python" "$here/make_nf4_golden.py" --out "$here/data/nf4" "$@"
echo "make_nf4_golden: wrote $here/data/nf4 ($(du -sh "$here/data/nf4" | cut -f1)); commit it"
