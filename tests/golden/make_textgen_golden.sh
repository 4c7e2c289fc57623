#!/usr/bin/env bash
# Regenerates tests/golden/data/textgen/ (`make golden-textgen`): PyPI's torch and the pinned
# transformers of requirements-textgen.txt in a virtualenv at $SCALELAB_TEXTGEN_VENV (default:
# <repo>/.venv-textgen, ignored by git).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${SCALELAB_TEXTGEN_VENV:-$repo/.venv-textgen}"
if [ ! -x "$venv/bin/python" ]; then
  echo "make_textgen_golden: creating $venv"
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$here/requirements-textgen.txt"
"$venv/bin/python" "$here/make_textgen_golden.py" --out "$here/data/textgen" "$@"
echo "make_textgen_golden: wrote $here/data/textgen ($(du -sh "$here/data/textgen" | cut -f1)); commit it"
