#!/usr/bin/env bash
# Regenerates the analysis goldens: a pinned virtualenv (default /work/venvs/analysis, or $VENV)
# with requirements.txt, then make_golden.py writes sweep.json, runs.csv and expected.json here.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
VENV=${VENV:-/work/venvs/analysis}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q -r "$HERE/requirements.txt"
fi
"$VENV/bin/python" "$HERE/make_golden.py" "$HERE"
