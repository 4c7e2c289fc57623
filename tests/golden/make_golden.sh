#!/usr/bin/env bash
# Regenerates tests/golden/data/ (`make golden`): PyTorch 1.13 from Debian (python3-torch) plus
# the pinned Hugging Face packages of requirements.txt in a virtualenv that sees Debian's
# site-packages. The virtualenv lives in $SCALELAB_GOLDEN_VENV (default: <repo>/.venv-golden,
# ignored by git); tests that need transformers (check_hf_load.py) find it there too.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${SCALELAB_GOLDEN_VENV:-$repo/.venv-golden}"

# Debian's interpreter with torch; installs python3-torch / python3-venv when missing.
"$repo/scripts/deps.sh" python3-torch python3-venv
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "make_golden: /usr/bin/python3 cannot import torch — install python3-torch" >&2
  exit 2
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "make_golden: creating $venv"
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$here/requirements.txt"
"$venv/bin/python" "$here/make_golden.py" --out "$here/data" "$@"
echo "make_golden: wrote $here/data ($(du -sh "$here/data" | cut -f1)); commit it"
