#!/usr/bin/env bash
# Regenerates tests/golden/data/chat/expected.json: the pinned packages of requirements-chat.txt in a
# virtualenv at $SCALELAB_CHAT_VENV (default: <repo>/.venv-chat, ignored by git).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${SCALELAB_CHAT_VENV:-$repo/.venv-chat}"
if [ ! -x "$venv/bin/python" ]; then
  echo "make_chat_golden: creating $venv"
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$here/requirements-chat.txt"
"$venv/bin/python" "$here/make_chat_golden.py" --out "$here/data/chat" "$@"
echo "make_chat_golden: wrote $here/data/chat/expected.json; commit it"
